//! The program's own virtual memory calls, beside the pool's expandable segments: its
//! `cuMemCreate`, which gets the memory the pool caches when the driver has none left, and
//! `cuMemGetAddressRange_v2` of an address in the pool's mapped memory.

use crate::cuda::contexts::in_primary_context;
use crate::cuda::driver::{self as cu, CuDevicePtr, CuResult};
use crate::guard;

use super::{pooled, serving};

/// `cuMemCreate`, `real` the driver's own call: the program's own physical memory, which the
/// pool does not serve. Never worse on memory: when the driver is out of memory on `prop`'s
/// device, the pool's cache there (free mapped granules, idle segments) goes back to it and
/// the driver is asked again, as for an allocation in a context the program made. PyTorch's
/// expandable segments and NCCL's buffers make their memory this way beside the pool.
///
/// # Safety
/// `prop` NULL or readable as a `CUmemAllocationProp`.
pub unsafe fn mem_create(
    prop: *const cu::MemAllocationProp,
    real: impl Fn() -> CuResult,
) -> CuResult {
    let r = real();
    if r != cu::CU_ERROR_OUT_OF_MEMORY || prop.is_null() {
        return r;
    }
    let Some((pool, d)) = serving() else {
        return r;
    };
    // SAFETY: non-NULL, and readable by the caller's contract (the driver just read it).
    let (kind, id) = unsafe { ((*prop).location_type, (*prop).location_id) };
    let device = u32::try_from(id).ok().filter(|&dev| {
        kind == cu::MEM_LOCATION_TYPE_DEVICE && (dev as usize) < crate::pool::MAX_DEVICES
    });
    let (Some(dev), Some(_inside)) = (device, guard::enter()) else {
        return r;
    };
    // The pool's unmaps and its fence are made in the device's primary context, whichever
    // context the program has current.
    let released = in_primary_context(d, dev, || {
        super::super::ready_thread_for_backend(pool, dev);
        pool.release_for_others(dev)
    });
    match released {
        Some(bytes) if bytes > 0 => real(),
        _ => r,
    }
}

/// `cuMemGetAddressRange_v2`: for an address in the pool's mapped memory, the run of mapped
/// granules around it, as a classic segment is reported whole (the driver would give the one
/// 2 MiB mapping holding it, less than the block). Anything else is the driver's answer.
///
/// # Safety
/// As `cuMemGetAddressRange_v2`: `base` and `size` NULL or writable.
pub unsafe fn mem_get_address_range(
    base: *mut CuDevicePtr,
    size: *mut usize,
    dptr: CuDevicePtr,
    real: impl Fn() -> CuResult,
) -> CuResult {
    let Some((pool, _)) = pooled() else {
        return real();
    };
    let Some(_inside) = guard::enter() else {
        return real();
    };
    let Some((run_base, run_size)) = pool.mapped_run(dptr) else {
        return real();
    };
    // Either out-pointer may be NULL, as for the driver.
    if !base.is_null() {
        // SAFETY: not NULL, and writable by the caller's contract.
        unsafe { *base = run_base };
    }
    if !size.is_null() {
        // SAFETY: as above; a run is at most a reserved range, which fit in a `size_t`.
        unsafe { *size = run_size as usize };
    }
    cu::CU_SUCCESS
}
