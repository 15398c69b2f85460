//! The driver's context entry points: primary contexts' reset and release, the contexts a
//! program makes (`cuCtxCreate`, green contexts and their streams) or destroys, the thread's
//! current context (`cuCtxSetCurrent`, push and pop) and peer access between contexts. Each is
//! the panic boundary, then `dispatch::driver`, with the driver's real function.

#![allow(non_snake_case)]

use std::ffi::{c_int, c_uint, c_void};

use crate::cuda::driver::*;
use crate::cuda::types::Stream;
use crate::dispatch::driver as dispatch;
use crate::guard::boundary;

/// # Safety
/// As `cuDevicePrimaryCtxReset_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CuDevice) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        dispatch::primary_ctx_reset(dev, || real!(PrimaryCtxReset, DeviceFn, |f| f(dev)))
    })
}

/// # Safety
/// As `cuDevicePrimaryCtxRelease_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CuDevice) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        dispatch::primary_ctx_release(dev, || real!(PrimaryCtxRelease, DeviceFn, |f| f(dev)))
    })
}

/// # Safety
/// As `cuCtxDestroy_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: CuContext) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        dispatch::ctx_destroyed(ctx, || real!(CtxDestroy, CtxFn, |f| f(ctx)))
    })
}

/// # Safety
/// As `cuCtxEnablePeerAccess`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxEnablePeerAccess(peer: CuContext, flags: c_uint) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        dispatch::ctx_enable_peer_access(peer, || {
            real!(CtxEnablePeerAccess, CtxEnablePeerAccessFn, |f| f(
                peer, flags
            ))
        })
    })
}

/// # Safety
/// As `cuCtxSetCurrent`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: CuContext) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        dispatch::ctx_made_current(ctx, || real!(CtxSetCurrent, CtxFn, |f| f(ctx)))
    })
}

/// # Safety
/// As `cuCtxPushCurrent_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(ctx: CuContext) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        dispatch::ctx_made_current(ctx, || real!(CtxPushCurrent, CtxFn, |f| f(ctx)))
    })
}

/// # Safety
/// As `cuCtxPopCurrent_v2`: `ctx` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(ctx: *mut CuContext) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        dispatch::ctx_popped(|| real!(CtxPopCurrent, CtxPopCurrentFn, |f| f(ctx)))
    })
}

/// # Safety
/// As `cuCtxCreate_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(
    ctx: *mut CuContext,
    flags: c_uint,
    dev: CuDevice,
) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        dispatch::ctx_created(|| real!(CtxCreate, CtxCreateFn, |f| f(ctx, flags, dev)))
    })
}

/// # Safety
/// As `cuCtxCreate_v3`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v3(
    ctx: *mut CuContext,
    affinity: *mut c_void,
    affinities: c_int,
    flags: c_uint,
    dev: CuDevice,
) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        dispatch::ctx_created(|| {
            real!(CtxCreateV3, CtxCreateV3Fn, |f| f(
                ctx, affinity, affinities, flags, dev
            ))
        })
    })
}

/// # Safety
/// As `cuCtxCreate_v4`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v4(
    ctx: *mut CuContext,
    params: *mut c_void,
    flags: c_uint,
    dev: CuDevice,
) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        dispatch::ctx_created(|| real!(CtxCreateV4, CtxCreateV4Fn, |f| f(ctx, params, flags, dev)))
    })
}

/// # Safety
/// As `cuGreenCtxCreate` (CUDA 12.4; one ABI, no versioned name).
#[no_mangle]
pub unsafe extern "C" fn cuGreenCtxCreate(
    green: *mut *mut c_void,
    desc: *mut c_void,
    dev: CuDevice,
    flags: c_uint,
) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        dispatch::green_ctx_created(|| {
            real!(GreenCtxCreate, GreenCtxCreateFn, |f| f(
                green, desc, dev, flags
            ))
        })
    })
}

/// # Safety
/// As `cuGreenCtxStreamCreate` (CUDA 12.5; one ABI, no versioned name).
#[no_mangle]
pub unsafe extern "C" fn cuGreenCtxStreamCreate(
    stream: *mut Stream,
    green: *mut c_void,
    flags: c_uint,
    priority: c_int,
) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        dispatch::green_stream_created(real!(GreenCtxStreamCreate, GreenCtxStreamCreateFn, |f| f(
            stream, green, flags, priority
        )))
    })
}
