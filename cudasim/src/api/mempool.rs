//! The default memory pool of each device: its handle, attributes and trimming (the model is
//! in `crate::mempool`).

use super::CudaMemPool;
use crate::config;
use crate::errors::{CudaResult, INVALID_DEVICE, INVALID_VALUE};
use crate::faults::Func;
use crate::ffi::{runtime_call, Out};
use crate::mempool::Attr;
use crate::state::with_state;
use std::ffi::{c_int, c_void};

/// A stable handle per device, distinct from every other device's.
#[no_mangle]
pub unsafe extern "C" fn cudaDeviceGetDefaultMemPool(
    mem_pool: *mut CudaMemPool,
    device: c_int,
) -> c_int {
    runtime_call(Func::cudaDeviceGetDefaultMemPool, || {
        let d = usize::try_from(device).map_err(|_| INVALID_DEVICE)?;
        if d >= config::get()?.devices {
            return Err(INVALID_DEVICE);
        }
        // SAFETY: the caller passes NULL or a pointer valid for writing a cudaMemPool_t.
        let out = unsafe { Out::new(mem_pool)? };
        with_state(|st| {
            out.set(st.pool_handles[d] as CudaMemPool);
            Ok(())
        })
    })
}

/// The attribute of the raw value, checked with the value's pointer (the pool is checked under
/// the lock).
fn resolve(attr: c_int, value: *mut c_void) -> CudaResult<Attr> {
    if value.is_null() {
        return Err(INVALID_VALUE);
    }
    Attr::from_raw(attr)
}

/// The reuse policies are `int`s (0 or 1); the others 64-bit unsigned integers.
#[no_mangle]
pub unsafe extern "C" fn cudaMemPoolGetAttribute(
    pool: CudaMemPool,
    attr: c_int,
    value: *mut c_void,
) -> c_int {
    runtime_call(Func::cudaMemPoolGetAttribute, || {
        let attr = resolve(attr, value)?;
        let v = with_state(|st| {
            let d = st.pool_device(pool as usize)?;
            Ok(st.devices[d].pool.get(attr))
        })?;
        if attr.is_int() {
            // SAFETY: `value` is not NULL and, by the caller's contract, valid for an int.
            unsafe { value.cast::<c_int>().write_unaligned(v as c_int) };
        } else {
            // SAFETY: `value` is not NULL and, by the caller's contract, valid for a u64.
            unsafe { value.cast::<u64>().write_unaligned(v) };
        }
        Ok(())
    })
}

/// The current figures cannot be set; the high-water marks only to 0 (a reset to the current
/// value); a reuse policy to any `int` (non-zero: enabled).
#[no_mangle]
pub unsafe extern "C" fn cudaMemPoolSetAttribute(
    pool: CudaMemPool,
    attr: c_int,
    value: *mut c_void,
) -> c_int {
    runtime_call(Func::cudaMemPoolSetAttribute, || {
        let attr = resolve(attr, value)?;
        let v = if attr.is_int() {
            // SAFETY: `value` is not NULL and, by the caller's contract, holds an int.
            u64::from(unsafe { value.cast::<c_int>().read_unaligned() } != 0)
        } else {
            // SAFETY: `value` is not NULL and, by the caller's contract, holds a u64.
            unsafe { value.cast::<u64>().read_unaligned() }
        };
        with_state(|st| {
            let d = st.pool_device(pool as usize)?;
            st.devices[d].pool.set(attr, v)
        })
    })
}

/// Releases kept bytes until the pool reserves at most `min_bytes_to_keep` (used bytes stay).
#[no_mangle]
pub unsafe extern "C" fn cudaMemPoolTrimTo(pool: CudaMemPool, min_bytes_to_keep: usize) -> c_int {
    runtime_call(Func::cudaMemPoolTrimTo, || {
        with_state(|st| {
            let d = st.pool_device(pool as usize)?;
            st.devices[d].pool.trim_to(min_bytes_to_keep as u64);
            Ok(())
        })
    })
}
