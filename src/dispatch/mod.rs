//! The one path every entry point takes to the pool or the runtime: the exported CUDA runtime
//! symbols (`hooks::runtime`) and the C API (`api`) both call these; the driver's hooks take
//! `driver.rs`, to the same pool. Argument
//! checks and the reentrancy guard, then the pool or the real runtime. Callers hold the panic
//! boundary.
//!
//! Every call the pool does not handle goes to the application's runtime unchanged, so the
//! program sees that runtime's own answer (`cudaFree(NULL)`, `cudaMalloc(&p, 0)`, a NULL
//! out-pointer, pointers from other allocators).

mod after_oom;
pub(crate) mod capture;
pub(crate) mod current_pool;
pub mod default_pool;
pub mod driver;
mod ipc;
pub mod peer;
mod pitch;
mod stream_names;
mod watched;

use std::ffi::c_void;
use std::sync::atomic::AtomicBool;

use crate::config::ReuseMode;
use crate::cuda::backend::CudaBackend;
use crate::cuda::last_error;
use crate::cuda::runtime::Runtime;
use crate::cuda::types::*;
use crate::global::{self, Global};
use crate::guard;
use crate::log;
use crate::pool::{Backend, CudaError, FreeKind, FreeOutcome, Origin, Pool, StreamKey, NO_STREAM};
use crate::report::oom::RequestApi;

pub use capture::{stream_begin_capture, stream_begin_capture_to_graph, stream_end_capture};
pub use ipc::ipc_get_mem_handle;
pub(crate) use ipc::ipc_refused;
pub use pitch::{malloc_pitch, mem_alloc_pitch};
pub(crate) use stream_names::async_stream_key;
pub use stream_names::Promise;
use stream_names::{free_stream_key_asked, stream_is_blocking, stream_key, stream_key_known};
pub use watched::{
    device_reset, device_synchronize, event_synchronize, execution_ctx_stream_create,
    launch_kernel, stream_create_with_flags, stream_create_with_priority, stream_synchronize,
};

/// The runtime, or the status to return when there is none.
pub(crate) fn runtime() -> Result<&'static Global, CudaStatus> {
    global::get().ok_or_else(global::missing_runtime)
}

/// Calls a runtime entry point the application has (it called it), or reports its absence.
pub(crate) fn forward<F: Copy>(f: Option<F>, call: impl FnOnce(F) -> CudaStatus) -> CudaStatus {
    match f {
        Some(f) => call(f),
        None => ERROR_INSUFFICIENT_DRIVER,
    }
}

/// The current device as the pool indexes it, if it is one the pool serves. A failed query
/// leaves no error behind (`own_query`): the pool carries on without the answer. In a process
/// that sees one device, that device is current on every thread: no query at all (each hook
/// asked once per call, which on a GPU costs more than the rest of a cache hit).
pub(crate) fn current_device(rt: &Runtime) -> Option<u32> {
    if one_device(rt) {
        return Some(0);
    }
    rt.current_device()
        .map_err(|e| own_query(rt, e))
        .ok()
        .and_then(|d| u32::try_from(d).ok())
        .filter(|&d| (d as usize) < crate::pool::MAX_DEVICES)
}

/// Whether the process sees exactly one device (`Runtime::sees_one_device`).
pub(crate) fn one_device(rt: &Runtime) -> bool {
    rt.sees_one_device()
}

static INVALID_FREE: AtomicBool = AtomicBool::new(false);
static INSIDE_FREE: AtomicBool = AtomicBool::new(false);

/// A free made while this thread is inside the pool: from a signal handler that interrupted a
/// pool call, or a runtime callback during one. The pool cannot look the pointer up (the
/// interrupted call may hold the locks), and passing a pooled block to the runtime's own free
/// would free its whole segment under the pool: refused, the memory kept. (An allocation there
/// goes to the runtime instead: memory the runtime's own free takes back later.)
pub(crate) fn refuse_inside_free(ptr: *mut c_void, what: &str) -> CudaStatus {
    log::warn_once(&INSIDE_FREE, || {
        format!(
            "{what}({ptr:p}) called while this thread was inside the pool (a signal handler?): \
             returned cudaErrorUnknown, nothing freed (reported once)"
        )
    });
    ERROR_UNKNOWN
}

