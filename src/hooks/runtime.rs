//! The CUDA runtime entry points this library exports: the panic boundary, then the one path
//! in `dispatch` that the C API shares.

#![allow(non_snake_case)]

use std::ffi::c_void;

use crate::cuda::others::Entry;
use crate::cuda::runtime::ExecutionCtx;
use crate::cuda::types::*;
use crate::dispatch;
use crate::guard::boundary;
use crate::mempool;
use crate::pool::Origin;

use super::origin::exported_with_origin;
use super::per_thread;

exported_with_origin! {
    /// # Safety
    /// As `cudaMalloc`: `dev_ptr` is NULL or valid for a write.
    fn cudaMalloc(dev_ptr: *mut *mut c_void, size: usize) -> CudaStatus = malloc_from, "rdx"
}

/// `cudaMalloc` made by `origin`.
unsafe extern "C" fn malloc_from(
    dev_ptr: *mut *mut c_void,
    size: usize,
    origin: Origin,
) -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe {
        dispatch::malloc_on(dev_ptr, size, None, None, origin)
    })
}

exported_with_origin! {
    /// # Safety
    /// As `cudaMallocPitch`: `dev_ptr` and `pitch` are NULL or valid for a write.
    fn cudaMallocPitch(dev_ptr: *mut *mut c_void, pitch: *mut usize, width: usize, height: usize)
        -> CudaStatus = malloc_pitch_from, "r8"
}

/// `cudaMallocPitch` made by `origin`.
unsafe extern "C" fn malloc_pitch_from(
    dev_ptr: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
    origin: Origin,
) -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe {
        dispatch::malloc_pitch(dev_ptr, pitch, width, height, origin)
    })
}

/// # Safety
/// As `cudaMemGetInfo`.
#[no_mangle]
pub unsafe extern "C" fn cudaMemGetInfo(free: *mut usize, total: *mut usize) -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe {
        dispatch::mem_get_info(free, total)
    })
}

/// # Safety
/// As `cudaFree`.
#[no_mangle]
pub unsafe extern "C" fn cudaFree(ptr: *mut c_void) -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe { dispatch::free(ptr) })
}

exported_with_origin! {
    /// # Safety
    /// As `cudaMallocAsync`: `dev_ptr` is NULL or valid for a write.
    fn cudaMallocAsync(dev_ptr: *mut *mut c_void, size: usize, stream: Stream) -> CudaStatus =
        malloc_async_from, "rcx"
}

/// `cudaMallocAsync` made by `origin`.
unsafe extern "C" fn malloc_async_from(
    dev_ptr: *mut *mut c_void,
    size: usize,
    stream: Stream,
    origin: Origin,
) -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe {
        mempool::malloc_async(dev_ptr, size, stream, origin)
    })
}

exported_with_origin! {
    /// The per-thread-default-stream form (`nvcc --default-stream per-thread`): stream 0 is the
    /// calling thread's own default stream.
    ///
    /// # Safety
    /// As `cudaMallocAsync`.
    fn cudaMallocAsync_ptsz(dev_ptr: *mut *mut c_void, size: usize, stream: Stream) -> CudaStatus =
        malloc_async_ptsz_from, "rcx"
}

/// `cudaMallocAsync_ptsz` made by `origin`.
unsafe extern "C" fn malloc_async_ptsz_from(
    dev_ptr: *mut *mut c_void,
    size: usize,
    stream: Stream,
    origin: Origin,
) -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe {
        mempool::malloc_async(dev_ptr, size, per_thread(stream), origin)
    })
}

/// The per-thread-default-stream form of `cudaFreeAsync`. A block of the pool freed this way
/// must come back to the pool: the runtime would free the segment under it.
///
/// # Safety
/// As `cudaFreeAsync`.
#[no_mangle]
pub unsafe extern "C" fn cudaFreeAsync_ptsz(ptr: *mut c_void, stream: Stream) -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe {
        dispatch::free_on(ptr, per_thread(stream), None, dispatch::Promise::Runtime)
    })
}

