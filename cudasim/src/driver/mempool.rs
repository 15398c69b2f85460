//! The driver's memory pool calls: the runtime's (`api::mempool`) on the same pools. They name
//! devices, not contexts, so they need `cuInit` and no current context.

use super::{driver_call, CuDevice, CuResult};
use crate::api::mempool::{self, MemPoolProps};
use crate::context;
use crate::faults::Func;
use std::ffi::{c_int, c_void};

/// `CUmemoryPool`: a `cudaMemPool_t`.
pub type CuMemoryPool = *mut c_void;

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(
    pool: *mut CuMemoryPool,
    props: *const MemPoolProps,
) -> CuResult {
    driver_call(Func::cuMemPoolCreate, || {
        context::require_init()?;
        // SAFETY: the caller passes NULL or valid pointers.
        unsafe { mempool::create(pool, props) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CuMemoryPool) -> CuResult {
    driver_call(Func::cuMemPoolDestroy, || {
        context::require_init()?;
        mempool::destroy(pool)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceSetMemPool(dev: CuDevice, pool: CuMemoryPool) -> CuResult {
    driver_call(Func::cuDeviceSetMemPool, || {
        context::require_init()?;
        mempool::set_current(dev, pool)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut CuMemoryPool, dev: CuDevice) -> CuResult {
    driver_call(Func::cuDeviceGetMemPool, || {
        context::require_init()?;
        // SAFETY: the caller passes NULL or a pointer valid for writing a CUmemoryPool.
        unsafe { mempool::get(pool, dev, true) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(
    pool: *mut CuMemoryPool,
    dev: CuDevice,
) -> CuResult {
    driver_call(Func::cuDeviceGetDefaultMemPool, || {
        context::require_init()?;
        // SAFETY: the caller passes NULL or a pointer valid for writing a CUmemoryPool.
        unsafe { mempool::get(pool, dev, false) }
    })
}

/// As `cudaMemPoolGetAttribute` (the same attribute numbers).
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: CuMemoryPool,
    attr: c_int,
    value: *mut c_void,
) -> CuResult {
    driver_call(Func::cuMemPoolGetAttribute, || {
        context::require_init()?;
        // SAFETY: forwarded from the caller.
        unsafe { mempool::get_attribute(pool, attr, value) }
    })
}

/// As `cudaMemPoolSetAttribute`.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: CuMemoryPool,
    attr: c_int,
    value: *mut c_void,
) -> CuResult {
    driver_call(Func::cuMemPoolSetAttribute, || {
        context::require_init()?;
        // SAFETY: forwarded from the caller.
        unsafe { mempool::set_attribute(pool, attr, value) }
    })
}

/// As `cudaMemPoolSetAccess`.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAccess(
    pool: CuMemoryPool,
    descs: *const mempool::MemAccessDesc,
    count: usize,
) -> CuResult {
    driver_call(Func::cuMemPoolSetAccess, || {
        context::require_init()?;
        // SAFETY: forwarded from the caller.
        unsafe { mempool::set_access(pool, descs, count) }
    })
}

/// As `cudaMemPoolTrimTo`.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: CuMemoryPool, min_bytes_to_keep: usize) -> CuResult {
    driver_call(Func::cuMemPoolTrimTo, || {
        context::require_init()?;
        mempool::trim_to(pool, min_bytes_to_keep)
    })
}
