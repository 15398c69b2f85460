//! The summary in the Prometheus text exposition format (`GPUPOOL_SUMMARY=/path/job-%r.prom`),
//! for node_exporter's textfile collector. One family per figure, one sample per device,
//! labelled with the device, the rank and the pid.

use std::fmt::Write;

use super::summary::{bucket_bound, DeviceReport, Report};
use crate::passed_through::{Reason, Tally};
use crate::pool::stats::HISTOGRAM_BUCKETS;
use crate::pool::Expandable;

/// A label value with `\`, `"` and newlines escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

type Getter = fn(&DeviceReport) -> f64;

/// (name, type, help, value) of every family with one sample per device.
const FAMILIES: &[(&str, &str, &str, Getter)] = &[
    (
        "gpupool_requested_bytes",
        "gauge",
        "Bytes the program asked for and has not freed.",
        |d| d.snap.stats.requested.current as f64,
    ),
    (
        "gpupool_requested_bytes_peak",
        "gauge",
        "Highest requested bytes.",
        |d| d.snap.stats.requested.peak_ever() as f64,
    ),
    (
        "gpupool_allocated_bytes",
        "gauge",
        "Bytes handed out after rounding.",
        |d| d.snap.stats.allocated.current as f64,
    ),
    (
        "gpupool_allocated_bytes_peak",
        "gauge",
        "Highest allocated bytes.",
        |d| d.snap.stats.allocated.peak_ever() as f64,
    ),
    (
        "gpupool_reserved_bytes",
        "gauge",
        "Bytes held from the driver.",
        |d| d.snap.stats.reserved.current as f64,
    ),
    (
        "gpupool_reserved_bytes_peak",
        "gauge",
        "Highest reserved bytes.",
        |d| d.snap.stats.reserved.peak_ever() as f64,
    ),
    (
        "gpupool_cached_bytes",
        "gauge",
        "Reserved bytes not handed out (free or awaiting in-flight work).",
        |d| d.snap.cached as f64,
    ),
    (
        "gpupool_pending_bytes",
        "gauge",
        "Cached bytes awaiting a fence or barrier before reuse.",
        |d| d.snap.pending as f64,
    ),
    (
        "gpupool_largest_free_block_bytes",
        "gauge",
        "Largest block that could be handed out now.",
        |d| d.snap.largest_free as f64,
    ),
    (
        "gpupool_fragmentation_ratio",
        "gauge",
        "Share of reusable cached bytes outside the largest free block.",
        |d| d.fragmentation(),
    ),
    (
        "gpupool_releasable_bytes",
        "gauge",
        "Cached bytes the pool could give back to the driver now: idle segments, and mapped granules no live block touches.",
        |d| d.snap.figures.releasable as f64,
    ),
    (
        "gpupool_stranded_bytes",
        "gauge",
        "Cached bytes that cannot go back while live blocks stay: free pieces of segments and granules that also hold live blocks.",
        |d| d.snap.figures.stranded as f64,
    ),
    (
        "gpupool_expandable_enabled",
        "gauge",
        "1 if blocks come from expandable segments (GPUPOOL_EXPANDABLE and the driver's virtual memory), else 0.",
        |d| (d.snap.expandable == Expandable::On) as u8 as f64,
    ),
    (
        "gpupool_expandable_address_space_bytes",
        "gauge",
        "Address space expandable segments reserve (costs no memory until mapped).",
        |d| d.snap.figures.range_bytes as f64,
    ),
    (
        "gpupool_expandable_mapped_bytes",
        "gauge",
        "Bytes mapped in expandable segments (part of the reserved bytes).",
        |d| d.snap.figures.mapped as f64,
    ),
    (
        "gpupool_granules_mapped_total",
        "counter",
        "Granules of expandable segments mapped.",
        |d| d.snap.stats.granules_mapped as f64,
    ),
    (
        "gpupool_granules_unmapped_total",
        "counter",
        "Granules of expandable segments unmapped (given back to the driver).",
        |d| d.snap.stats.granules_unmapped as f64,
    ),
    (
        "gpupool_slack_moved_granules_total",
        "counter",
        "Granules unmapped to move their memory to a new block within the mapped slack.",
        |d| d.snap.stats.slack_unmapped_granules as f64,
    ),
    (
        "gpupool_live_blocks",
        "gauge",
        "Blocks allocated and not freed.",
        |d| d.snap.stats.blocks.current as f64,
    ),
    (
        "gpupool_live_blocks_peak",
        "gauge",
        "Highest number of blocks allocated at once.",
        |d| d.snap.stats.blocks.peak_ever() as f64,
    ),
    (
        "gpupool_segments",
        "gauge",
        "Segments held from the driver.",
        |d| d.snap.stats.segments.current as f64,
    ),
    (
        "gpupool_segments_peak",
        "gauge",
        "Highest number of segments held at once.",
        |d| d.snap.stats.segments.peak_ever() as f64,
    ),
    (
        "gpupool_release_threshold_bytes",
        "gauge",
        "Cached bytes kept (+Inf: keep all).",
        |d| unbounded_as_inf(d.snap.threshold),
    ),
    (
        "gpupool_limit_bytes",
        "gauge",
        "The most bytes the pool reserves on the device, GPUPOOL_LIMIT (+Inf: no limit).",
        |d| unbounded_as_inf(d.snap.limit),
    ),
    (
        "gpupool_limit_refusals_total",
        "counter",
        "Times the limit refused the pool memory (a segment, or granules of an expandable one to map) before the driver was asked.",
        |d| d.snap.stats.limit_refusals as f64,
    ),
    (
        "gpupool_allocations_total",
        "counter",
        "Allocations served.",
        |d| d.snap.stats.allocs as f64,
    ),
    (
        "gpupool_frees_total",
        "counter",
        "Blocks given back.",
        |d| d.snap.stats.frees as f64,
    ),
    (
        "gpupool_cache_hits_total",
        "counter",
        "Allocations served from cached memory.",
        |d| d.snap.stats.hits as f64,
    ),
    (
        "gpupool_thread_cache_hits_total",
        "counter",
        "Allocations served by a thread's own cache (part of the cache hits).",
        |d| d.snap.stats.thread_cache_hits as f64,
    ),
    (
        "gpupool_stream_hits_total",
        "counter",
        "Allocations on a stream served by blocks freed on that stream before a barrier or fence covered them (part of the cache hits).",
        |d| d.snap.stats.stream_hits as f64,
    ),
    (
        "gpupool_cache_misses_total",
        "counter",
        "Allocations that needed a new segment.",
        |d| d.snap.stats.misses as f64,
    ),
    (
        "gpupool_driver_mallocs_total",
        "counter",
        "Real cudaMalloc calls.",
        |d| d.snap.stats.real_mallocs as f64,
    ),
    (
        "gpupool_driver_mallocs_refused_total",
        "counter",
        "Real cudaMalloc calls the driver refused (part of the calls; no segment).",
        |d| d.snap.stats.mallocs_refused() as f64,
    ),
    (
        "gpupool_driver_frees_total",
        "counter",
        "Real cudaFree calls.",
        |d| d.snap.stats.real_frees as f64,
    ),
    (
        "gpupool_driver_malloc_seconds_total",
        "counter",
        "Time inside real cudaMalloc.",
        |d| d.snap.stats.real_malloc_ns as f64 / 1e9,
    ),
    (
        "gpupool_driver_free_seconds_total",
        "counter",
        "Time inside real cudaFree.",
        |d| d.snap.stats.real_free_ns as f64 / 1e9,
    ),
    (
        "gpupool_threshold_released_segments_total",
        "counter",
        "Segments released because the threshold was exceeded.",
        |d| d.snap.stats.threshold_releases as f64,
    ),
    (
        "gpupool_empty_cache_released_segments_total",
        "counter",
        "Segments released by empty-cache requests.",
        |d| d.snap.stats.empty_cache_releases as f64,
    ),
    (
        "gpupool_threshold_released_granules_total",
        "counter",
        "Granules of expandable segments unmapped because the threshold was exceeded.",
        |d| d.snap.stats.threshold_released_granules as f64,
    ),
    (
        "gpupool_empty_cache_released_granules_total",
        "counter",
        "Granules of expandable segments unmapped by empty-cache requests.",
        |d| d.snap.stats.empty_cache_released_granules as f64,
    ),
    (
        "gpupool_outgrown_released_segments_total",
        "counter",
        "Idle segments released because a larger request outgrew them.",
        |d| d.snap.stats.outgrown_releases as f64,
    ),
    (
        "gpupool_threshold_released_bytes_total",
        "counter",
        "Bytes released because the threshold was exceeded.",
        |d| d.snap.stats.threshold_released_bytes as f64,
    ),
    (
        "gpupool_empty_cache_released_bytes_total",
        "counter",
        "Bytes released by empty-cache requests.",
        |d| d.snap.stats.empty_cache_released_bytes as f64,
    ),
    (
        "gpupool_outgrown_released_bytes_total",
        "counter",
        "Bytes of idle segments released because a larger request outgrew them.",
        |d| d.snap.stats.outgrown_released_bytes as f64,
    ),
    (
        "gpupool_oom_released_bytes_total",
        "counter",
        "Bytes released to recover from out-of-memory.",
        |d| d.snap.stats.oom_released_bytes as f64,
    ),
    (
        "gpupool_oom_retries_total",
        "counter",
        "Driver out-of-memory failures the pool retried after releasing cache.",
        |d| d.snap.stats.oom_retries as f64,
    ),
    (
        "gpupool_oom_recovered_total",
        "counter",
        "Allocations that succeeded after such a retry.",
        |d| d.snap.stats.oom_recovered as f64,
    ),
    (
        "gpupool_ooms_total",
        "counter",
        "Out-of-memory errors returned to the program.",
        |d| d.snap.stats.ooms as f64,
    ),
    (
        "gpupool_fences_total",
        "counter",
        "Device fences the pool took.",
        |d| d.snap.stats.fences as f64,
    ),
    (
        "gpupool_fence_wait_seconds_total",
        "counter",
        "Time the host waited in those fences.",
        |d| d.snap.stats.fence_ns as f64 / 1e9,
    ),
    (
        "gpupool_barriers_total",
        "counter",
        "Legacy-stream barriers the pool issued.",
        |d| d.snap.stats.barriers as f64,
    ),
    (
        "gpupool_program_syncs_used_total",
        "counter",
        "Program synchronizations (cudaDeviceSynchronize) that made blocks awaiting in-flight work reusable.",
        |d| d.snap.stats.observed_fences as f64,
    ),
    (
        "gpupool_resets_total",
        "counter",
        "Resets of the device: cudaDeviceReset, cuDevicePrimaryCtxReset, the primary context's last release (the pool forgot its memory).",
        |d| d.snap.stats.resets as f64,
    ),
    (
        "gpupool_invalid_frees_total",
        "counter",
        "Double or interior frees refused.",
        |d| d.snap.stats.invalid_frees as f64,
    ),
    (
        "gpupool_device_total_bytes",
        "gauge",
        "Device memory (last cudaMemGetInfo sample; absent before one).",
        |d| d.snap.memory.map_or(f64::NAN, |m| m.total as f64),
    ),
    (
        "gpupool_device_outside_pool_bytes",
        "gauge",
        "Device memory used outside the pool at the last sample.",
        |d| d.snap.memory.map_or(f64::NAN, |m| m.outside_pool() as f64),
    ),
];

