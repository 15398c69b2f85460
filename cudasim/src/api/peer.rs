//! Peer access between devices: `cudaDeviceCanAccessPeer`, `cudaDeviceEnablePeerAccess`,
//! `cudaDeviceDisablePeerAccess`, and the state the driver's `cuCtxEnablePeerAccess` shares.
//!
//! Every two distinct devices can reach each other. Enabling records the pair (the current
//! device may then reach the peer's memory) and nothing else: allocations of `cudaMalloc` are
//! reachable from every device in the simulator whatever the pair, and mapped virtual memory
//! only where `cuMemSetAccess` gave the device access, enabled or not, as in CUDA.

use crate::config;
use crate::current;
use crate::errors::{
    CudaResult, INVALID_DEVICE, INVALID_VALUE, PEER_ACCESS_ALREADY_ENABLED, PEER_ACCESS_NOT_ENABLED,
};
use crate::faults::Func;
use crate::ffi::{runtime_call, Out};
use crate::link;
use crate::state::with_state;
use std::ffi::{c_int, c_uint};

/// A device ordinal in range.
fn device(ordinal: c_int) -> CudaResult<usize> {
    usize::try_from(ordinal)
        .ok()
        .filter(|&d| d < config::get().map_or(0, |c| c.devices))
        .ok_or(INVALID_DEVICE)
}

/// Whether `device` can reach `peer`'s memory: any two distinct devices.
pub fn can_access(out: CudaResult<Out<c_int>>, dev: c_int, peer: c_int) -> CudaResult {
    let out = out?;
    let (d, p) = (device(dev)?, device(peer)?);
    out.set(c_int::from(d != p));
    Ok(())
}

/// The current device may now reach `owner`'s memory (`flags` must be 0). Enabling a device
/// for itself is `cudaErrorInvalidDevice`, a pair enabled already 704.
pub fn enable(owner: usize, flags: c_uint) -> CudaResult {
    let accessor = current::get();
    if flags != 0 {
        return Err(INVALID_VALUE);
    }
    if owner == accessor {
        return Err(INVALID_DEVICE);
    }
    with_state(|st| {
        st.use_device(accessor);
        st.use_device(owner);
        if st.peer_access.insert((accessor, owner)) {
            Ok(())
        } else {
            Err(PEER_ACCESS_ALREADY_ENABLED)
        }
    })
}

/// The current device may no longer reach `owner`'s memory (705 if it could not).
pub fn disable(owner: usize) -> CudaResult {
    let accessor = current::get();
    with_state(|st| {
        if st.peer_access.remove(&(accessor, owner)) {
            Ok(())
        } else {
            Err(PEER_ACCESS_NOT_ENABLED)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaDeviceCanAccessPeer(
    can: *mut c_int,
    dev: c_int,
    peer: c_int,
) -> c_int {
    runtime_call(Func::cudaDeviceCanAccessPeer, || {
        // SAFETY: the caller passes NULL or a pointer valid for writing an int.
        can_access(unsafe { Out::new(can) }, dev, peer)
    })
}

/// Through the driver (`cuCtxEnablePeerAccess` with the peer's primary context), as the
/// runtime does.
#[no_mangle]
pub unsafe extern "C" fn cudaDeviceEnablePeerAccess(peer: c_int, flags: c_uint) -> c_int {
    runtime_call(Func::cudaDeviceEnablePeerAccess, || {
        let owner = device(peer)?;
        match link::driver() {
            // SAFETY: the driver's cuCtxEnablePeerAccess, with a live primary context.
            Some(d) => link::result(unsafe {
                (d.ctx_enable_peer_access)(crate::context::primary(owner) as _, flags)
            }),
            None => enable(owner, flags),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaDeviceDisablePeerAccess(peer: c_int) -> c_int {
    runtime_call(Func::cudaDeviceDisablePeerAccess, || {
        let owner = device(peer)?;
        match link::driver() {
            // SAFETY: the driver's cuCtxDisablePeerAccess, with a live primary context.
            Some(d) => link::result(unsafe {
                (d.ctx_disable_peer_access)(crate::context::primary(owner) as _)
            }),
            None => disable(owner),
        }
    })
}
