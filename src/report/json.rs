//! The summary as JSON (`GPUPOOL_SUMMARY=/path/job-%p.json`), for dashboards and post-mortems.
//! Sizes in bytes, times in nanoseconds; one object per device.

use std::fmt::Write;

use super::summary::{DeviceReport, Report};
use crate::passed_through::{Counts as PassedThrough, Tally};
use crate::pool::stats::Gauge;
use crate::pool::Expandable;

/// The `expandable` object: whether blocks came from expandable segments (or why not),
/// their address space and mapped bytes, and the granules mapped and unmapped over the run.
fn expandable(d: &DeviceReport) -> String {
    let (f, s) = (&d.snap.figures, &d.snap.stats);
    let state = match d.snap.expandable {
        Expandable::On => "on",
        Expandable::Off => "off",
        Expandable::Unavailable => "unavailable",
        Expandable::NoPeerAccess => "no_peer_access",
        Expandable::Refused(_) => "refused",
    };
    format!(
        concat!(
            "{{\"state\":\"{}\",\"granule_bytes\":{},\"ranges\":{},",
            "\"address_space_bytes\":{},\"mapped_bytes\":{},",
            "\"granules_mapped\":{},\"granules_unmapped\":{},\"reservations_refused\":{},",
            "\"slack_moved_granules\":{},\"slack_moves\":{}}}"
        ),
        state,
        f.granule,
        f.ranges,
        f.range_bytes,
        f.mapped,
        s.granules_mapped,
        s.granules_unmapped,
        s.ranges_refused,
        s.slack_unmapped_granules,
        s.slack_moves
    )
}

/// The `passed_through` object: the allocations left to CUDA and their requested bytes, by
/// reason.
fn passed_through(p: &PassedThrough) -> String {
    let tally = |t: Tally| {
        format!(
            "{{\"allocations\":{},\"bytes\":{}}}",
            t.allocations, t.bytes
        )
    };
    let fields: Vec<String> = p
        .each()
        .map(|(reason, t)| format!("{}:{}", quote(reason.name()), tally(t)))
        .collect();
    format!("{{{}}}", fields.join(","))
}

