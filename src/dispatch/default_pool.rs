//! Each device's default memory pool, with the pool's part in it, for both APIs. The pool
//! serves that pool's allocations, so once CUDA's own call about it succeeded the pool adds
//! what it holds: its figures to the reserved and used bytes a program reads, its cache to a
//! trim, and a release threshold the program sets becomes the pool's on that device, unless
//! the user chose one (`GPUPOOL_RELEASE_THRESHOLD`, or `gpupool_set_release_threshold`:
//! PyTorch's `cudaMallocAsync` backend sets the threshold to keep everything, at start). A
//! read of the threshold answers the pool's, which decides what its cache keeps. The
//! attributes' numbers are the same in both APIs (`cudaMemPoolAttr`, `CUmemPool_attribute`);
//! the runtime's calls are in `mempool.rs`, the driver's here.

use std::ffi::c_void;

use crate::cuda::backend::CudaBackend;
use crate::cuda::driver::{self as cu, CuResult};
use crate::global;
use crate::guard;
use crate::pool::Pool;

/// `cudaMemPoolAttrReleaseThreshold`, then reserved current and high, used current and high.
pub(crate) const RELEASE_THRESHOLD: i32 = 4;
pub(crate) const RESERVED_CURRENT: i32 = 5;
pub(crate) const RESERVED_HIGH: i32 = 6;
pub(crate) const USED_CURRENT: i32 = 7;
pub(crate) const USED_HIGH: i32 = 8;

/// Which devices' default pools a call may concern for the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Concerns {
    /// None: CUDA's answer is the whole answer.
    Nothing,
    /// Those the pool served already (a device never used holds nothing of the pool's).
    UsedDevices,
    /// Any device (a threshold set before the device's first allocation still applies).
    AnyDevice,
}

/// What a read of `attr` into `value` concerns: the pool's figures, and its release threshold
/// (which a device has before its first allocation too).
pub(crate) fn read_concerns(attr: i32, value: *mut c_void) -> Concerns {
    match attr {
        _ if value.is_null() => Concerns::Nothing,
        RELEASE_THRESHOLD => Concerns::AnyDevice,
        RESERVED_CURRENT..=USED_HIGH => Concerns::UsedDevices,
        _ => Concerns::Nothing,
    }
}

/// What setting `attr` from `value` concerns.
pub(crate) fn set_concerns(attr: i32, value: *mut c_void) -> Concerns {
    match attr {
        _ if value.is_null() => Concerns::Nothing,
        RELEASE_THRESHOLD => Concerns::AnyDevice,
        RESERVED_HIGH | USED_HIGH => Concerns::UsedDevices,
        _ => Concerns::Nothing,
    }
}

/// What giving access to a pool concerns, for `count` descriptors at `descs`: any device (the
/// access may come before the device's first allocation).
pub(crate) fn access_concerns(descs: *const cu::MemAccessDesc, count: usize) -> Concerns {
    if descs.is_null() || count == 0 {
        Concerns::Nothing
    } else {
        Concerns::AnyDevice
    }
}

/// After CUDA gave the `count` accesses at `descs` to `owner`'s default pool (`what`, the
/// call): each other device given access (read, or read and write) is a peer of `owner`, as
/// after `cudaDeviceEnablePeerAccess` (`peer::grant`). The pool's mapped memory there gets the
/// access, and its fences of `owner` wait for that device's kernels, which may use its blocks.
/// PyTorch's `cudaMallocAsync` backend and static-runtime programs let devices reach each
/// other's memory so. Access taken away leaves the grants, as a disabled peer access does.
///
/// # Safety
/// `descs` is not NULL and holds `count` descriptors (`access_concerns`), which CUDA just read.
pub(crate) unsafe fn access_set(
    pool: &Pool<CudaBackend>,
    owner: u32,
    descs: *const cu::MemAccessDesc,
    count: usize,
    what: &str,
) {
    // SAFETY: the caller's contract.
    let descs = unsafe { std::slice::from_raw_parts(descs, count) };
    for d in descs {
        let accessor = u32::try_from(d.location_id).ok().filter(|&a| {
            a != owner && d.location_type == cu::MEM_LOCATION_TYPE_DEVICE && d.flags != 0
        });
        if let Some(accessor) = accessor {
            super::peer::grant(pool, owner, accessor, what);
        }
    }
}

