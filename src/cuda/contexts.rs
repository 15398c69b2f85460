//! Contexts as the pool's own driver calls need them: which handle is each device's primary
//! context, and a call run with that context current. The pool serves primary contexts only,
//! and CUDA's context calls (`cuCtxSynchronize`, `cuMemGetInfo`) act on the current context
//! alone, so a call about a device is made in its primary context, whatever the thread has.

use std::ffi::{c_int, c_uint};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::driver::{CtxFn, CuContext, CuDevice, DeviceFn, Driver, CU_SUCCESS};
use crate::pool::MAX_DEVICES;

/// Each device's primary context, once seen (0: not yet).
static PRIMARY: [AtomicUsize; MAX_DEVICES] = [const { AtomicUsize::new(0) }; MAX_DEVICES];

/// The handle of `dev`'s primary context, when it is active. Found once by retaining it and
/// releasing it again: only when it is active (a context the program made may be current while
/// the primary one was never made, and retaining would make it).
pub fn primary_context(d: &Driver, dev: u32) -> Option<usize> {
    let slot = PRIMARY.get(dev as usize)?;
    let known = slot.load(Ordering::Relaxed);
    if known != 0 {
        return Some(known);
    }
    // Given back at once: the handle outlives the retain, until a reset.
    let ctx = retain_active(d, dev)?.ctx as usize;
    slot.store(ctx, Ordering::Relaxed);
    Some(ctx)
}

/// Forget the handle of `dev`'s primary context (a reset, through the runtime too).
pub fn forget_primary(dev: u32) {
    if let Some(slot) = PRIMARY.get(dev as usize) {
        slot.store(0, Ordering::Relaxed);
    }
}

/// `dev`'s primary context, retained until the guard drops, when it is active: retaining one
/// that is not would make it.
fn retain_active(d: &Driver, dev: u32) -> Option<Retained> {
    let dev = CuDevice::try_from(dev).ok()?;
    let (mut flags, mut active): (c_uint, c_int) = (0, 0);
    // SAFETY: valid out-pointers and a device ordinal the pool serves.
    let r = unsafe { (d.primary_ctx_get_state)(dev, &mut flags, &mut active) };
    if r != CU_SUCCESS || active == 0 {
        return None;
    }
    let mut ctx: CuContext = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the context is active, so retaining it makes nothing.
    if unsafe { (d.primary_ctx_retain)(&mut ctx, dev) } != CU_SUCCESS {
        return None;
    }
    Some(Retained {
        release: d.primary_ctx_release,
        dev,
        ctx,
    })
}

/// The calling thread's current context, or null; `None` when the driver cannot say.
pub fn current(d: &Driver) -> Option<CuContext> {
    let mut ctx: CuContext = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    let r = unsafe { (d.ctx_get_current)(&mut ctx) };
    (r == CU_SUCCESS).then_some(ctx)
}

/// Whether the calling thread's current context is `device`'s primary context, so that a
/// synchronization it just made (`cudaDeviceSynchronize`, `cuCtxSynchronize`) waited for all of
/// the primary context's work. Both act on the current context alone: a context the program
/// made, or a green context's handle (`cuCtxFromGreenCtx`), waits for its own work, and only
/// the primary context's synchronization waits for the device's green contexts too. With no
/// driver loaded, only a primary context can be current. Called after the runtime's
/// synchronization too, so it looks for the driver on the calling thread, as that path does.
pub fn primary_is_current(device: u32) -> bool {
    let Some(found) = super::driver::loaded_here() else {
        return true;
    };
    let d = &found.driver;
    match current(d) {
        Some(ctx) if !ctx.is_null() => primary_context(d, device) == Some(ctx as usize),
        _ => false,
    }
}

/// Whether the calling thread has a current context. A thread's first runtime call binds one;
/// before it, driver calls that need a context fail with `CUDA_ERROR_INVALID_CONTEXT`.
pub fn has_current_context(d: &Driver) -> bool {
    current(d).is_some_and(|ctx| !ctx.is_null())
}

/// `f` with `device`'s primary context current, then the thread's own context again (none, if
/// it had none), after a panic in `f` too. `None`, and `f` not run, when that context is not
/// active (retaining it would make one) or the driver cannot switch. The context is retained
/// for the call, so a reset on another thread cannot destroy it under `f`.
pub fn in_primary_context<T>(d: &Driver, device: u32, f: impl FnOnce() -> T) -> Option<T> {
    let own = current(d)?;
    if primary_context(d, device) == Some(own as usize) {
        return Some(f());
    }
    // Released last, after the thread's own context is back.
    let retained = retain_active(d, device)?;
    let set = d.ctx_set_current?;
    // SAFETY: the context just retained.
    if unsafe { set(retained.ctx) } != CU_SUCCESS {
        return None;
    }
    let _back = KeepContext { set, ctx: own };
    Some(f())
}

/// The calling thread's current context, made current again exactly when dropped (after a
/// panic too): a context the program made itself (`cuCtxCreate`) stays current across the
/// pool's own calls, where `cudaSetDevice` would put back the device's primary context.
pub struct KeepContext {
    set: CtxFn,
    ctx: CuContext,
}

impl KeepContext {
    /// `None` when the thread has no current context, or the driver cannot set one.
    pub fn save(d: &Driver) -> Option<KeepContext> {
        let ctx = current(d).filter(|ctx| !ctx.is_null())?;
        Some(KeepContext {
            set: d.ctx_set_current?,
            ctx,
        })
    }
}

impl Drop for KeepContext {
    fn drop(&mut self) {
        // SAFETY: a context that was current on this thread a moment ago (NULL: none, which
        // unbinds the thread).
        unsafe { (self.set)(self.ctx) };
    }
}

