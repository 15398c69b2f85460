//! Virtual memory management: reserve address space, create physical memory, map it, give the
//! device access, unmap, release. The model is `crate::vmm`; this file checks the arguments
//! as CUDA does and accounts physical memory on the same capacity as `cuMemAlloc_v2`.

use super::{driver_call, CuDevicePtr, CuResult};
use crate::config;
use crate::context;
use crate::errors::{
    CudaResult, CU_NOT_SUPPORTED, INVALID_DEVICE, INVALID_VALUE, MEMORY_ALLOCATION,
};
use crate::faults::Func;
use crate::ffi::Out;
use crate::state::{with_state, State};
use crate::vmm::{self, Prot, GRANULARITY};
use std::ffi::{c_int, c_ulonglong, c_void};

/// `CUmemGenericAllocationHandle`.
pub type MemHandle = c_ulonglong;

/// `CU_MEM_ALLOCATION_TYPE_PINNED`, `CU_MEM_LOCATION_TYPE_DEVICE`.
const ALLOCATION_TYPE_PINNED: c_int = 1;
const LOCATION_TYPE_DEVICE: c_int = 1;
/// `CU_MEM_ALLOC_GRANULARITY_MINIMUM`, `_RECOMMENDED`.
const GRANULARITY_MINIMUM: c_int = 0;
const GRANULARITY_RECOMMENDED: c_int = 1;
/// `CU_MEM_ACCESS_FLAGS_PROT_NONE`, `_READ`, `_READWRITE`.
const PROT_NONE: c_int = 0;
const PROT_READ: c_int = 1;
const PROT_READWRITE: c_int = 3;

/// `CUmemLocation`.
#[repr(C)]
pub struct MemLocation {
    kind: c_int,
    id: c_int,
}

/// The `allocFlags` of `CUmemAllocationProp`: the simulator reads `gpuDirectRDMACapable` only.
#[repr(C)]
pub struct AllocFlags {
    compression_type: u8,
    gpu_direct_rdma_capable: u8,
    usage: u16,
    reserved: [u8; 4],
}

/// `CUmemAllocationProp`.
#[repr(C)]
pub struct AllocationProp {
    kind: c_int,
    requested_handle_types: c_int,
    location: MemLocation,
    win32_handle_meta_data: *mut c_void,
    alloc_flags: AllocFlags,
}

/// `CUmemAccessDesc`.
#[repr(C)]
pub struct AccessDesc {
    location: MemLocation,
    flags: c_int,
}

// The layouts of CUDA's cuda.h on 64-bit Linux.
const _: () = assert!(std::mem::size_of::<AllocationProp>() == 32);
const _: () = assert!(std::mem::size_of::<AccessDesc>() == 12);

/// The device a location names: it must be a device (`CUDA_ERROR_INVALID_VALUE`) in range
/// (`CUDA_ERROR_INVALID_DEVICE`).
fn location_device(loc: &MemLocation) -> CudaResult<usize> {
    if loc.kind != LOCATION_TYPE_DEVICE {
        return Err(INVALID_VALUE);
    }
    let devices = config::get()?.devices;
    usize::try_from(loc.id)
        .ok()
        .filter(|&d| d < devices)
        .ok_or(INVALID_DEVICE)
}

/// The device of pinned device memory that `prop` asks for.
///
/// # Safety
/// `prop` must be NULL or point to a readable `CUmemAllocationProp`.
unsafe fn prop_device(prop: *const AllocationProp) -> CudaResult<usize> {
    // SAFETY: by the caller's contract, NULL or readable.
    let prop = unsafe { prop.as_ref() }.ok_or(INVALID_VALUE)?;
    if prop.kind != ALLOCATION_TYPE_PINNED {
        return Err(INVALID_VALUE);
    }
    location_device(&prop.location)
}

/// Physical memory of `device` is gone (released and unmapped, or never mapped).
fn physical_freed(st: &mut State, device: usize, size: usize) {
    let dev = &mut st.devices[device];
    dev.live_allocations -= 1;
    dev.live_bytes -= size as u64;
    dev.vmm_created_bytes -= size as u64;
}

