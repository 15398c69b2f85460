//! The control API of `cudasim.h`: statistics, busy ranges, fault injection. These calls do
//! not count for fault injection and do not touch the last error.

use crate::config;
use crate::errors::{CudaResult, INVALID_DEVICE, INVALID_VALUE, SUCCESS, UNKNOWN};
use crate::faults::{self, Func};
use crate::ffi::boundary;
use crate::state::with_state;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::mem::size_of;

/// `cudasimStats`, in the header's order.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Stats {
    pub struct_size: usize,
    pub malloc_calls: u64,
    pub malloc_failures: u64,
    pub free_calls: u64,
    pub live_allocations: u64,
    pub live_bytes: u64,
    pub peak_live_bytes: u64,
    pub device_syncs: u64,
    pub stream_syncs: u64,
    pub event_syncs: u64,
    pub implicit_syncs: u64,
    pub event_records: u64,
    pub stream_wait_events: u64,
    pub kernels_launched: u64,
    pub kernel_writes: u64,
    pub async_mallocs: u64,
    pub captured_mallocs: u64,
    pub pool_used_bytes: u64,
    pub pool_reserved_bytes: u64,
    pub driver_mallocs: u64,
    pub driver_frees: u64,
    pub vmm_created_bytes: u64,
    pub vmm_mapped_bytes: u64,
    pub vmm_creates: u64,
    pub vmm_maps: u64,
    pub vmm_unmaps: u64,
    pub unmapped_while_busy: u64,
    pub accessed_without_access: u64,
    pub vmm_rdma_creates: u64,
}

fn stats_of(device: c_int) -> CudaResult<Stats> {
    let d = usize::try_from(device).map_err(|_| INVALID_DEVICE)?;
    if d >= config::get()?.devices {
        return Err(INVALID_DEVICE);
    }
    with_state(|st| {
        let dev = &st.devices[d];
        let c = &dev.counters;
        Ok(Stats {
            struct_size: size_of::<Stats>(),
            malloc_calls: c.malloc_calls,
            malloc_failures: c.malloc_failures,
            free_calls: c.free_calls,
            live_allocations: dev.live_allocations,
            live_bytes: dev.live_bytes,
            peak_live_bytes: dev.peak_live_bytes,
            device_syncs: c.device_syncs,
            stream_syncs: c.stream_syncs,
            event_syncs: c.event_syncs,
            implicit_syncs: c.implicit_syncs,
            event_records: c.event_records,
            stream_wait_events: c.stream_wait_events,
            kernels_launched: c.kernels_launched,
            kernel_writes: c.kernel_writes,
            async_mallocs: c.async_mallocs,
            captured_mallocs: c.captured_mallocs,
            pool_used_bytes: st.pools.default_pool(d).used,
            pool_reserved_bytes: st.pools.default_pool(d).reserved(),
            driver_mallocs: c.driver_mallocs,
            driver_frees: c.driver_frees,
            vmm_created_bytes: dev.vmm_created_bytes,
            vmm_mapped_bytes: dev.vmm_mapped_bytes,
            vmm_creates: c.vmm_creates,
            vmm_maps: c.vmm_maps,
            vmm_unmaps: c.vmm_unmaps,
            unmapped_while_busy: c.unmapped_while_busy,
            accessed_without_access: c.accessed_without_access,
            vmm_rdma_creates: c.vmm_rdma_creates,
        })
    })
}

/// Fills the fields of `*out` that fit in `out->struct_size` (set by the caller, so an older
/// or newer header still works); `struct_size` itself is left as the caller set it.
#[no_mangle]
pub unsafe extern "C" fn cudasimGetStats(device: c_int, out: *mut Stats) -> c_int {
    boundary(UNKNOWN, || {
        if out.is_null() {
            return INVALID_VALUE;
        }
        // SAFETY: `out` is not NULL and, by the caller's contract, starts with a readable
        // `size_t struct_size`.
        let size = unsafe { (out as *const usize).read_unaligned() };
        let header = size_of::<usize>();
        if size < header {
            return INVALID_VALUE;
        }
        match stats_of(device) {
            Ok(stats) => {
                let n = size.min(size_of::<Stats>()) - header;
                let src = (&stats as *const Stats).cast::<u8>();
                // SAFETY: the caller made `struct_size` bytes writable at `out`; we write
                // bytes `header..header + n` of them, with `n` within our own `Stats`.
                unsafe {
                    std::ptr::copy_nonoverlapping(src.add(header), out.cast::<u8>().add(header), n)
                };
                SUCCESS
            }
            Err(e) => e,
        }
    })
}

