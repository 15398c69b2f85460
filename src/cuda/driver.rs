//! The CUDA driver the process loaded, as a table of its entry points: the real functions
//! behind the driver hooks, and the pool's backend where no runtime is loaded.
//!
//! Found only among loaded objects (`dlopen` with `RTLD_NOLOAD`): the library never loads the
//! driver into a process that did not load it.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use super::dl;
use super::symbols::{optional, required, Lookup};
use super::types::{Event, Stream};

/// `CUresult`.
pub type CuResult = c_int;
/// `CUdevice`.
pub type CuDevice = c_int;
/// `CUdeviceptr`.
pub type CuDevicePtr = u64;
/// `CUcontext`.
pub type CuContext = *mut c_void;

pub const CU_SUCCESS: CuResult = 0;
pub const CU_ERROR_INVALID_VALUE: CuResult = 1;
pub const CU_ERROR_OUT_OF_MEMORY: CuResult = 2;
pub const CU_ERROR_NOT_INITIALIZED: CuResult = 3;
pub const CU_ERROR_INVALID_CONTEXT: CuResult = 201;
pub const CU_ERROR_INVALID_HANDLE: CuResult = 400;
pub const CU_ERROR_PEER_ACCESS_ALREADY_ENABLED: CuResult = 704;
pub const CU_ERROR_UNKNOWN: CuResult = 999;

pub type MemAllocFn = unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult;
pub type MemFreeFn = unsafe extern "C" fn(CuDevicePtr) -> CuResult;
pub type MemAllocPitchFn =
    unsafe extern "C" fn(*mut CuDevicePtr, *mut usize, usize, usize, c_uint) -> CuResult;
pub type MemAllocAsyncFn = unsafe extern "C" fn(*mut CuDevicePtr, usize, Stream) -> CuResult;
pub type MemAllocManagedFn = unsafe extern "C" fn(*mut CuDevicePtr, usize, u32) -> CuResult;
pub type MemAllocFromPoolAsyncFn =
    unsafe extern "C" fn(*mut CuDevicePtr, usize, CuMemoryPool, Stream) -> CuResult;
pub type MemFreeAsyncFn = unsafe extern "C" fn(CuDevicePtr, Stream) -> CuResult;
pub type MemGetInfoFn = unsafe extern "C" fn(*mut usize, *mut usize) -> CuResult;
pub type VoidFn = unsafe extern "C" fn() -> CuResult;
pub type StreamFn = unsafe extern "C" fn(Stream) -> CuResult;
pub type EventFn = unsafe extern "C" fn(Event) -> CuResult;
pub type EventRecordFn = unsafe extern "C" fn(Event, Stream) -> CuResult;
pub type EventCreateFn = unsafe extern "C" fn(*mut Event, c_uint) -> CuResult;
pub type StreamWaitEventFn = unsafe extern "C" fn(Stream, Event, c_uint) -> CuResult;
pub type StreamCreateFn = unsafe extern "C" fn(*mut Stream, c_uint) -> CuResult;
pub type StreamCreateWithPriorityFn = unsafe extern "C" fn(*mut Stream, c_uint, c_int) -> CuResult;
pub type StreamGetIdFn = unsafe extern "C" fn(Stream, *mut u64) -> CuResult;
/// `cuStreamGetCtx`.
pub type StreamGetCtxFn = unsafe extern "C" fn(Stream, *mut CuContext) -> CuResult;
pub type StreamIsCapturingFn = unsafe extern "C" fn(Stream, *mut c_int) -> CuResult;
pub type StreamGetFlagsFn = unsafe extern "C" fn(Stream, *mut c_uint) -> CuResult;
pub type CtxGetCurrentFn = unsafe extern "C" fn(*mut CuContext) -> CuResult;
/// `cuCtxPopCurrent_v2`: the context popped goes to the pointer, when it is not NULL.
pub type CtxPopCurrentFn = unsafe extern "C" fn(*mut CuContext) -> CuResult;
pub type CtxGetDeviceFn = unsafe extern "C" fn(*mut CuDevice) -> CuResult;
pub type CtxFn = unsafe extern "C" fn(CuContext) -> CuResult;
pub type CtxCreateFn = unsafe extern "C" fn(*mut CuContext, c_uint, CuDevice) -> CuResult;
/// `cuCtxCreate_v3` (CUDA 11.4 to 12.4's `cuCtxCreate` by lookup): the execution affinity
/// parameters (MPS) and their count as the caller gave them.
pub type CtxCreateV3Fn =
    unsafe extern "C" fn(*mut CuContext, *mut c_void, c_int, c_uint, CuDevice) -> CuResult;