/// 2 MiB, the minimum and the recommended granularity alike. Needs no context.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const AllocationProp,
    option: c_int,
) -> CuResult {
    driver_call(Func::cuMemGetAllocationGranularity, || {
        context::require_init()?;
        // SAFETY: the caller passes NULL or a pointer valid for writing a size_t.
        let out = unsafe { Out::new(granularity)? };
        // SAFETY: the caller passes NULL or a readable CUmemAllocationProp.
        unsafe { prop_device(prop)? };
        if option != GRANULARITY_MINIMUM && option != GRANULARITY_RECOMMENDED {
            return Err(INVALID_VALUE);
        }
        out.set(GRANULARITY);
        Ok(())
    })
}

/// Address space only: no device memory, nothing taken from any capacity. The address hint
/// is ignored (CUDA treats it as a hint too); `flags` must be 0.
#[no_mangle]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CuDevicePtr,
    size: usize,
    alignment: usize,
    _addr: CuDevicePtr,
    flags: c_ulonglong,
) -> CuResult {
    driver_call(Func::cuMemAddressReserve, || {
        context::require_context()?;
        // SAFETY: the caller passes NULL or a pointer valid for writing a CUdeviceptr.
        let out = unsafe { Out::new(ptr)? };
        let align_ok = alignment == 0 || (vmm::granular(alignment) && alignment.is_power_of_two());
        if flags != 0 || !vmm::granular(size) || !align_ok {
            return Err(INVALID_VALUE);
        }
        let base = with_state(|st| st.vmm.reserve(size, alignment).ok_or(MEMORY_ALLOCATION))?;
        out.set(base as CuDevicePtr);
        Ok(())
    })
}

/// The range must be exactly one reservation with no mapping left in it.
#[no_mangle]
pub unsafe extern "C" fn cuMemAddressFree(ptr: CuDevicePtr, size: usize) -> CuResult {
    driver_call(Func::cuMemAddressFree, || {
        context::require_context()?;
        with_state(|st| {
            if st.vmm.unreserve(ptr as usize, size) {
                Ok(())
            } else {
                Err(INVALID_VALUE)
            }
        })
    })
}

/// Physical memory on the prop's device, taken from the capacity `cuMemAlloc_v2` uses.
/// Shareable handle types are not simulated (`CUDA_ERROR_NOT_SUPPORTED`); `flags` must be 0.
/// `gpuDirectRDMACapable` is counted in `vmm_rdma_creates`, and refused
/// (`CUDA_ERROR_NOT_SUPPORTED`) where the devices lack it (`CUDASIM_VMM_RDMA=0`).
#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut MemHandle,
    size: usize,
    prop: *const AllocationProp,
    flags: c_ulonglong,
) -> CuResult {
    driver_call(Func::cuMemCreate, || {
        context::require_context()?;
        // SAFETY: the caller passes NULL or a pointer valid for writing the handle.
        let out = unsafe { Out::new(handle)? };
        // SAFETY: the caller passes NULL or a readable CUmemAllocationProp.
        let d = unsafe { prop_device(prop)? };
        // SAFETY: checked readable just above.
        let prop = unsafe { &*prop };
        if prop.requested_handle_types != 0 {
            return Err(CU_NOT_SUPPORTED);
        }
        let rdma = prop.alloc_flags.gpu_direct_rdma_capable != 0;
        if rdma && !config::get()?.vmm_rdma {
            return Err(CU_NOT_SUPPORTED);
        }
        if flags != 0 || !vmm::granular(size) {
            return Err(INVALID_VALUE);
        }
        let h = with_state(|st| {
            st.use_device(d).counters.vmm_creates += 1;
            if size as u64 > st.free_bytes(d) {
                return Err(MEMORY_ALLOCATION);
            }
            let h = st.vmm.create(d, size).ok_or(MEMORY_ALLOCATION)?;
            let dev = &mut st.devices[d];
            dev.live_allocations += 1;
            dev.live_bytes += size as u64;
            dev.peak_live_bytes = dev.peak_live_bytes.max(dev.live_bytes);
            dev.vmm_created_bytes += size as u64;
            dev.counters.vmm_rdma_creates += u64::from(rdma);
            Ok(h)
        })?;
        out.set(h);
        Ok(())
    })
}