/// Zeroes every device's counters; the live figures stay, and the peak restarts from the
/// live bytes.
#[no_mangle]
pub unsafe extern "C" fn cudasimResetStats() {
    boundary((), || {
        let _ = with_state(|st| {
            for dev in &mut st.devices {
                dev.counters = Default::default();
                dev.peak_live_bytes = dev.live_bytes;
            }
            st.pools.reset_counts();
            Ok(())
        });
    })
}

/// The allocations the memory pool `pool` served (a default pool or a created one) since
/// the start or the last `cudasimResetStats`: `cudaErrorInvalidValue` for a NULL `out` or a
/// handle that is no live pool.
#[no_mangle]
pub unsafe extern "C" fn cudasimGetPoolMallocs(pool: *mut c_void, out: *mut u64) -> c_int {
    boundary(UNKNOWN, || {
        if out.is_null() {
            return INVALID_VALUE;
        }
        match with_state(|st| Ok(st.pools.entry_mut(pool as usize)?.mallocs)) {
            Ok(n) => {
                // SAFETY: not NULL, and by the caller's contract valid for writing a u64.
                unsafe { out.write(n) };
                SUCCESS
            }
            Err(e) => e,
        }
    })
}

/// The launched kernels not yet complete whose range overlaps `[p, p + n)`.
#[no_mangle]
pub unsafe extern "C" fn cudasimRangeBusy(p: *const c_void, n: usize) -> usize {
    boundary(0, || {
        let lo = p as usize;
        let hi = lo.saturating_add(n);
        if n == 0 {
            return 0;
        }
        with_state(|st| Ok(st.queue.kernels_overlapping(lo, hi))).unwrap_or(0)
    })
}

/// Arms a fault: the `nth` next call of `name` (1 = the very next) returns `error`.
#[no_mangle]
pub unsafe extern "C" fn cudasimFailNext(name: *const c_char, nth: c_uint, error: c_int) -> c_int {
    boundary(UNKNOWN, || {
        if name.is_null() || nth == 0 {
            return INVALID_VALUE;
        }
        // SAFETY: `name` is not NULL and, by the caller's contract, a NUL-terminated string.
        let name = unsafe { CStr::from_ptr(name) };
        match name.to_str().ok().and_then(Func::from_name) {
            Some(func) => {
                // Read the configuration first, so `CUDASIM_FAIL` is armed before counting.
                let _ = config::get();
                faults::fail_next(func, u64::from(nth), error);
                SUCCESS
            }
            None => INVALID_VALUE,
        }
    })
}

/// The calls of `name` counted so far (`faults::call_count`).
#[no_mangle]
pub unsafe extern "C" fn cudasimCallCount(name: *const c_char, out: *mut u64) -> c_int {
    boundary(UNKNOWN, || {
        if name.is_null() || out.is_null() {
            return INVALID_VALUE;
        }
        // SAFETY: `name` is not NULL and, by the caller's contract, a NUL-terminated string.
        let name = unsafe { CStr::from_ptr(name) };
        match name.to_str().ok().and_then(Func::from_name) {
            Some(func) => {
                // Read the configuration first, so `CUDASIM_FAIL` is armed before counting.
                let _ = config::get();
                // SAFETY: `out` is not NULL and, by the caller's contract, writable.
                unsafe { *out = faults::call_count(func) };
                SUCCESS
            }
            None => INVALID_VALUE,
        }
    })
}