fn refuse_invalid_free(rt: &Runtime, ptr: *mut c_void, what: &str) -> CudaStatus {
    // The runtime's own refusal is also the program's last error (`cudaGetLastError`): so is
    // this one (never set by `cudaFree` itself, which would free a whole segment).
    last_error::set(rt, ERROR_INVALID_VALUE);
    log::warn_once(&INVALID_FREE, || {
        format!(
            "{what}({ptr:p}): not the start of a live allocation (double or interior free); \
             returned cudaErrorInvalidValue and left the pool intact (reported once)"
        )
    });
    ERROR_INVALID_VALUE
}

/// `cudaMalloc` for use on `stream` when there is one (`gpupool_malloc_async`): a block freed on
/// the same stream may serve it before a barrier or fence covers it (`relaxed` mode). `current`
/// is the calling thread's current device when the caller knows it (it made it current), else
/// the runtime is asked. `origin` is who calls (`Origin`).
///
/// # Safety
/// As `cudaMalloc`; `stream` as for `cudaMallocAsync`; `current` the current device or `None`.
#[inline(always)]
pub unsafe fn malloc_on(
    dev_ptr: *mut *mut c_void,
    size: usize,
    stream: Option<Stream>,
    current: Option<u32>,
    origin: Origin,
) -> CudaStatus {
    let stream = stream.map(|s| OnStream::Ask(s, Promise::Pool));
    // SAFETY: the caller's arguments, passed on unchanged.
    unsafe {
        malloc_with(
            dev_ptr,
            size,
            stream,
            current,
            origin,
            RequestApi::Runtime,
            move |rt| (rt.malloc)(dev_ptr, size),
        )
    }
}

/// The stream a stream-ordered allocation is for, as `malloc_with` takes it.
#[derive(Clone, Copy)]
pub(crate) enum OnStream {
    /// To be named in `malloc_with` by the rule of the call's promise (`stream_key`).
    Ask(Stream, Promise),
    /// A created stream, named by the runtime's id the caller just asked (`async_stream_key`),
    /// which the thread's next stream-ordered free on it takes (`stream_names::remember`).
    Asked(Stream, StreamKey),
}

/// `malloc_on`, where `api` is the program's call and `call` the runtime's own, made when the
/// pool does not serve the request (`cudaMalloc`, `cudaMallocPitch` for `pitch::malloc_pitch`,
/// or `cudaMallocAsync` for `mempool::malloc_async`).
///
/// # Safety
/// As `malloc_on`; `call` makes the runtime's call with the caller's arguments.
#[inline(always)]
pub(crate) unsafe fn malloc_with(
    dev_ptr: *mut *mut c_void,
    size: usize,
    stream: Option<OnStream>,
    current: Option<u32>,
    origin: Origin,
    api: RequestApi,
    call: impl Fn(&Runtime) -> CudaStatus + Copy,
) -> CudaStatus {
    match global::allocating() {
        // SAFETY: the caller's arguments and contract.
        Some((g, pool)) => unsafe {
            malloc_in(
                g, pool, false, dev_ptr, size, stream, current, origin, api, call,
            )
        },
        // SAFETY: the caller's arguments and contract.
        None => unsafe { malloc_checked(dev_ptr, size, stream, current, origin, api, call) },
    }
}

/// `malloc_with` before the state was made, in a forked child, and once the program made a
/// context of its own: each allocation then asks which context is current.
///
/// # Safety
/// As `malloc_with`.
#[cold]
#[inline(never)]
unsafe fn malloc_checked(
    dev_ptr: *mut *mut c_void,
    size: usize,
    stream: Option<OnStream>,
    current: Option<u32>,
    origin: Origin,
    api: RequestApi,
    call: impl Fn(&Runtime) -> CudaStatus + Copy,
) -> CudaStatus {
    let Some((g, pool)) = global::with_pool() else {
        return global::missing_runtime();
    };
    // SAFETY: the caller's arguments and contract.
    unsafe {
        malloc_in(
            g, pool, true, dev_ptr, size, stream, current, origin, api, call,
        )
    }
}

