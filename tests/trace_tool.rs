//! `gpupool-trace perfetto` and `gpupool-trace plot` on a trace recorded from a C program under
//! the preloaded pool (two simulated devices), on hand-made odd traces, and on corrupt ones.

#[path = "../cudasim/tests/common/mod.rs"]
mod sim;
mod support;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::Value;
use sim::Sim;
use support::{library, scratch};

fn tool(args: &[&str]) -> Output {
    Command::new(support::trace_tool())
        .args(args)
        .output()
        .expect("run gpupool-trace")
}

/// Runs the tool; asserts success; returns stdout.
fn tool_ok(args: &[&str]) -> Vec<u8> {
    let o = tool(args);
    assert!(
        o.status.success(),
        "gpupool-trace {args:?} failed ({}):\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    o.stdout
}

/// A trace of `churn 2 800 2` on two simulated devices, recorded once per test process.
fn churn_trace() -> &'static Path {
    &churn().0
}

/// The trace, and what churn printed.
fn churn() -> &'static (PathBuf, String) {
    static TRACE: OnceLock<(PathBuf, String)> = OnceLock::new();
    TRACE.get_or_init(|| {
        let dir = scratch("trace-tool");
        let trace = dir.join("churn.trace");
        let exe = Sim::get().compile(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/churn.c"),
            &[],
        );
        let out = support::clean_command(&exe)
            .args(["2", "800", "2"])
            .env("LD_PRELOAD", library())
            .env("CUDASIM_DEVICES", "2")
            .env("GPUPOOL_TRACE", &trace)
            .output()
            .expect("run churn");
        let (stdout, stderr) = support::texts(&out);
        assert!(out.status.success(), "churn failed:\n{stdout}\n{stderr}");
        assert!(trace.exists(), "no trace written");
        (trace, stdout)
    })
}

/// A record of the binary trace, decoded here independently of the library.
struct Rec {
    t_ns: u64,
    b: u64,
    c: u64,
    kind: u8,
    device: u8,
}

fn records(path: &Path) -> Vec<Rec> {
    let data = std::fs::read(path).unwrap();
    assert_eq!(&data[..8], b"GPTRACE1");
    data[8..]
        .chunks_exact(40)
        .map(|r| {
            let u = |i: usize| u64::from_le_bytes(r[i..i + 8].try_into().unwrap());
            Rec {
                t_ns: u(0),
                b: u(16),
                c: u(24),
                kind: r[36],
                device: r[37],
            }
        })
        .collect()
}

/// What `gpupool-trace stats` says about one device.
#[derive(Debug, Default, Clone)]
struct DeviceStats {
    allocations: u64,
    frees: u64,
    failed: u64,
    segments: u64,
    fences: u64,
    peak_allocated: u64,
    peak_reserved: u64,
    /// `388 MiB`, as printed.
    peak_allocated_h: String,
    peak_reserved_h: String,
}

/// The number before `word` in `text` (`"445 allocations"` → 445).
fn before(text: &str, word: &str) -> u64 {
    let i = text
        .find(word)
        .unwrap_or_else(|| panic!("no {word:?} in {text}"));
    let digits: String = text[..i]
        .trim_end()
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.chars().rev().collect::<String>().parse().unwrap()
}

/// `peak reserved 388 MiB (406847488 bytes)` → ("388 MiB", 406847488).
fn peak(text: &str, key: &str) -> (String, u64) {
    let rest = &text[text.find(key).unwrap() + key.len()..];
    let open = rest.find(" (").unwrap();
    let close = rest.find(" bytes)").unwrap();
    (
        rest[..open].trim().to_string(),
        rest[open + 2..close].parse().unwrap(),
    )
}