/// A handle still mapped keeps its memory until its last unmap, as in CUDA.
#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: MemHandle) -> CuResult {
    driver_call(Func::cuMemRelease, || {
        context::require_context()?;
        with_state(|st| {
            let (device, size) = st
                .vmm
                .handle(handle)
                .map(|h| (h.device, h.size))
                .ok_or(INVALID_VALUE)?;
            if st.vmm.release(handle) == Some(true) {
                physical_freed(st, device, size);
            }
            Ok(())
        })
    })
}

/// Maps the whole handle (`offset` 0 and `size` its size: the simulator maps nothing less)
/// at `ptr`, a granule of free reserved space; the device has no access until
/// `cuMemSetAccess`. `flags` must be 0.
#[no_mangle]
pub unsafe extern "C" fn cuMemMap(
    ptr: CuDevicePtr,
    size: usize,
    offset: usize,
    handle: MemHandle,
    flags: c_ulonglong,
) -> CuResult {
    driver_call(Func::cuMemMap, || {
        context::require_context()?;
        if flags != 0 || offset != 0 || !vmm::granular(size) {
            return Err(INVALID_VALUE);
        }
        with_state(|st| {
            let d = st
                .vmm
                .map(ptr as usize, size, handle)
                .ok_or(INVALID_VALUE)?;
            let dev = &mut st.devices[d];
            dev.vmm_mapped_bytes += size as u64;
            dev.counters.vmm_maps += 1;
            Ok(())
        })
    })
}

/// Unmaps the whole mappings of the range (one cut in part → `CUDA_ERROR_INVALID_VALUE`).
/// Like CUDA, it waits for nothing: a kernel not yet complete on the range is counted in
/// `unmapped_while_busy` and the unmap proceeds (the kernel's fill is then dropped).
#[no_mangle]
pub unsafe extern "C" fn cuMemUnmap(ptr: CuDevicePtr, size: usize) -> CuResult {
    driver_call(Func::cuMemUnmap, || {
        context::require_context()?;
        with_state(|st| {
            let lo = ptr as usize;
            let busy = st.queue.kernels_overlapping(lo, lo.saturating_add(size)) > 0;
            let done = st.vmm.unmap(lo, size).ok_or(INVALID_VALUE)?;
            for u in &done {
                st.devices[u.device].vmm_mapped_bytes -= u.size as u64;
                if u.freed {
                    physical_freed(st, u.device, u.size);
                }
            }
            // Counted once per call, on the device of the range's first mapping.
            let counters = &mut st.devices[done[0].device].counters;
            counters.vmm_unmaps += 1;
            counters.unmapped_while_busy += u64::from(busy);
            Ok(())
        })
    })
}

/// Gives each descriptor's device its access (`PROT_NONE`, `PROT_READ` or `PROT_READWRITE`)
/// to the whole mappings that tile the range without holes.
#[no_mangle]
pub unsafe extern "C" fn cuMemSetAccess(
    ptr: CuDevicePtr,
    size: usize,
    desc: *const AccessDesc,
    count: usize,
) -> CuResult {
    driver_call(Func::cuMemSetAccess, || {
        context::require_context()?;
        if desc.is_null() || count == 0 {
            return Err(INVALID_VALUE);
        }
        // SAFETY: not NULL, and the caller passes `count` readable descriptors.
        let descs = unsafe { std::slice::from_raw_parts(desc, count) };
        let grants = descs
            .iter()
            .map(|a| {
                let prot = match a.flags {
                    PROT_NONE => Prot::None,
                    PROT_READ => Prot::Read,
                    PROT_READWRITE => Prot::ReadWrite,
                    _ => return Err(INVALID_VALUE),
                };
                Ok((location_device(&a.location)?, prot))
            })
            .collect::<CudaResult<Vec<_>>>()?;
        with_state(|st| {
            for (device, prot) in grants {
                // The range is the same for every grant: the first refusal changes nothing.
                if !st.vmm.set_access(ptr as usize, size, device, prot) {
                    return Err(INVALID_VALUE);
                }
            }
            Ok(())
        })
    })
}
