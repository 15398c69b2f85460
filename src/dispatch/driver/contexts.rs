//! Which device a context belongs to, for the driver path: it pools only in primary contexts
//! (`cuda::contexts` knows their handles), and a context the program made goes to the driver.

use std::ffi::c_int;

use super::device_count;
use crate::cuda::contexts::{current, primary_context};
use crate::cuda::driver::{self as cu, CuContext, Driver};
use crate::passed_through::Reason;

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
