//! PyTorch's pluggable allocator: `torch.cuda.memory.CUDAPluggableAllocator(path,
//! "gpupool_torch_malloc", "gpupool_torch_free")` loads these two by name.

use std::ffi::{c_int, c_void};

use super::context::{on_device, state};
use super::memory::{free_async_on, malloc_async_on};
use super::{
    cudaStream_t, gpupool_empty_cache, ssize_t, GPUPOOL_ALL_DEVICES, GPUPOOL_ERROR_INVALID_VALUE,
    GPUPOOL_ERROR_MEMORY_ALLOCATION, GPUPOOL_SUCCESS,
};
use crate::guard::boundary;
use crate::log;

/// PyTorch's allocation function (`void *alloc(ssize_t size, int device, cudaStream_t
/// stream)`): `size` bytes on `device` for use on `stream`, whatever device is current (it is
/// made current for the call, then the previous one is restored). Returns NULL for size 0, and
/// when the memory cannot be had (out of memory, a bad device, a negative size): PyTorch does
/// not check for NULL, so each such failure also prints one line on stderr.
///
/// # Safety
/// `stream` is NULL, `cudaStreamLegacy`, `cudaStreamPerThread` or a live stream of `device`.
#[no_mangle]
pub unsafe extern "C" fn gpupool_torch_malloc(
    size: ssize_t,
    device: c_int,
    stream: cudaStream_t,
) -> *mut c_void {
    boundary(std::ptr::null_mut(), || {
        crate::frameworks::note_pluggable();
        // A cached block needs no device made current.
        if let (Ok(size), Ok(device)) = (usize::try_from(size), u32::try_from(device)) {
            if let Some(p) = crate::dispatch::malloc_hit_on(size, device, stream, 0) {
                return p;
            }
        }
        let g = match state() {
            Ok(g) => g,
            Err(e) => return refuse(size, device, e),
        };
        let (Ok(size), Ok(device)) = (usize::try_from(size), u32::try_from(device)) else {
            return refuse(size, device, GPUPOOL_ERROR_INVALID_VALUE);
        };
        let mut p = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer; the caller's stream; `device` is made current.
        let r = on_device(&g.runtime, device, || unsafe {
            malloc_async_on(&mut p, size, stream, Some(device))
        });
        match r {
            Ok(GPUPOOL_SUCCESS) => p,
            Ok(e) | Err(e) => refuse(size as ssize_t, device as c_int, e),
        }
    })
}

/// A failed allocation: NULL, and the line PyTorch will not print.
fn refuse(size: ssize_t, device: c_int, status: c_int) -> *mut c_void {
    log::warn(&format!(
        "gpupool_torch_malloc({size} bytes, device {device}) failed with CUDA error {status}{}; \
         returned NULL",
        if status == GPUPOOL_ERROR_MEMORY_ALLOCATION {
            " (out of memory)"
        } else {
            ""
        }
    ));
    std::ptr::null_mut()
}

/// PyTorch's free function (`void free(void *ptr, ssize_t size, int device, cudaStream_t
/// stream)`): gives `ptr` back in the order of `stream`, the stream it was allocated on (see
/// `gpupool_free_async`: in `relaxed` mode the next allocation on that stream may take it at
/// once). `size` is not needed: the pool knows its blocks; `device` is where it looks first (a
/// wrong one costs a search of the others). A free that fails (a pointer that is not a live
/// allocation, or one the runtime's `cudaFreeAsync` refuses) prints one line on stderr each
/// time, and leaves no error behind in `cudaGetLastError`: PyTorch cannot be told, and its next
/// check would blame an unrelated kernel.
///
/// # Safety
/// `ptr` is NULL or came from `gpupool_torch_malloc`; `stream` as there.
#[no_mangle]
pub unsafe extern "C" fn gpupool_torch_free(
    ptr: *mut c_void,
    size: ssize_t,
    device: c_int,
    stream: cudaStream_t,
) {
    boundary((), || {
        // SAFETY: the caller's arguments, as gpupool_free_async takes them.
        let r = unsafe { free_async_on(ptr, stream, u32::try_from(device).ok()) };
        if r == GPUPOOL_SUCCESS {
            return;
        }
        // Not left behind for PyTorch's next check, as for the pool's own queries.
        if let Ok(g) = state() {
            crate::dispatch::own_query(&g.runtime, r);
        }
        log::warn(&format!(
            "gpupool_torch_free({ptr:p}, {size} bytes, device {device}) failed with CUDA error \
             {r}{}; nothing freed",
            if r == GPUPOOL_ERROR_INVALID_VALUE {
                " (not a live allocation)"
            } else {
                ""
            }
        ));
    })
}

/// Empties the cache of every device (`gpupool_empty_cache(-1, NULL)`), with the `void(void)`
/// signature of PyTorch's C++ `CUDAPluggableAllocator::set_reset_fn`, which
/// `torch.cuda.empty_cache()` calls. The Python class offers no way to register it: call it
/// through ctypes, or register it from a C++ extension.
#[no_mangle]
pub extern "C" fn gpupool_torch_empty_cache() {
    boundary((), || {
        // SAFETY: NULL is an allowed `released` argument.
        unsafe { gpupool_empty_cache(GPUPOOL_ALL_DEVICES, std::ptr::null_mut()) };
    })
}
