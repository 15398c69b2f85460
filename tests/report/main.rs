//! What the pool tells its user (issue 3): the summary in its three forms checked number by number
//! against what a test program did, path templates and unwritable paths, the `always:` summary of
//! processes the pool never served, the live dump (`SIGUSR1`, periodic), and the out-of-memory
//! report. C programs run under `LD_PRELOAD=libgpupool.so` against the CUDA runtime simulator.

#[path = "../../cudasim/tests/common/mod.rs"]
mod sim;
#[path = "../support/mod.rs"]
mod support;

mod destination;
mod live_dump;
mod never_served;
mod numbers;
mod out_of_memory;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

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
