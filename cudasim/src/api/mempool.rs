//! Memory pools: each device's default one, the pools the program creates and destroys, each
//! device's current pool, their attributes and trimming (the registry is `crate::pools`, the
//! figures of one pool `crate::mempool`).

use super::CudaMemPool;
use crate::config;
use crate::errors::{CudaResult, INVALID_DEVICE, INVALID_VALUE, NOT_SUPPORTED};
use crate::faults::Func;
use crate::ffi::{runtime_call, Out};
use crate::mempool::Attr;
use crate::state::with_state;
use std::ffi::{c_int, c_void};

/// `cudaMemPoolProps` and the driver's `CUmemPoolProps` (the same layout, 88 bytes).
#[repr(C)]
pub struct MemPoolProps {
    alloc_type: c_int,
    handle_types: c_int,
    location_type: c_int,
    location_id: c_int,
    win32_security_attributes: *mut c_void,
    max_size: usize,
    usage: u16,
    reserved: [u8; 54],
}

const _: () = assert!(std::mem::size_of::<MemPoolProps>() == 88);

/// `cudaMemAllocationTypePinned`; `cudaMemLocationTypeDevice`, then the host locations.
const ALLOCATION_PINNED: c_int = 1;
const LOCATION_DEVICE: c_int = 1;
const LOCATION_HOST_FIRST: c_int = 2;
const LOCATION_HOST_LAST: c_int = 4;
/// `cudaMemHandleTypeNone`, `PosixFileDescriptor`; then Win32, Win32Kmt and Fabric.
const HANDLE_NONE: c_int = 0;
const HANDLE_POSIX_FD: c_int = 1;
const HANDLE_OTHERS: [c_int; 3] = [2, 4, 8];

/// Device `device`, checked against the configuration (`cudaErrorInvalidDevice`).
pub(super) fn device_index(device: c_int) -> CudaResult<usize> {
    let d = usize::try_from(device).map_err(|_| INVALID_DEVICE)?;
    if d >= config::get()?.devices {
        return Err(INVALID_DEVICE);
    }
    Ok(d)
}

/// Checks the properties of a pool to create; returns its device. Pinned device memory only:
/// host locations and the handle types of other systems are not simulated (not supported).
fn checked_props(props: &MemPoolProps) -> CudaResult<usize> {
    if props.alloc_type != ALLOCATION_PINNED
        || !props.win32_security_attributes.is_null()
        || props.reserved.iter().any(|&b| b != 0)
    {
        return Err(INVALID_VALUE);
    }
    match props.handle_types {
        HANDLE_NONE | HANDLE_POSIX_FD => {}
        h if HANDLE_OTHERS.contains(&h) => return Err(NOT_SUPPORTED),
        _ => return Err(INVALID_VALUE),
    }
    match props.location_type {
        LOCATION_DEVICE => device_index(props.location_id).map_err(|_| INVALID_VALUE),
        LOCATION_HOST_FIRST..=LOCATION_HOST_LAST => Err(NOT_SUPPORTED),
        _ => Err(INVALID_VALUE),
    }
}

/// `cudaMemPoolCreate` and `cuMemPoolCreate`: a pool on the device of `props`.
///
/// # Safety
/// `pool` and `props` NULL or valid (for writing a handle, for reading the properties).
pub unsafe fn create(pool: *mut CudaMemPool, props: *const MemPoolProps) -> CudaResult {
    // SAFETY: forwarded from the caller.
    let out = unsafe { Out::new(pool)? };
    // SAFETY: NULL or, by the caller's contract, valid for reading.
    let props = unsafe { props.as_ref() }.ok_or(INVALID_VALUE)?;
    let d = checked_props(props)?;
    with_state(|st| {
        out.set(st.pools.create(d) as CudaMemPool);
        Ok(())
    })
}

