//! Green contexts (CUDA 12.4): a device's SM resource, split and made into a descriptor, a green
//! context made from it, its context handle and its streams. The simulator has no SMs to share
//! out: it keeps the counts the program asked for, and a green context is a context whose
//! streams the primary context's synchronization waits for (`context.rs`).

use super::context::device;
use super::{driver_call, CuContext, CuDevice, CuResult, CuStream};
use crate::context;
use crate::errors::{CudaResult, CU_INVALID_CONTEXT, INVALID_VALUE};
use crate::faults::Func;
use crate::ffi::Out;
use crate::handles::{self, RESOURCE_DESC_MAGIC, STREAM_MAGIC};
use crate::state::with_state;
use crate::timeline::Kind;
use std::ffi::{c_int, c_uint, c_void};

/// `CUgreenCtx`, `CUdevResourceDesc`: opaque pointers.
pub type CuGreenCtx = *mut c_void;
pub type CuDevResourceDesc = *mut c_void;

/// `CU_DEV_RESOURCE_TYPE_SM`, the one resource type CUDA 12 has.
const RESOURCE_TYPE_SM: c_int = 1;
/// The SMs of each simulated device (an H100 SXM's).
const DEVICE_SMS: c_uint = 132;
/// `CU_GREEN_CTX_DEFAULT_STREAM`, the one creation flag.
const GREEN_CTX_DEFAULT_STREAM: c_uint = 1;
/// `CU_STREAM_NON_BLOCKING`, which a green context's stream must have.
const STREAM_NON_BLOCKING: c_uint = 1;

/// `CUdevResource` as CUDA 12's `cuda.h` lays it out: the type, 92 bytes of padding, then a
/// union of 48 bytes whose SM member is its count. (CUDA 13 keeps the 144 bytes.)
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DevResource {
    kind: c_int,
    internal_padding: [u8; 92],
    sm_count: c_uint,
    oversize: [u8; 44],
}

const _: () = assert!(std::mem::size_of::<DevResource>() == 144);

impl DevResource {
    fn sms(sm_count: c_uint) -> DevResource {
        DevResource {
            kind: RESOURCE_TYPE_SM,
            internal_padding: [0; 92],
            sm_count,
            oversize: [0; 44],
        }
    }
}

/// The SM count of a resource the caller passes: an SM resource, or `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// `r` is NULL or valid for reading a `CUdevResource`.
unsafe fn sm_count(r: *const DevResource) -> CudaResult<c_uint> {
    // SAFETY: by the caller's contract.
    match unsafe { r.as_ref() } {
        Some(r) if r.kind == RESOURCE_TYPE_SM => Ok(r.sm_count),
        _ => Err(INVALID_VALUE),
    }
}

/// All of a device's SMs. Another resource type → `CUDA_ERROR_INVALID_VALUE`.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDevResource(
    dev: CuDevice,
    resource: *mut DevResource,
    kind: c_int,
) -> CuResult {
    driver_call(Func::cuDeviceGetDevResource, || {
        context::require_init()?;
        // SAFETY: the caller passes NULL or a pointer valid for writing a CUdevResource.
        let out = unsafe { Out::new(resource)? };
        device(dev)?;
        if kind != RESOURCE_TYPE_SM {
            return Err(INVALID_VALUE);
        }
        out.set(DevResource::sms(DEVICE_SMS));
        Ok(())
    })
}

/// Up to `*groups` groups of `min_count` SMs (at least 1) cut from `input`, the rest into
/// `remaining` (may be NULL); `*groups` says how many were made. With `result` NULL, only how
/// many could be. The flags are accepted and ignored (the simulator has no SM clusters).
#[no_mangle]
pub unsafe extern "C" fn cuDevSmResourceSplitByCount(
    result: *mut DevResource,
    groups: *mut c_uint,
    input: *const DevResource,
    remaining: *mut DevResource,
    _flags: c_uint,
    min_count: c_uint,
) -> CuResult {
    driver_call(Func::cuDevSmResourceSplitByCount, || {
        context::require_init()?;
        // SAFETY: the caller passes NULL or a pointer valid for reading a CUdevResource.
        let total = unsafe { sm_count(input)? };
        if groups.is_null() {
            return Err(INVALID_VALUE);
        }
        let size = min_count.max(1);
        // SAFETY: not NULL, and valid for reading and writing an unsigned int by the contract.
        let asked = unsafe { groups.read() };
        let n = if result.is_null() {
            total / size
        } else {
            (total / size).min(asked)
        };
        for i in 0..n as usize {
            if !result.is_null() {
                // SAFETY: the caller passes room for `*groups` resources, and `n` is no more.
                unsafe { result.add(i).write(DevResource::sms(size)) };
            }
        }
        if !remaining.is_null() {
            // SAFETY: not NULL, and valid for writing a CUdevResource by the contract.
            unsafe { remaining.write(DevResource::sms(total - n * size)) };
        }
        // SAFETY: as read above.
        unsafe { groups.write(n) };
        Ok(())
    })
}