/// A retain of `dev`'s primary context, `ctx`, released when dropped.
struct Retained {
    release: DeviceFn,
    dev: CuDevice,
    ctx: CuContext,
}

impl Drop for Retained {
    fn drop(&mut self) {
        // SAFETY: the retain this guard stands for, released once.
        unsafe { (self.release)(self.dev) };
    }
}

/// A context the program made itself (`cuCtxCreate`) and has not destroyed, with its device.
struct Own {
    ctx: usize,
    dev: u32,
    /// Fences synchronizing it now: its destroy waits for them.
    syncing: u32,
    /// Its destroy is underway: fences of its device wait for it to end.
    dying: bool,
}

/// The contexts the program made and has not destroyed. CUDA's synchronizations wait for one
/// context's work, and a kernel in such a context may use a pool block (memory of its device,
/// which every context of the device reaches): a fence of the device must wait for these
/// contexts too. The lock is held for moments, never across a CUDA call: a fence marks the
/// contexts it synchronizes and lets go, so a fence of one device, a synchronization or a
/// context made or destroyed elsewhere never waits for another device's kernels, and a destroy
/// waits only for the fences of its own context.
static OWN: parking_lot::Mutex<Vec<Own>> = parking_lot::Mutex::new(Vec::new());
/// Signalled when a fence's marks go or a destroy ends.
static CHANGED: parking_lot::Condvar = parking_lot::Condvar::new();

/// Whether the program made a context on `device` that it has not destroyed.
pub fn own_contexts_on(device: u32) -> bool {
    OWN.lock().iter().any(|o| o.dev == device)
}

/// The program made context `ctx` on `device`. A handle the list still holds was destroyed
/// unseen, and the driver gave it out again: the entry now names this context.
pub fn note_own_created(ctx: CuContext, device: u32) {
    let ctx = ctx as usize;
    let mut own = OWN.lock();
    match own.iter_mut().find(|o| o.ctx == ctx) {
        Some(o) => o.dev = device,
        None => own.push(Own {
            ctx,
            dev: device,
            syncing: 0,
            dying: false,
        }),
    }
}

/// `destroy`, the driver's `cuCtxDestroy` of `ctx`: once no fence synchronizes the context, it
/// is marked dying (the fences of its device wait for the destroy to end, where the driver may
/// still be tearing its work down), and it leaves the list when the driver destroyed it.
pub fn own_destroyed(ctx: CuContext, destroy: impl FnOnce() -> i32) -> i32 {
    let ctx = ctx as usize;
    let mut own = OWN.lock();
    loop {
        match own.iter_mut().find(|o| o.ctx == ctx) {
            None => {
                drop(own);
                return destroy();
            }
            Some(o) if o.syncing > 0 || o.dying => CHANGED.wait(&mut own),
            Some(o) => {
                o.dying = true;
                break;
            }
        }
    }
    drop(own);
    let r = destroy();
    let mut own = OWN.lock();
    if r == CU_SUCCESS {
        own.retain(|o| o.ctx != ctx);
    } else if let Some(o) = own.iter_mut().find(|o| o.ctx == ctx) {
        o.dying = false;
    }
    drop(own);
    CHANGED.notify_all();
    r
}

/// The contexts a fence synchronizes, marked so that their destroys wait; unmarked when
/// dropped (after a panic too), and those the driver no longer took (`forget`) leave the list.
struct Marked {
    ctxs: Vec<usize>,
    forget: Vec<usize>,
}

impl Drop for Marked {
    fn drop(&mut self) {
        let mut own = OWN.lock();
        for o in own.iter_mut().filter(|o| self.ctxs.contains(&o.ctx)) {
            o.syncing -= 1;
        }
        own.retain(|o| o.syncing > 0 || o.dying || !self.forget.contains(&o.ctx));
        drop(own);
        CHANGED.notify_all();
    }
}

/// Synchronize every context the program made on `device`, each made current for its
/// `cuCtxSynchronize`, then the thread's own context (or none) again. The first failure's code,
/// or `CU_SUCCESS`. A destroy of one of them underway is waited for first. A context the driver
/// no longer lets be made current was destroyed where the hooks could not see it (through a
/// pointer to the driver's own destroy taken before this library loaded): none of its work
/// runs, and it is forgotten rather than failing every fence.
pub fn synchronize_own(d: &Driver, device: u32) -> i32 {
    let mut own = OWN.lock();
    while own.iter().any(|o| o.dev == device && o.dying) {
        CHANGED.wait(&mut own);
    }
    if !own.iter().any(|o| o.dev == device) {
        return CU_SUCCESS;
    }
    let ctxs: Vec<usize> = own
        .iter_mut()
        .filter(|o| o.dev == device)
        .map(|o| {
            o.syncing += 1;
            o.ctx
        })
        .collect();
    drop(own);
    let mut marked = Marked {
        ctxs,
        forget: Vec::new(),
    };
    let (Some(set), Some(mine)) = (d.ctx_set_current, current(d)) else {
        return super::driver::CU_ERROR_INVALID_CONTEXT;
    };
    // Dropped before `marked`: the thread's context is back before a destroy may go ahead.
    let _back = KeepContext { set, ctx: mine };
    for i in 0..marked.ctxs.len() {
        let ctx = marked.ctxs[i];
        // SAFETY: a context the program made; a destroy the hooks see waits for the mark, and
        // the driver refuses a handle it destroyed otherwise.
        if unsafe { set(ctx as CuContext) } != CU_SUCCESS {
            marked.forget.push(ctx);
            continue;
        }
        // SAFETY: no arguments: synchronizes the context just made current.
        let r = unsafe { (d.ctx_synchronize)() };
        if r != CU_SUCCESS {
            return r;
        }
    }
    CU_SUCCESS
}
