//! The out-of-memory report: when the pool finally returns `cudaErrorMemoryAllocation`, one
//! block on stderr says what was asked, what the device and the pool held, what the pool already
//! tried, and what the user can change. Once per distinct situation (device and order of
//! magnitude of the request), not per retry.

use std::fmt::Write;
use std::sync::Mutex;

use super::summary::{DeviceReport, Report};
use super::units::{bytes, count};
use crate::log;
use crate::pool::stats::histogram_bucket;
use crate::pool::Expandable;

/// Situations already reported; bounded so a program retrying forever cannot grow it.
static REPORTED: Mutex<Vec<(u32, usize)>> = Mutex::new(Vec::new());
const MAX_REPORTS: usize = 32;

/// The API a request that ran out of memory came through: the report names its call, and
/// CUDA's own try of it, whichever API the pool's segments come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestApi {
    /// `cudaMalloc` and its kin, retried with the runtime's own call.
    Runtime,
    /// `cudaMallocAsync` (PyTorch's backend under the preload), retried with the runtime's own.
    RuntimeAsync,
    /// `cudaMallocPitch`, of the image's padded size, retried with the runtime's own.
    RuntimePitch,
    /// `cuMemAlloc` and its kin, retried with the driver's own call.
    Driver,
    /// `cuMemAllocAsync`, retried with the driver's own.
    DriverAsync,
    /// `cuMemAllocPitch`, of the image's padded size, retried with the driver's own.
    DriverPitch,
}

impl RequestApi {
    /// The allocation call of this API.
    fn malloc(self) -> &'static str {
        match self {
            RequestApi::Runtime => "cudaMalloc",
            RequestApi::RuntimeAsync => "cudaMallocAsync",
            RequestApi::RuntimePitch => "cudaMallocPitch",
            RequestApi::Driver => "cuMemAlloc",
            RequestApi::DriverAsync => "cuMemAllocAsync",
            RequestApi::DriverPitch => "cuMemAllocPitch",
        }
    }

    /// The library whose own call tries the request after the pool: the runtime or the driver.
    fn owner(self) -> &'static str {
        match self {
            RequestApi::Runtime | RequestApi::RuntimeAsync | RequestApi::RuntimePitch => "runtime",
            RequestApi::Driver | RequestApi::DriverAsync | RequestApi::DriverPitch => "driver",
        }
    }
}

/// Report the out-of-memory of a `size`-byte request on `device` made through `api`, if this
/// situation is new.
pub fn report(src: &super::Source, device: u32, size: u64, api: RequestApi) {
    let key = (device, histogram_bucket(size));
    {
        let mut seen = REPORTED.lock().unwrap_or_else(|e| e.into_inner());
        if seen.contains(&key) || seen.len() >= MAX_REPORTS {
            return;
        }
        seen.push(key);
    }
    let Some(pool) = src.pool else { return };
    let report = Report::collect(pool, src.runtime_path, crate::pool::LockWait::Brief);
    if let Some(d) = report.devices.iter().find(|d| d.snap.device == device) {
        log::write_stream(
            log::Stream::Stderr,
            render(d, size, report.max_split_size, api).as_bytes(),
        );
    }
}

