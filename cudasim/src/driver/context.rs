//! Initialization, versions, devices and contexts.

use super::{driver_call, CuContext, CuDevice, CuResult};
use crate::api::device::{reset, synchronize_context, synchronize_device, VERSION};
use crate::config;
use crate::context::{self, primary};
use crate::current;
use crate::errors::{
    CudaResult, CU_INVALID_CONTEXT, CU_NOT_SUPPORTED, INVALID_DEVICE, INVALID_VALUE,
};
use crate::faults::Func;
use crate::ffi::Out;
use crate::state::with_state;
use std::ffi::{c_int, c_uint, c_void};

/// A device ordinal in range (`CUDA_ERROR_INVALID_DEVICE` otherwise).
pub(super) fn device(dev: CuDevice) -> CudaResult<usize> {
    let d = usize::try_from(dev).map_err(|_| INVALID_DEVICE)?;
    if d < config::get()?.devices {
        Ok(d)
    } else {
        Err(INVALID_DEVICE)
    }
}

/// `Flags` must be 0, as in CUDA.
#[no_mangle]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CuResult {
    driver_call(Func::cuInit, || {
        if flags != 0 {
            return Err(crate::errors::INVALID_VALUE);
        }
        context::initialize()
    })
}

/// Callable before `cuInit`; the runtime's version number (12080).
#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CuResult {
    driver_call(Func::cuDriverGetVersion, || {
        // SAFETY: the caller passes NULL or a pointer valid for writing an int.
        unsafe { Out::new(version)? }.set(VERSION);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CuResult {
    driver_call(Func::cuDeviceGetCount, || {
        context::require_init()?;
        // SAFETY: the caller passes NULL or a pointer valid for writing an int.
        let out = unsafe { Out::new(count)? };
        out.set(config::get()?.devices as c_int);
        Ok(())
    })
}

/// A `CUdevice` is the device's ordinal.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(dev: *mut CuDevice, ordinal: c_int) -> CuResult {
    driver_call(Func::cuDeviceGet, || {
        context::require_init()?;
        // SAFETY: the caller passes NULL or a pointer valid for writing a CUdevice.
        let out = unsafe { Out::new(dev)? };
        out.set(device(ordinal)? as CuDevice);
        Ok(())
    })
}

/// `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED` and
/// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED`: the attributes modelled.
const ATTRIBUTE_VMM_SUPPORTED: c_int = 102;
const ATTRIBUTE_RDMA_WITH_VMM_SUPPORTED: c_int = 110;

/// The attributes the simulator models; any other → `CUDA_ERROR_INVALID_VALUE`. Needs no
/// context.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    value: *mut c_int,
    attribute: c_int,
    dev: CuDevice,
) -> CuResult {
    driver_call(Func::cuDeviceGetAttribute, || {
        context::require_init()?;
        // SAFETY: the caller passes NULL or a pointer valid for writing an int.
        let out = unsafe { Out::new(value)? };
        device(dev)?;
        let answer = match attribute {
            ATTRIBUTE_VMM_SUPPORTED => true,
            ATTRIBUTE_RDMA_WITH_VMM_SUPPORTED => config::get()?.vmm_rdma,
            _ => return Err(crate::errors::INVALID_VALUE),
        };
        out.set(c_int::from(answer));
        Ok(())
    })
}

/// The device's primary context (its handle is fixed for the process), whose memory the
/// runtime uses too; retaining it makes it (takes `CUDASIM_CONTEXT_BYTES`).
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut CuContext, dev: CuDevice) -> CuResult {
    driver_call(Func::cuDevicePrimaryCtxRetain, || {
        context::require_init()?;
        // SAFETY: the caller passes NULL or a pointer valid for writing a CUcontext.
        let out = unsafe { Out::new(ctx)? };
        let d = device(dev)?;
        with_state(|st| {
            st.activate_primary(d);
            st.primary_retains[d] += 1;
            Ok(())
        })?;
        out.set(primary(d) as CuContext);
        Ok(())
    })
}

