//! The driver API's path to the pool: what the driver hooks (`hooks::driver`) call. The same
//! pool as the runtime's: a block `cuMemAlloc` gave may be freed by `cudaFree`, and the reverse.
//!
//! Only the devices' primary contexts are pooled, the contexts the runtime uses. A context the
//! program made itself (`cuCtxCreate`) owns its allocations, which die with it: those calls go
//! to the driver unchanged, as does everything the pool does not handle. Every answer is a
//! `CUresult`; the driver keeps no last error, so the pool sets none.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::current_pool;
use super::stream_names::{remember, remembered_for_free};
use crate::config::ReuseMode;
use crate::cuda::backend::CudaBackend;
use crate::cuda::driver::{self as cu, CuContext, CuDevicePtr, CuResult, Driver};
use crate::cuda::hooked;
use crate::cuda::types::{is_legacy, Stream, STREAM_NON_BLOCKING, STREAM_PER_THREAD};
use crate::global;
use crate::guard;
use crate::lifecycle::note_passed_through;
use crate::log;
use crate::passed_through::Reason;
use crate::pool::{
    CudaError, FreeKind, FreeOutcome, Origin, Pool, StreamKey, LEGACY_STREAM, NO_STREAM,
};
use crate::report::oom::RequestApi;

mod contexts;
mod unserved;
mod vmm;

pub(crate) use contexts::{
    ctx_created, ctx_destroyed, ctx_popped, green_ctx_created, green_stream_created,
    runtime_in_own_context,
};
pub use unserved::alloc_unserved;
pub(crate) use unserved::runtime_unserved;
use unserved::unserved;
pub(super) use unserved::{release_cache, unserved_context};
pub use vmm::{mem_create, mem_get_address_range};

pub(crate) use crate::cuda::contexts::forget_primary;
use crate::cuda::contexts::primary_context;
pub(crate) use contexts::context_device;
use contexts::{current_context, primary_device};

/// The pool and the driver, when the pool is on and the driver is loaded.
pub(super) fn pooled() -> Option<(&'static Pool<CudaBackend>, &'static Driver)> {
    // The driver first: a hook called where no driver is loaded makes no process state (no
    // trace file, no summary).
    let driver = &cu::loaded()?.driver;
    Some((global::process_pool()?, driver))
}

/// `pooled`, when the driver's calls are pooled too (not with `GPUPOOL_DRIVER_HOOKS=0`: a
/// program linked with `-lcuda` reaches the hooks by symbol even then). What keeps the pool
/// intact works either way: a free of a block the pool handed out, a reset, an IPC handle.
pub(super) fn serving() -> Option<(&'static Pool<CudaBackend>, &'static Driver)> {
    if !hooked::swapping() {
        return None;
    }
    pooled()
}

/// Whether the pool serves the driver's allocations: with no runtime in the process too.
pub(crate) fn serves() -> bool {
    serving().is_some()
}

/// The primary context of `dev` was reset or destroyed: the pool forgets the device's memory
/// (the driver freed it) and the handle (a new context may get another).
/// `forgot`: the pool forgot the device's memory already.
fn forget_device(pool: &Pool<CudaBackend>, dev: u32, forgot: bool) {
    forget_primary(dev);
    current_pool::forget(dev);
    if !forgot {
        pool.forget_device(dev);
    }
    pool.backend().forget_device(dev);
}

/// `cuMemAlloc_v2`, or `cuMemAllocAsync` when `stream` is given, made by `origin`; `real` is the
/// driver's own call with the caller's arguments.
///
/// # Safety
/// As `cuMemAlloc_v2`: `dptr` NULL or writable.
pub unsafe fn mem_alloc(
    dptr: *mut CuDevicePtr,
    size: usize,
    stream: Option<Stream>,
    origin: Origin,
    real: impl Fn() -> CuResult,
) -> CuResult {
    let api = match stream {
        Some(_) => RequestApi::DriverAsync,
        None => RequestApi::Driver,
    };
    // SAFETY: the caller's arguments and contract.
    unsafe { mem_alloc_as(dptr, size, stream, origin, api, real) }
}