fn stats(trace: &Path) -> BTreeMap<u8, DeviceStats> {
    let out = String::from_utf8(tool_ok(&["stats", trace.to_str().unwrap()])).unwrap();
    let mut m = BTreeMap::new();
    for block in out.split("device ").skip(1) {
        let d: u8 = block[..block.find(':').unwrap()].parse().unwrap();
        let (pah, pa) = peak(block, "peak allocated ");
        let (prh, pr) = peak(block, "peak reserved ");
        m.insert(
            d,
            DeviceStats {
                allocations: before(block, " allocations"),
                frees: before(block, " frees"),
                failed: before(block, " failed"),
                segments: before(block, " segments"),
                fences: before(block, " fences"),
                peak_allocated: pa,
                peak_reserved: pr,
                peak_allocated_h: pah,
                peak_reserved_h: prh,
            },
        );
    }
    m
}

fn str_field<'a>(e: &'a Value, k: &str) -> &'a str {
    e[k].as_str()
        .unwrap_or_else(|| panic!("event without string {k:?}: {e}"))
}

/// Checks the fields every event of its phase must have; returns (track, ts) for timed events.
fn check_event(e: &Value) -> Option<(String, f64)> {
    let ph = str_field(e, "ph");
    str_field(e, "name");
    assert_eq!(e["pid"].as_u64(), Some(1), "{e}");
    assert!(e["args"].is_object(), "event without args: {e}");
    if ph == "M" {
        return None;
    }
    let ts = e["ts"]
        .as_f64()
        .unwrap_or_else(|| panic!("event without ts: {e}"));
    assert!(ts >= 0.0, "{e}");
    match ph {
        "C" => {
            assert!(e["args"]["bytes"].is_u64(), "counter without bytes: {e}");
            assert_eq!(e["args"].as_object().unwrap().len(), 1, "{e}");
            Some((format!("counter {}", str_field(e, "name")), ts))
        }
        "i" => {
            assert_eq!(e["s"].as_str(), Some("t"), "{e}");
            let tid = e["tid"].as_u64().unwrap_or_else(|| panic!("no tid: {e}"));
            Some((format!("thread {tid}"), ts))
        }
        _ => panic!("unexpected phase {ph}: {e}"),
    }
}

/// Parses the tool's JSON and checks what holds for any trace: the format, every event's
/// fields, and non-decreasing timestamps on every track.
fn parse_perfetto(json: &[u8]) -> Vec<Value> {
    let doc: Value = serde_json::from_slice(json).expect("perfetto output is not valid JSON");
    assert_eq!(doc["displayTimeUnit"].as_str(), Some("ms"));
    let events = doc["traceEvents"].as_array().expect("traceEvents").clone();
    let mut last: HashMap<String, f64> = HashMap::new();
    for e in &events {
        if let Some((track, ts)) = check_event(e) {
            let prev = last.insert(track.clone(), ts).unwrap_or(0.0);
            assert!(ts >= prev, "{track}: ts {ts} after {prev}");
        }
    }
    let process: Vec<&Value> = events
        .iter()
        .filter(|e| e["name"] == "process_name")
        .collect();
    assert_eq!(process.len(), 1);
    assert_eq!(process[0]["args"]["name"], "gpupool");
    events
}