/// Releasing a primary context that is not retained gives `CUDA_ERROR_INVALID_CONTEXT`. The
/// last release drops nothing (CUDA destroys the context then; the runtime's own use keeps
/// it alive in practice).
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CuDevice) -> CuResult {
    driver_call(Func::cuDevicePrimaryCtxRelease_v2, || {
        context::require_init()?;
        let d = device(dev)?;
        with_state(|st| {
            let n = &mut st.primary_retains[d];
            *n = n.checked_sub(1).ok_or(CU_INVALID_CONTEXT)?;
            Ok(())
        })
    })
}

/// Whether the device's primary context is active (its context exists: retained, or used by
/// the runtime), and its flags (always 0). Never makes the context.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: CuDevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CuResult {
    driver_call(Func::cuDevicePrimaryCtxGetState, || {
        context::require_init()?;
        let d = device(dev)?;
        // SAFETY: the caller passes NULL or pointers valid for writing an unsigned int and an int.
        let (flags, active) = unsafe { (Out::new(flags)?, Out::new(active)?) };
        let on = with_state(|st| Ok(st.devices[d].primary_active))?;
        flags.set(0);
        active.set(c_int::from(on));
        Ok(())
    })
}

/// As `cudaDeviceReset` of that device: waits for its work, then drops its allocations,
/// streams, events and context.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CuDevice) -> CuResult {
    driver_call(Func::cuDevicePrimaryCtxReset_v2, || {
        context::require_init()?;
        reset(device(dev)?)
    })
}

/// NULL when the thread has no current context.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut CuContext) -> CuResult {
    driver_call(Func::cuCtxGetCurrent, || {
        context::require_init()?;
        // SAFETY: the caller passes NULL or a pointer valid for writing a CUcontext.
        let out = unsafe { Out::new(ctx)? };
        out.set(context::current_context().unwrap_or(0) as CuContext);
        Ok(())
    })
}

/// Replaces the top of the thread's context stack (NULL: pops it); the context's device
/// becomes the runtime's current device.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: CuContext) -> CuResult {
    driver_call(Func::cuCtxSetCurrent, || {
        context::require_init()?;
        context::set_current(ctx as usize)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(dev: *mut CuDevice) -> CuResult {
    driver_call(Func::cuCtxGetDevice, || {
        context::require_context()?;
        // SAFETY: the caller passes NULL or a pointer valid for writing a CUdevice.
        let out = unsafe { Out::new(dev)? };
        out.set(current::get() as CuDevice);
        Ok(())
    })
}

/// As `cudaDeviceSynchronize` (counted in `device_syncs`).
#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CuResult {
    driver_call(Func::cuCtxSynchronize, || {
        context::require_context()?;
        synchronize_device()
    })
}

/// CUDA 13's `cuCtxSynchronize_v2`: waits for `ctx`'s work (NULL: the current context's), as
/// `cuCtxSynchronize` with `ctx` current, and leaves the thread's context as it was.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize_v2(ctx: CuContext) -> CuResult {
    driver_call(Func::cuCtxSynchronize_v2, || {
        if ctx.is_null() {
            context::require_context()?;
            return synchronize_device();
        }
        context::require_init()?;
        let d = context::device_of(ctx as usize)?;
        synchronize_context(d, context::created(ctx as usize))
    })
}

/// A context distinct from the primary one, of device `dev`, pushed on the thread's stack.
/// It shares its device's memory and events, and has streams of its own, a legacy default
/// stream too (see `context.rs`). The flags are accepted and ignored.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(
    ctx: *mut CuContext,
    _flags: c_uint,
    dev: CuDevice,
) -> CuResult {
    // SAFETY: the caller's out-pointer, passed on.
    driver_call(Func::cuCtxCreate_v2, || unsafe { create(ctx, dev) })
}

/// A created context of `dev`, pushed on the stack, into `*ctx`.
///
/// # Safety
/// `ctx` is NULL or valid for writing a CUcontext.
unsafe fn create(ctx: *mut CuContext, dev: CuDevice) -> CudaResult {
    context::require_init()?;
    // SAFETY: as the caller passes it.
    let out = unsafe { Out::new(ctx)? };
    let h = context::create(device(dev)?)?;
    out.set(h as CuContext);
    Ok(())
}

