//! The summary's content: built from the pool's counters alone (no CUDA call, so it can be made
//! at exit), and its human form, a compact table in the shape PyTorch users know from
//! `torch.cuda.memory_summary()`. `json.rs` and `prometheus.rs` render the same `Report`.

use std::collections::BTreeMap;
use std::fmt::Write;

pub use super::holders::{holders_text, Holder};
use super::units::{bytes, count, duration_ns};
use crate::passed_through::Counts as PassedThrough;
use crate::pool::stats::{Gauge, HISTOGRAM_BUCKETS};
use crate::pool::{Backend, DeviceSnapshot, Expandable, IpcRefusals, LiveBlock, LockWait, Pool};

pub struct Report {
    pub pid: u32,
    pub rank: String,
    pub host: String,
    pub runtime: String,
    pub reuse: &'static str,
    /// `GPUPOOL_MAX_SPLIT_SIZE` (`u64::MAX`: none), for the out-of-memory advice.
    pub max_split_size: u64,
    pub devices: Vec<DeviceReport>,
    /// Devices the pool serves whose lock another thread held throughout a brief wait (a fence
    /// waiting for the GPU's work, or a thread stopped inside the pool): not read.
    pub unread: Vec<u32>,
    /// Made at exit: the blocks still allocated are the ones the program never freed (a live
    /// dump lists the same blocks as allocated now).
    pub at_exit: bool,
    /// Frameworks in the process and what their caches do above the pool.
    pub frameworks: Vec<crate::frameworks::FrameworkNote>,
    /// IPC handles the pool refused, and so the variable the program needs (`ipc_text`).
    pub ipc: IpcRefusals,
    /// Allocations left to CUDA, which the devices' figures do not hold (`passed_text`).
    pub passed_through: PassedThrough,
}

pub struct DeviceReport {
    pub snap: DeviceSnapshot,
    /// Blocks still allocated: (requested size, count), largest size first.
    pub leaks: Vec<(u64, u64)>,
    pub leaked_blocks: u64,
    pub leaked_bytes: u64,
    /// Who holds those blocks: the libraries that allocated them, most bytes first.
    pub holders: Vec<Holder>,
}

impl DeviceReport {
    /// Cached bytes that could be handed out now (not waiting for in-flight work).
    pub fn cached_free(&self) -> u64 {
        self.snap.cached - self.snap.pending
    }

    /// Share of the reusable cache that is not in its largest block: 0 when all of it could
    /// serve one request, near 1 when it is scattered in small pieces.
    pub fn fragmentation(&self) -> f64 {
        let free = self.cached_free();
        if free == 0 {
            0.0
        } else {
            1.0 - self.snap.largest_free.min(free) as f64 / free as f64
        }
    }

    /// Non-empty histogram buckets as (upper bound in bytes, count): requests of size
    /// `< bound` (and at least the previous bound).
    pub fn histogram(&self) -> Vec<(u64, u64)> {
        (0..HISTOGRAM_BUCKETS)
            .filter(|&i| self.snap.stats.histogram[i] > 0)
            .map(|i| (bucket_bound(i), self.snap.stats.histogram[i]))
            .collect()
    }
}

/// The exclusive upper bound of histogram bucket `i` (`u64::MAX` for the last).
pub fn bucket_bound(i: usize) -> u64 {
    if i + 1 >= HISTOGRAM_BUCKETS {
        u64::MAX
    } else {
        1u64 << i
    }
}

fn group_leaks(leaks: &[LiveBlock]) -> Vec<(u64, u64)> {
    let mut by_size: BTreeMap<u64, u64> = BTreeMap::new();
    for b in leaks {
        *by_size.entry(b.requested).or_default() += 1;
    }
    by_size.into_iter().rev().collect()
}

/// The calls that take and give back segments: the runtime's, or the driver's in a process
/// where the pool's calls go to the driver (its library named as the report's runtime).
pub fn segment_calls(runtime: &str) -> (&'static str, &'static str) {
    let file = runtime.rsplit('/').next().unwrap_or(runtime);
    if file.starts_with("libcuda.so") {
        ("cuMemAlloc", "cuMemFree")
    } else {
        ("cudaMalloc", "cudaFree")
    }
}