#[test]
fn perfetto_json_round_trips_the_trace() {
    let trace = churn_trace();
    let t = trace.to_str().unwrap();
    let stats = stats(trace);
    assert_eq!(
        stats.keys().copied().collect::<Vec<_>>(),
        [0, 1],
        "{stats:?}"
    );
    let out = scratch("trace-tool-perfetto").join("churn.json");
    assert!(tool_ok(&["perfetto", t, out.to_str().unwrap()]).is_empty());
    let json = std::fs::read(&out).unwrap();
    assert_eq!(tool_ok(&["perfetto", t]), json, "stdout and OUT differ");
    // No pretty-printing: one event per line.
    let events = parse_perfetto(&json);
    assert_eq!(
        json.iter().filter(|&&b| b == b'\n').count(),
        events.len() + 2
    );

    let recs = records(trace);
    for (&d, s) in &stats {
        // One track per device, named.
        let tid = 100 + u64::from(d);
        let names: Vec<&Value> = events
            .iter()
            .filter(|e| e["name"] == "thread_name" && e["tid"].as_u64() == Some(tid))
            .collect();
        assert_eq!(names.len(), 1, "device {d}");
        assert_eq!(names[0]["args"]["name"], format!("device {d}"));

        let counter = |what: &str| -> Vec<u64> {
            let name = format!("device {d} {what}");
            events
                .iter()
                .filter(|e| e["ph"] == "C" && e["name"] == name.as_str())
                .map(|e| e["args"]["bytes"].as_u64().unwrap())
                .collect()
        };
        let steps = |v: &[u64]| -> (u64, u64) {
            let mut prev = 0;
            let (mut up, mut down) = (0, 0);
            for &x in v {
                up += u64::from(x > prev);
                down += u64::from(x < prev);
                prev = x;
            }
            (up, down)
        };
        let allocated = counter("allocated");
        let reserved = counter("reserved");
        // The allocation-related events: one rise of the allocated counter per Alloc record,
        // one fall per Free record; one rise of reserved per classic segment and per granule
        // an expandable segment mapped.
        let mine = |kind: u8| recs.iter().filter(move |r| r.device == d && r.kind == kind);
        let alloc_records = mine(1).count() as u64;
        assert_eq!(alloc_records, s.allocations, "device {d}");
        assert_eq!(steps(&allocated), (alloc_records, mine(3).count() as u64));
        assert_eq!(mine(3).count() as u64, s.frees, "device {d}");
        let (segment_records, map_records) = (mine(4).count() as u64, mine(19).count() as u64);
        assert_eq!(
            steps(&reserved).0,
            segment_records + map_records,
            "device {d}"
        );
        let failed = events
            .iter()
            .filter(|e| e["tid"].as_u64() == Some(tid) && e["name"] == "out of memory")
            .count() as u64;
        assert_eq!(failed, s.failed);
        // Peaks as `stats` reports them; final values as the records add up.
        assert_eq!(
            allocated.iter().max(),
            Some(&s.peak_allocated),
            "device {d}"
        );
        assert_eq!(reserved.iter().max(), Some(&s.peak_reserved), "device {d}");
        // And as the simulator saw it, where churn prints it per device.
        let key = format!("device {d} real mallocs ");
        if let Some(line) = churn().1.lines().find(|l| l.starts_with(&key)) {
            let sim_peak: u64 = line
                .split_once("peak real bytes ")
                .and_then(|(_, n)| n.trim().parse().ok())
                .unwrap_or_else(|| panic!("{line}"));
            assert_eq!(reserved.iter().max(), Some(&sim_peak), "device {d}: {line}");
        }
        let sum = |add: u8, sub: u8, field: fn(&Rec) -> u64| -> u64 {
            let plus: u64 = mine(add).map(field).sum();
            plus - mine(sub).map(field).sum::<u64>()
        };
        assert_eq!(allocated.last(), Some(&sum(1, 3, |r| r.c)), "device {d}");
        let held = sum(4, 6, |r| r.b) + sum(19, 21, |r| r.b);
        assert_eq!(reserved.last(), Some(&held), "device {d}");
        // Counter timestamps are the records' times, in microseconds.
        let first_t = recs.iter().find(|r| r.device == d).unwrap().t_ns;
        let last_t = recs.iter().filter(|r| r.device == d).map(|r| r.t_ns).max();
        let ts: Vec<f64> = events
            .iter()
            .filter(|e| e["ph"] == "C" && str_field(e, "name").starts_with(&format!("device {d} ")))
            .map(|e| e["ts"].as_f64().unwrap())
            .collect();
        assert!((ts[0] - first_t as f64 / 1e3).abs() < 1e-3);
        assert!(ts.iter().all(|&x| x * 1e3 <= last_t.unwrap() as f64 + 1.0));
        // Instants: fences with their wait, segments with size and reason.
        let instants = |name: &str| -> Vec<&Value> {
            events
                .iter()
                .filter(|e| e["ph"] == "i" && e["tid"].as_u64() == Some(tid) && e["name"] == name)
                .collect()
        };
        let fences = instants("fence");
        assert_eq!(fences.len() as u64, s.fences, "device {d}");
        assert!(fences.iter().all(|e| e["args"]["wait_ns"].is_u64()));
        let segments = instants("segment allocated");
        assert_eq!(segments.len() as u64, s.segments);
        assert!(segments
            .iter()
            .all(|e| e["args"]["size"].as_u64() > Some(0)));
        assert!(instants("segment released")
            .iter()
            .all(|e| e["args"]["reason"].is_string() && e["args"]["size"].is_u64()));
        assert_eq!(instants("pool settings").len(), 1);
    }
}

