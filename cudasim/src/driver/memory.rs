//! Allocation, copies and memory queries. The memory is the runtime's: `cuMemAlloc_v2` and
//! `cudaMalloc` take from the same capacity, and either free takes either pointer.

use super::mempool::CuMemoryPool;
use super::{driver_call, with_ptsz, CuDevicePtr, CuResult, CuStream};
use crate::api::memory::{
    copy, free, free_async, malloc, malloc_async, malloc_from_pool, malloc_managed, mem_get_info,
};
use crate::context;
use crate::errors::{CU_NOT_FOUND, INVALID_VALUE};
use crate::faults::Func;
use crate::ffi::Out;
use crate::memory::Kind;
use crate::state::with_state;
use std::ffi::c_void;

/// The out-pointer of an allocation of `size` bytes: 0 bytes is `CUDA_ERROR_INVALID_VALUE`, as
/// the driver documents (the call is still counted, as a failed one).
///
/// # Safety
/// `dptr` must be NULL or valid for writing a `CUdeviceptr`.
unsafe fn allocation_out(
    dptr: *mut CuDevicePtr,
    size: usize,
) -> crate::errors::CudaResult<Out<*mut c_void>> {
    if size == 0 {
        return Err(INVALID_VALUE);
    }
    // SAFETY: forwarded from the caller; a CUdeviceptr is pointer-sized.
    unsafe { Out::new(dptr.cast()) }
}

/// As `cudaMalloc` (also counted in `driver_mallocs`), except for 0 bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CuDevicePtr, size: usize) -> CuResult {
    driver_call(Func::cuMemAlloc_v2, || {
        context::require_context()?;
        // SAFETY: the caller passes NULL or a pointer valid for writing a CUdeviceptr.
        let out = unsafe { allocation_out(dptr, size) };
        malloc(out, size, true)
    })
}

/// As `cudaMallocPitch` (also counted in `driver_mallocs`), except that an empty row or height
/// is `CUDA_ERROR_INVALID_VALUE`, as is an element size other than 4, 8 or 16 bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CuDevicePtr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: std::ffi::c_uint,
) -> CuResult {
    driver_call(Func::cuMemAllocPitch_v2, || {
        context::require_context()?;
        if width == 0 || height == 0 || !matches!(element_size, 4 | 8 | 16) {
            return Err(INVALID_VALUE);
        }
        // SAFETY: the caller passes NULL or a pointer valid for writing a size_t.
        let pitch_out = unsafe { Out::new(pitch) }?;
        let row = width
            .checked_next_multiple_of(crate::api::memory::PITCH_ALIGNMENT)
            .ok_or(crate::errors::MEMORY_ALLOCATION)?;
        let size = row
            .checked_mul(height)
            .ok_or(crate::errors::MEMORY_ALLOCATION)?;
        // SAFETY: the caller passes NULL or a pointer valid for writing a CUdeviceptr.
        let out = unsafe { allocation_out(dptr, size) };
        malloc(out, size, true)?;
        pitch_out.set(row);
        Ok(())
    })
}

/// As `cudaFree` (also counted in `driver_frees`); 0 succeeds and does nothing.
#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CuDevicePtr) -> CuResult {
    driver_call(Func::cuMemFree_v2, || {
        context::require_context()?;
        if dptr == 0 {
            return Ok(());
        }
        free(dptr as usize, true)
    })
}

with_ptsz! {
    /// As `cudaMallocAsync` (also counted in `driver_mallocs`), except for 0 bytes.
    fn cuMemAllocAsync / cuMemAllocAsync_ptsz (dptr: *mut CuDevicePtr, size: usize, stream: CuStream; stream) {
        context::require_context()?;
        // SAFETY: the caller passes NULL or a pointer valid for writing a CUdeviceptr.
        let out = unsafe { allocation_out(dptr, size) };
        malloc_async(out, size, stream, true)
    }
}