/// `cudaMemPoolDestroy` and `cuMemPoolDestroy`.
pub fn destroy(pool: CudaMemPool) -> CudaResult {
    with_state(|st| st.pools.destroy(pool as usize))
}

/// `cudaDeviceSetMemPool` and `cuDeviceSetMemPool`: `pool` must be a pool of `device`.
pub fn set_current(device: c_int, pool: CudaMemPool) -> CudaResult {
    let d = device_index(device)?;
    with_state(|st| st.pools.set_current(d, pool as usize))
}

/// `cudaDeviceGetMemPool`/`cuDeviceGetMemPool` (`current`), or the `...DefaultMemPool` calls.
///
/// # Safety
/// `pool` NULL or valid for writing a handle.
pub unsafe fn get(pool: *mut CudaMemPool, device: c_int, current: bool) -> CudaResult {
    let d = device_index(device)?;
    // SAFETY: forwarded from the caller.
    let out = unsafe { Out::new(pool)? };
    with_state(|st| {
        let id = if current { st.pools.current(d) } else { d };
        out.set(st.pools.entry(id).handle as CudaMemPool);
        Ok(())
    })
}

/// A stable handle per device, distinct from every other device's.
#[no_mangle]
pub unsafe extern "C" fn cudaDeviceGetDefaultMemPool(
    mem_pool: *mut CudaMemPool,
    device: c_int,
) -> c_int {
    // SAFETY: the caller passes NULL or a pointer valid for writing a cudaMemPool_t.
    runtime_call(Func::cudaDeviceGetDefaultMemPool, || unsafe {
        get(mem_pool, device, false)
    })
}