/// What Python's XML parser sees in an SVG: the root's tag, the panels' ids, every text.
fn parse_svg(path: &Path) -> Value {
    let script = r#"
import json, sys
import xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
ns = "{http://www.w3.org/2000/svg}"
print(json.dumps({
    "root": root.tag,
    "panels": [g.get("id") for g in root.iter(ns + "g") if g.get("class") == "panel"],
    "texts": ["".join(t.itertext()) for t in root.iter(ns + "text")],
    "title": "".join(root.find(ns + "title").itertext()),
    "paths": sum(1 for _ in root.iter(ns + "path")),
}))
"#;
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let o = Command::new(python)
        .arg("-c")
        .arg(script)
        .arg(path)
        .output()
        .expect("run python3");
    assert!(
        o.status.success(),
        "the SVG does not parse as XML:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn plot_draws_one_panel_per_device_with_its_peaks() {
    let trace = churn_trace();
    let t = trace.to_str().unwrap();
    let stats = stats(trace);
    let out = scratch("trace-tool-plot").join("churn.svg");
    assert!(tool_ok(&["plot", t, out.to_str().unwrap()]).is_empty());
    let svg = std::fs::read_to_string(&out).unwrap();
    assert_eq!(
        tool_ok(&["plot", t]),
        svg.as_bytes(),
        "stdout and OUT differ"
    );
    // Self-contained: no script, no reference to anything outside the file.
    for banned in ["<script", "href", "<image", "@import", "url("] {
        assert!(!svg.contains(banned), "the SVG holds {banned:?}");
    }
    assert_eq!(svg.matches("http").count(), 1, "only the SVG namespace");
    let doc = parse_svg(&out);
    assert_eq!(doc["root"], "{http://www.w3.org/2000/svg}svg");
    assert_eq!(doc["panels"], serde_json::json!(["device-0", "device-1"]));
    assert!(doc["title"].as_str().unwrap().contains("churn.trace"));
    // Two area and two line paths per panel.
    assert_eq!(doc["paths"], 8);
    let texts: Vec<&str> = doc["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    for s in stats.values() {
        for label in [
            format!("peak reserved {}", s.peak_reserved_h),
            format!("peak allocated {}", s.peak_allocated_h),
        ] {
            assert!(
                texts.iter().any(|t| *t == label),
                "no {label:?} label in {texts:?}"
            );
        }
    }
    for t in [
        "device 0",
        "device 1",
        "reserved from the driver",
        "allocated by the program",
    ] {
        assert!(texts.contains(&t), "no {t:?} in {texts:?}");
    }
    // Axes in seconds and binary units.
    assert!(texts.iter().any(|t| t.contains("(s)")));
    assert!(texts.iter().any(|t| t.ends_with(" MiB")));
    assert!(texts.contains(&"0"));
}

/// Encodes one record as the library writes it.
#[allow(clippy::too_many_arguments)]
fn record(out: &mut Vec<u8>, t: u64, kind: u8, device: u8, a: u64, b: u64, c: u64, aux: u16) {
    for v in [t, a, b, c] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&7u32.to_le_bytes());
    out.push(kind);
    out.push(device);
    out.extend_from_slice(&aux.to_le_bytes());
}