/// The report of a `size`-byte request made through `api` that failed on `d`'s device, with
/// `max_split_size` the pool's setting.
pub fn render(d: &DeviceReport, size: u64, max_split_size: u64, api: RequestApi) -> String {
    let s = &d.snap.stats;
    let malloc = api.malloc();
    let mut o = String::new();
    let _ = writeln!(
        o,
        "gpupool: out of memory on device {}: {malloc} of {} ({size} bytes) failed",
        d.snap.device,
        bytes(size)
    );
    let oom = d.snap.last_oom;
    if let Some(m) = oom.and_then(|o| o.memory).or(d.snap.memory) {
        let _ = writeln!(
            o,
            "  device     {} total, {} free when it failed; {} used outside this pool (CUDA context, other allocators, other processes)",
            bytes(m.total),
            bytes(m.free),
            bytes(m.outside_pool())
        );
    }
    let _ = writeln!(
        o,
        "  the pool   reserves {}: {} allocated to the program ({} requested), {} cached \
         (largest free block {}, fragmentation {:.0}%, {} awaiting in-flight work)",
        bytes(s.reserved.current),
        bytes(s.allocated.current),
        bytes(s.requested.current),
        bytes(d.snap.cached),
        bytes(d.snap.largest_free),
        d.fragmentation() * 100.0,
        bytes(d.snap.pending)
    );
    let limited = d.snap.limit != u64::MAX;
    if limited {
        let _ = writeln!(
            o,
            "  limit      GPUPOOL_LIMIT lets the pool reserve {} on this device: {} more",
            bytes(d.snap.limit),
            bytes(d.snap.limit.saturating_sub(s.reserved.current))
        );
    }
    let f = &d.snap.figures;
    // With expandable segments a request maps granules: that is what failed.
    let mapping = oom.map_or(d.snap.expandable == Expandable::On && f.ranges > 0, |e| {
        e.mapping
    });
    if d.snap.expandable == Expandable::On {
        let _ = writeln!(
            o,
            "  expandable {} mapped in {} of reserved address space ({} granules; address \
             space is not memory, only what is mapped)",
            bytes(f.mapped),
            bytes(f.range_bytes),
            bytes(f.granule)
        );
    }
    // After the retry everything that could go back went: what stays cached lies in segments
    // or granules that also hold live blocks, which the driver cannot take back while they
    // live.
    let stranded = f.stranded;
    if oom.is_some() && stranded > 0 {
        if d.snap.expandable == Expandable::On {
            let _ = writeln!(
                o,
                "  stranded   {} free beside {} ({} in granules they share, {} in classic \
                 segments; largest piece {}): a granule or segment goes back to the driver only \
                 once no live block touches it",
                bytes(stranded),
                count(s.blocks.current, "live block"),
                bytes(f.stranded_in_granules),
                bytes(stranded.saturating_sub(f.stranded_in_granules)),
                bytes(f.largest_piece)
            );
        } else {
            let _ = writeln!(
                o,
                "  stranded   {} free inside {} holding {} (largest piece {}): no segment can \
                 go back to the driver while a block in it lives",
                bytes(stranded),
                count(s.segments.current, "segment"),
                count(s.blocks.current, "live block"),
                bytes(f.largest_piece)
            );
        }
    }
    if let Some(e) = oom {
        let retried = if mapping {
            let segment = if e.segment_asked {
                format!(
                    ", then asked the driver for a {} segment",
                    bytes(e.requested)
                )
            } else {
                String::new()
            };
            format!(
                " (free granules included), then tried again to map the granules the request \
                 lacks{segment}"
            )
        } else {
            format!(
                ", then retried with a {} segment{}",
                bytes(e.segment),
                if e.segment != e.requested {
                    format!(" and an exact {} one", bytes(e.requested))
                } else {
                    String::new()
                }
            )
        };
        let _ = writeln!(
            o,
            "  it tried   {}released {} of cached segments to the driver{retried}{}",
            if e.fenced {
                "waited for the device's in-flight work, "
            } else if e.capture {
                "could not wait for the device's in-flight work (a graph capture was underway), "
            } else {
                ""
            },
            bytes(e.released),
            if limited {
                String::new()
            } else {
                format!(" and with the {}'s own {}", api.owner(), api.malloc())
            }
        );
    }
    let _ = writeln!(
        o,
        "  peak       {} allocated at most, {} reserved at most; {} live blocks now",
        bytes(s.allocated.peak_ever()),
        bytes(s.reserved.peak_ever()),
        s.blocks.current
    );
    if !d.holders.is_empty() {
        let _ = writeln!(
            o,
            "  held by    {}",
            super::summary::holders_text(&d.holders)
        );
    }
    let mut advice = Vec::new();
    let total = d.snap.memory.map_or(u64::MAX, |m| m.total);
    // What the device had for the pool: beside the CUDA context and whatever else was in use
    // when the pool began.
    let usable = total.saturating_sub(d.snap.memory_first.map_or(0, |m| m.outside_pool()));
    let device_free = oom.and_then(|e| e.memory).map_or(0, |m| m.free);
    let by_limit = oom.is_some_and(|e| e.limited);
    // The memory is on the device, but in free pieces of segments that hold live blocks: the
    // pool's packing, not the program's tensors, stands between the request and the memory.
    let packing = !by_limit
        && oom.is_some()
        && d.snap.largest_free < size
        && stranded.saturating_add(device_free) >= size;
    if by_limit {
        advice.push(format!(
            "the pool's limit refused it (GPUPOOL_LIMIT, {} on this device; the driver may have \
             the memory): raise the limit, or free tensors the program no longer needs",
            bytes(d.snap.limit)
        ));
    } else if size > total {
        advice.push(format!(
            "the request alone is larger than the device's {}: split it",
            bytes(total)
        ));
    } else if s.allocated.current + size > usable {
        advice.push("the program's live allocations alone do not fit: smaller batches or model shards, or free tensors sooner (look for references kept across steps)".to_string());
    } else if packing {
        advice.push(packing_advice(d, stranded, device_free));
    } else {
        advice.push(
            "free tensors the program no longer needs (references kept across steps are the usual leak)"
                .to_string(),
        );
    }
    // A cap at or below the request keeps cached blocks of its size or more whole for requests
    // like it (smaller ones no longer carve them): for the next run, and only if the setting
    // is not that low already (advice that repeats the setting in force helps no one). Blocks
    // of expandable segments have no cap: not where a mapping failed.
    let cap = 1u64 << (63 - size.max(1).leading_zeros());
    if size > crate::pool::size::SMALL_LIMIT
        && !mapping
        && cap > crate::config::MAX_SPLIT_SIZE_ABOVE
        && cap < max_split_size
        && d.fragmentation() > 0.3
        && d.cached_free() >= size
    {
        advice.push(format!(
            "the cache holds enough but in pieces: in the next run, GPUPOOL_MAX_SPLIT_SIZE={} keeps cached blocks of that size or more whole for requests like this one",
            bytes(cap).replace(' ', "")
        ));
    }
    // Growth since the pool began, not the CUDA context: the context alone, 300-500 MiB,
    // would bring this advice on every smaller request.
    let grown = match (d.snap.memory, d.snap.memory_first) {
        (Some(now), Some(first)) => now.outside_pool().saturating_sub(first.outside_pool()),
        _ => 0,
    };
    if grown > size {
        advice.push(format!(
            "memory used outside this pool grew by {} since its first segment: other allocators in the process (a framework's own cache), or other processes on the GPU",
            bytes(grown)
        ));
    }
    // A capture refuses the pool's fences and barriers: what awaits in-flight work stays until
    // it ends, whatever the reuse mode. A classic segment's `cudaFree` waits by itself.
    let capture = oom.is_some_and(|e| e.capture);
    if capture && d.snap.pending > 0 {
        advice.push(format!(
            "{} of freed blocks await in-flight work, which the pool cannot wait for during a \
             graph capture: allocate before the capture begins{}",
            bytes(d.snap.pending),
            if d.snap.expandable == Expandable::On {
                ", or run with GPUPOOL_EXPANDABLE=0, whose segments go back with a cudaFree that \
                 waits for that work"
            } else {
                ""
            }
        ));
    }
    // Only when freed blocks still await in-flight work after the retry: the fence taken at
    // out-of-memory (strict mode always takes one) says nothing about the reuse mode helping.
    if d.snap.pending > 0 && !capture {
        advice.push("GPUPOOL_REUSE=barrier reuses freed blocks sooner when the program's work is on the default and blocking streams".to_string());
    }
    let _ = writeln!(o, "  you can    {}", advice.join(";\n             "));
    o
}

