//! What the pool tells its user (issue 3): the summary in its three forms checked number by number
//! against what a test program did, path templates and unwritable paths, the `always:` summary of
//! processes the pool never served, the live dump (`SIGUSR1`, periodic), and the out-of-memory
//! report. C programs run under `LD_PRELOAD=libgpupool.so` against the CUDA runtime simulator.

#[path = "../cudasim/tests/common/mod.rs"]
mod sim;
mod support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;
use sim::Sim;
use support::{library, number, scratch};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn c_program(name: &str) -> PathBuf {
    static BUILT: OnceLock<std::sync::Mutex<BTreeMap<String, PathBuf>>> = OnceLock::new();
    let map = BUILT.get_or_init(Default::default);
    let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
    map.entry(name.to_string())
        .or_insert_with(|| {
            let src = support::root().join(format!("tests/c/{name}.c"));
            Sim::get().compile(&src, &[])
        })
        .clone()
}

/// `exe` under the preloaded pool with a clean environment (no `GPUPOOL_*`, `CUDASIM_*`, rank
/// variables) plus `env`.
fn pooled(exe: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = support::clean_command(exe);
    for v in ["RANK", "LOCAL_RANK", "SLURM_PROCID"] {
        cmd.env_remove(v);
    }
    cmd.args(args).env("LD_PRELOAD", library());
    cmd.envs(env.iter().copied());
    cmd
}

/// Runs `exe` pooled; asserts it exited 0; returns (pid, stdout, stderr).
fn run_ok(exe: &Path, args: &[&str], env: &[(&str, &str)]) -> (u32, String, String) {
    let child = pooled(exe, args, env)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start program");
    let pid = child.id();
    let out: Output = child.wait_with_output().expect("wait for program");
    let (stdout, stderr) = support::texts(&out);
    assert!(
        out.status.success(),
        "{} {args:?} with {env:?} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        exe.display(),
        out.status
    );
    (pid, stdout, stderr)
}

fn figure(text: &str, key: &str) -> u64 {
    number(text, key)
}

/// Per device: (real mallocs, peak real bytes) from churn's "device D real mallocs N peak real
/// bytes N" lines.
fn churn_devices(out: &str) -> Vec<(u64, u64)> {
    out.lines()
        .filter(|l| l.starts_with("device "))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(
                (w.len(), w[2], w[3], w[5], w[6], w[7]),
                (9, "real", "mallocs", "peak", "real", "bytes"),
                "{l}"
            );
            (parse(w[4]), parse(w[8]))
        })
        .collect()
}

fn parse(s: &str) -> u64 {
    s.parse().unwrap_or_else(|_| panic!("not a number: {s:?}"))
}

fn read_json(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", path.display()))
}

fn u(v: &Value, pointer: &str) -> u64 {
    v.pointer(pointer)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("no unsigned {pointer} in {v}"))
}

/// `units::bytes` as the summary's text prints sizes: `512 B`, `1.50 KiB`, `20.0 MiB`, `300 GiB`.
fn human(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if v >= 100.0 {
        format!("{v:.0} {}", UNITS[i])
    } else if v >= 10.0 {
        format!("{v:.1} {}", UNITS[i])
    } else {
        format!("{v:.2} {}", UNITS[i])
    }
}

// ---------------------------------------------------------------------------------------------
// The summary's numbers

/// The invariants every device object of a JSON summary taken at exit holds, whatever the program.
fn check_json_device_at_exit(d: &Value) {
    let allocs = u(d, "/allocations");
    assert_eq!(u(d, "/frees"), allocs, "{d}");
    assert_eq!(u(d, "/cache_hits") + u(d, "/cache_misses"), allocs, "{d}");
    assert_eq!(
        u(d, "/driver/mallocs_avoided"),
        allocs - u(d, "/cache_misses"),
        "{d}"
    );
    // Nothing is live at exit.
    for g in ["requested_bytes", "allocated_bytes", "live_blocks"] {
        assert_eq!(u(d, &format!("/{g}/current")), 0, "{g}: {d}");
        assert_eq!(
            u(d, &format!("/{g}/total_in")),
            u(d, &format!("/{g}/total_out")),
            "{g}: {d}"
        );
    }
    assert_eq!(u(d, "/live_blocks/total_in"), allocs, "{d}");
    assert_eq!(u(d, "/still_allocated/blocks"), 0, "{d}");
    assert_eq!(u(d, "/still_allocated/requested_bytes"), 0, "{d}");
    assert!(d["still_allocated"]["by_size"]
        .as_array()
        .unwrap()
        .is_empty());
    // Rounding only grows a request; the pool holds at least what it handed out.
    assert!(u(d, "/allocated_bytes/total_in") >= u(d, "/requested_bytes/total_in"));
    assert!(u(d, "/allocated_bytes/peak") >= u(d, "/requested_bytes/peak"));
    assert!(u(d, "/reserved_bytes/peak") >= u(d, "/allocated_bytes/peak"));
    // Reserved bytes are the driver's segments: what came in and went out of them.
    assert_eq!(
        u(d, "/reserved_bytes/current"),
        u(d, "/reserved_bytes/total_in") - u(d, "/reserved_bytes/total_out")
    );
    // A range of expandable segments counts as a segment, reserved with no cudaMalloc.
    assert_eq!(
        u(d, "/segments/total_in"),
        u(d, "/driver/mallocs") + u(d, "/expandable/ranges"),
        "{d}"
    );
    assert_eq!(u(d, "/segments/total_out"), u(d, "/driver/frees"), "{d}");
    // With nothing allocated, every reserved byte is cached.
    assert_eq!(
        u(d, "/cached_bytes"),
        u(d, "/reserved_bytes/current"),
        "{d}"
    );
    assert_eq!(
        u(d, "/cached_free_bytes") + u(d, "/pending_bytes"),
        u(d, "/cached_bytes")
    );
    assert!(u(d, "/largest_free_block_bytes") <= u(d, "/cached_free_bytes"));
    let frag = d["fragmentation"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&frag), "{d}");
    // Nothing live: nothing stranded, the whole cache could go back to the driver.
    assert_eq!(u(d, "/stranded_bytes"), 0, "{d}");
    assert_eq!(u(d, "/stranded_in_granules_bytes"), 0, "{d}");
    assert_eq!(u(d, "/releasable_bytes"), u(d, "/cached_bytes"), "{d}");
    // Expandable segments: their mapped bytes are part of the reserved ones, the granules
    // mapped less those unmapped.
    let e = &d["expandable"];
    assert!(["on", "off"].contains(&e["state"].as_str().unwrap()), "{d}");
    assert!(
        u(e, "/mapped_bytes") <= u(d, "/reserved_bytes/current"),
        "{d}"
    );
    assert_eq!(
        u(e, "/mapped_bytes"),
        (u(e, "/granules_mapped") - u(e, "/granules_unmapped")) * u(e, "/granule_bytes"),
        "{d}"
    );
    // The histogram counts every request once, in the bucket of its size.
    let hist = d["request_histogram"].as_array().unwrap();
    let counted: u64 = hist.iter().map(|b| u(b, "/count")).sum();
    assert_eq!(counted, allocs, "{d}");
    let bounds: Vec<u64> = hist
        .iter()
        .map(|b| b["below"].as_u64().unwrap_or(u64::MAX))
        .collect();
    assert!(bounds.windows(2).all(|w| w[0] < w[1]), "{bounds:?}");
    assert!(bounds.iter().all(|b| b.is_power_of_two() || *b == u64::MAX));
    // Nothing ran out of memory, nothing was released.
    assert_eq!(u(d, "/out_of_memory/returned"), 0);
    assert_eq!(u(d, "/out_of_memory/retries"), 0);
    assert_eq!(u(d, "/released/out_of_memory_bytes"), 0);
    assert_eq!(u(d, "/invalid_frees"), 0);
    assert!(d["release_threshold_bytes"].is_null(), "{d}");
    // Sampled with cudaMemGetInfo when a segment was taken: the simulator's default 80 GiB.
    assert_eq!(u(d, "/memory/total_bytes"), 80 * GIB, "{d}");
}