#[test]
fn odd_traces_still_give_valid_json_and_svg() {
    let dir = scratch("trace-tool-odd");
    // Every kind, extreme values, unknown reason codes, records at the same time, the last
    // device number, a cut-off last record, and a file name that needs escaping everywhere.
    let mut t = b"GPTRACE1".to_vec();
    for kind in 0..=14u8 {
        record(
            &mut t,
            1000 * u64::from(kind),
            kind,
            255,
            u64::MAX,
            u64::MAX,
            u64::MAX,
            999,
        );
    }
    record(&mut t, 14_000, 1, 255, 1, 2, 3, 0);
    record(&mut t, 0, 0, 0, u64::MAX, 0, u64::MAX, 0);
    record(&mut t, u64::MAX, 4, 0, 0, 1 << 20, 0, 0);
    t.extend_from_slice(&[1, 2, 3]);
    let name = "we\"ird <&> \\ 'name'\t\u{1}é.trace";
    let path = dir.join(name);
    std::fs::write(&path, &t).unwrap();
    let p = path.to_str().unwrap();

    let o = tool(&["perfetto", p]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cut-off record"));
    let events = parse_perfetto(&o.stdout);
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["otherData"]["source"], name);
    assert!(events.iter().any(|e| e["name"] == "device 255 reserved"));
    assert!(events
        .iter()
        .any(|e| e["name"] == "segment released" && e["args"]["reason"] == "unknown (999)"));

    let svg = dir.join("odd.svg");
    assert!(tool_ok(&["plot", p, svg.to_str().unwrap()]).is_empty());
    let doc = parse_svg(&svg);
    assert_eq!(doc["panels"], serde_json::json!(["device-0", "device-255"]));
    assert!(doc["title"]
        .as_str()
        .unwrap()
        .contains("we\"ird <&> \\ 'name'"));

    // A trace with no records at all.
    let empty = dir.join("empty.trace");
    std::fs::write(&empty, b"GPTRACE1").unwrap();
    let e = empty.to_str().unwrap();
    parse_perfetto(&tool_ok(&["perfetto", e]));
    let svg = dir.join("empty.svg");
    tool_ok(&["plot", e, svg.to_str().unwrap()]);
    let doc = parse_svg(&svg);
    assert_eq!(doc["panels"], serde_json::json!([]));
}

#[test]
fn corrupt_traces_exit_2_with_a_message() {
    let dir = scratch("trace-tool-corrupt");
    let good = std::fs::read(churn_trace()).unwrap();
    let mut unknown_kind = good.clone();
    unknown_kind[8 + 40 * 3 + 36] = 200;
    // 32 bytes of a chunk lost midway (a write that failed in part): what follows is shifted.
    let mut shifted = good[..8 + 40 * 100].to_vec();
    shifted.extend_from_slice(&good[8 + 40 * 100 + 32..]);
    // Two records of a device swapped: time goes back.
    let at = |i: usize| u64::from_le_bytes(good[8 + 40 * i..][..8].try_into().unwrap());
    let device = |i: usize| good[8 + 40 * i + 37];
    let i = (10..)
        .find(|&i| at(i) < at(i + 1) && device(i) == device(i + 1))
        .unwrap();
    let mut swapped = good.clone();
    let (a, b) = (8 + 40 * i, 8 + 40 * (i + 1));
    let first = swapped[a..b].to_vec();
    swapped.copy_within(b..b + 40, a);
    swapped[b..b + 40].copy_from_slice(&first);
    let gzipped = std::process::Command::new("gzip")
        .arg("-c")
        .arg(churn_trace())
        .output()
        .unwrap()
        .stdout;
    let cases: [(&str, Vec<u8>, &str); 8] = [
        ("empty", Vec::new(), "bad magic"),
        ("cut-header", b"GPTR".to_vec(), "cut short"),
        (
            "not-a-trace",
            b"PK\x03\x04 some zip file".to_vec(),
            "bad magic",
        ),
        ("unknown-kind", unknown_kind, "record 3: unknown kind 200"),
        ("shifted", shifted, "the trace is corrupt"),
        ("swapped", swapped, "time goes back"),
        ("gzipped", gzipped, "decompress it first"),
        ("missing", Vec::new(), "No such file"),
    ];
    for (name, bytes, why) in &cases {
        let path = dir.join(format!("{name}.trace"));
        if *name != "missing" {
            std::fs::write(&path, bytes).unwrap();
        }
        for cmd in ["stats", "replay", "perfetto", "plot"] {
            let out = dir.join(format!("{name}.{cmd}.out"));
            let o = tool(&[cmd, path.to_str().unwrap(), out.to_str().unwrap()]);
            let stderr = String::from_utf8_lossy(&o.stderr);
            if cmd == "stats" || cmd == "replay" {
                // These take no output file: the extra argument is the error.
                assert_eq!(o.status.code(), Some(2), "{cmd} {name}: {stderr}");
                continue;
            }
            assert_eq!(o.status.code(), Some(2), "{cmd} {name}: {stderr}");
            assert!(
                stderr.starts_with("gpupool-trace: ") && stderr.contains(why),
                "{cmd} {name}: {stderr}"
            );
            assert!(!stderr.contains("panicked"), "{stderr}");
            assert!(o.stdout.is_empty());
            assert!(!out.exists(), "{cmd} {name}: wrote {}", out.display());
        }
        for cmd in ["stats", "replay"] {
            let o = tool(&[cmd, path.to_str().unwrap()]);
            let stderr = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "{cmd} {name}: {stderr}");
            assert!(
                stderr.contains(why) && !stderr.contains("panicked"),
                "{stderr}"
            );
        }
    }
    // A record cut off at the end (a process killed while writing) is left out, with a warning.
    let cut = dir.join("cut.trace");
    std::fs::write(&cut, &good[..good.len() - 17]).unwrap();
    let o = tool(&["plot", cut.to_str().unwrap()]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("warning"));
    // Usage errors.
    for args in [
        &[][..],
        &["plot"],
        &["draw", "x.trace"],
        &["plot", "x", "y", "z"],
    ] {
        let o = tool(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&o.stderr).contains("usage:"));
    }
}