/// `mem_alloc` for the program's call `api` (`cuMemAllocPitch` of the padded image, too).
///
/// # Safety
/// As `mem_alloc`.
pub unsafe fn mem_alloc_as(
    dptr: *mut CuDevicePtr,
    size: usize,
    stream: Option<Stream>,
    origin: Origin,
    api: RequestApi,
    real: impl Fn() -> CuResult,
) -> CuResult {
    let Some((pool, d)) = serving() else {
        return real();
    };
    if dptr.is_null() || size == 0 {
        return real();
    }
    let Some(inside) = guard::enter() else {
        return real();
    };
    let Some(dev) = context_device(d) else {
        return unserved_context(pool, d, || size, real);
    };
    if stream.is_some() && !current_pool::is_default(dev, || current_is_default(d, dev)) {
        return note_passed_through(Reason::OwnMemoryPool, size, unserved(pool, d, real));
    }
    let key = match stream {
        None => None,
        Some(s) => match async_stream(d, s) {
            Ok(k) => {
                // Asked just now: the thread's next free on the stream takes it.
                remember(&inside, s, k);
                Some(k).filter(|&k| k != NO_STREAM)
            }
            Err(why) => return note_passed_through(why, size, unserved(pool, d, real)),
        },
    };
    // The hit apart, as in `dispatch::malloc_with`: the way past it may call the backend under
    // a pool lock.
    let hit = pool.alloc_hit(dev, size as u64, key, origin);
    let served = match hit {
        Some(addr) => Ok(addr),
        None => {
            super::ready_for_backend(&inside, pool, dev);
            pool.alloc_general(dev, size as u64, key, origin)
        }
    };
    match served {
        Ok(addr) => {
            // SAFETY: `dptr` is non-NULL and, by the caller's contract, writable.
            unsafe { *dptr = addr };
            // The thread has a context: the driver's, in which the request was made.
            super::served_on(&inside, dev, None);
            cu::CU_SUCCESS
        }
        // The pool gave back what it could: the driver's own answer, unless a limit refused.
        Err(CudaError::MEMORY_ALLOCATION) => {
            let r = if pool.limit(dev) == u64::MAX {
                real()
            } else {
                cu::CU_ERROR_OUT_OF_MEMORY
            };
            super::after_oom::answer(pool, dev, size, r, |dev, size| {
                crate::report::oom::report(&global::process().report_source(), dev, size, api)
            })
        }
        // Any other failure: the driver's own answer to the program's call.
        Err(_) => real(),
    }
}

/// Whether device `dev`'s current memory pool is its default one, as the driver says (`None`
/// when it cannot).
fn current_is_default(d: &Driver, dev: u32) -> Option<bool> {
    let current = mem_pool_of(d.device_get_mem_pool?, dev)?;
    Some(Some(current) == mem_pool_of(d.device_get_default_mem_pool?, dev))
}

/// What `get` (`cuDeviceGetMemPool` or `cuDeviceGetDefaultMemPool`) gives for `dev`.
pub(super) fn mem_pool_of(get: cu::DeviceGetMemPoolFn, dev: u32) -> Option<usize> {
    let mut p: cu::CuMemoryPool = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the driver checks the ordinal.
    (unsafe { get(&mut p, dev as c_int) } == cu::CU_SUCCESS).then_some(p as usize)
}

/// `cuDeviceSetMemPool`: after the driver's own call succeeded, whether the pool set is the
/// device's default one decides whether its `cuMemAllocAsync`s are pooled.
pub fn device_set_mem_pool(
    dev: c_int,
    pool: cu::CuMemoryPool,
    real: impl Fn() -> CuResult,
) -> CuResult {
    let r = real();
    if r == cu::CU_SUCCESS {
        let default = cu::loaded()
            .and_then(|l| l.driver.device_get_default_mem_pool)
            .zip(u32::try_from(dev).ok())
            .and_then(|(get, dev)| mem_pool_of(get, dev));
        current_pool::note_set(dev, default.map(|p| p == pool as usize));
    }
    r
}

/// After `cuMemPoolDestroy`: destroying a device's current pool makes its default one current.
pub fn mem_pool_destroyed(r: CuResult) -> CuResult {
    if r == cu::CU_SUCCESS {
        current_pool::note_destroyed();
    }
    r
}