#[test]
fn json_summary_of_two_threads_on_two_devices_counts_what_the_program_did() {
    let dir = scratch("report-json");
    let path = dir.join("summary.json");
    let (pid, out, err) = run_ok(
        &c_program("churn"),
        &["2", "600", "2", "9"],
        &[
            ("CUDASIM_DEVICES", "2"),
            ("GPUPOOL_SUMMARY", path.to_str().unwrap()),
        ],
    );
    assert!(err.is_empty(), "{err}");
    let v = read_json(&path);
    assert_eq!(v["intercepted"], Value::Bool(true), "{v}");
    assert_eq!(u(&v, "/pid"), u64::from(pid));
    assert_eq!(v["rank"], "0");
    assert_eq!(v["reuse"], "strict");
    assert!(
        v["runtime"].as_str().unwrap().contains("libcudart.so"),
        "{v}"
    );
    let devices = v["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2, "{v}");
    for (i, d) in devices.iter().enumerate() {
        assert_eq!(u(d, "/device"), i as u64);
        check_json_device_at_exit(d);
    }
    let sum = |p: &str| devices.iter().map(|d| u(d, p)).sum::<u64>();
    let program = figure(&out, "program mallocs");
    assert_eq!(sum("/allocations"), program);
    assert_eq!(sum("/frees"), program);
    assert_eq!(sum("/driver/mallocs"), figure(&out, "real mallocs"));
    assert_eq!(sum("/reserved_bytes/peak"), figure(&out, "peak real bytes"));
    // Device by device: the simulator sees only the pool's segments.
    let sim = churn_devices(&out);
    assert_eq!(sim.len(), 2, "{out}");
    for (d, (real, peak)) in devices.iter().zip(sim) {
        assert_eq!(u(d, "/driver/mallocs"), real, "{d}");
        assert_eq!(u(d, "/reserved_bytes/peak"), peak, "{d}");
    }
    // Only the summary was written: no temporary file left behind.
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["summary.json"]);
}

/// Runs `python3 tests/prom_check.py FILE`: the reference parser's samples, by (sample name,
/// device label; for the process's samples, `reason=` and their reason label).
fn parse_prometheus(path: &Path) -> (Vec<Value>, BTreeMap<(String, String), Value>) {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(python)
        .arg(support::root().join("tests/prom_check.py"))
        .arg(path)
        .output()
        .expect("run python3 tests/prom_check.py");
    let (stdout, stderr) = support::texts(&out);
    assert!(
        out.status.success(),
        "the Prometheus parser rejected {} (is prometheus_client installed? scripts/test.sh \
         installs it):\n{stderr}\n--- file\n{}",
        path.display(),
        std::fs::read_to_string(path).unwrap_or_default()
    );
    let samples: Vec<Value> = serde_json::from_str(&stdout).expect("prom_check.py output");
    let mut by_name = BTreeMap::new();
    for s in &samples {
        let name = s["name"].as_str().unwrap().to_string();
        let labels = &s["labels"];
        if labels.get("le").is_some() {
            continue;
        }
        let device = match labels["reason"].as_str() {
            Some(reason) => format!("reason={reason}"),
            None => labels["device"].as_str().unwrap_or("").to_string(),
        };
        let old = by_name.insert((name.clone(), device.clone()), s["value"].clone());
        assert!(old.is_none(), "duplicate sample {name} device {device}");
    }
    (samples, by_name)
}

fn prom(map: &BTreeMap<(String, String), Value>, name: &str, device: u64) -> f64 {
    map.get(&(name.to_string(), device.to_string()))
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("no sample {name}{{device=\"{device}\"}}"))
}

/// The text summary's row `name` of device block `block`: (current, peak, total alloc, total
/// freed) as printed.
fn text_row(block: &str, name: &str) -> [String; 4] {
    let line = block
        .lines()
        .find(|l| l.trim_start().starts_with(name))
        .unwrap_or_else(|| panic!("no row {name:?} in:\n{block}"));
    let rest = line.trim_start()[name.len()..].to_string();
    // Columns are right-aligned in fields of 12, 12, 14, 14 characters.
    let rest = format!("{rest:>52}");
    let n = rest.len();
    let cols = [
        &rest[n - 52..n - 40],
        &rest[n - 40..n - 28],
        &rest[n - 28..n - 14],
        &rest[n - 14..],
    ];
    cols.map(|c| c.trim().to_string())
}

/// The numbers of the text summary's "calls" line: (mallocs, frees, hits, misses).
fn calls_line(block: &str) -> (u64, u64, u64, u64) {
    let line = block
        .lines()
        .find(|l| l.trim_start().starts_with("calls "))
        .unwrap_or_else(|| panic!("no calls line in:\n{block}"));
    // " calls      N mallocs, M frees; served from cache X% (H hits, Mi misses)"
    let w: Vec<&str> = line
        .split(|c: char| c.is_whitespace() || c == ',' || c == ';' || c == '(' || c == ')')
        .filter(|w| !w.is_empty())
        .collect();
    let after = |word: &str| -> u64 {
        let i = w
            .iter()
            .position(|x| *x == word)
            .unwrap_or_else(|| panic!("no {word} in {line}"));
        parse(w[i - 1])
    };
    (
        after("mallocs"),
        after("frees"),
        after("hits"),
        after("misses"),
    )
}

/// The device blocks of a text summary, by device number.
fn text_devices(text: &str) -> BTreeMap<u64, String> {
    let mut out = BTreeMap::new();
    let mut current: Option<(u64, String)> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix(" device ") {
            if rest.contains("release threshold") {
                if let Some((d, b)) = current.take() {
                    out.insert(d, b);
                }
                let d = parse(rest.split_whitespace().next().unwrap());
                current = Some((d, String::new()));
                continue;
            }
        }
        if let Some((_, b)) = current.as_mut() {
            b.push_str(line);
            b.push('\n');
        }
    }
    if let Some((d, b)) = current {
        out.insert(d, b);
    }
    out
}