/// What the review of the trace tool found besides corrupt files: an output naming the trace
/// itself, an empty trace, a `--max-split` the library would refuse, workloads too large to
/// build in memory, sizes whose sums overflow, and a comparison with nothing to compare.
#[test]
fn odd_requests_are_refused_or_explained() {
    let dir = scratch("trace-tool-requests");
    let trace = dir.join("t.trace");
    std::fs::copy(churn_trace(), &trace).unwrap();
    let t = trace.to_str().unwrap();
    let before = std::fs::read(&trace).unwrap();
    // The same file by its path, and through a hard link (whose name alone would pass the
    // check, and the plot would replace the trace).
    let hard = dir.join("hard.trace");
    std::fs::hard_link(&trace, &hard).unwrap();
    for cmd in ["plot", "perfetto"] {
        for out in [t, hard.to_str().unwrap()] {
            let o = tool(&[cmd, t, out]);
            assert_eq!(o.status.code(), Some(2), "{cmd} {out}");
            assert!(String::from_utf8_lossy(&o.stderr).contains("is the trace itself"));
        }
    }
    assert_eq!(
        std::fs::read(&trace).unwrap(),
        before,
        "the trace was overwritten"
    );

    let empty = dir.join("empty.trace");
    std::fs::write(&empty, b"GPTRACE1").unwrap();
    let e = empty.to_str().unwrap();
    assert!(String::from_utf8_lossy(&tool_ok(&["stats", e])).starts_with("no records"));
    assert!(String::from_utf8_lossy(&tool_ok(&["replay", e])).starts_with("no records"));

    let o = tool(&["replay", t, "--max-split", "1KiB"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("above 20MiB"));

    for spec in ["inference:10001", "training:10001", "random:1MiB:10000001"] {
        let o = tool(&["generate", spec]);
        assert_eq!(o.status.code(), Some(2), "{spec}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("bad count"),
            "{spec}"
        );
    }

    // `compare` on a hand-made trace of allocations of `sizes` bytes (its output).
    let compare_allocations = |name: &str, sizes: &[u64]| {
        let mut t = b"GPTRACE1".to_vec();
        record(&mut t, 0, 0, 0, u64::MAX, 256 << 20, u64::MAX, 2);
        for (i, &size) in sizes.iter().enumerate() {
            let i = i as u64 + 1;
            record(&mut t, i, 1, 0, size, i << 28, size, 0);
        }
        let path = dir.join(name);
        std::fs::write(&path, &t).unwrap();
        String::from_utf8_lossy(&tool_ok(&[
            "compare",
            path.to_str().unwrap(),
            "--min-time",
            "0",
        ]))
        .into_owned()
    };
    // Two allocations of 2^63 bytes: sums saturate instead of wrapping, and one of an
    // impossible size fails everywhere, so no percentage can be given.
    let out = compare_allocations("huge.trace", &[1 << 63, 1 << 63]);
    assert!(out.contains("peak requested 16384 PiB"), "{out}");
    for line in out.lines().filter(|l| l.starts_with("| gpupool |")) {
        // One served (8 EiB), one refused: never a wrapped sum.
        assert!(
            line.contains("| 8192 PiB |") && line.ends_with("|"),
            "{line}"
        );
    }
    let out = compare_allocations("max.trace", &[u64::MAX]);
    assert!(out.contains("| n/a | n/a (0 vs 0) |"), "{out}");
}

/// `--help` after any subcommand, a reader of stdout that stops early (`| head`), and
/// `--svg-dir` naming a directory still to be made.
#[test]
fn help_early_readers_and_new_plot_directories() {
    for args in [
        &["stats", "--help"][..],
        &["replay", "t.trace", "-h"],
        &["perfetto", "--help"],
        &["generate", "--help"],
        &["compare", "--help"],
    ] {
        let out = String::from_utf8_lossy(&tool_ok(args)).into_owned();
        assert!(out.starts_with("usage: gpupool-trace"), "{args:?}: {out}");
    }

    // perfetto's JSON of the churn trace is far larger than a pipe holds: the reader takes a
    // few bytes and goes away.
    let mut child = Command::new(support::trace_tool())
        .args(["perfetto", churn_trace().to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 16];
    std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut first).unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert!(first.starts_with(b"{"), "{first:?}");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let dir = scratch("trace-tool-svg-dir");
    let plots = dir.join("plots/new");
    tool_ok(&[
        "compare",
        "training:1",
        "--seed",
        "1",
        "--svg-dir",
        plots.to_str().unwrap(),
    ]);
    assert!(plots.join("training-1.svg").is_file());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Recorded under the preload with expandable segments on (the simulator's driver maps memory),
/// a trace holds the granules mapped: `stats` counts them as reserved, `replay` gives the same
/// peak from the pool's own decisions without diverging, and `--expandable both` gives the
/// peaks with and without them.
#[test]
fn a_trace_recorded_with_expandable_segments_replays_as_recorded_and_both_ways() {
    let dir = scratch("trace-tool-expandable");
    let trace = dir.join("churn.trace");
    let exe = Sim::get().compile(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/churn.c"),
        &[],
    );
    let out = support::clean_command(&exe)
        .args(["1", "800", "1"])
        .env("LD_PRELOAD", library())
        .env("CUDASIM_DEVICES", "1")
        .env("GPUPOOL_EXPANDABLE", "1")
        .env("GPUPOOL_TRACE", &trace)
        .output()
        .expect("run churn");
    let (stdout, stderr) = support::texts(&out);
    assert!(out.status.success(), "churn failed:\n{stdout}\n{stderr}");
    let t = trace.to_str().unwrap();
    let stats = String::from_utf8(tool_ok(&["stats", t])).unwrap();
    let mapped = before(&stats, " granules mapped");
    assert!(mapped > 0, "{stats}");
    let replay = String::from_utf8(tool_ok(&["replay", t])).unwrap();
    assert!(!replay.contains("diverged"), "{replay}");
    assert!(
        replay.contains(&format!("{mapped} granules mapped")),
        "{replay}"
    );
    assert_eq!(
        peak(&replay, "peak reserved ").1,
        peak(&stats, "peak reserved ").1,
        "{stats}\n{replay}"
    );
    let both = String::from_utf8(tool_ok(&["replay", t, "--expandable", "both"])).unwrap();
    for part in [
        "with expandable segments:\n",
        "without expandable segments:\n",
        "with expandable segments, ",
    ] {
        assert!(both.contains(part), "{part:?}\n{both}");
    }
    let o = tool(&["replay", t, "--expandable", "maybe"]);
    assert_eq!(o.status.code(), Some(2));
    std::fs::remove_dir_all(&dir).ok();
}