/// The pool's name for `stream` for a stream-ordered allocation on the current device, or why
/// the allocation must go to the driver: the stream is being captured into a graph (the graph
/// owns it), or it is not known to be the current context's (a created stream where the
/// driver sees several devices and cannot say whose it is), or the driver cannot say whether
/// it is captured.
fn async_stream(d: &Driver, stream: Stream) -> Result<StreamKey, Reason> {
    if is_legacy(stream) {
        return Ok(LEGACY_STREAM);
    }
    if capturing(d, stream).ok_or(Reason::UnplacedStream)? {
        return Err(Reason::GraphCapture);
    }
    let here = stream as usize == STREAM_PER_THREAD
        || one_device(d)
        || in_current_context(d, stream) == Some(true);
    here.then(|| stream_id(d, stream))
        .ok_or(Reason::UnplacedStream)
}

/// Whether `stream` belongs to the calling thread's current context (`cuStreamGetCtx`); `None`
/// when the driver cannot say. A stream of another device belongs to that device's context.
/// The current context alone is asked, not its device: the caller knows the device already.
pub(crate) fn in_current_context(d: &Driver, stream: Stream) -> Option<bool> {
    let get = d.stream_get_ctx?;
    let mut of_stream: CuContext = std::ptr::null_mut();
    // SAFETY: a stream the program passed, and a valid out-pointer.
    if unsafe { get(stream, &mut of_stream) } != cu::CU_SUCCESS {
        return None;
    }
    let current = crate::cuda::contexts::current(d).filter(|c| !c.is_null())?;
    Some(!of_stream.is_null() && of_stream == current)
}

/// Whether `stream` is being captured; `None` when the driver cannot say.
fn capturing(d: &Driver, stream: Stream) -> Option<bool> {
    capture_status(d, stream).ok().flatten()
}

/// Whether `stream` is being captured: `Ok(None)` when the driver has no such query, `Err` with
/// its refusal of the stream (one the program destroyed).
fn capture_status(d: &Driver, stream: Stream) -> Result<Option<bool>, CuResult> {
    let Some(f) = d.stream_is_capturing else {
        return Ok(None);
    };
    let mut status = 0;
    // SAFETY: a stream the program passed, and a valid out-pointer.
    match unsafe { f(stream, &mut status) } {
        cu::CU_SUCCESS => Ok(Some(status != 0)),
        refused => Err(refused),
    }
}

/// The driver's unique id of `stream`, or `NO_STREAM` when it cannot say.
fn stream_id(d: &Driver, stream: Stream) -> StreamKey {
    let Some(f) = d.stream_get_id else {
        return NO_STREAM;
    };
    let mut id = 0u64;
    // SAFETY: a stream the program passed, and a valid out-pointer.
    match unsafe { f(stream, &mut id) } {
        cu::CU_SUCCESS if id != NO_STREAM => id,
        _ => NO_STREAM,
    }
}

/// Whether the driver sees one device.
fn one_device(d: &Driver) -> bool {
    device_count(d) == 1
}

/// The devices the driver sees (asked once; 0 when it cannot say).
pub(super) fn device_count(d: &Driver) -> usize {
    static COUNT: AtomicUsize = AtomicUsize::new(usize::MAX);
    let known = COUNT.load(Ordering::Relaxed);
    if known != usize::MAX {
        return known;
    }
    let mut n = 0;
    let ok = d.device_get_count.is_some_and(|count| {
        // SAFETY: a valid out-pointer.
        unsafe { count(&mut n) == cu::CU_SUCCESS }
    });
    let n = if ok { n.max(0) as usize } else { 0 };
    COUNT.store(n, Ordering::Relaxed);
    n
}

static INVALID_FREE: AtomicBool = AtomicBool::new(false);