#[test]
fn one_thread_summary_gives_the_same_numbers_in_json_prometheus_and_text() {
    let dir = scratch("report-forms");
    let args = ["1", "1500", "2", "9"];
    let mut runs = BTreeMap::new();
    for ext in ["json", "prom", "txt"] {
        let path = dir.join(format!("summary.{ext}"));
        let (pid, out, err) = run_ok(
            &c_program("churn"),
            &args,
            &[
                ("CUDASIM_DEVICES", "2"),
                ("GPUPOOL_SUMMARY", path.to_str().unwrap()),
            ],
        );
        assert!(err.is_empty(), "{err}");
        runs.insert(ext, (pid, out, path));
    }
    // One thread: the program and the pool's decisions are the same in every run.
    let out = &runs["json"].1;
    assert_eq!(runs["prom"].1, *out);
    assert_eq!(runs["txt"].1, *out);
    let program = figure(out, "program mallocs");
    let sim = churn_devices(out);
    assert_eq!(sim.len(), 2);

    // JSON.
    let v = read_json(&runs["json"].2);
    assert_eq!(u(&v, "/pid"), u64::from(runs["json"].0));
    assert_eq!(v["intercepted"], Value::Bool(true));
    let devices = v["devices"].as_array().unwrap().clone();
    assert_eq!(devices.len(), 2);
    for (d, (real, peak)) in devices.iter().zip(&sim) {
        check_json_device_at_exit(d);
        assert_eq!(u(d, "/driver/mallocs"), *real);
        assert_eq!(u(d, "/reserved_bytes/peak"), *peak);
        // One thread: the sample is exact, and the simulator's context is all there is outside.
        assert_eq!(u(d, "/memory/outside_pool_bytes"), 300 * MIB, "{d}");
    }
    assert_eq!(
        devices.iter().map(|d| u(d, "/allocations")).sum::<u64>(),
        program
    );

    // Prometheus, through the reference parser.
    let (samples, p) = parse_prometheus(&runs["prom"].2);
    let pid = runs["prom"].0.to_string();
    for s in &samples {
        assert_eq!(s["labels"]["pid"], pid.as_str(), "{s}");
        assert_eq!(s["labels"]["rank"], "0", "{s}");
        let name = s["name"].as_str().unwrap();
        assert!(name.starts_with("gpupool_"), "{s}");
        if name.ends_with("_total") {
            assert_eq!(s["type"], "counter", "{s}");
        }
    }
    let mut program_from_prom = 0.0;
    for (i, d) in devices.iter().enumerate() {
        let i = i as u64;
        let g = |name: &str| prom(&p, name, i);
        // Every figure the two forms share is the same number (times differ between runs).
        for (name, pointer) in [
            ("gpupool_requested_bytes", "/requested_bytes/current"),
            ("gpupool_requested_bytes_peak", "/requested_bytes/peak"),
            ("gpupool_allocated_bytes", "/allocated_bytes/current"),
            ("gpupool_allocated_bytes_peak", "/allocated_bytes/peak"),
            ("gpupool_reserved_bytes", "/reserved_bytes/current"),
            ("gpupool_reserved_bytes_peak", "/reserved_bytes/peak"),
            ("gpupool_cached_bytes", "/cached_bytes"),
            ("gpupool_pending_bytes", "/pending_bytes"),
            (
                "gpupool_largest_free_block_bytes",
                "/largest_free_block_bytes",
            ),
            ("gpupool_live_blocks", "/live_blocks/current"),
            ("gpupool_live_blocks_peak", "/live_blocks/peak"),
            ("gpupool_segments", "/segments/current"),
            ("gpupool_segments_peak", "/segments/peak"),
            ("gpupool_allocations_total", "/allocations"),
            ("gpupool_frees_total", "/frees"),
            ("gpupool_cache_hits_total", "/cache_hits"),
            ("gpupool_cache_misses_total", "/cache_misses"),
            ("gpupool_driver_mallocs_total", "/driver/mallocs"),
            (
                "gpupool_driver_mallocs_refused_total",
                "/driver/mallocs_refused",
            ),
            ("gpupool_driver_frees_total", "/driver/frees"),
            (
                "gpupool_threshold_released_bytes_total",
                "/released/threshold_bytes",
            ),
            (
                "gpupool_empty_cache_released_bytes_total",
                "/released/empty_cache_bytes",
            ),
            (
                "gpupool_outgrown_released_bytes_total",
                "/released/outgrown_bytes",
            ),
            (
                "gpupool_oom_released_bytes_total",
                "/released/out_of_memory_bytes",
            ),
            ("gpupool_oom_retries_total", "/out_of_memory/retries"),
            ("gpupool_oom_recovered_total", "/out_of_memory/recovered"),
            ("gpupool_ooms_total", "/out_of_memory/returned"),
            (
                "gpupool_threshold_released_segments_total",
                "/released/threshold_segments",
            ),
            (
                "gpupool_empty_cache_released_segments_total",
                "/released/empty_cache_segments",
            ),
            (
                "gpupool_outgrown_released_segments_total",
                "/released/outgrown_segments",
            ),
            (
                "gpupool_program_syncs_used_total",
                "/in_flight/program_syncs_used",
            ),
            ("gpupool_resets_total", "/resets"),
            ("gpupool_fences_total", "/in_flight/fences"),
            ("gpupool_barriers_total", "/in_flight/barriers"),
            ("gpupool_invalid_frees_total", "/invalid_frees"),
            ("gpupool_device_total_bytes", "/memory/total_bytes"),
            (
                "gpupool_device_outside_pool_bytes",
                "/memory/outside_pool_bytes",
            ),
            ("gpupool_releasable_bytes", "/releasable_bytes"),
            ("gpupool_stranded_bytes", "/stranded_bytes"),
            (
                "gpupool_expandable_address_space_bytes",
                "/expandable/address_space_bytes",
            ),
            (
                "gpupool_expandable_mapped_bytes",
                "/expandable/mapped_bytes",
            ),
            (
                "gpupool_granules_mapped_total",
                "/expandable/granules_mapped",
            ),
            (
                "gpupool_granules_unmapped_total",
                "/expandable/granules_unmapped",
            ),
            (
                "gpupool_slack_moved_granules_total",
                "/expandable/slack_moved_granules",
            ),
            ("gpupool_request_size_bytes_count", "/allocations"),
            (
                "gpupool_request_size_bytes_sum",
                "/requested_bytes/total_in",
            ),
        ] {
            assert_eq!(g(name), u(d, pointer) as f64, "{name} vs JSON {pointer}");
        }
        let frag = d["fragmentation"].as_f64().unwrap();
        assert!((g("gpupool_fragmentation_ratio") - frag).abs() < 1e-3);
        assert_eq!(
            p[&("gpupool_release_threshold_bytes".to_string(), i.to_string())],
            "+Inf"
        );
        assert_eq!(
            g("gpupool_cache_hits_total") + g("gpupool_cache_misses_total"),
            g("gpupool_allocations_total")
        );
        assert_eq!(g("gpupool_reserved_bytes_peak"), sim[i as usize].1 as f64);
        assert_eq!(g("gpupool_driver_mallocs_total"), sim[i as usize].0 as f64);
        assert_eq!(g("gpupool_requested_bytes"), 0.0);
        assert_eq!(g("gpupool_allocated_bytes"), 0.0);
        program_from_prom += g("gpupool_allocations_total");
        // The histogram: cumulative buckets by size, ending at +Inf with every request, and
        // the same counts as the JSON's buckets.
        let buckets: Vec<(f64, f64)> = samples
            .iter()
            .filter(|s| {
                s["name"] == "gpupool_request_size_bytes_bucket"
                    && s["labels"]["device"] == i.to_string().as_str()
            })
            .map(|s| {
                let le = s["labels"]["le"].as_str().unwrap();
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap()
                };
                (le, s["value"].as_f64().unwrap())
            })
            .collect();
        assert!(buckets.len() > 2);
        assert!(buckets
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1));
        assert_eq!(
            *buckets.last().unwrap(),
            (f64::INFINITY, g("gpupool_allocations_total"))
        );
        for b in d["request_histogram"].as_array().unwrap() {
            let Some(below) = b["below"].as_u64() else {
                continue;
            };
            let upto = |le: f64| {
                buckets
                    .iter()
                    .find(|(l, _)| *l == le)
                    .unwrap_or_else(|| panic!("no bucket le={le}"))
                    .1
            };
            // Requests in [below/2, below) are those counted up to below-1 and not up to below/2-1.
            let n = upto((below - 1) as f64)
                - if below > 1 {
                    upto((below / 2 - 1) as f64)
                } else {
                    0.0
                };
            assert_eq!(n, u(b, "/count") as f64, "bucket below {below}");
        }
    }
    assert_eq!(program_from_prom, program as f64);
    // Nothing passed through to CUDA: zeros in both forms, no line in the text.
    for reason in ["own_memory_pool", "graph_capture"] {
        for (name, field) in [
            ("gpupool_passed_through_allocations_total", "allocations"),
            ("gpupool_passed_through_bytes_total", "bytes"),
        ] {
            let key = (name.to_string(), format!("reason={reason}"));
            assert_eq!(p[&key].as_f64(), Some(0.0), "{name} {reason}");
            assert_eq!(u(&v, &format!("/passed_through/{reason}/{field}")), 0);
        }
    }

    // The text table.
    let text = std::fs::read_to_string(&runs["txt"].2).unwrap();
    assert!(!text.contains("passed through"), "{text}");
    let header = text.lines().nth(1).unwrap_or("");
    assert!(
        header.starts_with(" gpupool summary   pid ")
            && header.contains(&format!("pid {}   rank 0   reuse strict", runs["txt"].0)),
        "{text}"
    );
    let blocks = text_devices(&text);
    assert_eq!(blocks.keys().copied().collect::<Vec<_>>(), [0, 1], "{text}");
    let mut program_from_text = 0;
    for (i, d) in devices.iter().enumerate() {
        let b = &blocks[&(i as u64)];
        let (mallocs, frees, hits, misses) = calls_line(b);
        assert_eq!(mallocs, u(d, "/allocations"), "{b}");
        assert_eq!(frees, mallocs);
        assert_eq!((hits, misses), (u(d, "/cache_hits"), u(d, "/cache_misses")));
        assert_eq!(hits + misses, mallocs);
        program_from_text += mallocs;
        assert!(
            b.contains(&format!(" driver     cudaMalloc {} (", sim[i].0)),
            "{b}"
        );
        let driver_calls = u(d, "/driver/mallocs")
            + u(d, "/driver/frees")
            + u(d, "/expandable/granules_mapped")
            + u(d, "/expandable/granules_unmapped");
        assert!(
            b.contains(&format!(
                ": {driver_calls} calls for the program's {}\n",
                mallocs + frees
            )),
            "{b}"
        );
        for (row, key) in [
            ("requested memory", "requested_bytes"),
            ("allocated memory", "allocated_bytes"),
            ("reserved (from driver)", "reserved_bytes"),
        ] {
            let want = ["current", "peak", "total_in", "total_out"]
                .map(|f| human(u(d, &format!("/{key}/{f}"))));
            assert_eq!(text_row(b, row), want, "{row}:\n{b}");
        }
        assert_eq!(text_row(b, "reserved (from driver)")[1], human(sim[i].1));
        let want = ["current", "peak", "total_in", "total_out"]
            .map(|f| u(d, &format!("/live_blocks/{f}")).to_string());
        assert_eq!(text_row(b, "allocations"), want, "{b}");
        assert!(
            b.contains(&format!(
                "\n device     80.0 GiB total; at the last sample {} free, 300 MiB used outside the pool",
                human(u(d, "/memory/free_bytes"))
            )),
            "{b}"
        );
        assert_eq!(
            u(d, "/memory/free_bytes"),
            80 * GIB - 300 * MIB - last_sample_reserved(d)
        );
        assert!(
            b.contains(" request sizes (count of requests below each bound):"),
            "{b}"
        );
        assert!(!b.contains("still allocated at exit"), "{b}");
    }
    assert_eq!(program_from_text, program);
    assert!(text.ends_with(&format!("{}\n", "=".repeat(78))), "{text}");
}

