//! Allocations the pool does not serve through the driver: a context the program made, a
//! stream being captured, a memory pool the program made current, `cuMemAllocManaged` and
//! `cuMemAllocFromPoolAsync`. Each goes to the driver, never worse on memory: refused for lack
//! of it, the pool's cache goes back and the driver is asked again.

use super::contexts::{current_context, own_context};
use super::serving;
use crate::cuda::backend::CudaBackend;
use crate::cuda::contexts::in_primary_context;
use crate::cuda::driver::{self as cu, CuResult, Driver};
use crate::guard;
use crate::lifecycle::note_passed_through;
use crate::pool::Pool;

/// The driver's answer to an allocation in a context the pool does not serve: counted as
/// passed through when the program made that context itself, with the bytes `size` says once
/// the driver answered (a pitched image's are its pitch's).
pub(in crate::dispatch) fn unserved_context(
    pool: &Pool<CudaBackend>,
    d: &Driver,
    size: impl FnOnce() -> usize,
    real: impl Fn() -> CuResult,
) -> CuResult {
    let r = unserved(pool, d, real);
    match own_context(d) {
        Some(why) => note_passed_through(why, if r == cu::CU_SUCCESS { size() } else { 0 }, r),
        None => r,
    }
}

/// The runtime's answer to an allocation of `size` bytes with a context the program made
/// current (`pass`, the runtime's own call), as `unserved_context`: the first refusal of a
/// retry is not left as the program's last error, which is then what the program left there.
/// Out of line: the hit path only tests for it.
#[cold]
#[inline(never)]
pub(crate) fn runtime_unserved(
    pool: &Pool<CudaBackend>,
    rt: &crate::cuda::runtime::Runtime,
    d: &Driver,
    size: usize,
    pass: impl Fn() -> CuResult,
) -> CuResult {
    let unread = crate::cuda::last_error::unread(rt);
    let first = std::cell::Cell::new(true);
    unserved_context(
        pool,
        d,
        || size,
        || {
            if !first.replace(false) {
                crate::cuda::last_error::restore(rt, unread);
            }
            pass()
        },
    )
}

/// The driver's answer to an allocation the pool does not serve (a context the program made, a
/// stream being captured, a memory pool the program made current). Never worse on memory: when
/// the driver is out of memory, the pool's cache on that device goes back to it and the driver
/// is asked again.
pub(super) fn unserved(
    pool: &Pool<CudaBackend>,
    d: &Driver,
    real: impl Fn() -> CuResult,
) -> CuResult {
    let r = real();
    if r == cu::CU_ERROR_OUT_OF_MEMORY && release_cache(pool, d) > 0 {
        return real();
    }
    r
}

/// `cuMemAllocManaged` and `cuMemAllocFromPoolAsync`, which the pool never serves (`real`, the
/// driver's own call): never worse on memory (`unserved_anywhere`).
pub fn alloc_unserved(real: impl Fn() -> CuResult) -> CuResult {
    let Some((pool, d)) = serving() else {
        return real();
    };
    let Some(_inside) = guard::enter() else {
        return real();
    };
    unserved_anywhere(pool, d, real)
}

/// `unserved`, then, still out of memory, asked once more after every other device's cache
/// went back: the memory pool a program names, or managed memory, may be on another device
/// than the current context's.
fn unserved_anywhere(
    pool: &Pool<CudaBackend>,
    d: &Driver,
    real: impl Fn() -> CuResult,
) -> CuResult {
    let r = unserved(pool, d, &real);
    if r != cu::CU_ERROR_OUT_OF_MEMORY {
        return r;
    }
    let here = current_context(d).map(|(_, dev)| dev);
    let released: u64 = pool
        .used_devices()
        .into_iter()
        .filter(|&dev| Some(dev) != here)
        .map(|dev| release_on(pool, d, dev))
        .sum();
    if released > 0 {
        return real();
    }
    r
}

/// Releases the pool's cache on the current context's device. Returns the bytes released.
pub(in crate::dispatch) fn release_cache(pool: &Pool<CudaBackend>, d: &Driver) -> u64 {
    current_context(d).map_or(0, |(_, device)| release_on(pool, d, device))
}

/// Releases the pool's cache on `device`, from its primary context (none active: nothing).
fn release_on(pool: &Pool<CudaBackend>, d: &Driver, device: u32) -> u64 {
    in_primary_context(d, device, || {
        crate::dispatch::ready_thread_for_backend(pool, device);
        pool.release_for_others(device)
    })
    .unwrap_or(0)
}