/// The device among `candidates` whose default pool is `mem_pool`, as `default_of` says.
pub(crate) fn device_of(
    mem_pool: usize,
    candidates: impl IntoIterator<Item = u32>,
    default_of: impl Fn(u32) -> Option<usize>,
) -> Option<u32> {
    candidates
        .into_iter()
        .find(|&dev| default_of(dev) == Some(mem_pool))
}

/// The devices a call that `concerns` them may be about: the pool's used ones, then for any
/// device the rest of the first `count` (the devices CUDA sees, the pool's limit at most). The
/// used ones come first: the call is most likely about one of them, and asking about the others
/// is then not needed.
pub(crate) fn candidates(pool: &Pool<CudaBackend>, concerns: Concerns, count: usize) -> Vec<u32> {
    let mut devices = match concerns {
        Concerns::Nothing => return Vec::new(),
        _ => pool.used_devices(),
    };
    if concerns == Concerns::AnyDevice {
        let used = devices.clone();
        let count = count.min(crate::pool::MAX_DEVICES) as u32;
        devices.extend((0..count).filter(|d| !used.contains(d)));
    }
    devices
}

/// After CUDA trimmed `dev`'s default pool to `keep` bytes: the pool gives back its cache until
/// the two parts together reserve at most `keep` (or nothing more can go). `cuda_keeps` is what
/// CUDA's part still reserves; one that cannot say counts as keeping everything.
pub(crate) fn trimmed(pool: &Pool<CudaBackend>, dev: u32, keep: u64, cuda_keeps: Option<u64>) {
    super::ready_thread_for_backend(pool, dev);
    pool.trim_to(dev, keep.saturating_sub(cuda_keeps.unwrap_or(keep)));
}

/// After CUDA wrote `attr` of `dev`'s default pool at `value` (checked by `read_concerns`):
/// the pool's figure added; for the release threshold, the pool's in place of CUDA's. CUDA's
/// own part holds only what passed through, and its threshold (0 unless the program set one)
/// would say the cache goes back at every synchronization while the pool keeps it
/// (`u64::MAX` unless the user or the program chose a threshold).
///
/// # Safety
/// `value` holds the `cuuint64_t` CUDA just wrote.
pub(crate) unsafe fn answer_read(
    pool: &Pool<CudaBackend>,
    dev: u32,
    attr: i32,
    value: *mut c_void,
) {
    if attr == RELEASE_THRESHOLD {
        // SAFETY: by the caller's contract.
        unsafe { value.cast::<u64>().write_unaligned(pool.threshold(dev)) };
        return;
    }
    let Some(s) = pool.device_counters(dev) else {
        return;
    };
    let ours = match attr {
        RESERVED_CURRENT => s.reserved.current,
        RESERVED_HIGH => s.reserved.peak,
        USED_CURRENT => s.allocated.current,
        _ => s.allocated.peak,
    };
    // SAFETY: by the caller's contract.
    unsafe { *value.cast::<u64>() += ours };
}

/// After CUDA accepted `attr` of `dev`'s default pool from `value` (checked by
/// `set_concerns`): a high-water mark reset (the only value CUDA allows is 0) resets the
/// pool's; a release threshold becomes the pool's on `dev` unless the user chose one, with
/// `GPUPOOL_RELEASE_THRESHOLD` or at run time.
///
/// # Safety
/// `value` holds the attribute's `cuuint64_t`, which CUDA just read.
pub(crate) unsafe fn attribute_set(
    pool: &Pool<CudaBackend>,
    dev: u32,
    attr: i32,
    value: *mut c_void,
) {
    if attr != RELEASE_THRESHOLD {
        pool.reset_peak(dev, attr == RESERVED_HIGH);
        return;
    }
    if !global::process().config.release_threshold_chosen {
        // SAFETY: by the caller's contract.
        pool.adopt_program_threshold(dev, unsafe { value.cast::<u64>().read_unaligned() });
    }
}

