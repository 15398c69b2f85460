//! The program's calls the pool watches without serving them: synchronizations, which make
//! freed blocks reusable and apply the release threshold; launches on the legacy stream, a
//! barrier in the modes that use one; non-blocking stream creation; and device reset, after
//! which the pool forgets what the driver freed.

use std::ffi::c_void;
use std::sync::atomic::AtomicBool;

use super::{current_device, current_pool, driver, forward, peer, runtime};
use crate::config::ReuseMode;
use crate::cuda::last_error;
use crate::cuda::others::{self, Entry};
use crate::cuda::runtime::{ExecutionCtx, LaunchKernelFn};
use crate::cuda::types::*;
use crate::global::Global;
use crate::guard;
use crate::log;

static RESET_UNKNOWN: AtomicBool = AtomicBool::new(false);

/// # Safety
/// As `cudaDeviceReset`.
pub unsafe fn device_reset() -> CudaStatus {
    let g = match runtime() {
        Ok(g) => g,
        Err(e) => return e,
    };
    let rt = &g.runtime;
    // SAFETY: no arguments.
    let real = || forward(rt.device_reset, |f| unsafe { f() });
    // A reset the pool's own call made (a runtime's reset through the driver's hook) is the
    // outer call's to forget.
    let Some(_inside) = guard::enter() else {
        return real();
    };
    let mut r = ERROR_UNKNOWN;
    let before = current_device(rt);
    if let (Some(pool), Some(dev)) = (g.pool(), before) {
        // Under the device's lock, so that no other thread's request comes between.
        pool.reset_device(dev, || {
            r = real();
            r == SUCCESS
        });
    } else {
        r = real();
    }
    // Asked again if the runtime could not say before: a pool that did not forget the
    // reset device would hand out memory the driver freed.
    let dev = before.or_else(|| (r == SUCCESS).then(|| current_device(rt)).flatten());
    match (r, g.pool(), dev) {
        (SUCCESS, Some(pool), Some(dev)) => {
            // The driver freed every allocation of the device, and its events: forget, do
            // not free. Mapped memory it keeps: given back (the reset waited for the work
            // and destroyed the context).
            if before.is_none() {
                pool.reset_device(dev, || true);
            }
            pool.backend().forget_device(dev);
            driver::forget_primary(dev);
            current_pool::forget(dev);
        }
        (SUCCESS, Some(_), None) => log::warn_once(&RESET_UNKNOWN, || {
            "cudaDeviceReset succeeded but the current device could not be read: the pool \
             cannot forget that device's memory (reported once)"
                .into()
        }),
        _ => {}
    }
    r
}

/// # Safety
/// As `cudaDeviceSynchronize`.
pub unsafe fn device_synchronize() -> CudaStatus {
    let g = match runtime() {
        Ok(g) => g,
        Err(e) => return e,
    };
    let rt = &g.runtime;
    // SAFETY: no arguments.
    let pass = || unsafe { (rt.device_synchronize)() };
    let (Some(pool), Some(dev)) = (g.pool(), current_device(rt)) else {
        return pass();
    };
    let Some(_inside) = guard::enter() else {
        return pass();
    };
    // Every block freed before this call is then safe to reuse, but for peers' kernels.
    peer::observed(pool, dev, pass, peer::device_synchronized)
}

/// After a program synchronization: the release threshold applies.
fn after_sync(g: &Global, r: CudaStatus) -> CudaStatus {
    if r == SUCCESS {
        if let (Some(pool), Some(dev), Some(_inside)) =
            (g.pool(), current_device(&g.runtime), guard::enter())
        {
            pool.sync_point(dev);
        }
    }
    r
}

/// # Safety
/// As `cudaStreamSynchronize`.
pub unsafe fn stream_synchronize(stream: Stream) -> CudaStatus {
    let g = match runtime() {
        Ok(g) => g,
        Err(e) => return e,
    };
    // SAFETY: the caller's argument, passed on unchanged.
    let r = forward(g.runtime.stream_synchronize, |f| unsafe { f(stream) });
    after_sync(g, r)
}

/// # Safety
/// As `cudaEventSynchronize`.
pub unsafe fn event_synchronize(event: Event) -> CudaStatus {
    let g = match runtime() {
        Ok(g) => g,
        Err(e) => return e,
    };
    // SAFETY: the caller's argument, passed on unchanged.
    let r = forward(g.runtime.event_synchronize, |f| unsafe { f(event) });
    after_sync(g, r)
}

/// A kernel launch: in the modes that use barriers, one on the legacy stream is a barrier (it
/// orders every later blocking-stream operation after every earlier one).
fn watch_launch(stream: Stream, launch: impl FnOnce(&Global) -> CudaStatus) -> CudaStatus {
    let g = match runtime() {
        Ok(g) => g,
        Err(e) => return e,
    };
    let rt = &g.runtime;
    let watching = g.reuse() != ReuseMode::Strict && is_legacy(stream);
    let (true, Some(pool), Some(dev)) = (watching, g.pool(), current_device(rt)) else {
        return launch(g);
    };
    peer::observed(pool, dev, || launch(g), peer::legacy_action)
}

