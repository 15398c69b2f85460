//! Which device a context belongs to, for the driver path: it pools only in primary contexts
//! (`cuda::contexts` knows their handles), and a context the program made goes to the driver.

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};

use super::device_count;
use crate::cuda::contexts::{current, has_current_context, primary_context};
use crate::cuda::driver::{self as cu, CuContext, Driver};
use crate::passed_through::Reason;

/// The device whose primary context is the calling thread's current context: the one the pool
/// serves. `None` with no current context, or one the program made.
pub(crate) fn context_device(d: &Driver) -> Option<u32> {
    let (ctx, dev) = current_context(d)?;
    (primary_context(d, dev)? == ctx as usize).then_some(dev)
}

/// Whether the program made a context of its own (`cuCtxCreate_v2`, `_v3`, `_v4`): until
/// then no runtime allocation asks which context is current.
static PROGRAM_MADE_ONE: AtomicBool = AtomicBool::new(false);

/// `cuCtxCreate_v2`, `_v3` or `_v4`, `real`: once it succeeded, runtime allocations look at the current context.
/// The new context is current, so its device is in use, as after `cuCtxSetCurrent`: it copies
/// from other devices' blocks as it would from `cudaMalloc` memory (`dispatch::peer`).
/// Its work is beyond the pool's barriers: each context has its own legacy stream, and its
/// blocking streams order themselves against that one alone, not the primary context's where
/// a barrier is. So `barrier` mode falls back to fences as for a non-blocking stream.
pub(crate) fn ctx_created(real: impl FnOnce() -> cu::CuResult) -> cu::CuResult {
    let r = real();
    if r == cu::CU_SUCCESS {
        PROGRAM_MADE_ONE.store(true, Ordering::Release);
        crate::global::program_made_a_context();
        if let (Some((pool, d)), Some(_inside)) = (super::pooled(), crate::guard::enter()) {
            if let Some((ctx, device)) = current_context(d) {
                // The pool's fences of the device wait for its work too.
                crate::cuda::contexts::note_own_created(ctx, device);
                crate::dispatch::peer::device_made_current(pool, device);
            }
            super::note_work_beyond_barriers(pool);
        }
    }
    r
}

/// `cuGreenCtxCreate`, `real` (a static runtime's `cudaGreenCtxCreate` reaches it through
/// `cuGetProcAddress`; the shared runtime's goes unseen, and makes no stream that
/// `cudaExecutionCtxStreamCreate` does not). A green context's streams are its own: those `cuGreenCtxStreamCreate`
/// makes are non-blocking, and those made with its context current order themselves against
/// its own legacy stream, never the primary context's where a barrier is. So, as for
/// `cuCtxCreate`, `barrier` mode falls back to fences. A fence needs nothing
/// more: synchronizing the primary context synchronizes the green contexts of the device
/// (`cuCtxSynchronize`'s documentation), so no list of them is kept. Not current after the
/// call, and its memory is the primary context's: the pool's view of the thread is unchanged.
pub(crate) fn green_ctx_created(real: impl FnOnce() -> cu::CuResult) -> cu::CuResult {
    let r = real();
    if r == cu::CU_SUCCESS {
        if let (Some((pool, _)), Some(_inside)) = (super::pooled(), crate::guard::enter()) {
            super::note_work_beyond_barriers(pool);
        }
    }
    r
}

/// `cuGreenCtxStreamCreate`'s result `r`. Every stream it makes is non-blocking, in a green
/// context: no barrier orders it. The green context's creation may have gone unseen (made
/// through a pointer the pool did not swap, or before the pool swapped a module's lookups), so
/// the stream is noted too, as `cuStreamCreate`'s non-blocking ones are.
pub(crate) fn green_stream_created(r: cu::CuResult) -> cu::CuResult {
    if r == cu::CU_SUCCESS {
        if let (Some(pool), Some(_inside)) = (crate::global::process_pool(), crate::guard::enter())
        {
            super::note_work_beyond_barriers(pool);
        }
    }
    r
}