/// The reserved bytes at the device's last memory sample, from the JSON (free = total − context −
/// reserved at that moment, in the simulator).
fn last_sample_reserved(d: &Value) -> u64 {
    u(d, "/memory/total_bytes") - u(d, "/memory/free_bytes") - u(d, "/memory/outside_pool_bytes")
}

// ---------------------------------------------------------------------------------------------
// Where the summary goes

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length minus the NUL kept at the end.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) };
    assert_eq!(r, 0);
    let end = buf.iter().position(|&b| b == 0).unwrap();
    String::from_utf8_lossy(&buf[..end]).replace('/', "_")
}

#[test]
fn path_templates_name_the_pid_rank_and_host() {
    let dir = scratch("report-template");
    let template = dir.join("job-%p-%r-%h-100%%.json");
    let host = hostname();
    for (env, rank) in [
        (
            vec![("RANK", "3"), ("LOCAL_RANK", "5"), ("SLURM_PROCID", "7")],
            "3",
        ),
        (vec![("LOCAL_RANK", "5"), ("SLURM_PROCID", "7")], "5"),
        (vec![("SLURM_PROCID", "7")], "7"),
        (vec![("RANK", ""), ("SLURM_PROCID", "7")], "7"),
        (vec![], "0"),
    ] {
        let mut env = env;
        env.push(("GPUPOOL_SUMMARY", template.to_str().unwrap()));
        let (pid, _, err) = run_ok(&c_program("churn"), &["1", "50", "1"], &env);
        assert!(err.is_empty(), "{err}");
        let path = dir.join(format!("job-{pid}-{rank}-{host}-100%.json"));
        let v = read_json(&path);
        assert_eq!(v["rank"], rank, "{env:?}");
        assert_eq!(v["host"], host.as_str());
        assert_eq!(u(&v, "/pid"), u64::from(pid));
        std::fs::remove_file(&path).unwrap();
    }
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
}