/// # Safety
/// As `cudaMemPoolTrimTo`.
#[no_mangle]
pub unsafe extern "C" fn cudaMemPoolTrimTo(mem_pool: MemPool, keep: usize) -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe {
        mempool::trim_to(mem_pool, keep)
    })
}

/// # Safety
/// As `cudaMemPoolGetAttribute`.
#[no_mangle]
pub unsafe extern "C" fn cudaMemPoolGetAttribute(
    mem_pool: MemPool,
    attr: i32,
    value: *mut c_void,
) -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe {
        mempool::get_attribute(mem_pool, attr, value)
    })
}

/// # Safety
/// As `cudaMemPoolSetAttribute`.
#[no_mangle]
pub unsafe extern "C" fn cudaMemPoolSetAttribute(
    mem_pool: MemPool,
    attr: i32,
    value: *mut c_void,
) -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe {
        mempool::set_attribute(mem_pool, attr, value)
    })
}

/// # Safety
/// As `cudaMallocFromPoolAsync`.
#[no_mangle]
pub unsafe extern "C" fn cudaMallocFromPoolAsync(
    dev_ptr: *mut *mut c_void,
    size: usize,
    mem_pool: MemPool,
    stream: Stream,
) -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe {
        mempool::malloc_from_pool_async(dev_ptr, size, mem_pool, stream)
    })
}

/// # Safety
/// As `cudaMallocManaged`.
#[no_mangle]
pub unsafe extern "C" fn cudaMallocManaged(
    dev_ptr: *mut *mut c_void,
    size: usize,
    flags: u32,
) -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe {
        mempool::malloc_managed(dev_ptr, size, flags)
    })
}

/// # Safety
/// As `cudaMemPoolSetAccess`.
#[no_mangle]
pub unsafe extern "C" fn cudaMemPoolSetAccess(
    mem_pool: MemPool,
    descs: *const crate::cuda::driver::MemAccessDesc,
    count: usize,
) -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe {
        mempool::set_access(mem_pool, descs, count)
    })
}

/// # Safety
/// As `cudaDeviceSetMemPool`.
#[no_mangle]
pub unsafe extern "C" fn cudaDeviceSetMemPool(device: i32, mem_pool: MemPool) -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe {
        mempool::device_set_mem_pool(device, mem_pool)
    })
}

/// # Safety
/// As `cudaMemPoolDestroy`.
#[no_mangle]
pub unsafe extern "C" fn cudaMemPoolDestroy(mem_pool: MemPool) -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe {
        mempool::mem_pool_destroy(mem_pool)
    })
}

/// # Safety
/// As `cudaFreeAsync`.
#[no_mangle]
pub unsafe extern "C" fn cudaFreeAsync(ptr: *mut c_void, stream: Stream) -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe {
        dispatch::free_on(ptr, stream, None, dispatch::Promise::Runtime)
    })
}

/// # Safety
/// As `cudaDeviceReset`.
#[no_mangle]
pub unsafe extern "C" fn cudaDeviceReset() -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe { dispatch::device_reset() })
}

/// # Safety
/// As `cudaDeviceSynchronize`.
#[no_mangle]
pub unsafe extern "C" fn cudaDeviceSynchronize() -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe { dispatch::device_synchronize() })
}

/// # Safety
/// As `cudaStreamSynchronize`.
#[no_mangle]
pub unsafe extern "C" fn cudaStreamSynchronize(stream: Stream) -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe {
        dispatch::stream_synchronize(stream)
    })
}

/// # Safety
/// As `cudaEventSynchronize`.
#[no_mangle]
pub unsafe extern "C" fn cudaEventSynchronize(event: Event) -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe {
        dispatch::event_synchronize(event)
    })
}