/// `cuCtxCreate_v2` with execution affinity parameters (MPS), CUDA 11.4's ABI, which
/// `cuGetProcAddress("cuCtxCreate")` gives for versions 11.4 to 12.4. No parameters make a
/// regular context; the simulator has no execution affinity (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v3(
    ctx: *mut CuContext,
    affinity: *mut c_void,
    affinities: c_int,
    _flags: c_uint,
    dev: CuDevice,
) -> CuResult {
    driver_call(Func::cuCtxCreate_v3, || {
        match affinities {
            0 => {}
            n if n < 0 || affinity.is_null() => return Err(INVALID_VALUE),
            _ => return Err(CU_NOT_SUPPORTED),
        }
        // SAFETY: the caller's out-pointer, passed on.
        unsafe { create(ctx, dev) }
    })
}

/// `CUctxCreateParams`.
#[repr(C)]
pub struct CtxCreateParams {
    exec_affinity_params: *mut c_void,
    num_exec_affinity_params: c_int,
    cig_params: *mut c_void,
}

/// `cuCtxCreate_v2` with CUDA 12.5's parameters, the ABI CUDA 13's `cuCtxCreate` names. NULL
/// parameters, or ones that name neither execution affinity (MPS) nor CIG (graphics interop),
/// make a regular context; the simulator has neither of those (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v4(
    ctx: *mut CuContext,
    params: *const CtxCreateParams,
    _flags: c_uint,
    dev: CuDevice,
) -> CuResult {
    driver_call(Func::cuCtxCreate_v4, || {
        // SAFETY: the caller passes NULL or a pointer valid for reading the structure.
        if let Some(p) = unsafe { params.as_ref() } {
            if !p.exec_affinity_params.is_null() || !p.cig_params.is_null() {
                return Err(CU_NOT_SUPPORTED);
            }
            if p.num_exec_affinity_params != 0 {
                return Err(INVALID_VALUE);
            }
        }
        // SAFETY: the caller's out-pointer, passed on.
        unsafe { create(ctx, dev) }
    })
}

/// Only created contexts can be destroyed; the memory allocated in one goes with it.
#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: CuContext) -> CuResult {
    driver_call(Func::cuCtxDestroy_v2, || {
        context::require_init()?;
        context::destroy(ctx as usize)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(ctx: CuContext) -> CuResult {
    driver_call(Func::cuCtxPushCurrent_v2, || {
        context::require_init()?;
        context::push(ctx as usize)
    })
}

/// `ctx` may be NULL; an empty stack gives `CUDA_ERROR_INVALID_CONTEXT`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(ctx: *mut CuContext) -> CuResult {
    driver_call(Func::cuCtxPopCurrent_v2, || {
        context::require_init()?;
        let h = context::pop()?;
        if !ctx.is_null() {
            // SAFETY: not NULL, and the caller passes a pointer valid for writing a CUcontext.
            unsafe { ctx.write(h as CuContext) };
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(
    can: *mut c_int,
    dev: CuDevice,
    peer: CuDevice,
) -> CuResult {
    driver_call(Func::cuDeviceCanAccessPeer, || {
        context::require_init()?;
        // SAFETY: the caller passes NULL or a pointer valid for writing an int.
        crate::api::peer::can_access(unsafe { Out::new(can) }, dev, peer)
    })
}

/// The current context's device may reach the memory of `peer`'s device (`flags` 0).
#[no_mangle]
pub unsafe extern "C" fn cuCtxEnablePeerAccess(peer: CuContext, flags: c_uint) -> CuResult {
    driver_call(Func::cuCtxEnablePeerAccess, || {
        context::require_context()?;
        crate::api::peer::enable(context::device_of(peer as usize)?, flags)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxDisablePeerAccess(peer: CuContext) -> CuResult {
    driver_call(Func::cuCtxDisablePeerAccess, || {
        context::require_context()?;
        crate::api::peer::disable(context::device_of(peer as usize)?)
    })
}