/// `cuMemFree_v2`, or `cuMemFreeAsync` when `stream` is given.
///
/// # Safety
/// As `cuMemFree_v2`.
pub unsafe fn mem_free(
    ptr: CuDevicePtr,
    stream: Option<Stream>,
    real: impl Fn() -> CuResult,
) -> CuResult {
    let Some((pool, d)) = pooled() else {
        return real();
    };
    if ptr == 0 {
        return real();
    }
    let what = if stream.is_some() {
        "cuMemFreeAsync"
    } else {
        "cuMemFree"
    };
    let Some(inside) = guard::enter() else {
        return super::refuse_inside_free(ptr as *mut c_void, what);
    };
    let answer = |outcome| match outcome {
        FreeOutcome::Freed => cu::CU_SUCCESS,
        FreeOutcome::Invalid => refuse_invalid_free(ptr, what),
        FreeOutcome::NotOurs => real(),
    };
    let kind = match stream {
        None => FreeKind::Sync,
        Some(s) => {
            let key = if is_legacy(s) {
                LEGACY_STREAM
            } else {
                match capture_status(d, s) {
                    Ok(Some(true)) => return answer(super::keep_captured_free(pool, ptr, what)),
                    // The id the thread's last allocation there asked, as on the runtime's
                    // side: a stale one only makes the block wait longer.
                    Ok(Some(false)) => remembered_for_free(s).unwrap_or_else(|| stream_id(d, s)),
                    Ok(None) => NO_STREAM,
                    // A stream the driver does not know (destroyed): its answer, and the block
                    // stays the program's, as the driver's own free would leave it.
                    Err(cu::CU_ERROR_INVALID_HANDLE) if pool.owner_of(ptr).is_some() => {
                        return cu::CU_ERROR_INVALID_HANDLE
                    }
                    Err(cu::CU_ERROR_INVALID_HANDLE) => return real(),
                    // Any other refusal cannot say, as on the runtime's side.
                    Err(_) => NO_STREAM,
                }
            };
            if pool.settings().reuse != ReuseMode::Relaxed {
                FreeKind::Ordered { stream: key }
            } else {
                FreeKind::Async {
                    blocking: pool.tells_blocking() && stream_is_blocking(d, s),
                    stream: key,
                }
            }
        }
    };
    // A free in stream order names a stream of the current context's device (`Pool::free`): the
    // legacy stream is every device's, and the device this thread last allocated on may be
    // another. That guess serves a plain free, whose outcome is the same wherever the block is.
    let first = match (stream, inside.last_device()) {
        (None, dev) if dev != guard::NO_DEVICE => Some(dev),
        _ => context_device(d),
    };
    answer(pool.free(ptr, kind, first))
}

/// A double or interior free of pool memory: refused, the pool intact.
fn refuse_invalid_free(ptr: CuDevicePtr, what: &str) -> CuResult {
    log::warn_once(&INVALID_FREE, || {
        format!(
            "{what}(0x{ptr:x}): not the start of a live allocation (double or interior free); \
             returned CUDA_ERROR_INVALID_VALUE and left the pool intact (reported once)"
        )
    });
    cu::CU_ERROR_INVALID_VALUE
}

/// Whether work on `stream` is ordered with the legacy stream (false when the driver cannot say).
fn stream_is_blocking(d: &Driver, stream: Stream) -> bool {
    if is_legacy(stream) || stream as usize == STREAM_PER_THREAD {
        return true;
    }
    let Some(f) = d.stream_get_flags else {
        return false;
    };
    let mut flags: c_uint = 0;
    // SAFETY: a stream the program passed, and a valid out-pointer.
    (unsafe { f(stream, &mut flags) } == cu::CU_SUCCESS) && flags & STREAM_NON_BLOCKING == 0
}

/// `cuMemGetInfo_v2`: the driver's figures, with the pool's reusable cache counted as free and
/// its limit as the total, as `cudaMemGetInfo` gives them.
///
/// # Safety
/// As `cuMemGetInfo_v2`.
pub unsafe fn mem_get_info(
    free: *mut usize,
    total: *mut usize,
    real: impl Fn() -> CuResult,
) -> CuResult {
    let r = real();
    let (Some((pool, d)), cu::CU_SUCCESS, false, false) =
        (serving(), r, free.is_null(), total.is_null())
    else {
        return r;
    };
    let Some(_inside) = guard::enter() else {
        return r;
    };
    let Some((ctx, dev)) = current_context(d) else {
        return r;
    };
    // SAFETY: the driver wrote both on success; the caller's pointers, non-NULL.
    let (f, t) = unsafe { (*free as u64, *total as u64) };
    let (f, t) = if primary_context(d, dev) == Some(ctx as usize) {
        pool.memory_for_program(dev, f, t)
    } else {
        // A context the program made: the pool's whole free segments come back to it when the
        // driver refuses it (`unserved`), so they count as free; the pool's limit is not its.
        ((f + pool.releasable(dev)).min(t), t)
    };
    super::after_oom::told_free(dev, f);
    // SAFETY: as above; the figures are at most the driver's `total`, which fit.
    unsafe {
        *free = f as usize;
        *total = t as usize;
    }
    r
}