/// The advice when the pool's own packing is the cause: `stranded` bytes free in pieces of
/// segments (or granules) that still hold live blocks, `device_free` more on the device, and
/// no piece fits the request. With expandable segments the pieces are granule edges (and any
/// classic segments a refused reservation left), not 20 MiB segments; without them,
/// `GPUPOOL_EXPANDABLE=1` packs blocks without stranding, where the driver has virtual memory.
fn packing_advice(d: &DeviceReport, stranded: u64, device_free: u64) -> String {
    let f = &d.snap.figures;
    let cause = "the pool's own packing is the cause, not the program's tensors";
    if d.snap.expandable == Expandable::On {
        return format!(
            "{cause}: {} is free in pieces of granules and segments that still hold live blocks \
             ({} in {} granules, {} in classic segments; {} more on the device), and no piece \
             fits. What helps now: free the live blocks beside those pieces, or request large \
             sizes in whole {} granules (blocks then share none)",
            bytes(stranded),
            bytes(f.stranded_in_granules),
            bytes(f.granule),
            bytes(stranded.saturating_sub(f.stranded_in_granules)),
            bytes(device_free),
            bytes(f.granule)
        );
    }
    let expandable = match d.snap.expandable {
        Expandable::Off => {
            "run this job with GPUPOOL_EXPANDABLE=1 (the default: blocks packed one after \
             another in virtual memory, at most a 2 MiB granule stranded beside a live block), "
        }
        Expandable::Unavailable
        | Expandable::NoPeerAccess
        | Expandable::Refused(_)
        | Expandable::On => "",
    };
    format!(
        "{cause}: {} is free in pieces of segments that still hold live blocks ({} more on the \
         device), and no piece fits; without the pool the driver would have that memory back. \
         What helps now: free the live blocks that share those segments, request sizes that \
         pack (requests of 1 to 10 MiB share 20 MiB segments: 5 or 10 MiB fill them, 7 MiB \
         leaves 6 MiB over), {expandable}or run this job with GPUPOOL_DISABLE=1 (every call \
         straight to the driver)",
        bytes(stranded),
        bytes(device_free)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DeviceBytes, ReuseMode};
    use crate::pool::model_driver::ModelDriver;
    use crate::pool::{FreeKind, LockWait, Pool, Settings};

    const MIB: u64 = 1 << 20;

    /// A split cap keeps no block of an expandable segment whole (`DevicePool::split_cap`), so
    /// the report does not advise one when a large request failed to map: here the cache holds
    /// enough, in 1.5 MiB pieces that share their granules with live blocks.
    #[test]
    fn no_split_cap_is_advised_where_large_blocks_come_from_a_range() {
        let mut settings = Settings::for_tests(ReuseMode::Strict, DeviceBytes::Unbounded, true);
        settings.thread_cache = 0;
        let p = Pool::new(
            ModelDriver::new().with_capacity(512 * MIB).with_vmm(),
            settings,
        );
        let blocks: Vec<_> = std::iter::from_fn(|| p.alloc(0, 3 * MIB / 2).ok()).collect();
        for &a in blocks.iter().step_by(2) {
            p.free(a, FreeKind::Sync, Some(0));
        }
        let at = p.seq_before_sync(0);
        p.observe_fence(0, at);
        assert!(p.alloc(0, 40 * MIB).is_err());
        let report = Report::collect(&p, "libcudart.so.12", LockWait::Unbounded);
        let d = &report.devices[0];
        assert_eq!(d.snap.expandable, Expandable::On);
        assert!(d.fragmentation() > 0.3 && d.cached_free() >= 40 * MIB);
        let text = render(d, 40 * MIB, u64::MAX, RequestApi::Runtime);
        assert!(text.contains("  expandable "), "{text}");
        assert!(!text.contains("GPUPOOL_MAX_SPLIT_SIZE"), "{text}");
    }
}
