//! Which context is which device's primary one: the driver path pools only there. Each
//! device's primary context handle is found once (retaining it only when it is active, which
//! makes nothing) and forgotten at a reset; the pool's own calls about a device run with that
//! context current.

use std::ffi::{c_int, c_uint};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::device_count;
use crate::cuda::driver::{self as cu, CuContext, Driver};
use crate::passed_through::Reason;

/// Each device's primary context, once seen (0: not yet).
static PRIMARY: [AtomicUsize; crate::pool::MAX_DEVICES] =
    [const { AtomicUsize::new(0) }; crate::pool::MAX_DEVICES];

/// The device whose primary context is the calling thread's current context: the one the pool
/// serves. `None` with no current context, or one the program made.
pub(crate) fn context_device(d: &Driver) -> Option<u32> {
    let (ctx, dev) = current_context(d)?;
    (primary_context(d, dev)? == ctx as usize).then_some(dev)
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
    let mut ctx: CuContext = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    if unsafe { (d.ctx_get_current)(&mut ctx) } != cu::CU_SUCCESS || ctx.is_null() {
        return None;
    }
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

/// The handle of `dev`'s primary context, when it is active. Found once by retaining it and
/// releasing it again: only when it is active (a context the program made may be current while
/// the primary one was never made, and retaining would make it).
pub(super) fn primary_context(d: &Driver, dev: u32) -> Option<usize> {
    let slot = &PRIMARY[dev as usize];
    let known = slot.load(Ordering::Relaxed);
    if known != 0 {
        return Some(known);
    }
    let (mut flags, mut active): (c_uint, c_int) = (0, 0);
    // SAFETY: valid out-pointers and a device ordinal the driver just gave.
    let r = unsafe { (d.primary_ctx_get_state)(dev as c_int, &mut flags, &mut active) };
    if r != cu::CU_SUCCESS || active == 0 {
        return None;
    }
    let mut ctx: CuContext = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the context is active, so retaining makes nothing.
    if unsafe { (d.primary_ctx_retain)(&mut ctx, dev as c_int) } != cu::CU_SUCCESS {
        return None;
    }
    // SAFETY: the retain just made, given back.
    unsafe { (d.primary_ctx_release)(dev as c_int) };
    slot.store(ctx as usize, Ordering::Relaxed);
    Some(ctx as usize)
}

/// Forget the handle of `dev`'s primary context (a `cudaDeviceReset` through the runtime too).
pub(crate) fn forget_primary(dev: u32) {
    if let Some(slot) = PRIMARY.get(dev as usize) {
        slot.store(0, Ordering::Relaxed);
    }
}

/// `f` run with `dev`'s primary context current, where the pool's own calls about `dev` are
/// made, and the thread's own context (or none) current again after. `None`, and `f` not run,
/// when that context is not active or cannot be made current.
pub(crate) fn with_primary_current<T>(d: &Driver, dev: u32, f: impl FnOnce() -> T) -> Option<T> {
    let primary = primary_context(d, dev)?;
    let mut ctx: CuContext = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    if unsafe { (d.ctx_get_current)(&mut ctx) } != cu::CU_SUCCESS {
        return None;
    }
    if ctx as usize == primary {
        return Some(f());
    }
    let set_current = d.ctx_set_current?;
    // SAFETY: the device's primary context, active (`primary_context`).
    if unsafe { set_current(primary as CuContext) } != cu::CU_SUCCESS {
        return None;
    }
    let out = f();
    // SAFETY: the context current a moment ago (NULL: none, which unbinds the thread).
    unsafe { set_current(ctx) };
    Some(out)
}

/// The device whose primary context `ctx` is, if it is an active one.
pub(super) fn primary_device(d: &Driver, ctx: CuContext) -> Option<u32> {
    let devices = device_count(d).min(crate::pool::MAX_DEVICES) as u32;
    (0..devices).find(|&dev| primary_context(d, dev) == Some(ctx as usize))
}
