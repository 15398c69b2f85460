//! `gpupool-trace perfetto` and `gpupool-trace plot` on a trace recorded from a C program under
//! the preloaded pool (two simulated devices), and a replay of one recorded with expandable
//! segments; hand-made odd traces and corrupt ones in `hostile.rs`; the comparison of a trace
//! whose run failed out of memory in `recorded_failures.rs`.

#[path = "../../cudasim/tests/common/mod.rs"]
mod sim;
#[path = "../support/mod.rs"]
mod support;

mod hostile;
mod recorded_failures;

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
        let trace = scratch("trace-tool").join("churn.trace");
        let stdout = record_trace(
            "churn",
            &["2", "800", "2"],
            &[("CUDASIM_DEVICES", "2")],
            &trace,
        );
        (trace, stdout)
    })
}

/// Runs `tests/c/PROGRAM.c` with `args` under the preloaded pool, with `env`, its trace going
/// to `trace`. Asserts that it succeeded and wrote the trace; returns its stdout.
fn record_trace(program: &str, args: &[&str], env: &[(&str, &str)], trace: &Path) -> String {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{program}.c"));
    let exe = Sim::get().compile(&source, &[]);
    let out = support::clean_command(&exe)
        .args(args)
        .env("LD_PRELOAD", library())
        .envs(env.iter().copied())
        .env("GPUPOOL_TRACE", trace)
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    let (stdout, stderr) = support::texts(&out);
    assert!(
        out.status.success(),
        "{program} failed:\n{stdout}\n{stderr}"
    );
    assert!(trace.exists(), "{program} wrote no trace");
    stdout
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

/// Recorded under the preload with expandable segments on (the simulator's driver maps memory),
/// a trace holds the granules mapped: `stats` counts them as reserved, `replay` gives the same
/// peak from the pool's own decisions without diverging, and `--expandable both` gives the
/// peaks with and without them.
#[test]
fn a_trace_recorded_with_expandable_segments_replays_as_recorded_and_both_ways() {
    let dir = scratch("trace-tool-expandable");
    let trace = dir.join("churn.trace");
    let env = [("CUDASIM_DEVICES", "1"), ("GPUPOOL_EXPANDABLE", "1")];
    record_trace("churn", &["1", "800", "1"], &env, &trace);
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

/// One thread churning under `GPUPOOL_LIMIT` with expandable segments, emptying the cache now
/// and then, so that granules are mapped again after the limit refused some: the replay takes
/// the limit's refusals again itself and gives the run's figures without diverging. The pool
/// used to record a refusal of the limit's as the driver's (`MapRefused`), which the replay
/// then played back on the next mapping it made.
#[test]
fn a_trace_recorded_under_a_limit_with_expandable_segments_replays_exactly() {
    let dir = scratch("trace-tool-limit-expandable");
    let trace = dir.join("race.trace");
    let env = [("GPUPOOL_LIMIT", "200MiB"), ("GPUPOOL_EXPANDABLE", "1")];
    record_trace("race", &["1", "3", "600", "1", "2", "obe"], &env, &trace);
    let t = trace.to_str().unwrap();
    let stats = String::from_utf8(tool_ok(&["stats", t])).unwrap();
    let replay = String::from_utf8(tool_ok(&["replay", t])).unwrap();
    assert!(!replay.contains("diverged"), "{stats}\n{replay}");
    assert_eq!(
        peak(&replay, "peak reserved ").1,
        peak(&stats, "peak reserved ").1,
        "{stats}\n{replay}"
    );
    let mapped = before(&stats, " granules mapped");
    assert!(
        replay.contains(&format!("{mapped} granules mapped")),
        "{stats}\n{replay}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// `tests/c/oom.c` on a 1 GiB device with no context, recorded once per test process: the
/// trace, and the JSON summary of the same run. 900 MiB of small blocks cached (450 granules),
/// then an 800 MiB block lacks more than the device has free; the pool gives its cache back
/// and maps it. Last, a 512 MiB request fails: the program gets `cudaErrorMemoryAllocation`.
fn oom() -> &'static (PathBuf, Value) {
    static RUN: OnceLock<(PathBuf, Value)> = OnceLock::new();
    RUN.get_or_init(|| {
        let dir = scratch("trace-tool-oom");
        let trace = dir.join("oom.trace");
        let json = dir.join("summary.json");
        let env = [
            ("CUDASIM_MEM", "1GiB"),
            ("CUDASIM_CONTEXT_BYTES", "0"),
            ("GPUPOOL_SUMMARY", json.to_str().unwrap()),
        ];
        record_trace("oom", &[], &env, &trace);
        let v = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        (trace, v)
    })
}

/// The 800 MiB request lacks more than the device has free: the pool maps nothing for it (it
/// would fill the device, then give it back), and the summary's peak reserved, `stats` and
/// `replay` all say the 900 MiB the small blocks held. The only granules unmapped are the small
/// blocks' 450, given back for it. (A mapping refused half-way counts in the peak:
/// `granules_mapped_and_unmapped_count_the_mappings_undone_at_a_refusal`.)
#[test]
fn a_request_beyond_the_free_memory_leaves_every_peak_reserved_as_it_was() {
    let (trace, v) = oom();
    let device = &v["devices"][0];
    assert_eq!(
        device["expandable"]["granules_unmapped"].as_u64(),
        Some(450),
        "{device}"
    );
    let t = trace.to_str().unwrap();
    let stats = String::from_utf8(tool_ok(&["stats", t])).unwrap();
    let replay = String::from_utf8(tool_ok(&["replay", t])).unwrap();
    assert!(!replay.contains("diverged"), "{replay}");
    let summary = device["reserved_bytes"]["peak"].as_u64().unwrap();
    assert_eq!(
        (
            summary,
            peak(&stats, "peak reserved ").1,
            peak(&replay, "peak reserved ").1
        ),
        (900 << 20, 900 << 20, 900 << 20),
        "{stats}\n{replay}"
    );
}

/// The request the program got out-of-memory for: one in the summary, one in `stats`, and one
/// in the replay, which fails it again; and on an 850 MiB device, 51: that one and the last
/// 50 of the 900 small blocks, which the recorded run served.
#[test]
fn a_replay_counts_the_requests_that_failed_as_the_summary_does() {
    let (trace, v) = oom();
    assert_eq!(v["devices"][0]["out_of_memory"]["returned"], 1, "{v}");
    let t = trace.to_str().unwrap();
    let stats = String::from_utf8(tool_ok(&["stats", t])).unwrap();
    assert_eq!(before(&stats, " failed"), 1, "{stats}");
    let replay = String::from_utf8(tool_ok(&["replay", t])).unwrap();
    assert!(
        replay.contains("requests that failed 1 (as in the recorded run)\n"),
        "{replay}"
    );
    let capped = String::from_utf8(tool_ok(&["replay", t, "--capacity", "850MiB"])).unwrap();
    assert!(
        capped.contains("requests that failed 51 (50 of them served in the recorded run)"),
        "{capped}"
    );
}
