//! The pool's counters, copied into a caller's struct that may be older (smaller) or newer
//! (larger) than this library's.

use std::ffi::c_int;
use std::mem::size_of;

use super::context::{report_patience, run, target, Devices};
use super::{GPUPOOL_ERROR_INVALID_VALUE, GPUPOOL_ERROR_UNKNOWN};
use crate::pool::DeviceSnapshot;

/// Counters of one device, or the sums over every device. Set `struct_size` to
/// `sizeof(gpupool_stats)` before calling `gpupool_get_stats`; fields are only ever added at the
/// end, so a program built against an older header keeps working with a newer library and the
/// other way round. Every byte count is in bytes; "peak" is the highest value since the start
/// (of one device; for all devices, -1, the sum of their peaks, which may have come at
/// different times: an upper bound of the peak of the sum).
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct gpupool_stats {
    /// In: `sizeof(gpupool_stats)` as the caller knows it. Out: the bytes the library filled
    /// (smaller when the library is older than the caller's header).
    pub struct_size: usize,
    /// Bytes the program asked for and has not freed.
    pub requested_bytes: u64,
    pub requested_bytes_peak: u64,
    /// The same, after rounding to the pool's 512-byte granule.
    pub allocated_bytes: u64,
    pub allocated_bytes_peak: u64,
    /// Bytes of all allocations ever made (PyTorch's "Tot Alloc").
    pub allocated_bytes_total: u64,
    /// Bytes held from the driver (live and cached).
    pub reserved_bytes: u64,
    pub reserved_bytes_peak: u64,
    /// Reserved but not allocated: free for reuse, or waiting for GPU work before reuse.
    pub cached_bytes: u64,
    /// Of `cached_bytes`, those still waiting for GPU work issued before their free.
    pub pending_bytes: u64,
    /// The largest request the cache serves now without asking the driver (a small-pool block
    /// serves 1 MiB at most; in an expandable segment only the mapped start of a free block
    /// counts).
    pub largest_free_block: u64,
    /// Live allocations, and driver segments held.
    pub active_allocations: u64,
    pub active_allocations_peak: u64,
    pub segments: u64,
    pub segments_peak: u64,
    /// Allocations and frees the program made through the pool.
    pub alloc_calls: u64,
    pub free_calls: u64,
    /// Allocations served from cached memory, and those that needed a new segment.
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Real `cudaMalloc` / `cudaFree` calls the pool made.
    pub driver_mallocs: u64,
    pub driver_frees: u64,
    /// Bytes given back to the driver because of the release threshold, `gpupool_empty_cache`,
    /// and out-of-memory recovery.
    pub threshold_released_bytes: u64,
    pub empty_cache_released_bytes: u64,
    pub oom_released_bytes: u64,
    /// Device-wide fences and legacy-stream barriers the pool issued itself.
    pub fences: u64,
    pub barriers: u64,
    /// Driver out-of-memory answers: retried after releasing cache, recovered that way, and
    /// returned to the program.
    pub oom_retries: u64,
    pub oom_recovered: u64,
    pub ooms: u64,
    /// Frees refused as double or interior frees.
    pub invalid_frees: u64,
    /// `cudaDeviceReset` calls that made the pool forget a device.
    pub resets: u64,
    /// Bytes of idle segments given back to the driver because a request larger than every
    /// segment so far outgrew them (added after `resets`).
    pub outgrown_released_bytes: u64,
    /// Of `cache_hits`, allocations on a stream (`gpupool_malloc_async`) served by a block freed
    /// on that stream before a barrier or fence covered it (`relaxed` mode; added after
    /// `outgrown_released_bytes`).
    pub stream_hits: u64,
    /// Expandable segments (added after `stream_hits`): bytes of physical memory mapped in
    /// them (part of `reserved_bytes`), and the address space they reserve, which is not
    /// memory.
    pub mapped_bytes: u64,
    pub address_space_bytes: u64,
    /// Of `cached_bytes`, those the pool could give back now (mapped granules and classic
    /// segments no live block touches; `gpupool_empty_cache` releases them), and those that
    /// cannot go back while the live blocks stay (free pieces of granules and segments that
    /// also hold live blocks). Computed when asked: a walk over the segments' blocks.
    pub releasable_bytes: u64,
    pub stranded_bytes: u64,
    /// The peaks since the last `gpupool_reset_peak_stats` (added after `stranded_bytes`), as
    /// PyTorch's `max_memory_allocated()` reads them; the `_peak` fields above are the run's.
    pub requested_bytes_peak_since_reset: u64,
    pub allocated_bytes_peak_since_reset: u64,
    pub reserved_bytes_peak_since_reset: u64,
    pub active_allocations_peak_since_reset: u64,
    pub segments_peak_since_reset: u64,
}