/// `malloc_with` with the state and its pool; `contexts`: whether the program may have made a
/// context of its own.
///
/// # Safety
/// As `malloc_with`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn malloc_in(
    g: &'static Global,
    pool: Option<&'static Pool<CudaBackend>>,
    contexts: bool,
    dev_ptr: *mut *mut c_void,
    size: usize,
    stream: Option<OnStream>,
    current: Option<u32>,
    origin: Origin,
    api: RequestApi,
    call: impl Fn(&Runtime) -> CudaStatus + Copy,
) -> CudaStatus {
    let rt = &g.runtime;
    let pass = || call(rt);
    let (Some(pool), false, false) = (pool, dev_ptr.is_null(), size == 0) else {
        return pass();
    };
    let Some(inside) = guard::enter() else {
        return pass();
    };
    // The runtime allocates in the current context: one the program made owns what it gets
    // and frees it when destroyed, so no pool block goes there (docs/driver-api.md).
    if contexts {
        if let Some(d) = driver::runtime_in_own_context() {
            return driver::runtime_unserved(pool, rt, d, size, pass);
        }
    }
    // Not `Option::or_else`, which stayed a call.
    let dev = match current.filter(|&d| (d as usize) < crate::pool::MAX_DEVICES) {
        Some(d) => d,
        None => match current_device(rt) {
            Some(d) => d,
            None => return pass(),
        },
    };
    let stream = stream
        .map(|s| match s {
            OnStream::Ask(s, promise) => stream_key(rt, pool, s, promise),
            OnStream::Asked(s, key) => {
                stream_names::remember(&inside, s, key);
                key
            }
        })
        .filter(|&k| k != NO_STREAM);
    let served = |addr: u64| {
        // SAFETY: `dev_ptr` is non-NULL and, by the caller's contract, writable.
        unsafe { *dev_ptr = addr as *mut c_void };
        served_on(&inside, dev, Some(pool));
        SUCCESS
    };
    // The hit apart, with its own return: its result needs no merging with the general way's.
    if let Some(addr) = pool.alloc_hit(dev, size as u64, stream, origin) {
        return served(addr);
    }
    ready_for_backend(&inside, pool, dev);
    match pool.alloc_general(dev, size as u64, stream, origin) {
        Ok(addr) => served(addr),
        // The pool released what it could and still failed: the runtime gives the
        // program its own answer (and sets its last error), or, if memory was freed in the
        // meantime, a plain allocation that later passes through cudaFree. Under a limit
        // the runtime is not asked for the memory: it would give what the limit refused.
        Err(CudaError::MEMORY_ALLOCATION) => {
            let r = if pool.limit(dev) == u64::MAX {
                pass()
            } else {
                refuse_over_limit(rt)
            };
            after_oom::answer(pool, dev, size, r, |dev, size| {
                crate::report::oom::report(&g.report_source(), dev, size, api)
            })
        }
        Err(e) => e.0,
    }
}

/// Out of memory under the pool's limit: `cudaErrorMemoryAllocation`, also as the program's
/// last error.
fn refuse_over_limit(rt: &Runtime) -> CudaStatus {
    last_error::set(rt, ERROR_MEMORY_ALLOCATION);
    ERROR_MEMORY_ALLOCATION
}

/// # Safety
/// As `cudaMemGetInfo`.
pub unsafe fn mem_get_info(free: *mut usize, total: *mut usize) -> CudaStatus {
    let g = match runtime() {
        Ok(g) => g,
        Err(e) => return e,
    };
    let rt = &g.runtime;
    // SAFETY: the caller's arguments, passed on unchanged.
    let r = unsafe { (rt.mem_get_info)(free, total) };
    let (Some(pool), SUCCESS, false, false) = (g.pool(), r, free.is_null(), total.is_null()) else {
        return r;
    };
    let Some(_inside) = guard::enter() else {
        return r;
    };
    let Some(dev) = current_device(rt) else {
        return r;
    };
    // SAFETY: the runtime wrote both on success; the caller's pointers, non-NULL.
    let (f, t) = unsafe { (*free as u64, *total as u64) };
    let (f, t) = if driver::runtime_in_own_context().is_some() {
        // A context the program made, as `cuMemGetInfo` tells it: the pool serves nothing
        // there, so its limit is not that context's, and its cache comes back when the driver
        // refuses (`driver::runtime_unserved`).
        ((f + pool.releasable(dev)).min(t), t)
    } else {
        pool.memory_for_program(dev, f, t)
    };
    after_oom::told_free(dev, f);
    // SAFETY: as above; the figures are at most the runtime's `total`, which fit.
    unsafe {
        *free = f as usize;
        *total = t as usize;
    }
    SUCCESS
}