/// # Safety
/// As `cudaLaunchKernel`.
#[no_mangle]
pub unsafe extern "C" fn cudaLaunchKernel(
    func: *const c_void,
    grid: Dim3,
    block: Dim3,
    args: *mut *mut c_void,
    shared_mem: usize,
    stream: Stream,
) -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe {
        dispatch::launch_kernel(Entry::Public, func, grid, block, args, shared_mem, stream)
    })
}

/// What `<<<...>>>` compiles to since CUDA 13 (same arguments, a `cudaKernel_t` first).
///
/// # Safety
/// As the runtime's `__cudaLaunchKernel`.
#[no_mangle]
pub unsafe extern "C" fn __cudaLaunchKernel(
    kernel: *const c_void,
    grid: Dim3,
    block: Dim3,
    args: *mut *mut c_void,
    shared_mem: usize,
    stream: Stream,
) -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe {
        dispatch::launch_kernel(
            Entry::Internal,
            kernel,
            grid,
            block,
            args,
            shared_mem,
            stream,
        )
    })
}

/// # Safety
/// As `cudaStreamCreateWithFlags`.
#[no_mangle]
pub unsafe extern "C" fn cudaStreamCreateWithFlags(stream: *mut Stream, flags: u32) -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe {
        dispatch::stream_create_with_flags(stream, flags)
    })
}

/// # Safety
/// As `cudaStreamCreateWithPriority`.
#[no_mangle]
pub unsafe extern "C" fn cudaStreamCreateWithPriority(
    stream: *mut Stream,
    flags: u32,
    priority: i32,
) -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe {
        dispatch::stream_create_with_priority(stream, flags, priority)
    })
}

/// # Safety
/// As `cudaExecutionCtxStreamCreate` (CUDA 13.1).
#[no_mangle]
pub unsafe extern "C" fn cudaExecutionCtxStreamCreate(
    stream: *mut Stream,
    ctx: ExecutionCtx,
    flags: u32,
    priority: i32,
) -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe {
        dispatch::execution_ctx_stream_create(stream, ctx, flags, priority)
    })
}

/// # Safety
/// As `cudaStreamBeginCapture`.
#[no_mangle]
pub unsafe extern "C" fn cudaStreamBeginCapture(stream: Stream, mode: i32) -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe {
        dispatch::stream_begin_capture(stream, mode)
    })
}

/// # Safety
/// As `cudaStreamBeginCaptureToGraph` (CUDA 12.3).
#[no_mangle]
pub unsafe extern "C" fn cudaStreamBeginCaptureToGraph(
    stream: Stream,
    graph: Graph,
    dependencies: *const c_void,
    edge_data: *const c_void,
    count: usize,
    mode: i32,
) -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe {
        dispatch::stream_begin_capture_to_graph(stream, graph, dependencies, edge_data, count, mode)
    })
}

/// # Safety
/// As `cudaStreamEndCapture`.
#[no_mangle]
pub unsafe extern "C" fn cudaStreamEndCapture(stream: Stream, graph: *mut Graph) -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe {
        dispatch::stream_end_capture(stream, graph)
    })
}

/// The per-thread-default-stream forms of the three above, which `nvcc --default-stream
/// per-thread` compiles the plain names to: a capture the pool did not see would be
/// invalidated by its next fence or barrier. The runtime's plain form takes the stream they
/// mean (`per_thread`), as for `cudaMallocAsync_ptsz`.
///
/// # Safety
/// As `cudaStreamBeginCapture`.
#[no_mangle]
pub unsafe extern "C" fn cudaStreamBeginCapture_ptsz(stream: Stream, mode: i32) -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe {
        dispatch::stream_begin_capture(per_thread(stream), mode)
    })
}

