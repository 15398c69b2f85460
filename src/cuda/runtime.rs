//! The application's CUDA runtime, as a table of its entry points.

use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicU8, Ordering};

use super::contexts::KeepContext;
use super::driver;
pub use super::symbols::Lookup;
use super::symbols::{optional, required};
use super::types::{
    CudaStatus, Dim3, Event, Graph, IpcMemHandle, MemPool, Stream, ERROR_INSUFFICIENT_DRIVER,
    SUCCESS,
};

pub type MallocFn = unsafe extern "C" fn(*mut *mut c_void, usize) -> CudaStatus;
pub type MallocPitchFn =
    unsafe extern "C" fn(*mut *mut c_void, *mut usize, usize, usize) -> CudaStatus;
pub type MallocAsyncFn = unsafe extern "C" fn(*mut *mut c_void, usize, Stream) -> CudaStatus;
pub type MallocFromPoolAsyncFn =
    unsafe extern "C" fn(*mut *mut c_void, usize, MemPool, Stream) -> CudaStatus;
pub type MallocManagedFn = unsafe extern "C" fn(*mut *mut c_void, usize, u32) -> CudaStatus;
pub type FreeFn = unsafe extern "C" fn(*mut c_void) -> CudaStatus;
pub type FreeAsyncFn = unsafe extern "C" fn(*mut c_void, Stream) -> CudaStatus;
pub type GetDeviceFn = unsafe extern "C" fn(*mut i32) -> CudaStatus;
pub type SetDeviceFn = unsafe extern "C" fn(i32) -> CudaStatus;
pub type VoidFn = unsafe extern "C" fn() -> CudaStatus;
pub type StreamFn = unsafe extern "C" fn(Stream) -> CudaStatus;
pub type EventFn = unsafe extern "C" fn(Event) -> CudaStatus;
pub type EventRecordFn = unsafe extern "C" fn(Event, Stream) -> CudaStatus;
pub type StreamWaitEventFn = unsafe extern "C" fn(Stream, Event, u32) -> CudaStatus;
pub type EventCreateWithFlagsFn = unsafe extern "C" fn(*mut Event, u32) -> CudaStatus;
pub type MemGetInfoFn = unsafe extern "C" fn(*mut usize, *mut usize) -> CudaStatus;
pub type StreamGetFlagsFn = unsafe extern "C" fn(Stream, *mut u32) -> CudaStatus;
pub type StreamGetIdFn = unsafe extern "C" fn(Stream, *mut u64) -> CudaStatus;
pub type StreamIsCapturingFn = unsafe extern "C" fn(Stream, *mut i32) -> CudaStatus;
pub type StreamBeginCaptureFn = unsafe extern "C" fn(Stream, i32) -> CudaStatus;
pub type StreamEndCaptureFn = unsafe extern "C" fn(Stream, *mut Graph) -> CudaStatus;
/// `cudaStreamBeginCaptureToGraph` (CUDA 12.3): stream, graph, dependencies, their edge data,
/// their number, mode.
pub type StreamBeginCaptureToGraphFn =
    unsafe extern "C" fn(Stream, Graph, *const c_void, *const c_void, usize, i32) -> CudaStatus;
pub type StreamCreateWithFlagsFn = unsafe extern "C" fn(*mut Stream, u32) -> CudaStatus;
pub type StreamCreateWithPriorityFn = unsafe extern "C" fn(*mut Stream, u32, i32) -> CudaStatus;
/// `cudaExecutionContext_t` (CUDA 13.1): an opaque pointer.
pub type ExecutionCtx = *mut c_void;
/// `cudaExecutionCtxStreamCreate`: the stream out, the execution context, flags, priority.
pub type ExecutionCtxStreamCreateFn =
    unsafe extern "C" fn(*mut Stream, ExecutionCtx, u32, i32) -> CudaStatus;
/// `cudaExecutionCtxGetDevice`: the device out, the execution context.
pub type ExecutionCtxGetDeviceFn = unsafe extern "C" fn(*mut i32, ExecutionCtx) -> CudaStatus;
/// `cudaDeviceGetExecutionCtx`: the execution context out, the device.
pub type DeviceGetExecutionCtxFn = unsafe extern "C" fn(*mut ExecutionCtx, i32) -> CudaStatus;
pub type LaunchKernelFn =
    unsafe extern "C" fn(*const c_void, Dim3, Dim3, *mut *mut c_void, usize, Stream) -> CudaStatus;