/// # Safety
/// As `cudaFree`.
#[inline(always)]
pub unsafe fn free(ptr: *mut c_void) -> CudaStatus {
    // The state's one load apart: a test of `with_pool`'s merged answer costs the hit two more.
    match global::with_pool_made() {
        // SAFETY: the caller's argument.
        Some((g, pool)) => unsafe { free_with(g, pool, ptr) },
        // SAFETY: the caller's argument.
        None => unsafe { free_unmade(ptr) },
    }
}

/// `free` before the state was made with its pool, and in a forked child.
///
/// # Safety
/// As `cudaFree`.
#[cold]
#[inline(never)]
unsafe fn free_unmade(ptr: *mut c_void) -> CudaStatus {
    match global::with_pool() {
        // SAFETY: the caller's argument.
        Some((g, pool)) => unsafe { free_with(g, pool, ptr) },
        None => global::missing_runtime(),
    }
}

/// `free` with the state and its pool.
///
/// # Safety
/// As `cudaFree`.
#[inline(always)]
unsafe fn free_with(
    g: &'static Global,
    pool: Option<&'static Pool<CudaBackend>>,
    ptr: *mut c_void,
) -> CudaStatus {
    // A copy of `ptr`, not a reference: it stays in a register.
    // SAFETY: the caller's argument, passed on unchanged.
    let pass = move || unsafe { (g.runtime.free)(ptr) };
    let (Some(pool), false) = (pool, ptr.is_null()) else {
        return pass();
    };
    let Some(inside) = guard::enter() else {
        return refuse_inside_free(ptr, "cudaFree");
    };
    // For a `cudaFree` the current device only says where to look first: the block is freed
    // the same way on whichever device holds it. The device this thread last allocated on is
    // as good a first guess, and saves asking the runtime (`cudaGetDevice`) on every free.
    // The last device is one the pool served on, or `NO_DEVICE`: a test against the device
    // table's bound tells the two apart and spares the lookup below its bounds check.
    let first = inside.last_device();
    if first as usize >= crate::pool::MAX_DEVICES {
        return free_first(&inside, g, pool, ptr, pass);
    }
    let outcome = pool.free(ptr as u64, FreeKind::Sync, Some(first));
    answer_free(outcome, &g.runtime, ptr, "cudaFree", pass)
}

/// `free` on a thread that never allocated from the pool, or lost its context since
/// (`guard::Inside::forget_context`): no device to look in first, and perhaps no context
/// (`bind_context`). `NO_DEVICE`, which names no device, makes the pool look on every device,
/// as `None` would: for a `FreeKind::Sync` free the device orders the search and nothing else.
#[cold]
#[inline(never)]
fn free_first(
    inside: &guard::Inside,
    g: &Global,
    pool: &Pool<CudaBackend>,
    ptr: *mut c_void,
    pass: impl FnOnce() -> CudaStatus,
) -> CudaStatus {
    let current = current_device(&g.runtime);
    let outcome = pool.free(
        ptr as u64,
        FreeKind::Sync,
        current.or(Some(guard::NO_DEVICE)),
    );
    bind_context(inside, pool, current, outcome);
    answer_free(outcome, &g.runtime, ptr, "cudaFree", pass)
}

/// The program's answer to its free of `ptr` (`what`), from the pool's `outcome`: a block that
/// is not the pool's goes to the runtime (`pass`).
#[inline(always)]
fn answer_free(
    outcome: FreeOutcome,
    rt: &Runtime,
    ptr: *mut c_void,
    what: &str,
    pass: impl FnOnce() -> CudaStatus,
) -> CudaStatus {
    match outcome {
        FreeOutcome::Freed => SUCCESS,
        FreeOutcome::Invalid => refuse_invalid_free(rt, ptr, what),
        FreeOutcome::NotOurs => pass(),
    }
}

/// Before a pool call that may call CUDA under a pool lock (the way past the hit, a release of
/// the cache, a trim, a synchronization seen through the driver): the calling thread's
/// per-thread state of the backend's API is made first, outside the locks
/// (`CudaBackend::prepare_thread`; docs/design-notes.md, "Note: the loader lock"). Once per
/// thread, and again after it lost its context, on a flag the guard keeps: no thread-local
/// access of its own.
#[inline(always)]
pub(crate) fn ready_for_backend(inside: &guard::Inside, pool: &Pool<CudaBackend>, device: u32) {
    if !inside.backend_ready() {
        prepare_backend(inside, pool, device);
    }
}

