//! The summary: built from the pool's counters alone (no CUDA call), rendered as a compact table
//! in the shape PyTorch users know from `torch.cuda.memory_summary()`.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::units::{bytes, duration_ns};
use crate::pool::stats::Gauge;
use crate::pool::{Backend, DeviceSnapshot, LiveBlock, Pool};

pub struct Report {
    pub pid: u32,
    pub runtime: String,
    pub reuse: &'static str,
    pub devices: Vec<(DeviceSnapshot, Vec<LiveBlock>)>,
}

impl Report {
    pub fn collect<B: Backend>(pool: &Pool<B>, runtime: &str) -> Report {
        let devices = pool
            .used_devices()
            .into_iter()
            .filter_map(|d| Some((pool.device_stats(d)?, pool.live_blocks(d))))
            .collect();
        Report {
            pid: std::process::id(),
            runtime: runtime.to_string(),
            reuse: pool.settings().reuse.name(),
            devices,
        }
    }
}

/// Percent of `part` in `whole`, as text.
fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.1}%", part as f64 * 100.0 / whole as f64)
    }
}

/// Fragmentation of the cache: the share of cached free memory that is not in its largest block
/// (0% when all of it could serve one request).
pub fn fragmentation(cached_free: u64, largest_free: u64) -> f64 {
    if cached_free == 0 {
        0.0
    } else {
        1.0 - largest_free as f64 / cached_free as f64
    }
}

pub fn render_text(r: &Report) -> String {
    let mut o = String::new();
    let rule = "=".repeat(78);
    let _ = writeln!(o, "{rule}");
    let _ = writeln!(
        o,
        " gpupool summary   pid {}   reuse {}   runtime {}",
        r.pid, r.reuse, r.runtime
    );
    if r.devices.is_empty() {
        let _ = writeln!(o, " no CUDA allocations were intercepted");
    }
    for (d, leaks) in &r.devices {
        let s = &d.stats;
        let threshold = if d.threshold == u64::MAX {
            "none (keep all)".to_string()
        } else {
            bytes(d.threshold)
        };
        let _ = writeln!(o, "{rule}");
        let _ = writeln!(o, " device {}   release threshold {threshold}", d.device);
        let _ = writeln!(o, "{}", "-".repeat(78));
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
                fmt(g.peak),
                fmt(g.total_in),
                fmt(g.total_out)
            );
        };
        row("requested memory", &s.requested, &bytes);
        row("allocated memory", &s.allocated, &bytes);
        row("reserved (from driver)", &s.reserved, &bytes);
        row("allocations", &s.blocks, &|n| n.to_string());
        row("segments", &s.segments, &|n| n.to_string());
        let _ = writeln!(o, "{}", "-".repeat(78));
        let cached_free = d.cached - d.pending;
        let _ = writeln!(
            o,
            " cached {}  (free {}, awaiting in-flight work {})   largest free block {}   fragmentation {:.0}%",
            bytes(d.cached),
            bytes(cached_free),
            bytes(d.pending),
            bytes(d.largest_free),
            fragmentation(cached_free, d.largest_free) * 100.0
        );
        let _ = writeln!(
            o,
            " calls      {} mallocs, {} frees; served from cache {} ({} hits, {} misses)",
            s.allocs,
            s.frees,
            pct(s.hits, s.allocs),
            s.hits,
            s.misses
        );
        let _ = writeln!(
            o,
            " driver     cudaMalloc {} ({} avoided, {}), cudaFree {} ({})",
            s.real_mallocs,
            s.allocs.saturating_sub(s.misses),
            duration_ns(s.real_malloc_ns),
            s.real_frees,
            duration_ns(s.real_free_ns)
        );
        let _ = writeln!(
            o,
            " in flight  fences taken {} ({} waiting), program syncs used {}, barriers {}",
            s.fences,
            duration_ns(s.fence_ns),
            s.observed_fences,
            s.barriers
        );
        let _ = writeln!(
            o,
            " released   by threshold {} ({}), by empty_cache {} ({}), at out-of-memory {}",
            s.threshold_releases,
            bytes(s.threshold_released_bytes),
            s.empty_cache_releases,
            bytes(s.empty_cache_released_bytes),
            bytes(s.oom_released_bytes)
        );
        let _ = writeln!(
            o,
            " out of mem {} retries, {} recovered, {} returned to the program; invalid frees {}; resets {}",
            s.oom_retries, s.oom_recovered, s.ooms, s.invalid_frees, s.resets
        );
        if !leaks.is_empty() {
            let mut by_size: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
            for b in leaks {
                let e = by_size.entry(b.requested).or_default();
                e.0 += 1;
                e.1 += b.size;
            }
            let total: u64 = leaks.iter().map(|b| b.requested).sum();
            let _ = writeln!(
                o,
                " still allocated at exit: {} blocks, {} requested",
                leaks.len(),
                bytes(total)
            );
            for (size, (count, _)) in by_size.iter().rev().take(10) {
                let _ = writeln!(o, "   {count:>8} x {}", bytes(*size));
            }
            if by_size.len() > 10 {
                let _ = writeln!(o, "   ... and {} more sizes", by_size.len() - 10);
            }
        }
    }
    let _ = writeln!(o, "{rule}");
    o
}