/// `cuCtxCreate_v4` (CUDA 12.5; CUDA 13's `cuCtxCreate`): its parameters as the caller gave them.
pub type CtxCreateV4Fn =
    unsafe extern "C" fn(*mut CuContext, *mut c_void, c_uint, CuDevice) -> CuResult;
/// `cuGreenCtxCreate` (CUDA 12.4): the green context out, the resource descriptor, the device
/// and the flags, as the caller gave them.
pub type GreenCtxCreateFn =
    unsafe extern "C" fn(*mut *mut c_void, *mut c_void, CuDevice, c_uint) -> CuResult;
/// `cuGreenCtxStreamCreate` (CUDA 12.5): the stream out, the green context, the flags and the
/// priority, as the caller gave them.
pub type GreenCtxStreamCreateFn =
    unsafe extern "C" fn(*mut Stream, *mut c_void, c_uint, c_int) -> CuResult;
pub type DeviceFn = unsafe extern "C" fn(CuDevice) -> CuResult;
pub type PrimaryCtxRetainFn = unsafe extern "C" fn(*mut CuContext, CuDevice) -> CuResult;
pub type PrimaryCtxGetStateFn = unsafe extern "C" fn(CuDevice, *mut c_uint, *mut c_int) -> CuResult;
pub type DeviceGetCountFn = unsafe extern "C" fn(*mut c_int) -> CuResult;
/// `CUmemoryPool`: a `cudaMemPool_t`.
pub type CuMemoryPool = *mut c_void;
/// `cuDeviceGetMemPool`, `cuDeviceGetDefaultMemPool`.
pub type DeviceGetMemPoolFn = unsafe extern "C" fn(*mut CuMemoryPool, CuDevice) -> CuResult;
/// `cuDeviceSetMemPool`.
pub type DeviceSetMemPoolFn = unsafe extern "C" fn(CuDevice, CuMemoryPool) -> CuResult;
/// `cuMemPoolDestroy`.
pub type MemPoolDestroyFn = unsafe extern "C" fn(CuMemoryPool) -> CuResult;
/// `cuMemPoolGetAttribute`, `cuMemPoolSetAttribute`.
pub type MemPoolAttributeFn = unsafe extern "C" fn(CuMemoryPool, c_int, *mut c_void) -> CuResult;
/// `cuMemPoolTrimTo`.
pub type MemPoolTrimToFn = unsafe extern "C" fn(CuMemoryPool, usize) -> CuResult;
pub type LaunchKernelFn = unsafe extern "C" fn(
    *mut c_void,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    Stream,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CuResult;
/// `CUmemAllocationProp` (32 bytes): pinned device memory on `location_id`, no shareable
/// handle. `alloc_flags` is `compressionType`, `gpuDirectRDMACapable`, `usage` (2 bytes) and
/// 4 reserved bytes.
#[repr(C)]
pub struct MemAllocationProp {
    pub kind: c_int,
    pub requested_handle_types: c_int,
    pub location_type: c_int,
    pub location_id: c_int,
    pub win32_handle_meta_data: *mut c_void,
    pub alloc_flags: [u8; 8],
}

const _: () = assert!(std::mem::size_of::<MemAllocationProp>() == 32);
const _: () = assert!(std::mem::size_of::<MemAccessDesc>() == 12);

/// `CUmemAccessDesc` (12 bytes).
#[repr(C)]
pub struct MemAccessDesc {
    pub location_type: c_int,
    pub location_id: c_int,
    pub flags: c_int,
}

/// `CU_MEM_ALLOCATION_TYPE_PINNED`, `CU_MEM_LOCATION_TYPE_DEVICE`,
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`, `CU_MEM_ALLOC_GRANULARITY_MINIMUM`.
pub const MEM_ALLOCATION_TYPE_PINNED: c_int = 1;
pub const MEM_LOCATION_TYPE_DEVICE: c_int = 1;
pub const MEM_ACCESS_PROT_READWRITE: c_int = 3;
pub const MEM_GRANULARITY_MINIMUM: c_int = 0;

pub type InitFn = unsafe extern "C" fn(c_uint) -> CuResult;
pub type MemGetGranularityFn =
    unsafe extern "C" fn(*mut usize, *const MemAllocationProp, c_int) -> CuResult;
pub type MemAddressReserveFn =
    unsafe extern "C" fn(*mut CuDevicePtr, usize, usize, CuDevicePtr, u64) -> CuResult;
pub type MemAddressFreeFn = unsafe extern "C" fn(CuDevicePtr, usize) -> CuResult;
pub type MemCreateFn =
    unsafe extern "C" fn(*mut u64, usize, *const MemAllocationProp, u64) -> CuResult;
pub type MemReleaseFn = unsafe extern "C" fn(u64) -> CuResult;
pub type MemMapFn = unsafe extern "C" fn(CuDevicePtr, usize, usize, u64, u64) -> CuResult;
pub type MemUnmapFn = unsafe extern "C" fn(CuDevicePtr, usize) -> CuResult;
pub type MemSetAccessFn =
    unsafe extern "C" fn(CuDevicePtr, usize, *const MemAccessDesc, usize) -> CuResult;

pub type MemPoolSetAccessFn =
    unsafe extern "C" fn(CuMemoryPool, *const MemAccessDesc, usize) -> CuResult;

/// The virtual memory calls expandable segments need (`cuMemCreate` and its kin), when the
/// driver has them all.
#[derive(Clone, Copy)]
pub struct Vmm {
    pub get_granularity: MemGetGranularityFn,
    pub address_reserve: MemAddressReserveFn,
    pub address_free: MemAddressFreeFn,
    pub create: MemCreateFn,
    pub release: MemReleaseFn,
    pub map: MemMapFn,
    pub unmap: MemUnmapFn,
    pub set_access: MemSetAccessFn,
    /// `cuDeviceCanAccessPeer`: which other devices may be given access to mapped memory.
    pub can_access_peer: Option<DeviceCanAccessPeerFn>,
    /// `cuDeviceGetAttribute`: whether mapped memory may be made GPUDirect RDMA capable.
    pub device_get_attribute: Option<DeviceGetAttributeFn>,
}

/// `cuDeviceCanAccessPeer(can, device, peer)`: whether `device` can reach `peer`'s memory.
pub type DeviceCanAccessPeerFn = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> CuResult;
/// `cuDeviceGetAttribute(value, attribute, device)`.
pub type DeviceGetAttributeFn = unsafe extern "C" fn(*mut c_int, c_int, CuDevice) -> CuResult;
/// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED`: `cuMemCreate` accepts
/// `allocFlags.gpuDirectRDMACapable` on the device.
pub const DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: c_int = 110;
/// The byte of `MemAllocationProp::alloc_flags` that is `gpuDirectRDMACapable` (after
/// `compressionType`).
pub const ALLOC_FLAG_GPU_DIRECT_RDMA_CAPABLE: usize = 1;

impl Vmm {
    fn resolve(lookup: Lookup) -> Option<Vmm> {
        Some(Vmm {
            get_granularity: optional!(lookup, "cuMemGetAllocationGranularity")?,
            address_reserve: optional!(lookup, "cuMemAddressReserve")?,
            address_free: optional!(lookup, "cuMemAddressFree")?,
            create: optional!(lookup, "cuMemCreate")?,
            release: optional!(lookup, "cuMemRelease")?,
            map: optional!(lookup, "cuMemMap")?,
            unmap: optional!(lookup, "cuMemUnmap")?,
            set_access: optional!(lookup, "cuMemSetAccess")?,
            can_access_peer: optional!(lookup, "cuDeviceCanAccessPeer"),
            device_get_attribute: optional!(lookup, "cuDeviceGetAttribute"),
        })
    }
}

/// `cuIpcGetMemHandle`: the handle is 64 opaque bytes, as `cudaIpcMemHandle_t`.
pub type IpcGetMemHandleFn =
    unsafe extern "C" fn(*mut super::types::IpcMemHandle, CuDevicePtr) -> CuResult;
/// `cuCtxEnablePeerAccess`.
pub type CtxEnablePeerAccessFn = unsafe extern "C" fn(CuContext, c_uint) -> CuResult;
/// `cuMemGetAddressRange_v2`: the base and size of the allocation holding an address.
pub type MemGetAddressRangeFn =
    unsafe extern "C" fn(*mut CuDevicePtr, *mut usize, CuDevicePtr) -> CuResult;
/// `cuGetProcAddress` (CUDA 11.3).
pub type GetProcAddressFn =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> CuResult;
/// `cuGetProcAddress_v2` (CUDA 12.0): also the query result.
pub type GetProcAddressV2Fn =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CuResult;

/// The driver's entry points the pool calls, by their versioned names. The first group must
/// exist for the driver path to be pooled; the rest are used when present.
#[derive(Clone, Copy)]
pub struct Driver {
    pub mem_alloc: MemAllocFn,
    pub mem_free: MemFreeFn,
    pub mem_get_info: MemGetInfoFn,
    pub ctx_synchronize: VoidFn,
    pub ctx_get_current: CtxGetCurrentFn,
    pub ctx_get_device: CtxGetDeviceFn,
    pub primary_ctx_retain: PrimaryCtxRetainFn,
    pub primary_ctx_release: DeviceFn,
    pub primary_ctx_get_state: PrimaryCtxGetStateFn,
    pub event_create: EventCreateFn,
    pub event_record: EventRecordFn,
    pub stream_wait_event: StreamWaitEventFn,
    pub device_get_count: Option<DeviceGetCountFn>,
    pub stream_get_id: Option<StreamGetIdFn>,
    pub stream_is_capturing: Option<StreamIsCapturingFn>,
    pub stream_get_flags: Option<StreamGetFlagsFn>,
    /// A stream's context: where several devices are seen, it places a stream on the current
    /// one (`dispatch::driver::in_current_context`).
    pub stream_get_ctx: Option<StreamGetCtxFn>,
    /// The virtual memory calls, for expandable segments.
    pub vmm: Option<Vmm>,
    /// `cuInit`: the pool's first virtual memory query may come before the runtime initialised
    /// the driver.
    pub init: Option<InitFn>,
    pub ctx_set_current: Option<CtxFn>,
    /// Each device's current and default memory pools: the program's own pool is left to the
    /// driver (`dispatch::current_pool`).
    pub device_get_mem_pool: Option<DeviceGetMemPoolFn>,
    pub device_get_default_mem_pool: Option<DeviceGetMemPoolFn>,
    /// What a default pool's CUDA part reserves, for a trim (`dispatch::default_pool`).
    pub mem_pool_get_attribute: Option<MemPoolAttributeFn>,
}

impl Driver {
    /// Build the table from a lookup of versioned names in the driver.
    pub fn resolve(lookup: Lookup) -> Result<Driver, &'static str> {
        Ok(Driver {
            mem_alloc: required!(lookup, "the driver", "cuMemAlloc_v2"),
            mem_free: required!(lookup, "the driver", "cuMemFree_v2"),
            mem_get_info: required!(lookup, "the driver", "cuMemGetInfo_v2"),
            ctx_synchronize: required!(lookup, "the driver", "cuCtxSynchronize"),
            ctx_get_current: required!(lookup, "the driver", "cuCtxGetCurrent"),
            ctx_get_device: required!(lookup, "the driver", "cuCtxGetDevice"),
            primary_ctx_retain: required!(lookup, "the driver", "cuDevicePrimaryCtxRetain"),
            primary_ctx_release: required!(lookup, "the driver", "cuDevicePrimaryCtxRelease_v2"),
            primary_ctx_get_state: required!(lookup, "the driver", "cuDevicePrimaryCtxGetState"),
            event_create: required!(lookup, "the driver", "cuEventCreate"),
            event_record: required!(lookup, "the driver", "cuEventRecord"),
            stream_wait_event: required!(lookup, "the driver", "cuStreamWaitEvent"),
            device_get_count: optional!(lookup, "cuDeviceGetCount"),
            stream_get_id: optional!(lookup, "cuStreamGetId"),
            stream_is_capturing: optional!(lookup, "cuStreamIsCapturing"),
            stream_get_flags: optional!(lookup, "cuStreamGetFlags"),
            stream_get_ctx: optional!(lookup, "cuStreamGetCtx"),
            ctx_set_current: optional!(lookup, "cuCtxSetCurrent"),
            vmm: Vmm::resolve(lookup),
            init: optional!(lookup, "cuInit"),
            device_get_mem_pool: optional!(lookup, "cuDeviceGetMemPool"),
            device_get_default_mem_pool: optional!(lookup, "cuDeviceGetDefaultMemPool"),
            mem_pool_get_attribute: optional!(lookup, "cuMemPoolGetAttribute"),
        })
    }
}