#[cold]
#[inline(never)]
fn prepare_backend(inside: &guard::Inside, pool: &Pool<CudaBackend>, device: u32) {
    pool.backend().prepare_thread(device);
    inside.set_backend_ready();
}

/// `ready_for_backend` for calls off the allocation path (releases, trims, synchronizations):
/// one thread-local access, no `Inside` needed.
pub(crate) fn ready_thread_for_backend(pool: &Pool<CudaBackend>, device: u32) {
    if guard::backend_unready() {
        pool.backend().prepare_thread(device);
    }
}

/// After an allocation the pool served on `device`: this thread's next free looks there
/// first, and the thread's first allocation tells the lifecycle (the process's first, which is
/// some thread's first, arms the exit summary), one test of the thread-local already reached.
/// `runtime`, the pool, when the program asked through the runtime: its first allocation, and
/// its first after it lost its context, also gets the thread the context the runtime's own
/// would have given it (`bind_context`).
#[inline(always)]
pub(crate) fn served_on(inside: &guard::Inside, device: u32, runtime: Option<&Pool<CudaBackend>>) {
    if inside.replace_last_device(device) == guard::NO_DEVICE {
        first_served(inside, device, runtime);
    }
}

#[cold]
#[inline(never)]
fn first_served(inside: &guard::Inside, device: u32, runtime: Option<&Pool<CudaBackend>>) {
    crate::lifecycle::note_allocation();
    if let Some(pool) = runtime {
        bind_context(inside, pool, Some(device), FreeOutcome::Freed);
    }
}

/// The runtime makes the current device's primary context the calling thread's at each of its
/// calls that needs a context, if the thread has none: a thread's first `cudaMalloc` or
/// `cudaFree`, and its first after it lost its context (`guard::Inside::forget_context`),
/// leaves it current, and the driver calls the program makes next
/// (`cuMemcpyHtoD`, `cuLaunchKernel`) act in it. A call the pool answered (`outcome`, a free's;
/// an allocation's is `Freed`) made no runtime call, and they would fail with
/// CUDA_ERROR_INVALID_CONTEXT. So the thread's backend state is made now if it was not
/// (`ready_for_backend`: the runtime's own idiom, `cudaFree(NULL)`, about `device`), after the
/// pool's work, outside its locks. A free the pool passed to the runtime is a runtime call, which
/// binds the context itself.
#[inline(always)]
fn bind_context(
    inside: &guard::Inside,
    pool: &Pool<CudaBackend>,
    device: Option<u32>,
    outcome: FreeOutcome,
) {
    if let (Some(device), false) = (device, outcome == FreeOutcome::NotOurs) {
        ready_for_backend(inside, pool, device);
    }
}

/// `bind_context` after a stream-ordered free the pool answered, on a thread that never
/// allocated from it or lost its context since, about its current device.
#[cold]
#[inline(never)]
fn bind_after_first_free(inside: &guard::Inside, pool: &Pool<CudaBackend>, rt: &Runtime) {
    bind_context(inside, pool, current_device(rt), FreeOutcome::Freed);
}

/// The status of a query the pool made for itself on a hot path (the current device, a
/// stream's name): on failure the error must not stay behind in the program's
/// `cudaGetLastError` (the pool carries on without the answer, on the safe side). It is
/// cleared, not restored as the pool's other own calls restore it (`last_error::own_call`):
/// a peek before each query would add a runtime call to every allocation and free that asks,
/// for refusals that only a destroyed stream or a broken runtime give.
pub(crate) fn own_query(rt: &Runtime, status: CudaStatus) -> CudaStatus {
    if status != SUCCESS {
        // SAFETY: no arguments.
        unsafe { (rt.get_last_error)() };
    }
    status
}

static CAPTURED_FREE: AtomicBool = AtomicBool::new(false);