with_ptsz! {
    /// As `cudaMallocFromPoolAsync` (also counted in `driver_mallocs`), except for 0 bytes.
    fn cuMemAllocFromPoolAsync / cuMemAllocFromPoolAsync_ptsz (dptr: *mut CuDevicePtr, size: usize, pool: CuMemoryPool, stream: CuStream; stream) {
        context::require_context()?;
        // SAFETY: the caller passes NULL or a pointer valid for writing a CUdeviceptr.
        let out = unsafe { allocation_out(dptr, size) };
        malloc_from_pool(out, size, pool as usize, stream, true)
    }
}

/// As `cudaMallocManaged` (also counted in `driver_mallocs`), except for 0 bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CuDevicePtr,
    size: usize,
    flags: std::ffi::c_uint,
) -> CuResult {
    driver_call(Func::cuMemAllocManaged, || {
        context::require_context()?;
        // SAFETY: the caller passes NULL or a pointer valid for writing a CUdeviceptr.
        let out = unsafe { allocation_out(dptr, size) };
        malloc_managed(out, size, flags, true)
    })
}

with_ptsz! {
    /// As `cudaFreeAsync` (also counted in `driver_frees`).
    fn cuMemFreeAsync / cuMemFreeAsync_ptsz (dptr: CuDevicePtr, stream: CuStream; stream) {
        context::require_context()?;
        free_async(dptr as usize, stream, true)
    }
}

/// As `cudaIpcGetMemHandle`: the handle names the whole allocation containing `dptr`.
#[no_mangle]
pub unsafe extern "C" fn cuIpcGetMemHandle(
    handle: *mut crate::api::memory::IpcMemHandle,
    dptr: CuDevicePtr,
) -> CuResult {
    driver_call(Func::cuIpcGetMemHandle, || {
        context::require_context()?;
        // SAFETY: the caller passes NULL or a pointer valid for writing the structure.
        unsafe { crate::api::memory::ipc_get_mem_handle(handle, dptr as usize) }
    })
}

/// As `cudaMemGetInfo`, for the current context's device.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CuResult {
    driver_call(Func::cuMemGetInfo_v2, || {
        context::require_context()?;
        // SAFETY: the caller passes NULL or pointers valid for writing a size_t.
        unsafe { mem_get_info(free, total) }
    })
}

/// The base and size of the device allocation, or of the virtual memory mapping, that contains
/// `dptr` (either out-pointer may be NULL); `CUDA_ERROR_NOT_FOUND` outside both.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    base: *mut CuDevicePtr,
    size: *mut usize,
    dptr: CuDevicePtr,
) -> CuResult {
    driver_call(Func::cuMemGetAddressRange_v2, || {
        context::require_context()?;
        let (start, len) = with_state(|st| {
            let p = dptr as usize;
            let a = st
                .allocs
                .live_containing(p)
                .filter(|a| a.kind != Kind::Host);
            let mapped = st.vmm.containing(p).map(|m| (m.base, m.size));
            Ok(a.map(|a| (a.base, a.size)).or(mapped))
        })?
        .ok_or(CU_NOT_FOUND)?;
        if !base.is_null() {
            // SAFETY: not NULL, and the caller passes a pointer valid for writing a CUdeviceptr.
            unsafe { base.write(start as CuDevicePtr) };
        }
        if !size.is_null() {
            // SAFETY: not NULL, and the caller passes a pointer valid for writing a size_t.
            unsafe { size.write(len) };
        }
        Ok(())
    })
}

/// As `cudaMemcpy(..., cudaMemcpyHostToDevice)`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dst: CuDevicePtr,
    src: *const c_void,
    count: usize,
) -> CuResult {
    driver_call(Func::cuMemcpyHtoD_v2, || {
        context::require_context()?;
        copy(dst as *mut c_void, src, count, 1, None)
    })
}

/// As `cudaMemcpy(..., cudaMemcpyDeviceToHost)`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(
    dst: *mut c_void,
    src: CuDevicePtr,
    count: usize,
) -> CuResult {
    driver_call(Func::cuMemcpyDtoH_v2, || {
        context::require_context()?;
        copy(dst, src as *const c_void, count, 2, None)
    })
}