/// A bound in bytes, `u64::MAX` (none) as +Inf.
fn unbounded_as_inf(bytes: u64) -> f64 {
    if bytes == u64::MAX {
        f64::INFINITY
    } else {
        bytes as f64
    }
}

fn value(v: f64) -> String {
    if v.is_infinite() {
        "+Inf".into()
    } else if v.fract() == 0.0 && v.abs() < 9.0e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// The figure of a `Tally` a family of the allocations left to CUDA counts.
type TallyGetter = fn(&Tally) -> u64;

/// The allocations left to CUDA and their requested bytes, one sample per reason, labelled
/// with the rank and the pid (they belong to no device of the pool's).
fn passed_through(o: &mut String, r: &Report) {
    // The reasons' own words: a list written here missed the reason added last.
    let reasons: Vec<String> = Reason::ALL
        .iter()
        .map(|why| format!("{} ({})", why.name(), why.text()))
        .collect();
    let allocations = format!(
        "Allocations left to CUDA, by reason: {}.",
        reasons.join(", ")
    );
    let families: [(&str, &str, TallyGetter); 2] = [
        (
            "gpupool_passed_through_allocations_total",
            &allocations,
            |t| t.allocations,
        ),
        (
            "gpupool_passed_through_bytes_total",
            "Bytes requested by the allocations left to CUDA.",
            |t| t.bytes,
        ),
    ];
    for (name, help, get) in families {
        let _ = writeln!(o, "# HELP {name} {help}");
        let _ = writeln!(o, "# TYPE {name} counter");
        for (reason, tally) in r.passed_through.each() {
            let _ = writeln!(
                o,
                "{name}{{reason=\"{}\",rank=\"{}\",pid=\"{}\"}} {}",
                reason.name(),
                label(&r.rank),
                r.pid,
                get(&tally)
            );
        }
    }
}

pub fn render_prometheus(r: &Report) -> String {
    let mut o = String::new();
    let labels = |d: &DeviceReport| {
        format!(
            "device=\"{}\",rank=\"{}\",pid=\"{}\"",
            d.snap.device,
            label(&r.rank),
            r.pid
        )
    };
    for (name, kind, help, get) in FAMILIES {
        let samples: Vec<String> = r
            .devices
            .iter()
            .filter(|d| !get(d).is_nan())
            .map(|d| format!("{name}{{{}}} {}", labels(d), value(get(d))))
            .collect();
        if samples.is_empty() {
            continue;
        }
        let _ = writeln!(o, "# HELP {name} {help}");
        let _ = writeln!(o, "# TYPE {name} {kind}");
        for s in samples {
            let _ = writeln!(o, "{s}");
        }
    }
    passed_through(&mut o, r);
    if !r.devices.is_empty() {
        let name = "gpupool_request_size_bytes";
        let _ = writeln!(o, "# HELP {name} Sizes the program requested.");
        let _ = writeln!(o, "# TYPE {name} histogram");
        for d in &r.devices {
            let s = &d.snap.stats;
            let mut cumulative = 0;
            for i in 0..HISTOGRAM_BUCKETS - 1 {
                cumulative += s.histogram[i];
                // Bucket i holds sizes below 2^i: the largest it holds is 2^i - 1.
                let le = bucket_bound(i) - 1;
                let _ = writeln!(o, "{name}_bucket{{{},le=\"{le}\"}} {cumulative}", labels(d));
            }
            let _ = writeln!(o, "{name}_bucket{{{},le=\"+Inf\"}} {}", labels(d), s.allocs);
            let _ = writeln!(o, "{name}_sum{{{}}} {}", labels(d), s.requested.total_in);
            let _ = writeln!(o, "{name}_count{{{}}} {}", labels(d), s.allocs);
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_help_of_the_passed_through_allocations_names_every_reason() {
        let r = Report {
            pid: 1,
            rank: "0".into(),
            host: "h".into(),
            runtime: "libcudart.so.12".into(),
            reuse: "strict",
            max_split_size: u64::MAX,
            devices: Vec::new(),
            unread: Vec::new(),
            at_exit: true,
            frameworks: Vec::new(),
            ipc: Default::default(),
            passed_through: Default::default(),
        };
        let text = render_prometheus(&r);
        let help = text
            .lines()
            .find(|l| l.starts_with("# HELP gpupool_passed_through_allocations_total "))
            .unwrap_or_else(|| panic!("{text}"));
        for why in Reason::ALL {
            assert!(help.contains(why.name()), "{} in {help}", why.name());
            let samples = format!(
                "gpupool_passed_through_allocations_total{{reason=\"{}\"",
                why.name()
            );
            assert!(text.contains(&samples), "{samples} in {text}");
        }
    }
}
