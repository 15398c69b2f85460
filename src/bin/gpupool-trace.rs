//! `gpupool-trace`: read an allocation trace written with `GPUPOOL_TRACE=PATH`.
//!
//! ```text
//! gpupool-trace stats TRACE                      what the trace holds, per device
//! gpupool-trace replay TRACE [options]           replay it through the pool algorithm
//!     --threshold SIZE|none  --max-split SIZE|none  --fence-bytes SIZE
//!     --reuse strict|barrier|relaxed  --capacity SIZE
//! ```

use std::process::ExitCode;

use gpupool::config::{parse_bytes, ReuseMode};
use gpupool::pool::replay::{replay, Overrides};
use gpupool::pool::trace::{self, Kind, Record};
use gpupool::report::units::bytes;

const USAGE: &str = "usage: gpupool-trace stats TRACE
       gpupool-trace replay TRACE [--threshold SIZE|none] [--max-split SIZE|none]
                                  [--fence-bytes SIZE] [--reuse strict|barrier|relaxed]
                                  [--capacity SIZE]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gpupool-trace: {e}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn run(args: &[String]) -> Result<String, String> {
    let (cmd, path) = match args {
        [cmd, path, ..] => (cmd.as_str(), path),
        _ => return Err("missing arguments".into()),
    };
    let data = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
    let records = trace::parse(&data).map_err(|e| format!("{path}: {e}"))?;
    match cmd {
        "stats" => Ok(stats(&records)),
        "replay" => {
            let o = overrides(&args[2..])?;
            Ok(render_replay(&records, &o))
        }
        _ => Err(format!("unknown command {cmd:?}")),
    }
}

fn size_or_none(v: &str) -> Result<u64, String> {
    if v == "none" {
        return Ok(u64::MAX);
    }
    parse_bytes(v.as_bytes()).ok_or_else(|| format!("bad size {v:?}"))
}

fn overrides(args: &[String]) -> Result<Overrides, String> {
    let mut o = Overrides::default();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--threshold" => o.threshold = Some(size_or_none(value)?),
            "--max-split" => o.max_split_size = Some(size_or_none(value)?),
            "--fence-bytes" => o.fence_bytes = Some(size_or_none(value)?),
            "--capacity" => o.capacity = Some(size_or_none(value)?),
            "--reuse" => {
                o.reuse = Some(match value.as_str() {
                    "strict" => ReuseMode::Strict,
                    "barrier" => ReuseMode::Barrier,
                    "relaxed" => ReuseMode::Relaxed,
                    _ => return Err(format!("bad reuse mode {value:?}")),
                })
            }
            _ => return Err(format!("unknown option {flag:?}")),
        }
    }
    Ok(o)
}

/// Allocated and reserved bytes over the trace, folded from its records.
#[derive(Default)]
struct Fold {
    records: u64,
    allocs: u64,
    frees: u64,
    failed: u64,
    allocated: u64,
    reserved: u64,
    peak_allocated: u64,
    peak_reserved: u64,
    segments: u64,
    fences: u64,
    duration_ns: u64,
}

fn fold(records: &[Record], device: u8) -> Fold {
    let mut f = Fold::default();
    for r in records.iter().filter(|r| r.device == device) {
        f.records += 1;
        f.duration_ns = f.duration_ns.max(r.t_ns);
        match r.kind {
            Kind::Alloc => {
                f.allocs += 1;
                f.allocated += r.c;
            }
            Kind::AllocFailed => f.failed += 1,
            Kind::Free => {
                f.frees += 1;
                f.allocated = f.allocated.saturating_sub(r.c);
            }
            Kind::SegmentAlloc => {
                f.segments += 1;
                f.reserved += r.b;
            }
            Kind::SegmentFree => f.reserved = f.reserved.saturating_sub(r.b),
            Kind::Fence => f.fences += 1,
            Kind::Reset => {
                f.allocated = 0;
                f.reserved = 0;
            }
            _ => {}
        }
        f.peak_allocated = f.peak_allocated.max(f.allocated);
        f.peak_reserved = f.peak_reserved.max(f.reserved);
    }
    f
}

fn devices(records: &[Record]) -> Vec<u8> {
    let mut d: Vec<u8> = records.iter().map(|r| r.device).collect();
    d.sort_unstable();
    d.dedup();
    d
}

fn stats(records: &[Record]) -> String {
    let mut o = String::new();
    for d in devices(records) {
        let f = fold(records, d);
        o += &format!(
            "device {d}: {} records over {:.3} s; {} allocations, {} frees, {} failed; \
             {} segments, {} fences\n  peak allocated {} ({} bytes), peak reserved {} ({} bytes)\n",
            f.records,
            f.duration_ns as f64 / 1e9,
            f.allocs,
            f.frees,
            f.failed,
            f.segments,
            f.fences,
            bytes(f.peak_allocated),
            f.peak_allocated,
            bytes(f.peak_reserved),
            f.peak_reserved
        );
    }
    o
}

fn render_replay(records: &[Record], o: &Overrides) -> String {
    let mut out = String::new();
    for r in replay(records, o) {
        let s = &r.stats;
        out += &format!(
            "device {}: peak reserved {} ({} bytes), peak allocated {} ({} bytes), \
             reserved/allocated {:.3}\n  driver calls: {} cudaMalloc, {} cudaFree; fences {}, \
             barriers {}; requests that failed {}{}\n",
            r.device,
            bytes(s.reserved.peak),
            s.reserved.peak,
            bytes(s.allocated.peak),
            s.allocated.peak,
            s.reserved.peak as f64 / s.allocated.peak.max(1) as f64,
            s.real_mallocs,
            s.real_frees,
            s.fences,
            s.barriers,
            r.failed,
            if r.diverged {
                " (diverged from the recorded run)"
            } else {
                ""
            }
        );
    }
    out
}