/// Runs churn briefly with `GPUPOOL_SUMMARY=dest`: exit status 0 and exactly one stderr line,
/// which names `dest`.
fn one_warning_for(dest: &Path) {
    let (_, out, err) = run_ok(
        &c_program("churn"),
        &["1", "50", "1"],
        &[("GPUPOOL_SUMMARY", dest.to_str().unwrap())],
    );
    assert!(out.contains("churn ok"), "{out}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.ends_with('\n'), "{err:?}");
    assert!(
        err.starts_with("gpupool: ") && err.contains(&format!("to {}:", dest.display())),
        "{err}"
    );
}

#[test]
fn an_unwritable_path_gives_one_warning_line() {
    let dir = scratch("report-unwritable");
    // A directory that does not exist.
    one_warning_for(&dir.join("missing/summary.json"));
    assert!(!dir.join("missing").exists());
    // A path that is a directory: left as it was, and no temporary file left beside it.
    let taken = dir.join("taken.txt");
    std::fs::create_dir(&taken).unwrap();
    std::fs::write(taken.join("inside"), b"x").unwrap();
    one_warning_for(&taken);
    assert!(taken.is_dir());
    assert_eq!(std::fs::read(taken.join("inside")).unwrap(), b"x");
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["taken.txt"]);
}

#[test]
fn a_symbolic_link_at_the_path_is_replaced_not_followed() {
    let dir = scratch("report-symlink");
    let target = dir.join("victim");
    std::fs::write(&target, b"keep").unwrap();
    let link = dir.join("summary.txt");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let (_, _, err) = run_ok(
        &c_program("churn"),
        &["1", "50", "1"],
        &[("GPUPOOL_SUMMARY", link.to_str().unwrap())],
    );
    assert!(err.is_empty(), "{err}");
    assert_eq!(std::fs::read(&target).unwrap(), b"keep");
    let meta = std::fs::symlink_metadata(&link).unwrap();
    assert!(meta.file_type().is_file(), "{meta:?}");
    let text = std::fs::read_to_string(&link).unwrap();
    assert!(text.contains(" gpupool summary   pid "), "{text}");
    // A dangling link is replaced too, and its target not created.
    let dangling = dir.join("dangling.json");
    std::os::unix::fs::symlink(dir.join("nowhere"), &dangling).unwrap();
    run_ok(
        &c_program("churn"),
        &["1", "50", "1"],
        &[("GPUPOOL_SUMMARY", dangling.to_str().unwrap())],
    );
    assert!(!dir.join("nowhere").exists());
    assert_eq!(read_json(&dangling)["intercepted"], Value::Bool(true));
}

// ---------------------------------------------------------------------------------------------
// Processes the pool never served

#[test]
fn always_reports_a_process_without_cuda_as_not_intercepted() {
    let dir = scratch("report-always");
    let path = dir.join("true.json");
    let dest = format!("always:{}", path.display());
    let (pid, out, err) = run_ok(Path::new("/bin/true"), &[], &[("GPUPOOL_SUMMARY", &dest)]);
    assert!(out.is_empty() && err.is_empty(), "{out}{err}");
    let v = read_json(&path);
    assert_eq!(v["intercepted"], Value::Bool(false), "{v}");
    assert_eq!(u(&v, "/pid"), u64::from(pid));
    assert!(v["devices"].as_array().unwrap().is_empty());
    let reason = v["reason"].as_str().unwrap();
    assert!(reason.contains("no CUDA runtime was loaded"), "{reason}");
    // The text form: one line on stderr.
    let (pid, out, err) = run_ok(
        Path::new("/bin/true"),
        &[],
        &[("GPUPOOL_SUMMARY", "always:stderr")],
    );
    assert!(out.is_empty(), "{out}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!("gpupool summary   pid {pid}: ")),
        "{err}"
    );
    assert!(
        err.contains("no CUDA allocations were intercepted: no CUDA runtime was loaded"),
        "{err}"
    );
}

/// With the pool disabled, `always:` still gives its one line, saying so; a plain destination
/// prints nothing.
#[test]
fn always_reports_a_disabled_pool() {
    let exe = c_program("churn");
    let (_, out, err) = run_ok(
        &exe,
        &["1", "50", "1"],
        &[
            ("GPUPOOL_SUMMARY", "always:stderr"),
            ("GPUPOOL_DISABLE", "1"),
        ],
    );
    assert!(out.contains("churn ok"), "{out}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(
            "no CUDA allocations were intercepted: the pool is disabled (GPUPOOL_DISABLE=1)"
        ),
        "{err}"
    );
    let (_, _, err) = run_ok(
        &exe,
        &["1", "50", "1"],
        &[("GPUPOOL_SUMMARY", "stderr"), ("GPUPOOL_DISABLE", "1")],
    );
    assert!(err.is_empty(), "{err}");
}

#[test]
fn always_reports_a_cuda_program_that_never_allocated_with_its_runtime() {
    let dir = scratch("report-noalloc");
    let simlib = Sim::get().simlib.display().to_string();
    // Only cudaGetDeviceCount (the pool never starts), then also cudaDeviceSynchronize (it does).
    for mode in ["count", "sync"] {
        let path = dir.join(format!("{mode}.json"));
        let dest = format!("always:{}", path.display());
        let (pid, out, err) = run_ok(
            &c_program("no_alloc"),
            &[mode],
            &[("GPUPOOL_SUMMARY", &dest)],
        );
        assert_eq!(out, "devices 1\n");
        assert!(err.is_empty(), "{err}");
        let v = read_json(&path);
        assert_eq!(v["intercepted"], Value::Bool(false), "{mode}: {v}");
        assert_eq!(u(&v, "/pid"), u64::from(pid));
        let reason = v["reason"]
            .as_str()
            .unwrap_or_else(|| panic!("{mode}: no reason in {v}"));
        assert!(
            reason.contains("a CUDA runtime was loaded")
                && reason.contains(&format!("{simlib}/libcudart.so")),
            "{mode}: {reason}"
        );
        // Without always:, nothing.
        let quiet = dir.join(format!("{mode}-quiet.json"));
        let (_, _, err) = run_ok(
            &c_program("no_alloc"),
            &[mode],
            &[("GPUPOOL_SUMMARY", quiet.to_str().unwrap())],
        );
        assert!(err.is_empty(), "{err}");
        assert!(!quiet.exists());
    }
}