impl Report {
    pub fn collect<B: Backend>(pool: &Pool<B>, runtime: &str, patience: LockWait) -> Report {
        let mut devices = Vec::new();
        let mut unread = Vec::new();
        for d in pool.used_devices() {
            let Some((snap, live)) = pool.device_report(d, patience) else {
                unread.push(d);
                continue;
            };
            devices.push(DeviceReport {
                leaks: group_leaks(&live),
                leaked_blocks: live.len() as u64,
                leaked_bytes: live.iter().map(|b| b.requested).sum(),
                holders: super::holders::holders(&live),
                snap,
            });
        }
        Report {
            unread,
            at_exit: false,
            pid: std::process::id(),
            rank: super::rank(),
            host: super::hostname(),
            runtime: runtime.to_string(),
            reuse: pool.settings().reuse.name(),
            max_split_size: pool.settings().policy.max_split_size,
            devices,
            frameworks: crate::frameworks::notes(),
            ipc: pool.ipc_refusals(),
            passed_through: crate::passed_through::counts(),
        }
    }

    /// Whether any allocation reached the pool: served, or refused out of memory (the pool
    /// printed its report for it).
    pub fn intercepted(&self) -> bool {
        self.devices
            .iter()
            .any(|d| d.snap.stats.allocs > 0 || d.snap.stats.ooms > 0)
            || !self.unread.is_empty()
    }

    /// Whether the program allocated through the hooks: the pool served it, or left it to
    /// CUDA (then the passed-through line is what the program has to read).
    pub fn allocated(&self) -> bool {
        self.intercepted() || self.passed_through.any()
    }
}

/// Percent of `part` in `whole`, as text. A share short of the whole never reads `100.0%`,
/// nor a share above none `0.0%`: the counts beside it would contradict it.
fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "-".into();
    }
    let mut p = part as f64 * 100.0 / whole as f64;
    if part < whole {
        p = p.min(99.9);
    }
    if part > 0 {
        p = p.max(0.1);
    }
    format!("{p:.1}%")
}

fn threshold_text(t: u64) -> String {
    if t == u64::MAX {
        "none (keep all)".into()
    } else {
        bytes(t)
    }
}

/// The limit, how close the peak came to it, and the segments it refused.
fn limit_text(limit: u64, s: &crate::pool::DeviceStats) -> String {
    if limit == u64::MAX {
        return String::new();
    }
    // A refusal is a segment, or with expandable segments granules to map: memory.
    let refused = match s.limit_refusals {
        0 => String::new(),
        1 => ", refused memory once".to_string(),
        n => format!(", refused memory {n} times"),
    };
    format!(
        "   limit {} (peak reserved {}{refused})",
        bytes(limit),
        pct(s.reserved.peak_ever(), limit)
    )
}

/// Whether blocks came from expandable segments (what they map and reserve, the
/// granules mapped and unmapped over the run) or why not, and where the cache lies: stranded
/// beside live blocks, or free to go back to the driver.
fn expandable_text(d: &DeviceReport) -> String {
    let (f, s) = (&d.snap.figures, &d.snap.stats);
    let state = match d.snap.expandable {
        Expandable::On => format!(
            "{} mapped in {} of reserved address space ({}); {} granules of {} mapped \
             over the run, {} unmapped",
            bytes(f.mapped),
            bytes(f.range_bytes),
            count(f.ranges, "range"),
            s.granules_mapped,
            bytes(f.granule),
            s.granules_unmapped
        ),
        Expandable::Off => "off (GPUPOOL_EXPANDABLE=0)".to_string(),
        Expandable::Unavailable => {
            "off: the driver has no virtual memory management on this device".to_string()
        }
        Expandable::NoPeerAccess => "off: a visible device cannot reach this device's memory \
                                     (cuDeviceCanAccessPeer), which mapped memory needs"
            .to_string(),
        Expandable::Refused(why) => format!(
            "off: the driver refused to map virtual memory (error {}), classic segments since",
            why.0
        ),
    };
    let refused = match s.ranges_refused {
        0 => String::new(),
        n => format!(
            "; {} refused (classic segments instead)",
            count(n, "reservation")
        ),
    };
    format!(
        "{state}{refused}; stranded {} beside live blocks, {} free to give back",
        bytes(f.stranded),
        bytes(f.releasable)
    )
}