// The layout is a `size_t` then `uint64_t` fields with no padding: `copy_out` relies on it.
const _: () =
    assert!(size_of::<usize>() == size_of::<u64>() && size_of::<gpupool_stats>().is_multiple_of(8));

impl gpupool_stats {
    /// Add one device's counters (peaks add up too: for several devices, the sum of their
    /// peaks).
    fn add(&mut self, d: &DeviceSnapshot) {
        let s = &d.stats;
        self.requested_bytes += s.requested.current;
        self.requested_bytes_peak += s.requested.peak_ever();
        self.allocated_bytes += s.allocated.current;
        self.allocated_bytes_peak += s.allocated.peak_ever();
        self.allocated_bytes_total += s.allocated.total_in;
        self.reserved_bytes += s.reserved.current;
        self.reserved_bytes_peak += s.reserved.peak_ever();
        self.cached_bytes += d.cached;
        self.pending_bytes += d.pending;
        self.largest_free_block = self.largest_free_block.max(d.largest_free);
        self.active_allocations += s.blocks.current;
        self.active_allocations_peak += s.blocks.peak_ever();
        self.segments += s.segments.current;
        self.segments_peak += s.segments.peak_ever();
        self.alloc_calls += s.allocs;
        self.free_calls += s.frees;
        self.cache_hits += s.hits;
        self.cache_misses += s.misses;
        self.driver_mallocs += s.real_mallocs;
        self.driver_frees += s.real_frees;
        self.threshold_released_bytes += s.threshold_released_bytes;
        self.empty_cache_released_bytes += s.empty_cache_released_bytes;
        self.oom_released_bytes += s.oom_released_bytes;
        self.fences += s.fences;
        self.barriers += s.barriers;
        self.oom_retries += s.oom_retries;
        self.oom_recovered += s.oom_recovered;
        self.ooms += s.ooms;
        self.invalid_frees += s.invalid_frees;
        self.resets += s.resets;
        self.outgrown_released_bytes += s.outgrown_released_bytes;
        self.stream_hits += s.stream_hits;
        let f = &d.figures;
        self.mapped_bytes += f.mapped;
        self.address_space_bytes += f.range_bytes;
        self.releasable_bytes += f.releasable;
        self.stranded_bytes += f.stranded;
        self.requested_bytes_peak_since_reset += s.requested.peak;
        self.allocated_bytes_peak_since_reset += s.allocated.peak;
        self.reserved_bytes_peak_since_reset += s.reserved.peak;
        self.active_allocations_peak_since_reset += s.blocks.peak;
        self.segments_peak_since_reset += s.segments.peak;
    }
}

/// Copy `stats` into the caller's struct at `out`, whose `struct_size` says how large it is:
/// only whole fields that fit are written, then `struct_size` becomes the bytes written.
///
/// # Safety
/// `out` is valid for reads and writes of `(*out).struct_size` bytes, aligned for `size_t`.
unsafe fn copy_out(stats: &gpupool_stats, out: *mut gpupool_stats) -> Result<(), c_int> {
    const HEAD: usize = size_of::<usize>();
    const FIELD: usize = size_of::<u64>();
    // SAFETY: `out` points at least at its first field (the caller's contract).
    let theirs = unsafe { out.cast::<usize>().read() };
    if theirs < HEAD {
        return Err(GPUPOOL_ERROR_INVALID_VALUE);
    }
    let fields = (theirs.min(size_of::<gpupool_stats>()) - HEAD) / FIELD;
    let filled = HEAD + fields * FIELD;
    let src = (stats as *const gpupool_stats).cast::<u8>();
    // SAFETY: both ranges lie inside their structs (`filled` is at most the smaller size), and a
    // caller's struct never overlaps this local copy.
    unsafe {
        std::ptr::copy_nonoverlapping(src.add(HEAD), out.cast::<u8>().add(HEAD), filled - HEAD);
        out.cast::<usize>().write(filled);
    }
    Ok(())
}