/// A program whose every allocation went to CUDA (its own memory pool current, or a stream being
/// captured) used CUDA: it writes its summary, at exit and periodically, and the summary names
/// what passed through, in each form.
#[test]
fn a_program_whose_every_allocation_passed_through_writes_its_summary() {
    let exe = c_program("passed_through");
    let dir = scratch("report-passed-through");
    let cases = [
        (
            "own-pool",
            "own_memory_pool",
            "served by the program's own memory pool",
        ),
        ("capture", "graph_capture", "captured into a CUDA graph"),
    ];
    // Three blocks of 1, 2 and 3 MiB.
    let (n, bytes) = (3, 6 * MIB);
    for (mode, reason, why) in cases {
        // `always:` too gets the whole summary, not the line for a process the pool never saw.
        for dest in ["stderr", "always:stderr"] {
            let (_, out, err) = run_ok(&exe, &[mode, "3"], &[("GPUPOOL_SUMMARY", dest)]);
            assert!(out.contains("passed_through ok"), "{mode}: {out}");
            let said = (figure(&out, "passed="), figure(&out, "passed_bytes="));
            assert_eq!(said, (n, bytes), "{mode}");
            let line = format!(
                " passed through to CUDA: {n} allocations ({}) {why}\n",
                human(bytes)
            );
            assert!(err.contains(&line), "{mode} {dest}: no {line:?} in:\n{err}");
            assert!(
                err.contains(" every allocation passed through to CUDA; the pool served none\n"),
                "{mode} {dest}: {err}"
            );
        }
        let json = dir.join(format!("{mode}.json"));
        let prom = dir.join(format!("{mode}.prom"));
        for path in [&json, &prom] {
            run_ok(
                &exe,
                &[mode, "3"],
                &[("GPUPOOL_SUMMARY", path.to_str().unwrap())],
            );
        }
        let v = read_json(&json);
        assert_eq!(v["intercepted"], Value::Bool(false), "{mode}: {v}");
        for (_, r, _) in cases {
            let want = if r == reason { (n, bytes) } else { (0, 0) };
            let got = (
                u(&v, &format!("/passed_through/{r}/allocations")),
                u(&v, &format!("/passed_through/{r}/bytes")),
            );
            assert_eq!(got, want, "{mode}: {r}");
        }
        let prom = std::fs::read_to_string(&prom).expect("the Prometheus summary");
        let sample = format!("gpupool_passed_through_allocations_total{{reason=\"{reason}\",");
        let line = prom.lines().find(|l| l.starts_with(&sample));
        assert_eq!(
            line.and_then(|l| l.rsplit(' ').next()),
            Some(n.to_string().as_str()),
            "{mode}:\n{prom}"
        );
    }
    // While it runs, the periodic summary too: several whole summaries on stderr.
    let (_, _, err) = run_ok(
        &exe,
        &["own-pool", "2", "1000"],
        &[
            ("GPUPOOL_SUMMARY", "stderr"),
            ("GPUPOOL_SUMMARY_INTERVAL", "100ms"),
        ],
    );
    let summaries = err
        .matches(" passed through to CUDA: 2 allocations ")
        .count();
    assert!(summaries >= 2, "{summaries} summaries:\n{err}");
}

// ---------------------------------------------------------------------------------------------
// The live dump

/// A started program whose stdout and stderr are read by threads.
struct Running {
    child: Child,
    stdout: std::sync::mpsc::Receiver<String>,
    stderr: std::thread::JoinHandle<String>,
}

impl Running {
    fn start(exe: &Path, args: &[&str], env: &[(&str, &str)]) -> Running {
        let mut child = pooled(exe, args, env)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start program");
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut err = child.stderr.take().unwrap();
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        Running {
            child,
            stdout: rx,
            stderr,
        }
    }

    /// Waits for the line `want` on stdout.
    fn wait_for_line(&self, want: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stdout.recv_timeout(left) {
                Ok(line) if line == want => return,
                Ok(_) => {}
                Err(e) => panic!("no {want:?} on stdout: {e}"),
            }
        }
    }

    /// Waits for the exit (killing the program and failing after `timeout`); asserts status 0;
    /// returns (the rest of stdout, stderr).
    fn finish(mut self, timeout: Duration) -> (String, String) {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "still running after {timeout:?} (deadlock?); stderr so far:\n{}",
                    self.stderr.join().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let err = self.stderr.join().unwrap();
        let out: Vec<String> = self.stdout.iter().collect();
        let out = out.join("\n") + "\n";
        assert!(
            status.success(),
            "{status}:\n--- stdout\n{out}\n--- stderr\n{err}"
        );
        (out, err)
    }
}

/// Splits stderr holding only text summaries into them, asserting each is whole: header, one
/// block per device with every line, closing rule. Returns each one's device-0 calls line.
fn summaries(err: &str) -> Vec<(u64, u64, u64, u64)> {
    let rule = "=".repeat(78);
    let start = format!("{rule}\n gpupool summary   pid ");
    let mut rest = err;
    let mut out = Vec::new();
    while !rest.is_empty() {
        assert!(
            rest.starts_with(&start),
            "stderr holds something other than whole summaries here:\n{}\n--- all of stderr\n{err}",
            &rest[..rest.len().min(400)]
        );
        let end = rest[1..].find(&start).map_or(rest.len(), |i| i + 1);
        let block = &rest[..end];
        assert!(
            block.ends_with(&format!("\n{rule}\n")),
            "torn summary:\n{block}"
        );
        let devices = text_devices(block);
        assert_eq!(devices.keys().copied().collect::<Vec<_>>(), [0], "{block}");
        let d = &devices[&0];
        for line in [
            " metric ",
            " requested memory ",
            " allocated memory ",
            " reserved (from driver) ",
            " allocations ",
            " segments ",
            " cached ",
            " expandable ",
            " calls ",
            " driver ",
            " in flight ",
            " released ",
            " out of mem ",
        ] {
            assert!(
                d.lines().any(|l| l.starts_with(line)),
                "no line {line:?} in:\n{block}"
            );
        }
        out.push(calls_line(d));
        rest = &rest[end..];
    }
    out
}

/// Blocks the program never freed: the exit summary lists them by size, and the JSON counts
/// them.
#[test]
fn the_exit_summary_lists_what_the_program_never_freed() {
    let (_, out, err) = run_ok(&c_program("leak"), &[], &[("GPUPOOL_SUMMARY", "stderr")]);
    assert!(out.contains("leak ok"), "{out}");
    let want = format!(
        " still allocated at exit: 4 blocks, {} requested\n   {:>8} x {}\n   {:>8} x {}\n",
        human(2 * MIB + 8192),
        2,
        human(MIB),
        2,
        human(4096)
    );
    assert!(err.contains(&want), "want {want:?} in:\n{err}");
    let dir = scratch("report-leak");
    let path = dir.join("s.json");
    run_ok(
        &c_program("leak"),
        &[],
        &[("GPUPOOL_SUMMARY", path.to_str().unwrap())],
    );
    let v = read_json(&path);
    let d = &v["devices"][0];
    assert_eq!(u(d, "/still_allocated/blocks"), 4, "{d}");
    // A reset drops the four: the totals out count them, and the text says so.
    let (_, _, err) = run_ok(
        &c_program("leak"),
        &["reset"],
        &[("GPUPOOL_SUMMARY", "stderr")],
    );
    assert!(err.contains(" calls      7 mallocs, 2 frees;"), "{err}");
    assert_eq!(text_row(&err, "allocations"), ["1", "5", "7", "6"], "{err}");
    assert!(
        err.contains(" total freed includes what 1 cudaDeviceReset call dropped"),
        "{err}"
    );
    assert!(
        err.contains(" still allocated at exit: 1 blocks, 1.00 MiB requested"),
        "{err}"
    );
    assert_eq!(
        u(d, "/still_allocated/requested_bytes"),
        2 * MIB + 8192,
        "{d}"
    );
}