pub type IpcGetMemHandleFn = unsafe extern "C" fn(*mut IpcMemHandle, *mut c_void) -> CudaStatus;
pub type DeviceEnablePeerAccessFn = unsafe extern "C" fn(i32, u32) -> CudaStatus;
pub type GetErrorStringFn = unsafe extern "C" fn(CudaStatus) -> *const c_char;
pub type StreamGetDeviceFn = unsafe extern "C" fn(Stream, *mut i32) -> CudaStatus;
pub type DeviceGetDefaultMemPoolFn = unsafe extern "C" fn(*mut MemPool, i32) -> CudaStatus;
pub type DeviceSetMemPoolFn = unsafe extern "C" fn(i32, MemPool) -> CudaStatus;
pub type MemPoolFn = unsafe extern "C" fn(MemPool) -> CudaStatus;
pub type MemPoolTrimToFn = unsafe extern "C" fn(MemPool, usize) -> CudaStatus;
pub type MemPoolAttributeFn = unsafe extern "C" fn(MemPool, i32, *mut c_void) -> CudaStatus;
pub type MemPoolSetAccessFn =
    unsafe extern "C" fn(MemPool, *const super::driver::MemAccessDesc, usize) -> CudaStatus;
pub type ExchangeCaptureModeFn = unsafe extern "C" fn(*mut i32) -> CudaStatus;
pub type GetDriverEntryPointFn =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, u64, *mut i32) -> CudaStatus;
pub type GetDriverEntryPointByVersionFn =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, u32, u64, *mut i32) -> CudaStatus;

/// Entry points of the runtime the application uses. The first group must exist for the pool to
/// work; the rest are forwarded to when the application calls them, so they exist whenever the
/// application could call them.
#[derive(Clone, Copy)]
pub struct Runtime {
    pub malloc: MallocFn,
    pub free: FreeFn,
    pub get_device: GetDeviceFn,
    pub device_synchronize: VoidFn,
    pub get_last_error: VoidFn,
    /// `cudaPeekAtLastError`: what a failed call the pool makes on its own must leave in
    /// place (`last_error.rs`).
    pub peek_at_last_error: Option<VoidFn>,
    pub mem_get_info: MemGetInfoFn,
    pub event_record: EventRecordFn,
    pub stream_wait_event: StreamWaitEventFn,
    pub event_create_with_flags: EventCreateWithFlagsFn,
    pub free_async: Option<FreeAsyncFn>,
    pub malloc_async: Option<MallocAsyncFn>,
    pub malloc_pitch: Option<MallocPitchFn>,
    pub set_device: Option<SetDeviceFn>,
    pub get_device_count: Option<GetDeviceFn>,
    pub device_reset: Option<VoidFn>,
    pub stream_synchronize: Option<StreamFn>,
    pub event_synchronize: Option<EventFn>,
    pub stream_get_flags: Option<StreamGetFlagsFn>,
    /// `cudaStreamGetId` (CUDA 12 and later): names streams for stream-ordered reuse.
    pub stream_get_id: Option<StreamGetIdFn>,
    /// `cudaStreamIsCapturing`: no stream id is asked of a stream being captured into a graph.
    pub stream_is_capturing: Option<StreamIsCapturingFn>,
    /// `cudaStreamBeginCapture` and `cudaStreamEndCapture`: no fence or barrier during a capture.
    pub stream_begin_capture: Option<StreamBeginCaptureFn>,
    pub stream_end_capture: Option<StreamEndCaptureFn>,
    pub stream_begin_capture_to_graph: Option<StreamBeginCaptureToGraphFn>,
    pub stream_create_with_flags: Option<StreamCreateWithFlagsFn>,
    pub stream_create_with_priority: Option<StreamCreateWithPriorityFn>,
    /// `cudaExecutionCtxStreamCreate` and what tells a device's primary execution context
    /// (CUDA 13.1): a stream made in another may escape the barriers.
    pub execution_ctx_stream_create: Option<ExecutionCtxStreamCreateFn>,
    pub execution_ctx_get_device: Option<ExecutionCtxGetDeviceFn>,
    pub device_get_execution_ctx: Option<DeviceGetExecutionCtxFn>,
    pub launch_kernel: Option<LaunchKernelFn>,
    /// `__cudaLaunchKernel`, the target of `<<<...>>>` since CUDA 13.
    pub launch_kernel_internal: Option<LaunchKernelFn>,
    pub ipc_get_mem_handle: Option<IpcGetMemHandleFn>,
    /// `cudaDeviceEnablePeerAccess`: the pool gives the peer access to its mapped memory too.
    pub device_enable_peer_access: Option<DeviceEnablePeerAccessFn>,
    pub get_error_string: Option<GetErrorStringFn>,
    /// `cudaStreamGetDevice` (CUDA 12.8 and later): the device of a stream `cudaMallocAsync`
    /// names.
    pub stream_get_device: Option<StreamGetDeviceFn>,
    /// The default memory pool's calls, which PyTorch's `cudaMallocAsync` backend makes
    /// (`mempool.rs`).
    pub device_get_default_mem_pool: Option<DeviceGetDefaultMemPoolFn>,
    pub mem_pool_trim_to: Option<MemPoolTrimToFn>,
    pub mem_pool_get_attribute: Option<MemPoolAttributeFn>,
    pub mem_pool_set_attribute: Option<MemPoolAttributeFn>,
    /// `cudaMemPoolSetAccess`: the devices a default pool's access names are its device's peers.
    pub mem_pool_set_access: Option<MemPoolSetAccessFn>,
    /// Allocators the pool leaves to the runtime, which get its cache back at out-of-memory
    /// (`mempool.rs`).
    pub malloc_from_pool_async: Option<MallocFromPoolAsyncFn>,
    pub malloc_managed: Option<MallocManagedFn>,
    /// Each device's current pool: the program's own is left to the runtime (`mempool.rs`).
    pub device_get_mem_pool: Option<DeviceGetDefaultMemPoolFn>,
    pub device_set_mem_pool: Option<DeviceSetMemPoolFn>,
    pub mem_pool_destroy: Option<MemPoolFn>,
    /// The driver's functions through the runtime (CUDA 12.0; `ByVersion` 12.5): their answers
    /// are swapped for the driver hooks, as `cuGetProcAddress`'s are.
    pub get_driver_entry_point: Option<GetDriverEntryPointFn>,
    /// `cudaThreadExchangeStreamCaptureMode`: the pool's own segment allocations run in relaxed
    /// mode, so that another thread's capture in global mode does not refuse them.
    pub thread_exchange_stream_capture_mode: Option<ExchangeCaptureModeFn>,
    pub get_driver_entry_point_by_version: Option<GetDriverEntryPointByVersionFn>,
}