/// A descriptor of `count` SM resources (their counts added), for `cuGreenCtxCreate`.
#[no_mangle]
pub unsafe extern "C" fn cuDevResourceGenerateDesc(
    desc: *mut CuDevResourceDesc,
    resources: *const DevResource,
    count: c_uint,
) -> CuResult {
    driver_call(Func::cuDevResourceGenerateDesc, || {
        context::require_init()?;
        // SAFETY: the caller passes NULL or a pointer valid for writing a CUdevResourceDesc.
        let out = unsafe { Out::new(desc)? };
        if resources.is_null() || count == 0 {
            return Err(INVALID_VALUE);
        }
        let mut sms: c_uint = 0;
        for i in 0..count as usize {
            // SAFETY: the caller passes `count` resources.
            sms = sms.saturating_add(unsafe { sm_count(resources.add(i))? });
        }
        let h = with_state(|st| {
            let h = handles::create(RESOURCE_DESC_MAGIC);
            st.resource_descs.insert(h, sms);
            Ok(h)
        })?;
        out.set(h as CuDevResourceDesc);
        Ok(())
    })
}

/// A green context of `dev` from a descriptor `cuDevResourceGenerateDesc` made (any other →
/// `CUDA_ERROR_INVALID_VALUE`), not made current. Flags 0 or `CU_GREEN_CTX_DEFAULT_STREAM`;
/// either way it has a NULL stream of its own, as a created context has.
#[no_mangle]
pub unsafe extern "C" fn cuGreenCtxCreate(
    green: *mut CuGreenCtx,
    desc: CuDevResourceDesc,
    dev: CuDevice,
    flags: c_uint,
) -> CuResult {
    driver_call(Func::cuGreenCtxCreate, || {
        context::require_init()?;
        // SAFETY: the caller passes NULL or a pointer valid for writing a CUgreenCtx.
        let out = unsafe { Out::new(green)? };
        let d = device(dev)?;
        let known = with_state(|st| Ok(st.resource_descs.contains_key(&(desc as usize))))?;
        if !known || flags & !GREEN_CTX_DEFAULT_STREAM != 0 {
            return Err(INVALID_VALUE);
        }
        let (h, _) = context::create_green(d)?;
        out.set(h as CuGreenCtx);
        Ok(())
    })
}

/// Its context handle goes with it; its work still runs.
#[no_mangle]
pub unsafe extern "C" fn cuGreenCtxDestroy(green: CuGreenCtx) -> CuResult {
    driver_call(Func::cuGreenCtxDestroy, || {
        context::require_init()?;
        context::destroy_green(green as usize)
    })
}

/// The green context's context handle, for `cuCtxSetCurrent`/`cuCtxPushCurrent`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxFromGreenCtx(ctx: *mut CuContext, green: CuGreenCtx) -> CuResult {
    driver_call(Func::cuCtxFromGreenCtx, || {
        context::require_init()?;
        // SAFETY: the caller passes NULL or a pointer valid for writing a CUcontext.
        let out = unsafe { Out::new(ctx)? };
        out.set(context::of_green(green as usize)? as CuContext);
        Ok(())
    })
}

/// A non-blocking stream of the green context, whatever context is current: the flags must
/// name `CU_STREAM_NON_BLOCKING`, as CUDA requires. The priority is accepted and ignored.
#[no_mangle]
pub unsafe extern "C" fn cuGreenCtxStreamCreate(
    stream: *mut CuStream,
    green: CuGreenCtx,
    flags: c_uint,
    _priority: c_int,
) -> CuResult {
    driver_call(Func::cuGreenCtxStreamCreate, || {
        context::require_init()?;
        // SAFETY: the caller passes NULL or a pointer valid for writing a CUstream.
        let out = unsafe { Out::new(stream)? };
        if flags != STREAM_NON_BLOCKING {
            return Err(INVALID_VALUE);
        }
        let ctx = context::of_green(green as usize)?;
        let h = with_state(|st| {
            let d = st.contexts.get(&ctx).copied().ok_or(CU_INVALID_CONTEXT)?;
            let h = handles::create(STREAM_MAGIC);
            st.streams.add(h, d, Kind::NonBlocking, Some(ctx));
            Ok(h)
        })?;
        out.set(h as CuStream);
        Ok(())
    })
}