#[test]
fn sigusr1_during_an_allocation_storm_dumps_whole_summaries_without_deadlock() {
    let run = Running::start(
        &c_program("storm"),
        &["1600", "4"],
        &[("GPUPOOL_SUMMARY", "stderr")],
    );
    run.wait_for_line("ready", Duration::from_secs(10));
    let pid = run.child.id() as libc::pid_t;
    for _ in 0..10 {
        // SAFETY: signalling our own child, which has not been waited for yet.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGUSR1) }, 0);
        std::thread::sleep(Duration::from_millis(100));
    }
    let (out, err) = run.finish(Duration::from_secs(20));
    assert!(out.contains("storm ok"), "{out}");
    let program = figure(&out, "program mallocs");
    let all = summaries(&err);
    // Ten signals make at most ten dumps (several pending at once make one), plus the exit
    // summary; at least one dump happened during the second of signals.
    assert!(
        (2..=11).contains(&all.len()),
        "{} summaries:\n{err}",
        all.len()
    );
    // Live dumps see the counts grow; the exit summary has everything given back.
    assert!(all.windows(2).all(|w| w[0].0 <= w[1].0), "{all:?}");
    for &(mallocs, frees, hits, misses) in &all {
        assert!(frees <= mallocs && hits + misses == mallocs, "{all:?}");
    }
    let last = *all.last().unwrap();
    assert_eq!((last.0, last.1), (program, program), "{err}");
    // A live dump lists the blocks held as allocated now, never as left at exit (found in
    // review); at exit there are none.
    assert!(err.contains(" allocated now: "), "{err}");
    assert!(!err.contains("still allocated at exit"), "{err}");
}