/// A driver call about `mem_pool` (`real`), then, when it succeeded and `mem_pool` is the
/// default pool of a device the call `concerns`, `then` on the driver, the pool and that
/// device, inside the pool. Returns the driver's answer.
fn on_default_pool(
    mem_pool: cu::CuMemoryPool,
    real: impl FnOnce() -> CuResult,
    concerns: Concerns,
    then: impl FnOnce(&cu::Driver, &Pool<CudaBackend>, u32),
) -> CuResult {
    let r = real();
    if r != cu::CU_SUCCESS || concerns == Concerns::Nothing {
        return r;
    }
    let Some((pool, d)) = super::driver::pooled() else {
        return r;
    };
    let Some(_inside) = guard::enter() else {
        return r;
    };
    let Some(get) = d.device_get_default_mem_pool else {
        return r;
    };
    let devices = candidates(pool, concerns, super::driver::device_count(d));
    let default_of = |dev: u32| super::driver::mem_pool_of(get, dev);
    if let Some(dev) = device_of(mem_pool as usize, devices, default_of) {
        then(d, pool, dev);
    }
    r
}

/// `cuMemPoolTrimTo`, `real` the driver's own call.
///
/// # Safety
/// As `cuMemPoolTrimTo`.
pub unsafe fn driver_trim_to(
    mem_pool: cu::CuMemoryPool,
    keep: usize,
    real: impl FnOnce() -> CuResult,
) -> CuResult {
    on_default_pool(mem_pool, real, Concerns::UsedDevices, |d, pool, dev| {
        let reserved = d.mem_pool_get_attribute.and_then(|get| {
            let mut v = 0u64;
            // SAFETY: a pool the driver just accepted, and an out-pointer to the attribute's type.
            let r = unsafe { get(mem_pool, RESERVED_CURRENT, (&mut v as *mut u64).cast()) };
            (r == cu::CU_SUCCESS).then_some(v)
        });
        // The pool's segments are freed in the device's primary context, which the caller
        // need not have current (CUDA's trim needs no context).
        crate::cuda::contexts::in_primary_context(d, dev, || {
            trimmed(pool, dev, keep as u64, reserved)
        });
    })
}

/// `cuMemPoolGetAttribute`, `real` the driver's own call.
///
/// # Safety
/// As `cuMemPoolGetAttribute`.
pub unsafe fn driver_get_attribute(
    mem_pool: cu::CuMemoryPool,
    attr: i32,
    value: *mut c_void,
    real: impl FnOnce() -> CuResult,
) -> CuResult {
    on_default_pool(
        mem_pool,
        real,
        read_concerns(attr, value),
        |_, pool, dev| {
            // SAFETY: the driver just wrote the attribute's `cuuint64_t` at `value`, non-NULL.
            unsafe { answer_read(pool, dev, attr, value) }
        },
    )
}

/// `cuMemPoolSetAccess`, `real` the driver's own call (`access_set`).
///
/// # Safety
/// As `cuMemPoolSetAccess`: `descs` NULL or `count` readable descriptors.
pub unsafe fn driver_set_access(
    mem_pool: cu::CuMemoryPool,
    descs: *const cu::MemAccessDesc,
    count: usize,
    real: impl FnOnce() -> CuResult,
) -> CuResult {
    on_default_pool(
        mem_pool,
        real,
        access_concerns(descs, count),
        |_, pool, dev| {
            // SAFETY: not NULL and `count` long (`access_concerns`); the driver just read them.
            unsafe { access_set(pool, dev, descs, count, "cuMemPoolSetAccess") }
        },
    )
}

/// `cuMemPoolSetAttribute`, `real` the driver's own call.
///
/// # Safety
/// As `cuMemPoolSetAttribute`.
pub unsafe fn driver_set_attribute(
    mem_pool: cu::CuMemoryPool,
    attr: i32,
    value: *mut c_void,
    real: impl FnOnce() -> CuResult,
) -> CuResult {
    on_default_pool(mem_pool, real, set_concerns(attr, value), |_, pool, dev| {
        // SAFETY: the driver just read the attribute's `cuuint64_t` at `value`, non-NULL.
        unsafe { attribute_set(pool, dev, attr, value) }
    })
}