/// The loaded driver, once found; null until then or when none is loaded (asked again then:
/// the program may load it later).
static DRIVER: AtomicPtr<Located> = AtomicPtr::new(std::ptr::null_mut());

/// The driver and where it was found.
pub struct Located {
    pub driver: Driver,
    pub path: String,
    /// The object's handle, kept open: the real functions behind the hooks are looked up in it.
    pub handle: *mut c_void,
}

// SAFETY: the handle is only passed to dlsym, which is thread-safe; the rest is plain data.
unsafe impl Send for Located {}
// SAFETY: as above.
unsafe impl Sync for Located {}

/// The driver the process loaded, if it loaded one (never loads it). Looks among the loaded
/// objects until it is found (`dlopen`, `dlsym`, `dladdr`: each takes the dynamic linker's
/// lock), so never under a pool lock: there, `found`. The looking is done on a thread of its
/// own (`plain_thread::run_aside`), since it clears the calling thread's `dlerror()`, which may
/// hold an error the program has yet to read: this is called from the driver hooks.
pub fn loaded() -> Option<&'static Located> {
    if let Some(d) = found() {
        return Some(d);
    }
    if !worth_looking() {
        return None;
    }
    // With the hooks off (`GPUPOOL_DRIVER_HOOKS=0`, `GPUPOOL_DISABLE=1`) the pool starts no
    // thread: it looks here, as before it kept `dlerror()`.
    if !crate::config::driver_hooks() || !crate::plain_thread::run_aside(c"gpupool-lookup", look) {
        look();
    }
    found()
}