/// `cuCtxDestroy_v2` of `ctx`, `real`: a context the program made leaves the ones the pool's
/// fences wait for. Inside the pool meanwhile, as the other hooks are: a signal handler that
/// allocates while the destroy is underway, which the fences of the device wait for, is passed
/// to CUDA rather than fencing on this very thread. The driver pops the context if it was the
/// thread's current one, which may leave the thread with none (`after_pop`).
pub(crate) fn ctx_destroyed(ctx: CuContext, real: impl FnOnce() -> cu::CuResult) -> cu::CuResult {
    let inside = crate::guard::enter();
    let r = crate::cuda::contexts::own_destroyed(ctx, real);
    if let Some(inside) = &inside {
        after_pop(inside, r);
    }
    r
}

/// `cuCtxPopCurrent_v2`, or `cuCtxSetCurrent(NULL)`, which pops the top of the thread's stack:
/// `real`, which may leave the thread with no current context (`after_pop`).
pub(crate) fn ctx_popped(real: impl FnOnce() -> cu::CuResult) -> cu::CuResult {
    // A thread the pool never served was given no context: its pops (a static runtime's
    // worker threads make many) cost no state of the pool's.
    if crate::guard::never_entered() {
        return real();
    }
    let Some(inside) = crate::guard::enter() else {
        return real();
    };
    let r = real();
    after_pop(&inside, r);
    r
}

/// After the driver's answer `r` to a call that pops the thread's current context: a thread it
/// left with none gets the primary context again from its next runtime call, which the pool
/// may answer with no runtime call. The pool binds it then, as for the thread's first call
/// (`guard::Inside::forget_context`). Nothing now: a driver call before that one has no
/// context, as without the pool. A driver that cannot say counts as none: the bind then costs
/// one runtime call and changes no context the thread has. The pool's own context switches
/// never come here: they call the driver's functions, not the hooks, and a runtime call the
/// pool makes finds the thread inside it.
fn after_pop(inside: &crate::guard::Inside, r: cu::CuResult) {
    if r != cu::CU_SUCCESS || !inside.gave_context() {
        return;
    }
    if let Some((_, d)) = super::pooled() {
        if !has_current_context(d) {
            inside.forget_context();
        }
    }
}

/// Whether the runtime would allocate in a context the program made, which owns what is
/// allocated in it and frees it when destroyed (`cuCtxDestroy`): the pool's blocks, from
/// segments of the primary context or of that context, must not be handed out there. One
/// atomic load in a program that never made a context.
/// The driver, to answer the allocation with, when it would.
#[inline(always)]
pub(crate) fn runtime_in_own_context() -> Option<&'static Driver> {
    if PROGRAM_MADE_ONE.load(Ordering::Acquire) {
        current_is_own()
    } else {
        None
    }
}

#[cold]
#[inline(never)]
fn current_is_own() -> Option<&'static Driver> {
    let d = &crate::cuda::driver::loaded_here()?.driver;
    own_context(d).map(|_| d)
}

/// `Reason::OwnContext` when the current context is one the program made on a device the pool
/// serves. With no current context the driver refuses, and a device beyond the pool's goes to
/// the driver as on the runtime path: neither is counted.
pub(super) fn own_context(d: &Driver) -> Option<Reason> {
    let (ctx, dev) = current_context(d)?;
    (primary_context(d, dev) != Some(ctx as usize)).then_some(Reason::OwnContext)
}

/// The calling thread's current context and its device, when it has one the pool serves.
pub(super) fn current_context(d: &Driver) -> Option<(CuContext, u32)> {
    let ctx = current(d).filter(|ctx| !ctx.is_null())?;
    let mut dev: c_int = -1;
    // SAFETY: a valid out-pointer; the thread has a current context.
    if unsafe { (d.ctx_get_device)(&mut dev) } != cu::CU_SUCCESS {
        return None;
    }
    let dev = u32::try_from(dev)
        .ok()
        .filter(|&v| (v as usize) < crate::pool::MAX_DEVICES)?;
    Some((ctx, dev))
}

/// The device whose primary context `ctx` is, if it is an active one.
pub(super) fn primary_device(d: &Driver, ctx: CuContext) -> Option<u32> {
    let devices = device_count(d).min(crate::pool::MAX_DEVICES) as u32;
    (0..devices).find(|&dev| primary_context(d, dev) == Some(ctx as usize))
}