/// The last pool `cudaDeviceSetMemPool` made current, or the default pool.
#[no_mangle]
pub unsafe extern "C" fn cudaDeviceGetMemPool(mem_pool: *mut CudaMemPool, device: c_int) -> c_int {
    // SAFETY: the caller passes NULL or a pointer valid for writing a cudaMemPool_t.
    runtime_call(Func::cudaDeviceGetMemPool, || unsafe {
        get(mem_pool, device, true)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaDeviceSetMemPool(device: c_int, mem_pool: CudaMemPool) -> c_int {
    runtime_call(Func::cudaDeviceSetMemPool, || set_current(device, mem_pool))
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemPoolCreate(
    mem_pool: *mut CudaMemPool,
    props: *const MemPoolProps,
) -> c_int {
    // SAFETY: the caller passes NULL or valid pointers.
    runtime_call(Func::cudaMemPoolCreate, || unsafe {
        create(mem_pool, props)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemPoolDestroy(mem_pool: CudaMemPool) -> c_int {
    runtime_call(Func::cudaMemPoolDestroy, || destroy(mem_pool))
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
    // SAFETY: forwarded from the caller.
    runtime_call(Func::cudaMemPoolGetAttribute, || unsafe {
        get_attribute(pool, attr, value)
    })
}

/// `cudaMemPoolGetAttribute`'s answer, also `cuMemPoolGetAttribute`'s.
///
/// # Safety
/// `value` must be NULL or valid for writing the attribute's type.
pub unsafe fn get_attribute(pool: CudaMemPool, attr: c_int, value: *mut c_void) -> CudaResult {
    let attr = resolve(attr, value)?;
    let v = with_state(|st| Ok(st.pools.entry_mut(pool as usize)?.pool.get(attr)))?;
    if attr.is_int() {
        // SAFETY: `value` is not NULL and, by the caller's contract, valid for an int.
        unsafe { value.cast::<c_int>().write_unaligned(v as c_int) };
    } else {
        // SAFETY: `value` is not NULL and, by the caller's contract, valid for a u64.
        unsafe { value.cast::<u64>().write_unaligned(v) };
    }
    Ok(())
}

/// The current figures cannot be set; the high-water marks only to 0 (a reset to the current
/// value); a reuse policy to any `int` (non-zero: enabled).
#[no_mangle]
pub unsafe extern "C" fn cudaMemPoolSetAttribute(
    pool: CudaMemPool,
    attr: c_int,
    value: *mut c_void,
) -> c_int {
    // SAFETY: forwarded from the caller.
    runtime_call(Func::cudaMemPoolSetAttribute, || unsafe {
        set_attribute(pool, attr, value)
    })
}

/// `cudaMemPoolSetAttribute`'s answer, also `cuMemPoolSetAttribute`'s.
///
/// # Safety
/// `value` must be NULL or valid for reading the attribute's type.
pub unsafe fn set_attribute(pool: CudaMemPool, attr: c_int, value: *mut c_void) -> CudaResult {
    let attr = resolve(attr, value)?;
    let v = if attr.is_int() {
        // SAFETY: `value` is not NULL and, by the caller's contract, holds an int.
        u64::from(unsafe { value.cast::<c_int>().read_unaligned() } != 0)
    } else {
        // SAFETY: `value` is not NULL and, by the caller's contract, holds a u64.
        unsafe { value.cast::<u64>().read_unaligned() }
    };
    with_state(|st| st.pools.entry_mut(pool as usize)?.pool.set(attr, v))
}

/// `cudaMemAccessDesc` and the driver's `CUmemAccessDesc`: a location, then its access flags.
#[repr(C)]
pub struct MemAccessDesc {
    location_type: c_int,
    location_id: c_int,
    flags: c_int,
}

/// `cudaMemAccessFlagsProtNone`, `ProtRead`, `ProtReadWrite`.
const ACCESS_FLAGS: [c_int; 3] = [0, 1, 3];

/// Which devices may use the memory of `pool` (PyTorch's `cudaMallocAsync` backend lets peers
/// reach a device's tensors so). Checked, then nothing recorded: the simulator refuses no
/// device's kernel on pool memory, as on `cudaMalloc` memory (*Peer access*).
#[no_mangle]
pub unsafe extern "C" fn cudaMemPoolSetAccess(
    pool: CudaMemPool,
    descs: *const MemAccessDesc,
    count: usize,
) -> c_int {
    // SAFETY: forwarded from the caller.
    runtime_call(Func::cudaMemPoolSetAccess, || unsafe {
        set_access(pool, descs, count)
    })
}

/// `cudaMemPoolSetAccess`'s answer, also `cuMemPoolSetAccess`'s.
///
/// # Safety
/// `descs` must be NULL or valid for reading `count` descriptors.
pub unsafe fn set_access(
    pool: CudaMemPool,
    descs: *const MemAccessDesc,
    count: usize,
) -> CudaResult {
    with_state(|st| st.pools.entry_mut(pool as usize).map(|_| ()))?;
    if descs.is_null() || count == 0 {
        return Err(INVALID_VALUE);
    }
    // SAFETY: not NULL, and by the caller's contract `count` descriptors.
    let descs = unsafe { std::slice::from_raw_parts(descs, count) };
    for d in descs {
        if d.location_type != LOCATION_DEVICE || !ACCESS_FLAGS.contains(&d.flags) {
            return Err(INVALID_VALUE);
        }
        device_index(d.location_id)?;
    }
    Ok(())
}

/// Releases kept bytes until the pool reserves at most `min_bytes_to_keep` (used bytes stay).
#[no_mangle]
pub unsafe extern "C" fn cudaMemPoolTrimTo(pool: CudaMemPool, min_bytes_to_keep: usize) -> c_int {
    runtime_call(Func::cudaMemPoolTrimTo, || trim_to(pool, min_bytes_to_keep))
}

/// `cudaMemPoolTrimTo`'s answer, also `cuMemPoolTrimTo`'s.
pub fn trim_to(pool: CudaMemPool, min_bytes_to_keep: usize) -> CudaResult {
    with_state(|st| {
        let e = st.pools.entry_mut(pool as usize)?;
        e.pool.trim_to(min_bytes_to_keep as u64);
        Ok(())
    })
}