/// A kernel launch through `entry` (`cudaLaunchKernel`, or `__cudaLaunchKernel`, what
/// `<<<...>>>` compiles to since CUDA 13: the same arguments, a `cudaKernel_t` first).
///
/// # Safety
/// As the runtime's entry point.
pub unsafe fn launch_kernel(
    entry: Entry,
    kernel: *const c_void,
    grid: Dim3,
    block: Dim3,
    args: *mut *mut c_void,
    shared_mem: usize,
    stream: Stream,
) -> CudaStatus {
    watch_launch(stream, |g| {
        // SAFETY: the caller's arguments, passed on unchanged.
        launch(g, entry, kernel, |f| unsafe {
            f(kernel, grid, block, args, shared_mem, stream)
        })
    })
}

/// A launch of `kernel` through `entry` of the pool's runtime, or of the other runtime in the
/// process that ran it (`cuda::others`): a kernel is known only to the runtime that registered
/// it.
fn launch(
    g: &Global,
    entry: Entry,
    kernel: *const c_void,
    call: impl Fn(LaunchKernelFn) -> CudaStatus,
) -> CudaStatus {
    if let Some(r) = others::launch_routed(entry, kernel as usize, &call) {
        return r;
    }
    let rt = &g.runtime;
    let own = entry.of(rt);
    let r = forward(own, &call);
    if r == ERROR_INVALID_DEVICE_FUNCTION || r == ERROR_INSUFFICIENT_DRIVER && own.is_none() {
        if let Some(answer) = others::relaunch(entry, kernel as usize, &g.runtime_path, own, &call)
        {
            // The pool's runtime recorded the failed attempt as the thread's last error.
            // SAFETY: no arguments.
            unsafe { (rt.get_last_error)() };
            return answer;
        }
    }
    r
}

fn note_stream_flags(g: &Global, r: CudaStatus, flags: u32) -> CudaStatus {
    if r == SUCCESS && flags & STREAM_NON_BLOCKING != 0 {
        // The first one may fence every device (the runtime's calls, made inside the pool).
        // Inside it already (a signal handler), the device locks may be held: not noted.
        if let (Some(pool), Some(_inside)) = (g.pool(), guard::enter()) {
            pool.note_work_beyond_barriers();
        }
    }
    r
}

/// # Safety
/// As `cudaExecutionCtxStreamCreate` (CUDA 13.1).
pub unsafe fn execution_ctx_stream_create(
    stream: *mut Stream,
    ctx: ExecutionCtx,
    flags: u32,
    priority: i32,
) -> CudaStatus {
    let g = match runtime() {
        Ok(g) => g,
        Err(e) => return e,
    };
    // SAFETY: the caller's arguments, passed on unchanged.
    let r = forward(g.runtime.execution_ctx_stream_create, |f| unsafe {
        f(stream, ctx, flags, priority)
    });
    // A green execution context's streams are non-blocking whatever the flags say.
    let escapes = if r != SUCCESS || flags & STREAM_NON_BLOCKING != 0 || is_primary(g, ctx) {
        flags
    } else {
        STREAM_NON_BLOCKING
    };
    note_stream_flags(g, r, escapes)
}

/// Whether `ctx` is its device's primary execution context, whose blocking streams the legacy
/// stream orders. Asked of the runtime (`cudaExecutionCtxGetDevice`, then
/// `cudaDeviceGetExecutionCtx`); a runtime that cannot say gets "no": the stream is then taken
/// for one no barrier orders, which only costs fences. Calls of the pool's own: a refusal
/// leaves the program's last error as it was (`last_error::own_call`).
fn is_primary(g: &Global, ctx: ExecutionCtx) -> bool {
    let rt = &g.runtime;
    let (Some(get_device), Some(primary_of)) =
        (rt.execution_ctx_get_device, rt.device_get_execution_ctx)
    else {
        return false;
    };
    let mut dev = -1;
    let mut primary: ExecutionCtx = std::ptr::null_mut();
    let found = last_error::own_call(rt, || {
        // SAFETY: an out-pointer to a local; `ctx` is the program's, which the runtime just took.
        unsafe { get_device(&mut dev, ctx) }
    }) == SUCCESS
        && last_error::own_call(rt, || {
            // SAFETY: an out-pointer to a local; `dev` is the device the runtime just named.
            unsafe { primary_of(&mut primary, dev) }
        }) == SUCCESS;
    found && primary == ctx
}

/// # Safety
/// As `cudaStreamCreateWithFlags`.
pub unsafe fn stream_create_with_flags(stream: *mut Stream, flags: u32) -> CudaStatus {
    let g = match runtime() {
        Ok(g) => g,
        Err(e) => return e,
    };
    // SAFETY: the caller's arguments, passed on unchanged.
    let r = forward(g.runtime.stream_create_with_flags, |f| unsafe {
        f(stream, flags)
    });
    note_stream_flags(g, r, flags)
}

/// # Safety
/// As `cudaStreamCreateWithPriority`.
pub unsafe fn stream_create_with_priority(
    stream: *mut Stream,
    flags: u32,
    priority: i32,
) -> CudaStatus {
    let g = match runtime() {
        Ok(g) => g,
        Err(e) => return e,
    };
    // SAFETY: the caller's arguments, passed on unchanged.
    let r = forward(g.runtime.stream_create_with_priority, |f| unsafe {
        f(stream, flags, priority)
    });
    note_stream_flags(g, r, flags)
}
