//! Peer access and the pool's mapped memory. The driver gives a peer access to `cudaMalloc`
//! memory itself once the program enables it; to CUDA virtual memory only `cuMemSetAccess`
//! does. So when the program lets a device reach another's memory, the pool gives it access to
//! the blocks it mapped there (`Pool::add_peer`), now and later. A disable is the runtime's
//! alone: the grants stay (docs/design-notes.md, "Note: expandable segments"). The driver's
//! `cuCtxEnablePeerAccess` comes through `driver.rs` to `grant`, and its `cuCtxSetCurrent` to
//! `device_made_current`.

use std::sync::atomic::AtomicBool;

use super::{current_device, forward, runtime};
use crate::cuda::backend::CudaBackend;
use crate::cuda::contexts::{own_contexts_on, primary_is_current};
use crate::cuda::types::*;
use crate::guard;
use crate::log;
use crate::pool::{Backend, Pool, SyncSeq};

static REFUSED: AtomicBool = AtomicBool::new(false);

/// The program let `accessor` reach `owner`'s memory with `what`: the pool's mapped memory on
/// `owner` gets that access, and its fences wait for `accessor`'s kernels too. A refusal is said
/// once on stderr: the program's kernels on `accessor` would fail on those blocks.
pub(crate) fn grant(pool: &Pool<CudaBackend>, owner: u32, accessor: u32, what: &str) {
    pool.backend().note_peer_access(owner, accessor);
    if let Err(e) = pool.add_peer(owner, accessor) {
        log::warn_once(&REFUSED, || {
            format!(
                "{what}: the driver refused device {accessor} access to the pool's mapped memory \
                 on device {owner} (error {}): device {accessor} cannot use those blocks (run with \
                 GPUPOOL_EXPANDABLE=0 for classic segments, which the driver shares itself) \
                 (reported once)",
                e.0
            )
        });
    }
}

/// A device made current is in use. A copy there may read another device's blocks, which
/// `cudaMalloc` memory allows without peer access; mapped memory needs the grant
/// (`Pool::note_device_in_use`). After `cudaSetDevice`, and `cuCtxSetCurrent` or
/// `cuCtxPushCurrent_v2` (`dispatch::driver`).
pub(crate) fn device_made_current<B: Backend>(pool: &Pool<B>, device: u32) {
    pool.note_device_in_use(device);
}

/// `call`, the program's synchronization of `device` or launch on its legacy stream (a status
/// of either API: 0 is success in both), then, once it succeeded, `proved` of what it proves
/// about the blocks freed before it (`device_synchronized`, `legacy_action`).
pub(crate) fn observed(
    pool: &Pool<CudaBackend>,
    device: u32,
    call: impl FnOnce() -> i32,
    proved: fn(&Pool<CudaBackend>, u32, SyncSeq),
) -> i32 {
    let seq = pool.seq_before_sync(device);
    let r = call();
    if r == SUCCESS {
        proved(pool, device, seq);
    }
    r
}

/// The program's own synchronization of `device` returned (`cudaDeviceSynchronize`,
/// `cuCtxSynchronize`): a fence of what was freed before `at`, unless devices that reach its
/// memory, or contexts the program made on it, may still run kernels on those blocks (the
/// pool's own fence waits for them too): it synchronized one context. Nor is it one unless
/// that context was the primary one: made with a green context current (or a context the
/// program made), it waited for that context's work alone. A release point either way.
pub(crate) fn device_synchronized(pool: &Pool<CudaBackend>, device: u32, at: SyncSeq) {
    synchronized(pool, device, at, || primary_is_current(device));
}

/// The program synchronized `device`'s primary context by its handle, current or not
/// (`cuCtxSynchronize_v2`): as `device_synchronized`.
pub(crate) fn primary_synchronized(pool: &Pool<CudaBackend>, device: u32, at: SyncSeq) {
    synchronized(pool, device, at, || true);
}

/// A fence of what was freed before `at` when `primary` says the primary context was the one
/// synchronized; a release point otherwise. Asked last: it may call the driver.
fn synchronized(
    pool: &Pool<CudaBackend>,
    device: u32,
    at: SyncSeq,
    primary: impl FnOnce() -> bool,
) {
    if pool.backend().accessors_of(device).is_empty() && !own_contexts_on(device) && primary() {
        pool.observe_fence(device, at);
    } else {
        pool.sync_point(device);
    }
}

/// The program put an action on `device`'s legacy stream after `at` (`barrier` and `relaxed`
/// modes): a barrier for what was freed before, unless devices that reach its memory may still
/// run kernels on those blocks, which it does not order (the pool's own barrier does). Nor does
/// it order a context the program made, but once one is made no free waits for a barrier
/// (`Pool::note_work_beyond_barriers`), so this action makes nothing reusable then.
pub(crate) fn legacy_action(pool: &Pool<CudaBackend>, device: u32, at: SyncSeq) {
    if pool.backend().accessors_of(device).is_empty() {
        pool.observe_barrier(device, at);
    }
}

/// `cudaSetDevice`: see `device_made_current`.
///
/// # Safety
/// As `cudaSetDevice`.
pub unsafe fn set_device(device: i32) -> CudaStatus {
    let g = match runtime() {
        Ok(g) => g,
        Err(e) => return e,
    };
    // SAFETY: the caller's argument, passed on unchanged.
    let r = forward(g.runtime.set_device, |f| unsafe { f(device) });
    if let (SUCCESS, Some(pool), Ok(device)) = (r, g.pool(), u32::try_from(device)) {
        device_made_current(pool, device);
    }
    r
}

/// # Safety
/// As `cudaDeviceEnablePeerAccess`.
pub unsafe fn device_enable_peer_access(peer: i32, flags: u32) -> CudaStatus {
    let g = match runtime() {
        Ok(g) => g,
        Err(e) => return e,
    };
    let rt = &g.runtime;
    // SAFETY: the caller's arguments, passed on unchanged.
    let pass = || forward(rt.device_enable_peer_access, |f| unsafe { f(peer, flags) });
    let Some(pool) = g.pool() else {
        return pass();
    };
    // Held while the runtime calls the driver: the driver's hook then leaves the grant here.
    let Some(_inside) = guard::enter() else {
        return pass();
    };
    let r = pass();
    // Enabled already, perhaps by a call the pool did not see: granted again, harmlessly.
    if r == SUCCESS || r == ERROR_PEER_ACCESS_ALREADY_ENABLED {
        if let (Some(accessor), Ok(owner)) = (current_device(rt), u32::try_from(peer)) {
            grant(pool, owner, accessor, "cudaDeviceEnablePeerAccess");
        }
    }
    r
}