/// The driver calls the pool made for memory, beside the program's own calls to the pool
/// (each of which would be a driver call without it): segments allocated and freed, and
/// granules mapped and unmapped once expandable segments mapped any.
fn driver_text(s: &crate::pool::DeviceStats, runtime: &str) -> String {
    // Calls the driver refused (out of memory, retried smaller or after a release) count
    // among the calls but made no segment: said, so that 42 calls beside 36 segments add up.
    let refused = match s.mallocs_refused() {
        0 => String::new(),
        n => format!(", {n} refused"),
    };
    let (malloc, free) = segment_calls(runtime);
    let granules = s.granules_mapped + s.granules_unmapped;
    let maps = if granules > 0 {
        format!(
            ", {} maps, {} unmaps",
            s.granules_mapped, s.granules_unmapped
        )
    } else {
        String::new()
    };
    format!(
        "{malloc} {}{refused} ({}), {free} {} ({}){maps}: {} calls for the program's {}",
        s.real_mallocs,
        duration_ns(s.real_malloc_ns),
        s.real_frees,
        duration_ns(s.real_free_ns),
        s.real_mallocs + s.real_frees + granules,
        s.allocs + s.frees
    )
}

pub fn render_text(r: &Report) -> String {
    let mut o = String::new();
    let rule = "=".repeat(78);
    let thin = "-".repeat(78);
    let _ = writeln!(o, "{rule}");
    let _ = writeln!(
        o,
        " gpupool summary   pid {}   rank {}   reuse {}   runtime {}",
        r.pid, r.rank, r.reuse, r.runtime
    );
    if !r.intercepted() {
        let line = if r.passed_through.any() {
            "every allocation passed through to CUDA; the pool served none"
        } else {
            "no CUDA allocations were intercepted"
        };
        let _ = writeln!(o, " {line}");
    }
    for d in &r.unread {
        let _ = writeln!(o, "{rule}");
        let _ = writeln!(
            o,
            " device {d}   not read: another thread held its pool throughout 200 ms (a fence \
             waiting for the GPU's work, or a thread stopped inside the pool)"
        );
    }
    for d in &r.devices {
        let s = &d.snap.stats;
        let _ = writeln!(o, "{rule}");
        let _ = writeln!(
            o,
            " device {}   release threshold {}{}",
            d.snap.device,
            threshold_text(d.snap.threshold),
            limit_text(d.snap.limit, s)
        );
        let _ = writeln!(o, "{thin}");
        let _ = writeln!(
            o,
            " {:<26}{:>12}{:>12}{:>14}{:>14}",
            "metric", "current", "peak", "total alloc", "total freed"
        );
        let mut row = |name: &str, g: &Gauge, fmt: &dyn Fn(u64) -> String| {
            let _ = writeln!(
                o,
                " {:<26}{:>12}{:>12}{:>14}{:>14}",
                name,
                fmt(g.current),
                fmt(g.peak_ever()),
                fmt(g.total_in),
                fmt(g.total_out)
            );
        };
        row("requested memory", &s.requested, &bytes);
        row("allocated memory", &s.allocated, &bytes);
        row("reserved (from driver)", &s.reserved, &bytes);
        row("allocations", &s.blocks, &|n| n.to_string());
        row("segments", &s.segments, &|n| n.to_string());
        if s.resets > 0 {
            // Else, after a reset, "total freed" reads more than the program freed.
            let _ = writeln!(
                o,
                " total freed includes what {} dropped (the blocks and segments the device \
                 held then)",
                count(s.resets, "device reset")
            );
        }
        let _ = writeln!(o, "{thin}");
        let _ = writeln!(
            o,
            " cached {}  (free {}, awaiting in-flight work {})   largest free block {}   fragmentation {:.0}%",
            bytes(d.snap.cached),
            bytes(d.cached_free()),
            bytes(d.snap.pending),
            bytes(d.snap.largest_free),
            d.fragmentation() * 100.0
        );
        let _ = writeln!(o, " expandable {}", expandable_text(d));
        if let Some(m) = d.snap.memory {
            let _ = writeln!(
                o,
                " device     {} total; at the last sample {} free, {} used outside the pool (CUDA context, other allocators, other processes)",
                bytes(m.total),
                bytes(m.free),
                bytes(m.outside_pool())
            );
        }
        let _ = writeln!(
            o,
            " calls      {} mallocs, {} frees; served from cache {} ({} hits, {} misses){}",
            s.allocs,
            s.frees,
            pct(s.hits, s.allocs),
            s.hits,
            s.misses,
            [
                (s.thread_cache_hits, "by thread caches"),
                (s.stream_hits, "on the stream that freed them")
            ]
            .iter()
            .filter(|&&(n, _)| n > 0)
            .map(|(n, what)| format!("; {n} {what}"))
            .collect::<String>()
        );
        let _ = writeln!(o, " driver     {}", driver_text(s, &r.runtime));
        let _ = writeln!(
            o,
            " in flight  fences taken {} ({} waiting), program syncs used {}, barriers {}",
            s.fences,
            duration_ns(s.fence_ns),
            s.observed_fences,
            s.barriers
        );
        // Segments freed and granules unmapped, by reason: only the reasons that released any.
        let released: Vec<String> = [
            (
                "by threshold",
                s.threshold_releases,
                s.threshold_released_granules,
                s.threshold_released_bytes,
            ),
            (
                "by empty_cache",
                s.empty_cache_releases,
                s.empty_cache_released_granules,
                s.empty_cache_released_bytes,
            ),
            (
                "outgrown",
                s.outgrown_releases,
                0,
                s.outgrown_released_bytes,
            ),
        ]
        .into_iter()
        .filter(|&(_, _, _, b)| b > 0)
        .map(|(why, segments, granules, b)| {
            let what: Vec<String> = [(segments, "segment"), (granules, "granule")]
                .into_iter()
                .filter(|&(n, _)| n > 0)
                .map(|(n, unit)| count(n, unit))
                .collect();
            format!("{why} {} ({})", what.join(", "), bytes(b))
        })
        .chain(
            (s.oom_released_bytes > 0)
                .then(|| format!("at out-of-memory {}", bytes(s.oom_released_bytes))),
        )
        .chain((s.slack_unmapped_granules > 0).then(|| {
            format!(
                "moved within the slack {} ({}) in {}",
                count(s.slack_unmapped_granules, "granule"),
                bytes(s.slack_unmapped_granules * d.snap.figures.granule),
                count(s.slack_moves, "move")
            )
        }))
        .collect();
        let _ = writeln!(
            o,
            " released   {}",
            if released.is_empty() {
                "nothing to the driver".to_string()
            } else {
                released.join(", ")
            }
        );
        let probes = if s.oom_probes > 0 {
            format!(" ({} a probe of all the free memory)", s.oom_probes)
        } else {
            String::new()
        };
        let _ = writeln!(
            o,
            " out of mem {} retries, {} recovered, {} returned to the program{probes}; invalid frees {}; resets {}",
            s.oom_retries, s.oom_recovered, s.ooms, s.invalid_frees, s.resets
        );
        let hist = d.histogram();
        if !hist.is_empty() {
            let _ = writeln!(o, " request sizes (count of requests below each bound):");
            for chunk in hist.chunks(5) {
                let mut line = String::from("   ");
                for &(bound, count) in chunk {
                    let b = if bound == u64::MAX {
                        "larger".to_string()
                    } else {
                        format!("<{}", bytes(bound))
                    };
                    let _ = write!(line, "{b:>11} {count:<9}");
                }
                let _ = writeln!(o, "{}", line.trim_end());
            }
        }
        if d.leaked_blocks > 0 {
            let _ = writeln!(
                o,
                " {}: {}, {} requested",
                if r.at_exit {
                    "still allocated at exit"
                } else {
                    "allocated now"
                },
                count(d.leaked_blocks, "block"),
                bytes(d.leaked_bytes)
            );
            for (size, count) in d.leaks.iter().take(10) {
                let _ = writeln!(o, "   {count:>8} x {}", bytes(*size));
            }
            if d.leaks.len() > 10 {
                let _ = writeln!(o, "   ... and {} more sizes", d.leaks.len() - 10);
            }
            let _ = writeln!(o, " held by    {}", holders_text(&d.holders));
        }
    }
    let process_lines: Vec<String> = [ipc_text(&r.ipc), passed_text(&r.passed_through)]
        .into_iter()
        .flatten()
        .collect();
    if !process_lines.is_empty() {
        let _ = writeln!(o, "{rule}");
        for line in process_lines {
            let _ = writeln!(o, " {line}");
        }
    }
    if !r.frameworks.is_empty() {
        let _ = writeln!(o, "{rule}");
        for f in &r.frameworks {
            let _ = writeln!(o, " {:<10}{}", f.name, f.note);
        }
    }
    let _ = writeln!(o, "{rule}");
    o
}