impl Runtime {
    /// Build the table from a symbol lookup.
    pub fn resolve(lookup: Lookup) -> Result<Runtime, &'static str> {
        Ok(Runtime {
            malloc: required!(lookup, "the runtime", "cudaMalloc"),
            free: required!(lookup, "the runtime", "cudaFree"),
            get_device: required!(lookup, "the runtime", "cudaGetDevice"),
            device_synchronize: required!(lookup, "the runtime", "cudaDeviceSynchronize"),
            get_last_error: required!(lookup, "the runtime", "cudaGetLastError"),
            mem_get_info: required!(lookup, "the runtime", "cudaMemGetInfo"),
            event_record: required!(lookup, "the runtime", "cudaEventRecord"),
            stream_wait_event: required!(lookup, "the runtime", "cudaStreamWaitEvent"),
            event_create_with_flags: required!(lookup, "the runtime", "cudaEventCreateWithFlags"),
            peek_at_last_error: optional!(lookup, "cudaPeekAtLastError"),
            free_async: optional!(lookup, "cudaFreeAsync"),
            malloc_async: optional!(lookup, "cudaMallocAsync"),
            malloc_pitch: optional!(lookup, "cudaMallocPitch"),
            set_device: optional!(lookup, "cudaSetDevice"),
            get_device_count: optional!(lookup, "cudaGetDeviceCount"),
            device_reset: optional!(lookup, "cudaDeviceReset"),
            stream_synchronize: optional!(lookup, "cudaStreamSynchronize"),
            event_synchronize: optional!(lookup, "cudaEventSynchronize"),
            stream_get_flags: optional!(lookup, "cudaStreamGetFlags"),
            stream_get_id: optional!(lookup, "cudaStreamGetId"),
            stream_is_capturing: optional!(lookup, "cudaStreamIsCapturing"),
            stream_begin_capture: optional!(lookup, "cudaStreamBeginCapture"),
            stream_end_capture: optional!(lookup, "cudaStreamEndCapture"),
            stream_begin_capture_to_graph: optional!(lookup, "cudaStreamBeginCaptureToGraph"),
            stream_create_with_flags: optional!(lookup, "cudaStreamCreateWithFlags"),
            stream_create_with_priority: optional!(lookup, "cudaStreamCreateWithPriority"),
            execution_ctx_stream_create: optional!(lookup, "cudaExecutionCtxStreamCreate"),
            execution_ctx_get_device: optional!(lookup, "cudaExecutionCtxGetDevice"),
            device_get_execution_ctx: optional!(lookup, "cudaDeviceGetExecutionCtx"),
            launch_kernel: optional!(lookup, "cudaLaunchKernel"),
            launch_kernel_internal: optional!(lookup, "__cudaLaunchKernel"),
            ipc_get_mem_handle: optional!(lookup, "cudaIpcGetMemHandle"),
            device_enable_peer_access: optional!(lookup, "cudaDeviceEnablePeerAccess"),
            get_error_string: optional!(lookup, "cudaGetErrorString"),
            stream_get_device: optional!(lookup, "cudaStreamGetDevice"),
            device_get_default_mem_pool: optional!(lookup, "cudaDeviceGetDefaultMemPool"),
            mem_pool_trim_to: optional!(lookup, "cudaMemPoolTrimTo"),
            mem_pool_get_attribute: optional!(lookup, "cudaMemPoolGetAttribute"),
            mem_pool_set_attribute: optional!(lookup, "cudaMemPoolSetAttribute"),
            mem_pool_set_access: optional!(lookup, "cudaMemPoolSetAccess"),
            malloc_from_pool_async: optional!(lookup, "cudaMallocFromPoolAsync"),
            malloc_managed: optional!(lookup, "cudaMallocManaged"),
            device_get_mem_pool: optional!(lookup, "cudaDeviceGetMemPool"),
            device_set_mem_pool: optional!(lookup, "cudaDeviceSetMemPool"),
            mem_pool_destroy: optional!(lookup, "cudaMemPoolDestroy"),
            get_driver_entry_point: optional!(lookup, "cudaGetDriverEntryPoint"),
            thread_exchange_stream_capture_mode: optional!(
                lookup,
                "cudaThreadExchangeStreamCaptureMode"
            ),
            get_driver_entry_point_by_version: optional!(
                lookup,
                "cudaGetDriverEntryPointByVersion"
            ),
        })
    }

    /// The calling thread's current device.
    pub fn current_device(&self) -> Result<i32, CudaStatus> {
        let mut d = 0;
        // SAFETY: `d` is a valid out-pointer for the duration of the call.
        match unsafe { (self.get_device)(&mut d) } {
            0 => Ok(d),
            e => Err(e),
        }
    }

    /// Run `f` with `device` current on this thread, then make the previous device current
    /// again (even when `f` panicked). Nothing is asked or set where `device` is current
    /// already, nor in a process that sees one device. Where the driver is loaded, the thread's
    /// own context comes back exactly: one the program made (`cuCtxCreate`) would be replaced
    /// by the device's primary context under `cudaSetDevice`.
    pub fn on_device<T>(&self, device: i32, f: impl FnOnce() -> T) -> Result<T, CudaStatus> {
        if device == 0 && self.sees_one_device() {
            // The only device is current on every thread.
            return Ok(f());
        }
        let current = self.current_device()?;
        if current == device {
            return Ok(f());
        }
        let set = self.set_device.ok_or(ERROR_INSUFFICIENT_DRIVER)?;
        let context = driver::found().and_then(|d| KeepContext::save(&d.driver));
        // SAFETY: cudaSetDevice takes any integer and rejects bad ordinals itself.
        let r = unsafe { set(device) };
        if r != SUCCESS {
            return Err(r);
        }
        let _restore = Restore {
            set,
            device: current,
            context,
        };
        Ok(f())
    }

    /// Whether the process sees exactly one device (`cudaGetDeviceCount`, asked once: the
    /// count does not change during a process's life), which is then current on every thread.
    /// The price (docs/guarantees.md, limits): where the query would have failed on a thread,
    /// and so the runtime's own `cudaMalloc`, a cached block is served.
    pub fn sees_one_device(&self) -> bool {
        const UNKNOWN: u8 = 0;
        const ONE: u8 = 1;
        const OTHER: u8 = 2;
        static COUNT: AtomicU8 = AtomicU8::new(UNKNOWN);
        // One comparison can give the three answers: `OTHER` above `ONE`, `UNKNOWN` below.
        let count = COUNT.load(Ordering::Relaxed);
        if count > ONE {
            return false;
        }
        match count {
            ONE => true,
            _ => {
                let mut n = 0;
                let one = self.get_device_count.is_some_and(|count| {
                    // SAFETY: a valid out-pointer for the call.
                    let r = unsafe { count(&mut n) };
                    if r != SUCCESS {
                        // The pool's own query: its error must not stay for the program.
                        // SAFETY: no arguments.
                        unsafe { (self.get_last_error)() };
                    }
                    r == SUCCESS && n == 1
                });
                COUNT.store(if one { ONE } else { OTHER }, Ordering::Relaxed);
                one
            }
        }
    }
}

/// Puts the thread's own context back where the driver could say which it was, else the
/// previous device, even when the work in between panicked.
struct Restore {
    set: SetDeviceFn,
    device: i32,
    context: Option<KeepContext>,
}

impl Drop for Restore {
    fn drop(&mut self) {
        // A context is made current again as it drops.
        if self.context.take().is_none() {
            // SAFETY: a device ordinal that was current a moment ago.
            unsafe { (self.set)(self.device) };
        }
    }
}