/// Reads the pool's counters for `device`, or their sums over every device for -1
/// (`GPUPOOL_ALL_DEVICES`), into `*out`. Set `out->struct_size = sizeof(gpupool_stats)` first:
/// the library fills the fields that fit in that size and sets `struct_size` to the bytes it
/// filled. A device the pool has not used yet, and a disabled pool, give zeros. Waits while
/// another thread holds a device's pool (a fence waits for the GPU's work). Not
/// async-signal-safe: called from a signal handler or a runtime callback on a thread that is
/// inside the pool, it waits 200 ms at most and then fails with 999 rather than deadlock.
///
/// Returns 0, 1 (`out` is NULL or `struct_size` is smaller than a `size_t`), 101, 35 (for a
/// device ordinal, without a runtime), or 999. Nothing is written on failure. For -1 it needs no
/// runtime and never looks for one: before the program's first CUDA call every counter is 0.
///
/// # Safety
/// `out` is NULL or valid for reads and writes of `out->struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn gpupool_get_stats(device: c_int, out: *mut gpupool_stats) -> c_int {
    run(|| {
        if out.is_null() {
            return Err(GPUPOOL_ERROR_INVALID_VALUE);
        }
        let (pool, which) = target(device)?;
        let (_inside, patience) = report_patience();
        let mut stats = gpupool_stats::default();
        if let Some(pool) = pool {
            let list = match which {
                Devices::All => pool.used_devices(),
                Devices::One(d) => vec![d],
            };
            for d in list {
                match pool.device_stats_with(d, patience) {
                    Some(snapshot) => stats.add(&snapshot),
                    // A device the pool uses whose lock this thread may hold: no figures
                    // rather than zeros.
                    None if pool.used_devices().contains(&d) => return Err(GPUPOOL_ERROR_UNKNOWN),
                    None => {}
                }
            }
        }
        stats.struct_size = size_of::<gpupool_stats>();
        // SAFETY: checked non-NULL; sized by the caller's contract.
        unsafe { copy_out(&stats, out) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> gpupool_stats {
        gpupool_stats {
            struct_size: size_of::<gpupool_stats>(),
            requested_bytes: 11,
            requested_bytes_peak: 22,
            outgrown_released_bytes: 97,
            segments_peak_since_reset: 99,
            ..Default::default()
        }
    }

    #[test]
    fn only_whole_fields_that_fit_are_written() {
        // An "old caller" knowing two counters (plus a partial third: ignored).
        let mut buf = [0xAAAA_AAAA_AAAA_AAAAu64; 8];
        buf[0] = (size_of::<usize>() + 2 * 8 + 5) as u64;
        // SAFETY: `buf` is larger than the size it declares and aligned for usize.
        unsafe { copy_out(&sample(), buf.as_mut_ptr().cast()) }.unwrap();
        assert_eq!(buf[0], (size_of::<usize>() + 16) as u64);
        assert_eq!(&buf[1..3], &[11, 22]);
        assert!(buf[3..].iter().all(|&w| w == 0xAAAA_AAAA_AAAA_AAAA));
    }

    #[test]
    fn a_newer_caller_gets_every_field_and_the_size_filled() {
        let words = size_of::<gpupool_stats>() / 8;
        let mut buf = vec![7u64; words + 4];
        buf[0] = ((words + 4) * 8) as u64;
        // SAFETY: as above.
        unsafe { copy_out(&sample(), buf.as_mut_ptr().cast()) }.unwrap();
        assert_eq!(buf[0] as usize, size_of::<gpupool_stats>());
        assert_eq!(&buf[words - 1..words], &[99], "the last field");
        assert_eq!(&buf[words..], &[7; 4]);
    }

    #[test]
    fn a_size_below_the_header_is_refused() {
        let mut buf = [3u64; 2];
        // SAFETY: as above.
        let r = unsafe { copy_out(&sample(), buf.as_mut_ptr().cast()) };
        assert_eq!(r, Err(GPUPOOL_ERROR_INVALID_VALUE));
        assert_eq!(buf, [3, 3]);
    }
}