/// The allocations left to CUDA, and why; `None` when there were none.
pub fn passed_text(p: &PassedThrough) -> Option<String> {
    let parts: Vec<String> = p
        .each()
        .filter(|(_, t)| t.allocations > 0)
        .map(|(why, t)| {
            format!(
                "{} ({}) {}",
                count(t.allocations, "allocation"),
                bytes(t.bytes),
                why.text()
            )
        })
        .collect();
    (!parts.is_empty()).then(|| format!("passed through to CUDA: {}", parts.join("; ")))
}

/// The IPC handles refused, and the variable that lets the program share its blocks.
pub fn ipc_text(ipc: &IpcRefusals) -> Option<String> {
    let handles = |n: u64| count(n, "IPC handle");
    let mut parts = Vec::new();
    if ipc.mapped > 0 {
        parts.push(format!(
            "{} refused on blocks in CUDA virtual memory: run with GPUPOOL_EXPANDABLE=0 \
             (classic segments) or GPUPOOL_DISABLE=1",
            handles(ipc.mapped)
        ));
    }
    if ipc.inside_segment > 0 {
        parts.push(format!(
            "{} refused on blocks inside a segment: run with GPUPOOL_DISABLE=1",
            handles(ipc.inside_segment)
        ));
    }
    (!parts.is_empty()).then(|| format!("ipc        {}", parts.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passed_through::{Reason, Tally};

    #[test]
    fn a_share_short_of_the_whole_never_reads_as_all_or_none() {
        // 39999 hits of 40000 allocations: not "served from cache 100.0%" beside a miss.
        assert_eq!(pct(39_999, 40_000), "99.9%");
        assert_eq!(pct(1, 40_000), "0.1%");
        assert_eq!(pct(40_000, 40_000), "100.0%");
        assert_eq!(pct(0, 40_000), "0.0%");
        assert_eq!(pct(977, 1000), "97.7%");
        assert_eq!(pct(1, 0), "-");
    }

    #[test]
    fn the_passed_through_line_names_only_the_reasons_that_happened() {
        assert_eq!(passed_text(&PassedThrough::default()), None);
        let tally = |allocations, bytes| Tally { allocations, bytes };
        let only_own = PassedThrough::default().with(Reason::OwnMemoryPool, tally(12, 48 << 20));
        assert_eq!(
            passed_text(&only_own).unwrap(),
            "passed through to CUDA: 12 allocations (48.0 MiB) served by the program's own \
             memory pool"
        );
        let both = only_own.with(Reason::GraphCapture, tally(1, 512));
        assert_eq!(
            passed_text(&both).unwrap(),
            "passed through to CUDA: 12 allocations (48.0 MiB) served by the program's own \
             memory pool; 1 allocation (512 B) captured into a CUDA graph"
        );
        let all = both
            .with(Reason::UnplacedStream, tally(2, 3 << 20))
            .with(Reason::OwnContext, tally(1, 4096));
        assert_eq!(
            passed_text(&all).unwrap(),
            "passed through to CUDA: 12 allocations (48.0 MiB) served by the program's own \
             memory pool; 1 allocation (512 B) captured into a CUDA graph; 2 allocations \
             (3.00 MiB) on a stream the pool could not place on the current device; 1 \
             allocation (4.00 KiB) in a CUDA context the program created"
        );
    }

    #[test]
    fn a_report_made_while_threads_allocate_agrees_with_itself() {
        // A live dump of a busy program: its leak list and holders are the blocks behind its
        // current figures, read at one moment.
        use crate::config::{DeviceBytes, ReuseMode};
        use crate::pool::model_driver::ModelDriver;
        use crate::pool::{FreeKind, LockWait, Pool, Settings};
        use std::sync::atomic::{AtomicBool, Ordering};
        for thread_cache in [0, 64 << 20] {
            let mut settings =
                Settings::for_tests(ReuseMode::Relaxed, DeviceBytes::Unbounded, false);
            settings.thread_cache = thread_cache;
            let p = Pool::new(ModelDriver::new().with_capacity(64 << 30), settings);
            let stop = AtomicBool::new(false);
            std::thread::scope(|t| {
                for _ in 0..2 {
                    t.spawn(|| {
                        let mut held = Vec::new();
                        let mut i = 0u64;
                        while !stop.load(Ordering::Relaxed) {
                            i += 1;
                            held.push(p.alloc(0, 4096 + (i % 7) * 512).unwrap());
                            if held.len() > 16 {
                                p.free(held.swap_remove(0), FreeKind::Sync, Some(0));
                            }
                        }
                        for a in held {
                            p.free(a, FreeKind::Sync, Some(0));
                        }
                    });
                }
                let mut disagreed = 0;
                for _ in 0..2000 {
                    let r = Report::collect(&p, "libcudart.so.12", LockWait::Unbounded);
                    let Some(d) = r.devices.first() else { continue };
                    let s = &d.snap.stats;
                    if (d.leaked_blocks, d.leaked_bytes) != (s.blocks.current, s.requested.current)
                    {
                        disagreed += 1;
                    }
                }
                stop.store(true, Ordering::Relaxed);
                assert_eq!(disagreed, 0, "thread cache {thread_cache}");
            });
        }
    }
}