/// # Safety
/// As `cudaStreamBeginCaptureToGraph`.
#[no_mangle]
pub unsafe extern "C" fn cudaStreamBeginCaptureToGraph_ptsz(
    stream: Stream,
    graph: Graph,
    dependencies: *const c_void,
    edge_data: *const c_void,
    count: usize,
    mode: i32,
) -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe {
        dispatch::stream_begin_capture_to_graph(
            per_thread(stream),
            graph,
            dependencies,
            edge_data,
            count,
            mode,
        )
    })
}

/// # Safety
/// As `cudaStreamEndCapture`.
#[no_mangle]
pub unsafe extern "C" fn cudaStreamEndCapture_ptsz(
    stream: Stream,
    graph: *mut Graph,
) -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe {
        dispatch::stream_end_capture(per_thread(stream), graph)
    })
}

/// An IPC handle names a whole driver allocation: refused for a pool block it cannot name
/// (`dispatch::ipc`), rather than a handle that maps something else.
///
/// # Safety
/// As `cudaIpcGetMemHandle`.
#[no_mangle]
pub unsafe extern "C" fn cudaIpcGetMemHandle(
    handle: *mut IpcMemHandle,
    ptr: *mut c_void,
) -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe {
        dispatch::ipc_get_mem_handle(handle, ptr)
    })
}

/// # Safety
/// As `cudaDeviceEnablePeerAccess`.
#[no_mangle]
pub unsafe extern "C" fn cudaDeviceEnablePeerAccess(peer: i32, flags: u32) -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe {
        dispatch::peer::device_enable_peer_access(peer, flags)
    })
}

/// # Safety
/// As `cudaSetDevice`.
#[no_mangle]
pub unsafe extern "C" fn cudaSetDevice(device: i32) -> CudaStatus {
    // SAFETY: the caller's contract.
    boundary(ERROR_UNKNOWN, || unsafe {
        dispatch::peer::set_device(device)
    })
}

/// The function a successful lookup wrote, swapped for its driver hook (`hooks::driver::swap`):
/// a `cuMemFree` got this way must not free a pool block's segment under the pool.
///
/// # Safety
/// `func` is NULL or valid for reading and writing a pointer.
unsafe fn swap_entry_point(r: CudaStatus, func: *mut *mut c_void) -> CudaStatus {
    if r == SUCCESS && !func.is_null() {
        // SAFETY: the caller's contract.
        unsafe { *func = super::driver::swap(*func) };
    }
    r
}

/// # Safety
/// As `cudaGetDriverEntryPoint`.
#[no_mangle]
pub unsafe extern "C" fn cudaGetDriverEntryPoint(
    symbol: *const std::ffi::c_char,
    func: *mut *mut c_void,
    flags: u64,
    status: *mut i32,
) -> CudaStatus {
    boundary(ERROR_UNKNOWN, || {
        let g = match dispatch::runtime() {
            Ok(g) => g,
            Err(e) => return e,
        };
        // SAFETY: the caller's arguments, passed on unchanged.
        let r = dispatch::forward(g.runtime.get_driver_entry_point, |f| unsafe {
            f(symbol, func, flags, status)
        });
        // SAFETY: the caller's contract.
        unsafe { swap_entry_point(r, func) }
    })
}

/// # Safety
/// As `cudaGetDriverEntryPointByVersion`.
#[no_mangle]
pub unsafe extern "C" fn cudaGetDriverEntryPointByVersion(
    symbol: *const std::ffi::c_char,
    func: *mut *mut c_void,
    version: u32,
    flags: u64,
    status: *mut i32,
) -> CudaStatus {
    boundary(ERROR_UNKNOWN, || {
        let g = match dispatch::runtime() {
            Ok(g) => g,
            Err(e) => return e,
        };
        // SAFETY: the caller's arguments, passed on unchanged.
        let r = dispatch::forward(g.runtime.get_driver_entry_point_by_version, |f| unsafe {
            f(symbol, func, version, flags, status)
        });
        // SAFETY: the caller's contract.
        unsafe { swap_entry_point(r, func) }
    })
}