/// A JSON string literal.
pub fn quote(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\r' => o.push_str("\\r"),
            '\t' => o.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn gauge(g: &Gauge) -> String {
    format!(
        "{{\"current\":{},\"peak\":{},\"peak_since_reset\":{},\"total_in\":{},\"total_out\":{}}}",
        g.current,
        g.peak_ever(),
        g.peak,
        g.total_in,
        g.total_out
    )
}

fn device(d: &DeviceReport) -> String {
    let s = &d.snap.stats;
    let threshold = if d.snap.threshold == u64::MAX {
        "null".to_string()
    } else {
        d.snap.threshold.to_string()
    };
    let limit = if d.snap.limit == u64::MAX {
        "null".to_string()
    } else {
        d.snap.limit.to_string()
    };
    let memory = match d.snap.memory {
        Some(m) => format!(
            "{{\"total_bytes\":{},\"free_bytes\":{},\"outside_pool_bytes\":{}}}",
            m.total,
            m.free,
            m.outside_pool()
        ),
        None => "null".into(),
    };
    let histogram: Vec<String> = d
        .histogram()
        .iter()
        .map(|&(bound, count)| {
            let le = if bound == u64::MAX {
                "null".to_string()
            } else {
                bound.to_string()
            };
            format!("{{\"below\":{le},\"count\":{count}}}")
        })
        .collect();
    let leaks: Vec<String> = d
        .leaks
        .iter()
        .map(|&(size, count)| format!("{{\"requested_bytes\":{size},\"count\":{count}}}"))
        .collect();
    let holders: Vec<String> = d
        .holders
        .iter()
        .map(|h| {
            format!(
                "{{\"library\":{},\"blocks\":{},\"requested_bytes\":{}}}",
                quote(&h.library),
                h.blocks,
                h.bytes
            )
        })
        .collect();
    format!(
        concat!(
            "{{\"device\":{},\"release_threshold_bytes\":{},",
            "\"limit_bytes\":{},\"limit_refusals\":{},",
            "\"requested_bytes\":{},\"allocated_bytes\":{},\"reserved_bytes\":{},",
            "\"live_blocks\":{},\"segments\":{},",
            "\"cached_bytes\":{},\"cached_free_bytes\":{},\"pending_bytes\":{},",
            "\"largest_free_block_bytes\":{},\"fragmentation\":{:.4},",
            "\"releasable_bytes\":{},\"stranded_bytes\":{},\"stranded_in_granules_bytes\":{},",
            "\"expandable\":{},",
            "\"memory\":{},",
            "\"allocations\":{},\"frees\":{},\"cache_hits\":{},\"cache_misses\":{},",
            "\"thread_cache_hits\":{},\"stream_hits\":{},",
            "\"driver\":{{\"mallocs\":{},\"mallocs_refused\":{},\"mallocs_avoided\":{},\"malloc_ns\":{},\"frees\":{},\"free_ns\":{}}},",
            "\"released\":{{\"threshold_segments\":{},\"threshold_bytes\":{},",
            "\"empty_cache_segments\":{},\"empty_cache_bytes\":{},\"out_of_memory_bytes\":{},",
            "\"threshold_granules\":{},\"empty_cache_granules\":{},",
            "\"outgrown_segments\":{},\"outgrown_bytes\":{}}},",
            "\"out_of_memory\":{{\"retries\":{},\"recovered\":{},\"returned\":{},\"probes\":{}}},",
            "\"in_flight\":{{\"fences\":{},\"fence_wait_ns\":{},\"program_syncs_used\":{},\"barriers\":{}}},",
            "\"invalid_frees\":{},\"resets\":{},",
            "\"request_histogram\":[{}],",
            "\"still_allocated\":{{\"blocks\":{},\"requested_bytes\":{},\"by_size\":[{}],",
            "\"by_library\":[{}]}}}}"
        ),
        d.snap.device,
        threshold,
        limit,
        s.limit_refusals,
        gauge(&s.requested),
        gauge(&s.allocated),
        gauge(&s.reserved),
        gauge(&s.blocks),
        gauge(&s.segments),
        d.snap.cached,
        d.cached_free(),
        d.snap.pending,
        d.snap.largest_free,
        d.fragmentation(),
        d.snap.figures.releasable,
        d.snap.figures.stranded,
        d.snap.figures.stranded_in_granules,
        expandable(d),
        memory,
        s.allocs,
        s.frees,
        s.hits,
        s.misses,
        s.thread_cache_hits,
        s.stream_hits,
        s.real_mallocs,
        s.mallocs_refused(),
        s.mallocs_avoided(),
        s.real_malloc_ns,
        s.real_frees,
        s.real_free_ns,
        s.threshold_releases,
        s.threshold_released_bytes,
        s.empty_cache_releases,
        s.empty_cache_released_bytes,
        s.oom_released_bytes,
        s.threshold_released_granules,
        s.empty_cache_released_granules,
        s.outgrown_releases,
        s.outgrown_released_bytes,
        s.oom_retries,
        s.oom_recovered,
        s.ooms,
        s.oom_probes,
        s.fences,
        s.fence_ns,
        s.observed_fences,
        s.barriers,
        s.invalid_frees,
        s.resets,
        histogram.join(","),
        d.leaked_blocks,
        d.leaked_bytes,
        leaks.join(","),
        holders.join(",")
    )
}

pub fn render_json(r: &Report) -> String {
    let devices: Vec<String> = r.devices.iter().map(device).collect();
    format!(
        "{{\"gpupool_version\":{},\"pid\":{},\"rank\":{},\"host\":{},\"runtime\":{},\"reuse\":{},\"intercepted\":{},\"devices\":[{}],\"unread_devices\":[{}],\"passed_through\":{},\"frameworks\":[{}]}}\n",
        quote(env!("CARGO_PKG_VERSION")),
        r.pid,
        quote(&r.rank),
        quote(&r.host),
        quote(&r.runtime),
        quote(r.reuse),
        r.intercepted(),
        devices.join(","),
        r.unread
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(","),
        passed_through(&r.passed_through),
        r.frameworks
            .iter()
            .map(|f| format!(
                "{{\"name\":{},\"caches_above_pool\":{},\"note\":{}}}",
                quote(f.name),
                f.caches_above,
                quote(&f.note)
            ))
            .collect::<Vec<_>>()
            .join(",")
    )
}

#[cfg(test)]
mod tests {
    use super::quote;

    #[test]
    fn strings_are_escaped() {
        assert_eq!(quote("a\"b\\c\nd\u{1}"), "\"a\\\"b\\\\c\\nd\\u0001\"");
        assert_eq!(quote("/opt/ü.so"), "\"/opt/ü.so\"");
    }
}