/// `cuCtxSynchronize`: every block freed before it is reusable once it returns.
pub fn ctx_synchronize(real: impl Fn() -> CuResult) -> CuResult {
    let Some((pool, d)) = serving() else {
        return real();
    };
    let Some(_inside) = guard::enter() else {
        return real();
    };
    let Some(dev) = context_device(d) else {
        return real();
    };
    super::peer::observed(pool, dev, real, super::peer::device_synchronized)
}

/// CUDA 13's `cuCtxSynchronize_v2`: `cuCtxSynchronize` of `ctx` (NULL: the current context).
/// Only a device's primary context waits for all the work the pool's blocks may have, current
/// or not; a context the program made, or a green context's handle, proves nothing.
pub fn ctx_synchronize_v2(ctx: CuContext, real: impl Fn() -> CuResult) -> CuResult {
    if ctx.is_null() {
        return ctx_synchronize(real);
    }
    let Some((pool, d)) = serving() else {
        return real();
    };
    let Some(_inside) = guard::enter() else {
        return real();
    };
    let Some(dev) = primary_device(d, ctx) else {
        return real();
    };
    super::peer::observed(pool, dev, real, super::peer::primary_synchronized)
}

/// After the program's `cuStreamSynchronize` or `cuEventSynchronize`: the release threshold
/// applies.
pub fn after_sync(r: CuResult) -> CuResult {
    if r == cu::CU_SUCCESS {
        if let (Some((pool, d)), Some(_inside)) = (serving(), guard::enter()) {
            if let Some(dev) = context_device(d) {
                // A thread of the driver API: the runtime's state for it may be yet to make.
                super::ready_thread_for_backend(pool, dev);
                pool.sync_point(dev);
            }
        }
    }
    r
}

/// After `cuStreamCreate`/`WithPriority`: a non-blocking stream changes what a barrier covers.
pub fn stream_created(r: CuResult, flags: c_uint) -> CuResult {
    if r == cu::CU_SUCCESS && flags & STREAM_NON_BLOCKING != 0 {
        // As the runtime's (`dispatch::watched::note_stream_flags`): inside the pool, not noted.
        if let (Some(pool), Some(_inside)) = (global::process_pool(), guard::enter()) {
            note_work_beyond_barriers(pool);
        }
    }
    r
}

/// The program made work no barrier orders (`Pool::note_work_beyond_barriers`), seen on the
/// driver's path. The first time, in a mode with barriers, it may fence every device the pool
/// uses, through the runtime: its state for this thread is made first, about a device whose
/// context exists. Otherwise the thread is left as it is: a runtime call made for nothing
/// would switch it to that device meanwhile.
fn note_work_beyond_barriers(pool: &Pool<CudaBackend>) {
    if pool.barriers_in_use() {
        if let Some(&dev) = pool.used_devices().first() {
            super::ready_thread_for_backend(pool, dev);
        }
    }
    pool.note_work_beyond_barriers();
}

/// A `cuLaunchKernel` on `stream` (the legacy one for a NULL stream of the non-`_ptsz` form):
/// in the modes that use barriers, a launch on the legacy stream is one.
pub fn launch(stream: Stream, real: impl Fn() -> CuResult) -> CuResult {
    let Some((pool, d)) = serving() else {
        return real();
    };
    if pool.settings().reuse == ReuseMode::Strict || !is_legacy(stream) {
        return real();
    }
    let Some(dev) = context_device(d) else {
        return real();
    };
    super::peer::observed(pool, dev, real, super::peer::legacy_action)
}

/// `cuDevicePrimaryCtxReset_v2`: the driver frees the device's memory but for virtual memory,
/// which the pool gives back first; the pool forgets the device.
pub fn primary_ctx_reset(dev: c_int, real: impl Fn() -> CuResult) -> CuResult {
    let pooled = match (global::process_pool(), u32::try_from(dev)) {
        (Some(pool), Ok(dev)) if (dev as usize) < crate::pool::MAX_DEVICES => Some((pool, dev)),
        _ => None,
    };
    // A reset made inside the pool (the runtime's reset through this hook) is the outer
    // call's to forget.
    let (Some((pool, dev)), Some(_inside)) = (pooled, guard::enter()) else {
        return real();
    };
    // Under the device's lock, so that no other thread's request comes between.
    let mut r = cu::CU_ERROR_UNKNOWN;
    pool.reset_device(dev, || {
        r = real();
        r == cu::CU_SUCCESS
    });
    if r == cu::CU_SUCCESS {
        forget_device(pool, dev, true);
    }
    r
}