/// A block of the pool freed in stream order on a stream being captured into a graph: CUDA frees
/// it when the graph runs, which the pool cannot see, and the graph's own work may use it until
/// then. The pool keeps it out of use for the rest of the process (it stays allocated in the
/// reports) rather than hand it out under a graph that has not run yet. `Invalid` for pool
/// memory that is not a live block (a double or interior free), which CUDA would take for the
/// segment's own free; `NotOurs` for memory that is not the pool's.
pub(crate) fn keep_captured_free<B: Backend>(pool: &Pool<B>, addr: u64, what: &str) -> FreeOutcome {
    if pool.live_block(addr).is_none() {
        return match pool.owner_of(addr) {
            Some(_) => FreeOutcome::Invalid,
            None => FreeOutcome::NotOurs,
        };
    }
    log::warn_once(&CAPTURED_FREE, || {
        format!(
            "{what}(0x{addr:x}) on a stream being captured into a graph: the graph frees it when \
             it runs, which the pool cannot see, so the pool keeps the block out of use \
             (reported once)"
        )
    });
    FreeOutcome::Freed
}

/// A cached allocation of `size` bytes on `device` for use on `stream`, as PyTorch's
/// allocation names both: made without asking or changing the current device, so without any
/// CUDA call (`Pool::alloc_hit`). `None` when it is not such a hit: the caller then makes the
/// device current and takes `malloc_on`'s way, which serves it as ever.
#[inline(always)]
pub fn malloc_hit_on(
    size: usize,
    device: u32,
    stream: Stream,
    origin: Origin,
) -> Option<*mut c_void> {
    let (g, Some(pool)) = global::with_pool()? else {
        return None;
    };
    if size == 0 {
        return None;
    }
    let inside = guard::enter()?;
    let stream = stream_key_known(&g.runtime, pool, stream, Promise::Pool)?;
    let addr = pool.alloc_hit(
        device,
        size as u64,
        Some(stream).filter(|&k| k != NO_STREAM),
        origin,
    )?;
    served_on(&inside, device, Some(pool));
    Some(addr as *mut c_void)
}

/// `cudaFreeAsync`, with the device of the block when the caller knows it (PyTorch's free
/// names it): the pool looks there first instead of asking the runtime for the current device.
///
/// # Safety
/// As `cudaFreeAsync`.
#[inline(always)]
pub unsafe fn free_on(
    ptr: *mut c_void,
    stream: Stream,
    device: Option<u32>,
    promise: Promise,
) -> CudaStatus {
    let Some((g, pool)) = global::with_pool() else {
        return global::missing_runtime();
    };
    let rt = &g.runtime;
    // SAFETY: the caller's arguments, passed on unchanged.
    let pass = || forward(rt.free_async, |f| unsafe { f(ptr, stream) });
    let (Some(pool), false) = (pool, ptr.is_null()) else {
        return pass();
    };
    let Some(inside) = guard::enter() else {
        return refuse_inside_free(ptr, "cudaFreeAsync");
    };
    // The legacy stream's name (PyTorch's) needs no question: that path stays an `Option`.
    let stream_key = match stream_key_known(rt, pool, stream, promise) {
        Some(key) => key,
        None => match free_stream_key_asked(rt, stream) {
            Ok(Some(key)) => key,
            Ok(None) => {
                let outcome = keep_captured_free(pool, ptr as u64, "cudaFreeAsync");
                return answer_free(outcome, rt, ptr, "cudaFreeAsync", pass);
            }
            // The runtime's own free refuses such a stream: so does its stand-in.
            Err(refused) if promise == Promise::Runtime && pool.owner_of(ptr as u64).is_some() => {
                return refused
            }
            Err(_) if promise == Promise::Runtime => return pass(),
            // The pool's own API and PyTorch's free cannot be refused after the fact (PyTorch's
            // returns nothing): the block goes back, to be reused after a fence.
            Err(refused) => {
                own_query(rt, refused);
                NO_STREAM
            }
        },
    };
    let kind = if promise == Promise::Runtime && pool.settings().reuse != ReuseMode::Relaxed {
        FreeKind::Ordered { stream: stream_key }
    } else {
        FreeKind::Async {
            blocking: pool.tells_blocking() && stream_is_blocking(rt, stream),
            stream: stream_key,
        }
    };
    let outcome = pool.free(ptr as u64, kind, device.or_else(|| current_device(rt)));
    // A thread that allocated has its context (`first_served`): only one that never did, or
    // lost it since, may lack it, a test of what the guard holds.
    if inside.last_device() == guard::NO_DEVICE && outcome != FreeOutcome::NotOurs {
        bind_after_first_free(&inside, pool, rt);
    }
    answer_free(outcome, rt, ptr, "cudaFreeAsync", pass)
}
