//! The pool's backend: the application's runtime once it was found, else the driver the process
//! loaded (a program that uses only the driver API). Either serves blocks of both APIs: a
//! primary context's memory is the same to `cudaFree` and `cuMemFree`.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::OnceLock;

use super::captures;
use super::contexts::{self, in_primary_context};
use super::driver::{self, Driver};
use super::last_error;
use super::runtime::Runtime;
use super::types::{Event, Stream, EVENT_DISABLE_TIMING, SUCCESS};
use crate::log;
use crate::pool::{Addr, Backend, CudaError, DeviceSet, MAX_DEVICES};

/// The runtime the pool's calls go to, once a runtime hook found it (`global::init`).
static RUNTIME: OnceLock<Runtime> = OnceLock::new();

/// Called once the application's runtime is found: the pool's calls go to it from then on.
pub fn runtime_found(rt: Runtime) {
    let _ = RUNTIME.set(rt);
}

/// Which API the pool's own calls go to.
enum Api {
    Runtime(&'static Runtime),
    Driver(&'static Driver),
}

fn api() -> Result<Api, CudaError> {
    if let Some(rt) = RUNTIME.get() {
        return Ok(Api::Runtime(rt));
    }
    match driver::found() {
        Some(d) => Ok(Api::Driver(&d.driver)),
        // Only a driver hook or a runtime hook calls the pool, and each found its library.
        None => Err(CudaError::UNKNOWN),
    }
}

pub struct CudaBackend {
    /// One event per device for the barrier: recorded on the legacy stream, then waited on
    /// there. Each is an action on the legacy stream, which waits for all earlier work of the
    /// blocking streams while their later work waits for it (CUDA's stream synchronization
    /// behavior names `cudaStreamWaitEvent`; the programming guide, any command to the NULL
    /// stream). Not a wait alone on an event never recorded: such an event is an empty set of
    /// work, and nothing documents that waiting on it orders anything. A peer's is also
    /// recorded on the peer's legacy stream, for the barriers of the devices it reaches.
    barrier_events: Vec<AtomicPtr<c_void>>,
    /// Taken to make one: thread caches take barriers outside the device's lock.
    making_event: parking_lot::Mutex<()>,
    /// For each device, the devices the program let reach its memory
    /// (`cudaDeviceEnablePeerAccess`, `cuCtxEnablePeerAccess`): their kernels may still use a
    /// block the program freed, so a fence of the device waits for them too.
    accessors: Vec<AtomicU64>,
}

impl CudaBackend {
    pub fn new() -> Self {
        CudaBackend {
            barrier_events: (0..MAX_DEVICES)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
            making_event: parking_lot::Mutex::new(()),
            accessors: (0..MAX_DEVICES).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The program let `accessor` reach `owner`'s memory: from now on a fence of `owner` also
    /// waits for `accessor`'s work. Kept after a disable: kernels launched before it may run on.
    pub fn note_peer_access(&self, owner: u32, accessor: u32) {
        if let Some(set) = self
            .accessors
            .get(owner as usize)
            .filter(|_| owner != accessor)
        {
            set.fetch_or(DeviceSet::one(accessor).0, Ordering::AcqRel);
        }
    }

    /// The devices whose kernels may use `owner`'s memory besides its own.
    pub fn accessors_of(&self, owner: u32) -> DeviceSet {
        self.accessors
            .get(owner as usize)
            .map_or(DeviceSet::default(), |s| {
                DeviceSet(s.load(Ordering::Acquire))
            })
    }

    /// `cudaDeviceReset` destroyed the device's context and its events with it: the next barrier
    /// makes a new event. The reset also ended its peer access both ways, and its kernels: a
    /// fence no longer makes its context again to wait for nothing.
    pub fn forget_device(&self, device: u32) {
        if (device as usize) < MAX_DEVICES {
            self.accessors[device as usize].store(0, Ordering::Release);
            let others = !DeviceSet::one(device).0;
            for set in &self.accessors {
                set.fetch_and(others, Ordering::AcqRel);
            }
        }
        if let Some(slot) = self.barrier_events.get(device as usize) {
            // Not while another thread makes one (it would store it after this).
            let _making = self.making_event.lock();
            slot.store(std::ptr::null_mut(), Ordering::Release);
        }
    }

    /// Makes the calling thread's per-thread state of the API the pool's calls go to, before the
    /// thread takes a pool lock for a call that may reach it (`dispatch::ready_for_backend`).
    /// A runtime may register that state's destructor under the dynamic linker's lock at a
    /// thread's first call, which then must not come under a pool lock: a thread inside
    /// `dlopen` holds the linker's lock and may wait for the pool's. `cudaFree(NULL)`, the
    /// runtime's own way to make a thread's state and context, about `device`, whose context
    /// the pool's call is about to use anyway; through the driver alone, the current context
    /// asked for. A failure leaves no error behind (`check_internal`).
    pub fn prepare_thread(&self, device: u32) {
        let _ = match api() {
            Ok(Api::Runtime(rt)) => {
                let r = check_internal(|| on_device(rt, device, || init_runtime(rt)));
                // The driver the runtime loaded, looked for now: under a pool lock the pool's
                // calls only read what was found (`driver::found`).
                let _ = driver::loaded_here();
                r
            }
            Ok(Api::Driver(d)) => {
                let mut ctx: *mut c_void = std::ptr::null_mut();
                // SAFETY: a valid out-pointer.
                check(unsafe { (d.ctx_get_current)(&mut ctx) })
            }
            Err(e) => Err(e),
        };
    }

    fn barrier_event(&self, device: u32) -> Result<Event, CudaError> {
        let slot = &self.barrier_events[device as usize];
        let e = slot.load(Ordering::Acquire);
        if !e.is_null() {
            return Ok(e);
        }
        // One thread makes it (barriers come from the device's lock and from thread caches).
        let _making = self.making_event.lock();
        let e = slot.load(Ordering::Acquire);
        if !e.is_null() {
            return Ok(e);
        }
        let mut e: Event = std::ptr::null_mut();
        let api = api()?;
        // A driver event is a runtime event: either API makes it.
        check_internal(|| match api {
            // SAFETY: `e` is a valid out-pointer; `device` is current (`barrier`).
            Api::Runtime(rt) => unsafe {
                (rt.event_create_with_flags)(&mut e, EVENT_DISABLE_TIMING)
            },
            // SAFETY: as above.
            Api::Driver(d) => unsafe { (d.event_create)(&mut e, EVENT_DISABLE_TIMING) },
        })?;
        slot.store(e, Ordering::Release);
        Ok(e)
    }
}

impl CudaBackend {
    /// Record `device`'s barrier event on the legacy stream of the current device, `device`:
    /// an action after every earlier operation of its blocking streams.
    fn record_on_legacy(&self, api: &Api, device: u32) -> Result<Event, CudaError> {
        let e = self.barrier_event(device)?;
        let r = match *api {
            // SAFETY: an event of the current device, and the legacy stream (null).
            Api::Runtime(rt) => check_internal(|| unsafe { (rt.event_record)(e, LEGACY) }),
            // SAFETY: as above, through the driver.
            Api::Driver(d) => check(unsafe { (d.event_record)(e, LEGACY) }),
        };
        self.forget_event_if(r, device, e).map(|()| e)
    }

    /// `record_on_legacy` of `peer`, with `peer` current for the while (through the driver
    /// alone, its primary context, if active).
    fn record_on_peer(&self, api: &Api, peer: u32) -> Result<Event, CudaError> {
        let mut recorded = Err(CudaError::UNKNOWN);
        check_internal(|| {
            with_device_current(api, peer, || {
                recorded = self.record_on_legacy(api, peer);
                SUCCESS
            })
        })?;
        recorded
    }

    /// The barrier of `device`, current: its legacy stream waits first for the legacy streams
    /// of the devices that reach its memory, so its later blocking-stream work comes after
    /// their kernels too, then for its own.
    fn barrier_here(&self, api: &Api, device: u32) -> Result<(), CudaError> {
        for peer in self.accessors_of(device).iter() {
            let e = self.record_on_peer(api, peer)?;
            self.wait_on_legacy(api, peer, e)?;
        }
        let e = self.record_on_legacy(api, device)?;
        self.wait_on_legacy(api, device, e)
    }

    /// The current device's legacy stream waits for `e`, `device`'s barrier event, just
    /// recorded: an action on it that the blocking streams' later work waits for.
    fn wait_on_legacy(&self, api: &Api, device: u32, e: Event) -> Result<(), CudaError> {
        let r = match *api {
            // SAFETY: an event just recorded, and the legacy stream; CUDA lets a stream wait
            // for another device's event.
            Api::Runtime(rt) => check_internal(|| unsafe { (rt.stream_wait_event)(LEGACY, e, 0) }),
            // SAFETY: as above, through the driver.
            Api::Driver(d) => check(unsafe { (d.stream_wait_event)(LEGACY, e, 0) }),
        };
        self.forget_event_if(r, device, e)
    }

    /// `r`; an error may mean that a reset destroyed `device`'s event `e` meanwhile: the next
    /// barrier makes a new one.
    fn forget_event_if(
        &self,
        r: Result<(), CudaError>,
        device: u32,
        e: Event,
    ) -> Result<(), CudaError> {
        if r.is_err() {
            let _ = self.barrier_events[device as usize].compare_exchange(
                e,
                std::ptr::null_mut(),
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
        r
    }
}

/// The legacy default stream of the current device.
const LEGACY: Stream = std::ptr::null_mut();

/// `call` with the calling thread in relaxed capture mode, as PyTorch's allocator makes its own
/// `cudaMalloc`: another thread's graph capture in global mode would refuse the segment (and
/// may be invalidated by it), though a cached block would have served the request at once. The
/// thread's own mode comes back after.
fn relaxed_capture(rt: &Runtime, call: impl FnOnce() -> i32) -> i32 {
    const RELAXED: i32 = 2;
    let Some(exchange) = rt.thread_exchange_stream_capture_mode else {
        return call();
    };
    let mut mode = RELAXED;
    // SAFETY: a valid in-out pointer.
    if check_internal(|| unsafe { exchange(&mut mode) }).is_err() {
        return call();
    }
    let status = call();
    // SAFETY: as above; `mode` holds the thread's own mode.
    let _ = check_internal(|| unsafe { exchange(&mut mode) });
    status
}

/// An error while the program captures a stream into a graph: CUDA would refuse the fence or
/// barrier and invalidate the capture (`captures`). Otherwise what keeps captures from beginning
/// until the fence or barrier ends. The capture is asked of the API the pool's calls go to: a
/// process without a runtime (XLA, the static runtime) asks the driver.
fn refuse_during_capture() -> Result<captures::Quiet, CudaError> {
    let is_capturing = match api()? {
        Api::Runtime(rt) => rt.stream_is_capturing,
        Api::Driver(d) => d.stream_is_capturing,
    };
    captures::quiet(is_capturing).ok_or(CudaError::STREAM_CAPTURE_UNSUPPORTED)
}

/// `cudaFree(NULL)`, the way CUDA programs initialise the runtime: it frees nothing, and makes
/// the runtime's state for the calling thread and the context of its current device.
fn init_runtime(rt: &Runtime) -> i32 {
    // SAFETY: NULL, which the runtime's `cudaFree` takes as "nothing to free".
    unsafe { (rt.free)(std::ptr::null_mut()) }
}

/// The driver's virtual memory calls, when the process loaded a driver that has them: a runtime
/// with no driver behind it keeps classic segments. Asked under the device's lock, so only of
/// the driver found already: `prepare_thread` looks for it after the runtime's initialisation,
/// which loads it, before the thread's first pool lock.
fn vmm() -> Option<&'static driver::Vmm> {
    driver::found()?.driver.vmm.as_ref()
}

/// Pinned memory on `device`, no shareable handle: what expandable segments map. GPUDirect
/// RDMA capable where the device supports it on virtual memory, as `cudaMalloc` memory is:
/// CUDA-aware MPI, UCX and NCCL's network plugins register the program's buffers with the NIC.
fn pinned_on(vmm: &driver::Vmm, device: u32) -> driver::MemAllocationProp {
    let mut alloc_flags = [0; 8];
    alloc_flags[driver::ALLOC_FLAG_GPU_DIRECT_RDMA_CAPABLE] = u8::from(rdma_with_vmm(vmm, device));
    driver::MemAllocationProp {
        kind: driver::MEM_ALLOCATION_TYPE_PINNED,
        requested_handle_types: 0,
        location_type: driver::MEM_LOCATION_TYPE_DEVICE,
        location_id: device as i32,
        win32_handle_meta_data: std::ptr::null_mut(),
        alloc_flags,
    }
}

/// Whether `cuMemCreate` on `device` accepts the GPUDirect RDMA flag: a device without the
/// support would refuse the memory. Asked at each mapping, as PyTorch does: the call costs
/// little beside the mapping's own.
fn rdma_with_vmm(vmm: &driver::Vmm, device: u32) -> bool {
    let Some(get_attribute) = vmm.device_get_attribute else {
        return false;
    };
    let mut supported: c_int = 0;
    let attribute = driver::DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED;
    // SAFETY: a valid out-pointer; the ordinal is a device the pool serves.
    let r = unsafe { get_attribute(&mut supported, attribute, device as c_int) };
    r == SUCCESS && supported != 0
}

impl Default for CudaBackend {
    fn default() -> Self {
        Self::new()
    }
}

fn check(status: i32) -> Result<(), CudaError> {
    if status == SUCCESS {
        Ok(())
    } else {
        Err(CudaError(status))
    }
}

/// `call`, a runtime call about the current device, made about `device`
/// (`Runtime::on_device`): its status, or why the device could not be made current. The pool
/// acts on a device from any thread (`gpupool_empty_cache(d)`, `cudaMemPoolTrimTo` of `d`'s
/// pool, a pool made by a C API call about `d`): a fence of the wrong device lets `cuMemUnmap`
/// run under `d`'s kernels, and the wrong device's size sizes `d`'s range and its percentage
/// limit.
fn on_device(rt: &Runtime, device: u32, call: impl FnOnce() -> i32) -> i32 {
    rt.on_device(device as i32, call)
        .unwrap_or_else(|status| status)
}

/// `check` for a call the pool makes on its own (a fence, a barrier, a segment's release, a
/// memory sample): the program did not make it, so a failure leaves its `cudaGetLastError` as
/// it was, the error it had not read yet or none (`last_error::own_call`; the driver keeps no
/// last error). The pool carries on without what the call would have given it; a sticky error
/// fails the program's next call anyway, with CUDA's own code.
fn check_internal(call: impl FnOnce() -> i32) -> Result<(), CudaError> {
    check(match RUNTIME.get() {
        Some(rt) => last_error::own_call(rt, call),
        None => call(),
    })
}

/// Wait for all work of `device`'s primary context (`cudaDeviceSynchronize` or
/// `cuCtxSynchronize` with it current), where the pool's blocks are used.
fn synchronize(api: &Api, device: u32) -> Result<(), CudaError> {
    check_internal(|| {
        with_device_current(api, device, || match *api {
            // SAFETY: no arguments; synchronizes the current context, `device`'s primary one.
            Api::Runtime(rt) => unsafe { (rt.device_synchronize)() },
            // SAFETY: as above, through the driver.
            Api::Driver(d) => unsafe { (d.ctx_synchronize)() },
        })
    })
}

/// `call` with `device`'s primary context current, and the caller's device or context back
/// after. CUDA's calls about "the device" act on the current context alone, so a fence or a
/// barrier made in a context the program created would wait for none of the primary context's
/// work. Through the runtime, a thread with no context yet gets the device's by its device
/// switch. `INVALID_DEVICE` where the primary context cannot be had through the driver: a call
/// about another context would prove nothing about `device`, and a failed fence or barrier
/// leaves every block waiting.
fn with_device_current(api: &Api, device: u32, mut call: impl FnMut() -> i32) -> i32 {
    match *api {
        Api::Runtime(rt) => match driver::found() {
            Some(found) if contexts::has_current_context(&found.driver) => {
                in_primary_context(&found.driver, device, &mut call)
                    .unwrap_or_else(|| on_device(rt, device, call))
            }
            _ => on_device(rt, device, call),
        },
        Api::Driver(d) => {
            in_primary_context(d, device, call).unwrap_or(CudaError::INVALID_DEVICE.0)
        }
    }
}

/// `call`, driver calls of virtual memory, with a context current: they need one (CUDA error 201
/// without). A thread whose first CUDA call is an allocation has none yet when the pool maps
/// for it. The device's primary context is then current for the call, as for a fence, and the
/// thread has none again after (the hook then asks the runtime for the one its own call would
/// have left: `dispatch::bind_context`). Where no thread made that context yet, the runtime
/// makes the thread's own as CUDA programs do it, `cudaFree(NULL)`: the thread allocates on
/// `device`, and the runtime's own `cudaMalloc` would have made it.
fn with_context(device: u32, mut call: impl FnMut() -> i32) -> i32 {
    let Some(found) = driver::found() else {
        return call();
    };
    let d = &found.driver;
    if contexts::has_current_context(d) {
        return call();
    }
    if let Some(r) = in_primary_context(d, device, &mut call) {
        return r;
    }
    if let Some(rt) = RUNTIME.get() {
        if rt.current_device() == Ok(device as c_int) {
            let _ = check_internal(|| init_runtime(rt));
        }
    }
    call()
}

impl Backend for CudaBackend {
    fn alloc_segment(&self, _device: u32, bytes: u64) -> Result<Addr, CudaError> {
        let bytes = usize::try_from(bytes).map_err(|_| CudaError::MEMORY_ALLOCATION)?;
        match api()? {
            Api::Runtime(rt) => {
                let mut p: *mut c_void = std::ptr::null_mut();
                let unread = last_error::unread(rt);
                // SAFETY: `p` is a valid out-pointer for the call.
                let status = relaxed_capture(rt, || unsafe { (rt.malloc)(&mut p, bytes) });
                if status == SUCCESS {
                    return Ok(p as Addr);
                }
                if status == CudaError::MEMORY_ALLOCATION.0 {
                    // The pool may recover from this failure; the program must find in
                    // cudaGetLastError what it left there. When the pool gives up, the
                    // runtime hook asks CUDA once more, which sets the error again; the
                    // driver hook asks the driver, which sets none. Any other error goes back
                    // to the program as the result of its allocation, as without the pool.
                    last_error::restore(rt, unread);
                }
                Err(CudaError(status))
            }
            Api::Driver(d) => {
                let mut p = 0u64;
                // SAFETY: `p` is a valid out-pointer; the device's primary context is current
                // (the driver path pools only there).
                check(unsafe { (d.mem_alloc)(&mut p, bytes) })?;
                Ok(p)
            }
        }
    }

    fn free_segment(&self, _device: u32, addr: Addr) -> Result<(), CudaError> {
        let api = api()?;
        check_internal(|| match api {
            // SAFETY: `addr` is a segment the pool allocated and no longer uses; either API
            // frees a primary context's memory.
            Api::Runtime(rt) => unsafe { (rt.free)(addr as *mut c_void) },
            // SAFETY: as above.
            Api::Driver(d) => unsafe { (d.mem_free)(addr) },
        })
    }

    fn fence(&self, device: u32) -> Result<(), CudaError> {
        let _quiet = refuse_during_capture()?;
        let api = api()?;
        synchronize(&api, device)?;
        // Kernels of the devices that reach this one's memory may still use its blocks.
        let peers = self.accessors_of(device);
        for peer in peers.iter() {
            synchronize(&api, peer)?;
        }
        // And kernels in contexts the program made there: each context's synchronization
        // waits for its own work alone. Only the driver makes such contexts.
        if let Some(found) = driver::found() {
            for dev in std::iter::once(device).chain(peers.iter()) {
                check_internal(|| contexts::synchronize_own(&found.driver, dev))?;
            }
        }
        Ok(())
    }

    fn barrier(&self, device: u32) -> Result<(), CudaError> {
        let _quiet = refuse_during_capture()?;
        let api = api()?;
        let mut ordered = Err(CudaError::UNKNOWN);
        // The legacy stream and the event are the current device's: `device` is made current
        // for both, as for the fence.
        check_internal(|| {
            with_device_current(&api, device, || {
                ordered = self.barrier_here(&api, device);
                SUCCESS
            })
        })?;
        ordered
    }

    fn vmm_granularity(&self, device: u32) -> Option<u64> {
        let vmm = vmm()?;
        let mut granule = 0usize;
        // Of the memory `vmm_map` will make (the prop is asked again after an initialisation).
        let ask = |g: &mut usize| {
            let prop = pinned_on(vmm, device);
            // SAFETY: valid pointers to a granularity and a property of the layout cuda.h gives.
            unsafe { (vmm.get_granularity)(g, &prop, driver::MEM_GRANULARITY_MINIMUM) }
        };
        let mut r = ask(&mut granule);
        if r == driver::CU_ERROR_NOT_INITIALIZED {
            // Before the runtime initialised the driver: as it will, `cuInit(0)` (idempotent).
            if let Some(init) = driver::found().and_then(|d| d.driver.init) {
                // SAFETY: flags 0, as CUDA requires.
                unsafe { init(0) };
                r = ask(&mut granule);
            }
        }
        (r == SUCCESS && granule > 0).then_some(granule as u64)
    }

    fn vmm_reserve(&self, device: u32, bytes: u64) -> Result<Addr, CudaError> {
        let vmm = vmm().ok_or(CudaError::NOT_SUPPORTED)?;
        let mut addr = 0u64;
        check(with_context(device, || {
            // SAFETY: a valid out-pointer; no alignment, address hint or flags asked.
            unsafe { (vmm.address_reserve)(&mut addr, bytes as usize, 0, 0, 0) }
        }))?;
        Ok(addr)
    }

    fn vmm_map(&self, device: u32, addr: Addr, bytes: u64) -> Result<(), CudaError> {
        let vmm = vmm().ok_or(CudaError::NOT_SUPPORTED)?;
        let prop = pinned_on(vmm, device);
        check(with_context(device, || {
            let mut handle = 0u64;
            // SAFETY: a valid out-pointer and property.
            let made = unsafe { (vmm.create)(&mut handle, bytes as usize, &prop, 0) };
            if made != SUCCESS {
                return made;
            }
            // SAFETY: `addr` lies in a range this backend reserved, unmapped there (the pool's
            // bitmap), and `handle` holds `bytes`.
            let mapped = unsafe { (vmm.map)(addr, bytes as usize, 0, handle, 0) };
            // The mapping keeps the memory: the handle goes now, the memory at the unmap (a
            // map refused leaves nothing).
            // SAFETY: the handle made above, released once.
            unsafe { (vmm.release)(handle) };
            mapped
        }))
    }

    fn vmm_access(&self, device: u32, addr: Addr, bytes: u64) -> Result<(), CudaError> {
        let vmm = vmm().ok_or(CudaError::NOT_SUPPORTED)?;
        let access = driver::MemAccessDesc {
            location_type: driver::MEM_LOCATION_TYPE_DEVICE,
            location_id: device as i32,
            flags: driver::MEM_ACCESS_PROT_READWRITE,
        };
        check(with_context(device, || {
            // SAFETY: whole mappings `vmm_map` just made side by side, and one valid descriptor.
            unsafe { (vmm.set_access)(addr, bytes as usize, &access, 1) }
        }))
    }

    fn vmm_peers(&self, device: u32) -> Option<DeviceSet> {
        let found = driver::found()?;
        let count = found.driver.device_get_count?;
        let mut n: c_int = 0;
        // SAFETY: a valid out-pointer.
        if unsafe { count(&mut n) } != SUCCESS || n < 1 {
            return None;
        }
        let mut peers = DeviceSet::default();
        for peer in (0..n as u32).filter(|&p| p != device) {
            let can_access = found.driver.vmm.as_ref()?.can_access_peer?;
            let mut can: c_int = 0;
            // SAFETY: a valid out-pointer and two device ordinals the driver counted.
            let r = unsafe { can_access(&mut can, peer as c_int, device as c_int) };
            if r != SUCCESS || can == 0 || peer as usize >= MAX_DEVICES {
                return None;
            }
            peers = peers | DeviceSet::one(peer);
        }
        Some(peers)
    }

    fn vmm_stopped(&self, device: u32, why: CudaError) {
        static SAID: AtomicBool = AtomicBool::new(false);
        log::warn_once(&SAID, || {
            format!(
                "the driver refused virtual memory on device {device} (CUDA error {}): expandable \
                 segments off there, classic segments serve its requests (GPUPOOL_EXPANDABLE=0 \
                 chooses them from the start; reported once)",
                why.0
            )
        });
    }

    fn vmm_peer_dropped(&self, device: u32, peer: u32, why: CudaError) {
        static SAID: AtomicBool = AtomicBool::new(false);
        log::warn_once(&SAID, || {
            format!(
                "the driver refused device {peer} access to new mapped memory on device {device} \
                 (CUDA error {}): device {peer} cannot use the pool's blocks mapped there from \
                 now on, until the program enables peer access again (GPUPOOL_EXPANDABLE=0 for \
                 classic segments, which the driver shares itself; reported once)",
                why.0
            )
        });
    }

    fn vmm_grant(
        &self,
        device: u32,
        addr: Addr,
        bytes: u64,
        peers: DeviceSet,
    ) -> Result<(), CudaError> {
        let vmm = vmm().ok_or(CudaError::NOT_SUPPORTED)?;
        let access: Vec<driver::MemAccessDesc> = peers
            .iter()
            .map(|d| driver::MemAccessDesc {
                location_type: driver::MEM_LOCATION_TYPE_DEVICE,
                location_id: d as i32,
                flags: driver::MEM_ACCESS_PROT_READWRITE,
            })
            .collect();
        check(with_context(device, || {
            // SAFETY: whole mappings `vmm_map` made, and `access.len()` valid descriptors.
            unsafe { (vmm.set_access)(addr, bytes as usize, access.as_ptr(), access.len()) }
        }))
    }

    fn vmm_unmap(&self, device: u32, addr: Addr, bytes: u64) -> Result<(), CudaError> {
        let vmm = vmm().ok_or(CudaError::NOT_SUPPORTED)?;
        check(with_context(device, || {
            // SAFETY: a whole mapping `vmm_map` made; the pool proved the work that used it
            // done.
            unsafe { (vmm.unmap)(addr, bytes as usize) }
        }))
    }

    fn vmm_free_reservation(&self, device: u32, addr: Addr, bytes: u64) -> Result<(), CudaError> {
        let vmm = vmm().ok_or(CudaError::NOT_SUPPORTED)?;
        check(with_context(device, || {
            // SAFETY: a reservation `vmm_reserve` made, nothing mapped in it.
            unsafe { (vmm.address_free)(addr, bytes as usize) }
        }))
    }

    fn allocation_starts_at(&self, addr: Addr) -> Option<bool> {
        /// `CUDA_ERROR_NOT_FOUND`: no allocation holds the address.
        const NOT_FOUND: driver::CuResult = 500;
        // SAFETY: `MemGetAddressRangeFn` is `cuMemGetAddressRange_v2`'s C signature.
        let range = unsafe {
            super::hooked::real_fn::<driver::MemGetAddressRangeFn>(
                super::hooked::Hooked::MemGetAddressRange,
            )
        }?;
        let ask = || {
            let (mut base, mut size) = (0, 0usize);
            // SAFETY: both out-pointers are valid for the call; the driver's own function.
            match unsafe { range(&mut base, &mut size, addr) } {
                driver::CU_SUCCESS => Some(Some(base == addr)),
                driver::CU_ERROR_INVALID_VALUE | NOT_FOUND => Some(Some(false)),
                driver::CU_ERROR_INVALID_CONTEXT => None,
                _ => Some(None),
            }
        };
        // A thread whose first CUDA call this free is has no context yet: the runtime makes it
        // one as its own free would (`init_runtime`), and the driver is asked again.
        ask()
            .or_else(|| match api() {
                Ok(Api::Runtime(rt)) => {
                    let _ = check_internal(|| init_runtime(rt));
                    ask()
                }
                _ => None,
            })
            .flatten()
    }

    fn memory_info(&self, device: u32) -> Result<(u64, u64), CudaError> {
        let (mut free, mut total) = (0usize, 0usize);
        let api = api()?;
        check_internal(|| match api {
            Api::Runtime(rt) => on_device(rt, device, || {
                // SAFETY: both out-pointers are valid for the call, about `device`.
                unsafe { (rt.mem_get_info)(&mut free, &mut total) }
            }),
            Api::Driver(d) => in_primary_context(d, device, || {
                // SAFETY: as above, the current context being the device's primary one.
                unsafe { (d.mem_get_info)(&mut free, &mut total) }
            })
            .unwrap_or(CudaError::INVALID_DEVICE.0),
        })?;
        Ok((free as u64, total as u64))
    }
}
