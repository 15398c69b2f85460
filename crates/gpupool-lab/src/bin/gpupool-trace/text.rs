//! The text commands: `stats` (what the trace holds) and `replay` (the trace through the pool
//! algorithm, with other settings if asked).

use gpupool::config::{parse_bytes, ReuseMode};
use gpupool::pool::replay::{replay as run_replay, DeviceResult, Overrides, Route};
use gpupool::pool::trace::Record;
use gpupool::report::units::bytes;

use crate::compare::ratio;
use crate::fold::{devices, fold};

pub fn size_or_none(v: &str) -> Result<u64, String> {
    if v == "none" {
        return Ok(u64::MAX);
    }
    parse_bytes(v.as_bytes()).ok_or_else(|| format!("bad size {v:?}"))
}

pub fn reuse_mode(value: &str) -> Result<ReuseMode, String> {
    match value {
        "strict" => Ok(ReuseMode::Strict),
        "barrier" => Ok(ReuseMode::Barrier),
        "relaxed" => Ok(ReuseMode::Relaxed),
        _ => Err(format!("bad reuse mode {value:?}")),
    }
}

/// `--slack`: a percentage of the peak allocated, as `GPUPOOL_EXPANDABLE_SLACK`, or `none`.
fn slack(value: &str) -> Result<Option<u32>, String> {
    gpupool::config::parse_slack_permille(value.as_bytes())
        .ok_or_else(|| format!("--slack is a percentage such as 4%, or none (got {value:?})"))
}

/// `replay`'s options: the overrides, and whether to replay with expandable segments on and
/// off (`--expandable both`).
pub struct ReplayOptions {
    pub overrides: Overrides,
    pub both: bool,
}

/// `replay`'s options.
pub fn overrides(args: &[String]) -> Result<ReplayOptions, String> {
    let mut o = Overrides::default();
    let mut both = false;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        if flag == "--one-stream" {
            o.route = Route::OneStream;
            continue;
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--threshold" => o.threshold = Some(size_or_none(value)?),
            "--max-split" => {
                let b = size_or_none(value)?;
                if b <= gpupool::config::MAX_SPLIT_SIZE_ABOVE {
                    return Err(format!(
                        "--max-split {value}: above 20MiB, as GPUPOOL_MAX_SPLIT_SIZE"
                    ));
                }
                o.max_split_size = Some(b);
            }
            "--fence-bytes" => o.fence_bytes = Some(size_or_none(value)?),
            "--capacity" => o.capacity = Some(size_or_none(value)?),
            "--limit" => o.limit = Some(size_or_none(value)?),
            "--reuse" => o.reuse = Some(reuse_mode(value)?),
            "--slack" => o.mapped_slack_permille = Some(slack(value)?),
            "--expandable" => {
                (o.expandable, both) = match value.as_str() {
                    "recorded" => (None, false),
                    "on" => (Some(true), false),
                    "off" => (Some(false), false),
                    "both" => (None, true),
                    _ => {
                        return Err(format!(
                            "--expandable is recorded, on, off or both (got {value:?})"
                        ))
                    }
                }
            }
            "--calls" => {
                o.route = match value.as_str() {
                    "recorded" => Route::Recorded,
                    "pluggable" => Route::OneStream,
                    "uncached" => Route::Uncached,
                    "async" => Route::RuntimeAsync,
                    _ => {
                        return Err(format!(
                            "--calls is recorded, pluggable, uncached or async (got {value:?})"
                        ))
                    }
                }
            }
            _ => return Err(format!("unknown option {flag:?}")),
        }
    }
    Ok(ReplayOptions { overrides: o, both })
}

pub fn stats(records: &[Record]) -> String {
    let mut o = String::new();
    for d in devices(records) {
        let f = fold(records, d);
        o += &format!(
            "device {d}: {} records over {:.3} s; {} allocations, {} frees, {} failed; \
             {} segments, {} granules mapped, {} unmapped, {} fences\n  peak allocated {} ({} \
             bytes), peak reserved {} ({} bytes)\n",
            f.records,
            f.t_ns as f64 / 1e9,
            f.allocs,
            f.frees,
            f.failed,
            f.segments,
            f.maps,
            f.unmaps,
            f.fences,
            bytes(f.peak_allocated),
            f.peak_allocated,
            bytes(f.peak_reserved),
            f.peak_reserved
        );
    }
    if o.is_empty() {
        o += "no records (the program made no allocation through the pool, or its first chunk \
              was never written)\n";
    }
    o
}

/// `replay`: the replay's figures per device; with `--expandable both`, those of a replay with
/// expandable segments and one without, and the two peaks side by side.
pub fn replay(records: &[Record], o: &ReplayOptions) -> String {
    if !o.both {
        return figures(&run_replay(records, &o.overrides));
    }
    let with = |on| {
        run_replay(
            records,
            &Overrides {
                expandable: Some(on),
                ..o.overrides
            },
        )
    };
    let (on, off) = (with(true), with(false));
    let mut out = format!(
        "with expandable segments:\n{}without expandable segments:\n{}",
        figures(&on),
        figures(&off)
    );
    for (a, b) in on.iter().zip(&off) {
        let (x, y) = (a.stats.reserved.peak_ever(), b.stats.reserved.peak_ever());
        out += &format!(
            "device {}: peak reserved {} with expandable segments, {} without: {} of it\n",
            a.device,
            bytes(x),
            bytes(y),
            ratio(x, y)
        );
    }
    out
}

/// Every request the replay could not serve, and of those the ones the recorded run served:
/// `1 (as in the recorded run)`, `51 (50 of them served in the recorded run)`.
fn failed(r: &DeviceResult) -> String {
    let total = r.failed + r.failed_as_recorded;
    match (r.failed, r.failed_as_recorded) {
        (0, 0) => "0".into(),
        (0, _) => format!("{total} (as in the recorded run)"),
        (new, _) => format!("{total} ({new} of them served in the recorded run)"),
    }
}

/// Each device's figures.
fn figures(results: &[DeviceResult]) -> String {
    let mut out = String::new();
    for r in results {
        let s = &r.stats;
        let moved = match s.slack_unmapped_granules {
            0 => String::new(),
            n => format!(
                " ({n} of them to stay within the slack, in {} moves)",
                s.slack_moves
            ),
        };
        let vmm = if r.expandable {
            format!(
                "\n  expandable segments: {} granules mapped, {} unmapped{moved}",
                r.maps, r.unmaps
            )
        } else {
            String::new()
        };
        out += &format!(
            "device {}: peak reserved {} ({} bytes), peak allocated {} ({} bytes), \
             reserved/allocated {}{vmm}\n  driver calls: {} cudaMalloc, {} cudaFree; \
             fences {}, barriers {}; requests that failed {}{}{}\n",
            r.device,
            bytes(s.reserved.peak_ever()),
            s.reserved.peak_ever(),
            bytes(s.allocated.peak_ever()),
            s.allocated.peak_ever(),
            ratio(s.reserved.peak_ever(), s.allocated.peak_ever()),
            s.real_mallocs,
            s.real_frees,
            s.fences,
            s.barriers,
            failed(r),
            match r.limit {
                u64::MAX => String::new(),
                l => format!(
                    "\n  limit {}: refused memory {}",
                    bytes(l),
                    match s.limit_refusals {
                        1 => "once".to_string(),
                        n => format!("{n} times"),
                    }
                ),
            },
            if r.diverged {
                " (diverged from the recorded run)"
            } else {
                ""
            }
        );
    }
    if out.is_empty() {
        out += "no records to replay\n";
    }
    out
}