/// `loaded`, looking on the calling thread: for callers inside a `dl*` call of the program's
/// (the exported `dlsym`), whose own error state glibc sets when it returns, and for the
/// runtime's path, whose first call looked up the runtime there already.
pub fn loaded_here() -> Option<&'static Located> {
    if let Some(d) = found() {
        return Some(d);
    }
    if worth_looking() {
        look();
    }
    found()
}

/// `objects_added` when the last look found no driver; `u64::MAX` before any.
static MISSED_AT: AtomicU64 = AtomicU64::new(u64::MAX);

/// Whether a look could find what the last one missed: something was loaded since. Counting
/// the loaded objects calls no `dl*` function that touches `dlerror()`.
fn worth_looking() -> bool {
    MISSED_AT.load(Ordering::Acquire) != dl::objects_added()
}

/// Looks for the driver once and publishes it in `DRIVER`, or notes the miss.
fn look() {
    // Read before looking: a driver loaded while the search runs is looked for next time.
    let added = dl::objects_added();
    let Some(located) = find() else {
        MISSED_AT.store(added, Ordering::Release);
        return;
    };
    let found = Box::into_raw(Box::new(located));
    if DRIVER
        .compare_exchange(
            std::ptr::null_mut(),
            found,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_err()
    {
        // Another thread found it first; its copy stays, ours goes (the handle's extra
        // reference on an object that stays loaded is harmless).
        // SAFETY: `found` is ours, never published.
        drop(unsafe { Box::from_raw(found) });
    }
}

/// The driver once `loaded` found it; never looks (takes no lock of the dynamic linker's), for
/// calls under a pool lock (docs/design-notes.md, "Note: the loader lock").
pub fn found() -> Option<&'static Located> {
    let p = DRIVER.load(Ordering::Acquire);
    // SAFETY: `DRIVER` only ever holds a leaked `Box`, never freed.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// The driver among the loaded objects: by its usual names, else the object that defines
/// `cuGetProcAddress_v2` itself (a driver loaded by a path outside the library search path).
/// Lookups that fail leave no error for the program's `dlerror()`.
fn find() -> Option<Located> {
    let mut failed = false;
    let mut found = ["libcuda.so.1", "libcuda.so"]
        .into_iter()
        .find_map(|name| open_as_driver(name, &mut failed));
    if found.is_none() {
        // Never this library, which exports `cuGetProcAddress_v2` too (its hook).
        let own = dl::object_of(find as *const () as usize).map(|(base, _)| base);
        for path in dl::loaded_objects() {
            if defines_get_proc_address(&path, own, &mut failed) {
                found = open_as_driver(&path, &mut failed);
                if found.is_some() {
                    break;
                }
            }
        }
    }
    if failed {
        dl::forget_lookup_error();
    }
    found
}

/// Whether the loaded object at `path` defines `cuGetProcAddress_v2` itself (not one of its
/// dependencies), and is not the object at `own`.
fn defines_get_proc_address(path: &str, own: Option<*mut c_void>, failed: &mut bool) -> bool {
    let Ok(c) = std::ffi::CString::new(path) else {
        return false;
    };
    // SAFETY: RTLD_NOLOAD opens only an object already loaded; a NUL-terminated path.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
    if h.is_null() {
        *failed = true;
        return false;
    }
    // SAFETY: a live handle and a NUL-terminated name.
    let f = unsafe { dl::real_dlsym(h, c"cuGetProcAddress_v2".as_ptr()) };
    *failed |= f.is_null();
    // SAFETY: the handle just opened, closed once (the object stays loaded).
    unsafe { dl::close(h) };
    !f.is_null()
        && dl::object_of(f as usize).is_some_and(|(base, p)| {
            // SAFETY: a NUL-terminated path owned by the dynamic linker.
            let p = unsafe { std::ffi::CStr::from_ptr(p) };
            Some(base) != own && p.to_bytes() == path.as_bytes()
        })
}

/// The loaded object `name` as the driver, if it is loaded and has the driver's functions.
fn open_as_driver(name: &str, failed: &mut bool) -> Option<Located> {
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: RTLD_NOLOAD opens only an object already loaded (and initialised).
    let handle = unsafe {
        libc::dlopen(
            c.as_ptr(),
            libc::RTLD_NOLOAD | libc::RTLD_LAZY | libc::RTLD_LOCAL,
        )
    };
    if handle.is_null() {
        *failed = true;
        return None;
    }
    let missed = std::cell::Cell::new(false);
    let lookup = |n: &[u8]| -> *mut c_void {
        // SAFETY: a live handle and a NUL-terminated name; looking up has no side effect.
        let p = unsafe { dl::real_dlsym(handle, n.as_ptr().cast()) };
        missed.set(missed.get() || p.is_null());
        p
    };
    let resolved = Driver::resolve(&lookup);
    *failed |= missed.get();
    match resolved {
        Ok(driver) => Some(Located {
            driver,
            path: name.to_string(),
            handle,
        }),
        Err(_) => {
            // SAFETY: the handle from the dlopen above, not used after.
            unsafe { dl::close(handle) };
            None
        }
    }
}

impl Located {
    /// Whether `f` lies in the driver's own object.
    pub fn contains(&self, f: *mut c_void) -> bool {
        let base = |a: usize| dl::object_of(a).map(|(base, _)| base);
        base(f as usize).is_some_and(|b| Some(b) == base(self.driver.mem_alloc as usize))
    }

    /// The driver's own function of a versioned name, or null.
    pub fn symbol(&self, name: &std::ffi::CStr) -> *mut c_void {
        // SAFETY: a live handle and a NUL-terminated name.
        unsafe { dl::real_dlsym(self.handle, name.as_ptr()) }
    }
}