/// `cuDevicePrimaryCtxRelease_v2`: the last release destroys the context and its memory, which
/// the pool then forgets. Only a release that found the context active: after a reset, the
/// program's release of its retain destroys nothing (the reset did, and was counted).
pub fn primary_ctx_release(dev: c_int, real: impl Fn() -> CuResult) -> CuResult {
    let served = pooled().zip(
        u32::try_from(dev)
            .ok()
            .filter(|&d| (d as usize) < crate::pool::MAX_DEVICES),
    );
    let was_active = served.is_some_and(|((_, d), _)| primary_active(d, dev) == Some(true));
    let r = real();
    let (cu::CU_SUCCESS, true, Some(((pool, d), device))) = (r, was_active, served) else {
        return r;
    };
    if primary_active(d, dev) == Some(false) {
        // The last release destroyed the context: its virtual memory stays until unmapped.
        let forgot = pool.release_mappings_after_reset(device);
        forget_device(pool, device, forgot);
    }
    r
}

/// Whether `dev`'s primary context is active, as the driver says (`None` when it cannot).
fn primary_active(d: &Driver, dev: c_int) -> Option<bool> {
    let (mut flags, mut active): (c_uint, c_int) = (0, 0);
    // SAFETY: valid out-pointers and the device the program named.
    let asked = unsafe { (d.primary_ctx_get_state)(dev, &mut flags, &mut active) };
    (asked == cu::CU_SUCCESS).then_some(active != 0)
}

/// `cuIpcGetMemHandle`: refused for a block inside a pool segment, as `cudaIpcGetMemHandle` is.
/// With no handle to write (`no_handle`) the driver refuses the call itself.
pub fn ipc_get_mem_handle(
    ptr: CuDevicePtr,
    no_handle: bool,
    real: impl Fn() -> CuResult,
) -> CuResult {
    match global::process_pool().filter(|_| !no_handle) {
        Some(pool) if super::ipc_refused(pool, ptr, "cuIpcGetMemHandle") => {
            cu::CU_ERROR_INVALID_VALUE
        }
        _ => real(),
    }
}

/// `cuCtxEnablePeerAccess`: the current context's device may now reach `peer`'s memory. When
/// `peer` is a primary context, the pool's mapped memory there gets that access too
/// (`dispatch::peer`): the driver gives it to `cuMemAlloc` memory only. Inside the pool (the
/// runtime's `cudaDeviceEnablePeerAccess` comes this way) its own hook does it.
pub fn ctx_enable_peer_access(peer: CuContext, real: impl Fn() -> CuResult) -> CuResult {
    let Some((pool, d)) = pooled() else {
        return real();
    };
    let Some(_inside) = guard::enter() else {
        return real();
    };
    let r = real();
    if r == cu::CU_SUCCESS || r == cu::CU_ERROR_PEER_ACCESS_ALREADY_ENABLED {
        if let (Some((_, accessor)), Some(owner)) = (current_context(d), primary_device(d, peer)) {
            super::peer::grant(pool, owner, accessor, "cuCtxEnablePeerAccess");
        }
    }
    r
}

/// `cuCtxSetCurrent`, `cuCtxPushCurrent_v2`: the context's device is in use, as after
/// `cudaSetDevice` (`dispatch::peer`). A program that makes devices current only through the
/// driver (a static runtime's does) copies there from other devices' blocks all the same. A
/// NULL context makes no device current: `cuCtxSetCurrent(NULL)` pops the thread's context
/// (`ctx_popped`), and the driver refuses to push one.
pub fn ctx_made_current(ctx: CuContext, real: impl Fn() -> CuResult) -> CuResult {
    if ctx.is_null() {
        return ctx_popped(real);
    }
    let Some((pool, d)) = pooled() else {
        return real();
    };
    let Some(_inside) = guard::enter() else {
        return real();
    };
    let r = real();
    if r == cu::CU_SUCCESS {
        if let Some((_, device)) = current_context(d) {
            super::peer::device_made_current(pool, device);
        }
    }
    r
}