#[test]
fn the_periodic_summary_is_written_while_the_program_runs() {
    let dir = scratch("report-interval");
    let path = dir.join("live.json");
    let mut run = Running::start(
        &c_program("storm"),
        &["1200", "4"],
        &[
            ("GPUPOOL_SUMMARY", path.to_str().unwrap()),
            ("GPUPOOL_SUMMARY_INTERVAL", "200ms"),
        ],
    );
    run.wait_for_line("ready", Duration::from_secs(10));
    let started = Instant::now();
    let mut seen = Vec::new();
    while run.child.try_wait().unwrap().is_none() && started.elapsed() < Duration::from_secs(20) {
        if let Ok(text) = std::fs::read_to_string(&path) {
            // Written atomically: whatever is there is a whole summary.
            let v: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("partial summary ({e}):\n{text}"));
            let allocs = u(&v, "/devices/0/allocations");
            if seen.last() != Some(&allocs) {
                seen.push(allocs);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let (out, err) = run.finish(Duration::from_secs(20));
    assert!(err.is_empty(), "{err}");
    assert!(
        !seen.is_empty(),
        "no summary appeared while the program ran"
    );
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    // At exit, the final numbers.
    let program = figure(&out, "program mallocs");
    let v = read_json(&path);
    let d = &v["devices"][0];
    check_json_device_at_exit(d);
    assert_eq!(u(d, "/allocations"), program);
    assert!(seen.iter().all(|&n| n <= program));
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["live.json"]);
}

#[test]
fn a_program_that_handles_sigusr1_itself_keeps_it() {
    for mode in ["handle", "ignore"] {
        let (_, out, err) = run_ok(&c_program("own_sigusr1"), &[mode], &[]);
        assert_eq!(out, "own handler ok\n");
        assert!(err.is_empty(), "{mode}: a summary was dumped:\n{err}");
        // With a summary asked for: only the one at exit.
        let (_, _, err) = run_ok(
            &c_program("own_sigusr1"),
            &[mode],
            &[("GPUPOOL_SUMMARY", "stderr")],
        );
        assert_eq!(summaries(&err), [(2, 2, 1, 1)], "{mode}");
    }
}

/// A child forked after the pool took `SIGUSR1` has no dump thread: the signal ends it, as it
/// would without the pool (the program never handled it), rather than being swallowed.
#[test]
fn sigusr1_ends_a_forked_child_as_it_would_without_the_pool() {
    let exe = c_program("fork_usr1");
    let without = support::ok(&mut support::unpooled(&exe, &[], &[])).0;
    assert_eq!(without, "child killed by signal 10\n");
    for env in [&[][..], &[("GPUPOOL_SUMMARY", "stderr")][..]] {
        let (_, out, err) = run_ok(&exe, &[], env);
        assert_eq!(out, without, "{env:?}\n{err}");
    }
}

/// The live-dump thread takes none of the program's signals: a program that blocks SIGTERM
/// and waits for it with `sigwait` still gets it (a thread that inherited the mask of the first
/// allocating thread would take the signal, and the process would die of it).
#[test]
fn the_dump_thread_takes_none_of_the_programs_signals() {
    for env in [
        &[][..],
        &[
            ("GPUPOOL_SUMMARY_INTERVAL", "1s"),
            ("GPUPOOL_SUMMARY", "stderr"),
        ][..],
    ] {
        let (_, out, _) = run_ok(&c_program("sigwait"), &[], env);
        assert_eq!(out, "sigwait got SIGTERM\n", "{env:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// The out-of-memory report

/// The advice of the out-of-memory report follows the situation: no split cap already in
/// force or above the pieces it means to protect, and no blame on other allocators for the CUDA
/// context.
#[test]
fn out_of_memory_advice_fits_the_situation() {
    let run = |mode: &str, env: &[(&str, &str)]| {
        let mut env = env.to_vec();
        let mem = if mode == "fragment" {
            "1400MiB"
        } else {
            "1GiB"
        };
        env.push(("CUDASIM_MEM", mem));
        // The advice for classic segments' packing: expandable segments have none of it.
        if !env.iter().any(|(k, _)| *k == "GPUPOOL_EXPANDABLE") {
            env.push(("GPUPOOL_EXPANDABLE", "0"));
        }
        let (_, out, err) = run_ok(&c_program("oom_advice"), &[mode], &env);
        assert!(out.ends_with("oom advice ok\n"), "{mode}: {out}");
        (out, err)
    };
    let advice = |mode: &str, env: &[(&str, &str)]| {
        let (_, err) = run(mode, env);
        let start = err
            .find("  you can ")
            .unwrap_or_else(|| panic!("{mode}: {err}"));
        err[start..].to_string()
    };
    // Free memory in 24 MiB pieces of a 1 GiB block, a 100 MiB request: a cap of 64 MiB would
    // keep such a block whole for requests like it, for the next run.
    let (out, _) = run("fragment", &[]);
    assert!(out.starts_with("big oom\n"), "{out}");
    let a = advice("fragment", &[]);
    assert!(
        a.contains("in the next run, GPUPOOL_MAX_SPLIT_SIZE=64.0MiB keeps cached blocks"),
        "{a}"
    );
    // Taken, the advice works: the 24 MiB blocks leave the big block alone (it goes back to the
    // driver when they need room), and the request succeeds.
    let (out, err) = run("fragment", &[("GPUPOOL_MAX_SPLIT_SIZE", "64.0MiB")]);
    assert!(out.starts_with("big ok\n"), "{out}\n{err}");
    assert!(!err.contains("out of memory"), "{err}");
    // Memory taken outside the pool after it began is named, with its size.
    let a = advice("outside", &[]);
    assert!(
        a.contains("memory used outside this pool grew by 600 MiB since its first segment"),
        "{a}"
    );
    assert!(
        a.contains("free tensors the program no longer needs"),
        "{a}"
    );
    // The driver's refusals count among its calls, and the summary says how many there were
    // (else more calls than segments go unexplained).
    let (_, err) = run("outside", &[("GPUPOOL_SUMMARY", "stderr")]);
    let line = err
        .lines()
        .find(|l| l.starts_with(" driver     cudaMalloc "))
        .unwrap_or_else(|| panic!("{err}"));
    let calls: u64 = line[" driver     cudaMalloc ".len()..]
        .split(',')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let segments = text_row(&err, "segments")[2].trim().parse::<u64>().unwrap();
    assert!(calls > segments, "{line}");
    assert!(
        line.contains(&format!(", {} refused (", calls - segments)),
        "{line}"
    );
    // The CUDA context alone (300 MiB in the simulator) is not blamed, and counts against what
    // the program's blocks can have: 64 MiB live and 900 MiB asked do not fit beside it.
    let a = advice("context", &[]);
    assert!(!a.contains("outside this pool"), "{a}");
    assert!(
        a.starts_with("  you can    the program's live allocations alone do not fit"),
        "{a}"
    );
}

#[test]
fn out_of_memory_report_names_the_numbers_once_per_situation() {
    let (_, out, err) = run_ok(
        &c_program("oom_report"),
        &[],
        &[("CUDASIM_MEM", "1GiB"), ("CUDASIM_CONTEXT_BYTES", "0")],
    );
    assert_eq!(out, "oom report ok\n");
    // 800 MiB three times and 900 MiB once: one device, one order of magnitude (both in
    // [512 MiB, 1 GiB)), one situation, one report.
    assert_eq!(err.matches("out of memory on device").count(), 1, "{err}");
    let first = err.lines().next().unwrap();
    assert_eq!(
        first,
        format!(
            "gpupool: out of memory on device 0: cudaMalloc of 800 MiB ({} bytes) failed",
            800 * MIB
        )
    );
    let line = |key: &str| {
        err.lines()
            .find(|l| l.trim_start().starts_with(key))
            .unwrap_or_else(|| panic!("no {key:?} line in:\n{err}"))
    };
    // Ten 60 MiB blocks, two freed and released at the out-of-memory: 480 MiB reserved, all of
    // it allocated; 544 MiB free, nothing used outside the pool (no context).
    assert!(
        line("device ").starts_with(
            "  device     1.00 GiB total, 544 MiB free when it failed; 0 B used outside this pool"
        ),
        "{err}"
    );
    assert!(
        line("the pool ").starts_with(
            "  the pool   reserves 480 MiB: 480 MiB allocated to the program (480 MiB requested), 0 B cached"
        ),
        "{err}"
    );
    assert!(
        line("it tried ").contains("released 120 MiB of cached segments to the driver"),
        "{err}"
    );
    assert!(
        line("peak ").starts_with(
            "  peak       600 MiB allocated at most, 600 MiB reserved at most; 8 live blocks now"
        ),
        "{err}"
    );
    // Live blocks plus the request exceed the device: the advice says so, and nothing about
    // the reuse mode (nothing awaits in-flight work once the pool fenced).
    assert!(
        line("you can ").starts_with(
            "  you can    the program's live allocations alone do not fit: smaller batches"
        ),
        "{err}"
    );
    assert!(!err.contains("GPUPOOL_REUSE"), "{err}");
    // The report is the whole of stderr: the runtime's answer needs no other message.
    assert!(
        err.lines()
            .all(|l| l.starts_with("gpupool: out of memory") || l.starts_with("  ")),
        "{err}"
    );
    // Another order of magnitude is another situation: one more report (for its first request).
    let (_, _, err) = run_ok(
        &c_program("oom_report"),
        &["larger"],
        &[("CUDASIM_MEM", "1GiB"), ("CUDASIM_CONTEXT_BYTES", "0")],
    );
    let heads: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("gpupool: out of memory"))
        .collect();
    assert_eq!(
        heads,
        [
            "gpupool: out of memory on device 0: cudaMalloc of 800 MiB (838860800 bytes) failed",
            "gpupool: out of memory on device 0: cudaMalloc of 2.00 GiB (2147483648 bytes) failed"
        ],
        "{err}"
    );
    // The second finds nothing left to release, and a request no device of this size holds.
    assert_eq!(
        err.matches("released 0 B of cached segments").count(),
        1,
        "{err}"
    );
    assert!(
        err.contains(
            "  you can    the request alone is larger than the device's 1.00 GiB: split it"
        ),
        "{err}"
    );
    // And it is on stderr even with a summary elsewhere; the summary counts the errors.
    let dir = scratch("report-oom");
    let path = dir.join("oom.json");
    let (_, _, err) = run_ok(
        &c_program("oom_report"),
        &[],
        &[
            ("CUDASIM_MEM", "1GiB"),
            ("CUDASIM_CONTEXT_BYTES", "0"),
            ("GPUPOOL_SUMMARY", path.to_str().unwrap()),
        ],
    );
    assert_eq!(err.matches("out of memory on device").count(), 1, "{err}");
    let v = read_json(&path);
    let d = &v["devices"][0];
    assert_eq!(u(d, "/out_of_memory/returned"), 4, "{d}");
    assert_eq!(u(d, "/released/out_of_memory_bytes"), 120 * MIB, "{d}");
    assert_eq!(u(d, "/allocations"), 10);
    assert_eq!(u(d, "/frees"), 10);
    assert_eq!(u(d, "/memory/total_bytes"), GIB);
}

/// With stdout and stderr one pipe (`> log 2>&1`), the program's own buffered output comes
/// before the summary (exit flushes stdio only after the exit handlers, so the pool flushes it
/// first).
#[test]
fn the_summary_follows_the_programs_own_output() {
    let exe = c_program("churn");
    for dest in ["stderr", "stdout", "always:stderr"] {
        let mut cmd = support::clean_command(Path::new("/bin/sh"));
        cmd.args(["-c", "exec \"$0\" \"$@\" 2>&1"])
            .arg(&exe)
            .args(["1", "50", "1"])
            .env("LD_PRELOAD", library())
            .env("GPUPOOL_SUMMARY", dest);
        let (out, _) = support::ok(&mut cmd);
        let program = out.find("churn ok").expect("the program's line");
        let summary = out.find("gpupool summary").expect("the summary");
        assert!(program < summary, "{dest}: the summary came first:\n{out}");
    }
}
