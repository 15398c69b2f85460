//! Allocation, copies and sets, memory queries.

use super::{CudaMemPool, CudaStream};
use crate::config;
use crate::current;
use crate::errors::{CudaResult, INVALID_VALUE, MEMORY_ALLOCATION, STREAM_CAPTURE_UNSUPPORTED};
use crate::faults::Func;
use crate::ffi::{runtime_call, Out};
use crate::link;
use crate::memory::{Kind, State as AllocState};
use crate::pools::PoolId;
use crate::state::{wait_until, with_state, State};
use crate::timeline::{self, Completion, StreamId};
use std::ffi::{c_int, c_uint, c_void};
use std::ptr::null_mut;

/// `cudaMemAttachGlobal`, `cudaMemAttachHost`.
const MEM_ATTACH_GLOBAL: c_uint = 1;
const MEM_ATTACH_HOST: c_uint = 2;
/// `cudaMallocPitch` and `cuMemAllocPitch_v2` round rows up to this.
pub(crate) const PITCH_ALIGNMENT: usize = 512;

/// Where an allocation's device comes from.
enum On {
    /// The calling thread's current device (synchronous allocations).
    Current,
    /// The current pool of this stream's device (`cudaMallocAsync`).
    Stream(usize),
    /// This pool, ordered on this stream (`cudaMallocFromPoolAsync`).
    Pool { pool: usize, stream: usize },
}

/// How an allocation is made and counted.
struct Request {
    kind: Kind,
    on: On,
    /// Counted in `malloc_calls`/`malloc_failures` (device memory).
    counted: bool,
    /// Pays `CUDASIM_MALLOC_US` and is refused during a capture that forbids it (synchronous
    /// device allocations).
    latency: bool,
    /// A driver call (`cuMemAlloc_v2`, `cuMemAllocAsync`): counted in `driver_mallocs` too.
    driver: bool,
}

impl Request {
    fn device(kind: Kind) -> Request {
        Request {
            kind,
            on: On::Current,
            counted: true,
            latency: true,
            driver: false,
        }
    }

    /// A stream-ordered allocation.
    fn stream_ordered(on: On) -> Request {
        Request {
            kind: Kind::Device,
            on,
            counted: true,
            latency: false,
            driver: false,
        }
    }

    fn via_driver(self, driver: bool) -> Request {
        Request { driver, ..self }
    }
}

/// Where an allocation is made: its device, the stream it is ordered on and the memory pool it
/// comes from (stream-ordered ones).
struct Target {
    device: usize,
    stream: Option<StreamId>,
    pool: Option<PoolId>,
}

fn target(st: &mut State, on: &On) -> CudaResult<Target> {
    match *on {
        On::Current => Ok(Target {
            device: current::get(),
            stream: None,
            pool: None,
        }),
        On::Stream(raw) => {
            let id = st.stream(raw)?;
            let device = st.streams.get(id).device;
            let pool = Some(st.pools.current(device));
            Ok(Target {
                device,
                stream: Some(id),
                pool,
            })
        }
        On::Pool { pool, stream } => {
            let id = st.stream(stream)?;
            let pool = st.pools.resolve(pool)?;
            let device = st.pools.entry(pool).device;
            Ok(Target {
                device,
                stream: Some(id),
                pool: Some(pool),
            })
        }
    }
}

/// Allocates `size` bytes into `out` (`size` 0: a NULL pointer). A stream-ordered allocation
/// comes from its memory pool (`cudaMallocAsync`: the device's current one), unless its stream
/// is being captured: then it belongs to the graph (an ordinary allocation, counted in
/// `captured_mallocs`).
fn allocate(out: CudaResult<Out<*mut c_void>>, size: usize, req: Request) -> CudaResult {
    let cfg = config::get()?;
    if req.latency && cfg.malloc_us > 0 {
        timeline::sleep_until(timeline::now() + timeline::micros(cfg.malloc_us));
    }
    with_state(|st| {
        let current = current::get();
        let target = target(st, &req.on);
        let counted_on = target.as_ref().map_or(current, |t| t.device);
        let captured = match target {
            Ok(Target {
                stream: Some(id), ..
            }) => st.streams.get(id).capture.is_some(),
            _ => false,
        };
        let stream_ordered = !matches!(req.on, On::Current);
        let dev = st.use_device(counted_on);
        if req.counted {
            dev.counters.malloc_calls += 1;
        }
        if stream_ordered {
            dev.counters.async_mallocs += 1;
        }
        if captured {
            dev.counters.captured_mallocs += 1;
        }
        if req.driver {
            dev.counters.driver_mallocs += 1;
        }
        let result = target.and_then(|t| {
            let out = out?;
            let (thread, mode) = (current::thread_key(), super::stream::thread_capture_mode());
            if req.latency && req.counted && st.streams.refuse_unsafe_call(thread, mode) {
                return Err(STREAM_CAPTURE_UNSUPPORTED);
            }
            let pool = t.pool.filter(|_| !captured);
            let p = if size == 0 {
                0
            } else {
                st.allocate(size, t.device, req.kind, pool)?
            };
            out.set(p as *mut c_void);
            Ok(())
        });
        if result.is_err() && req.counted {
            st.devices[counted_on].counters.malloc_failures += 1;
        }
        result
    })
}

/// `cudaMalloc` and `cuMemAlloc_v2` (`driver`; it refuses 0 bytes before calling this).
pub fn malloc(out: CudaResult<Out<*mut c_void>>, size: usize, driver: bool) -> CudaResult {
    allocate(out, size, Request::device(Kind::Device).via_driver(driver))
}

/// `cudaMallocAsync` and `cuMemAllocAsync` (`driver`).
pub fn malloc_async(
    out: CudaResult<Out<*mut c_void>>,
    size: usize,
    stream: usize,
    driver: bool,
) -> CudaResult {
    let req = Request::stream_ordered(On::Stream(stream)).via_driver(driver);
    allocate(out, size, req)
}

/// Through the driver (`cuMemAlloc_v2`) as NVIDIA's runtime does, except for 0 bytes, which
/// the runtime answers itself (the driver refuses them).
#[no_mangle]
pub unsafe extern "C" fn cudaMalloc(dev_ptr: *mut *mut c_void, size: usize) -> c_int {
    runtime_call(Func::cudaMalloc, || match link::driver() {
        // SAFETY: the driver's cuMemAlloc_v2, given the caller's out-pointer (a CUdeviceptr is
        // pointer-sized).
        Some(d) if size > 0 => link::result(unsafe { (d.mem_alloc)(dev_ptr.cast(), size) }),
        _ => {
            // SAFETY: the caller passes NULL or a pointer valid for writing a pointer.
            let out = unsafe { Out::new(dev_ptr) };
            malloc(out, size, false)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocAsync(
    dev_ptr: *mut *mut c_void,
    size: usize,
    stream: CudaStream,
) -> c_int {
    runtime_call(Func::cudaMallocAsync, || match link::driver() {
        Some(d) if size > 0 => {
            // SAFETY: the driver's cuMemAllocAsync, given the caller's arguments.
            link::result(unsafe { (d.mem_alloc_async)(dev_ptr.cast(), size, stream) })
        }
        _ => {
            // SAFETY: the caller passes NULL or a pointer valid for writing a pointer.
            let out = unsafe { Out::new(dev_ptr) };
            malloc_async(out, size, stream as usize, false)
        }
    })
}

/// As `cudaMallocAsync`, from `pool` (a device's default pool or one the program created), on
/// that pool's device.
#[no_mangle]
pub unsafe extern "C" fn cudaMallocFromPoolAsync(
    ptr: *mut *mut c_void,
    size: usize,
    pool: CudaMemPool,
    stream: CudaStream,
) -> c_int {
    runtime_call(Func::cudaMallocFromPoolAsync, || {
        // SAFETY: the caller passes NULL or a pointer valid for writing a pointer.
        let out = unsafe { Out::new(ptr) };
        malloc_from_pool(out, size, pool as usize, stream as usize, false)
    })
}

/// `cudaMallocFromPoolAsync` and `cuMemAllocFromPoolAsync` (`driver`): from `pool`, on its
/// device, ordered on `stream`.
pub fn malloc_from_pool(
    out: CudaResult<Out<*mut c_void>>,
    size: usize,
    pool: usize,
    stream: usize,
    driver: bool,
) -> CudaResult {
    let on = On::Pool { pool, stream };
    allocate(out, size, Request::stream_ordered(on).via_driver(driver))
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocManaged(
    dev_ptr: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> c_int {
    runtime_call(Func::cudaMallocManaged, || {
        // SAFETY: the caller passes NULL or a pointer valid for writing a pointer.
        let out = unsafe { Out::new(dev_ptr) };
        malloc_managed(out, size, flags, false)
    })
}

/// `cudaMallocManaged` and `cuMemAllocManaged` (`driver`): managed memory on the current
/// device, attached globally or to the host.
pub fn malloc_managed(
    out: CudaResult<Out<*mut c_void>>,
    size: usize,
    flags: c_uint,
    driver: bool,
) -> CudaResult {
    let out = match flags {
        MEM_ATTACH_GLOBAL | MEM_ATTACH_HOST => out,
        _ => Err(INVALID_VALUE),
    };
    allocate(out, size, Request::device(Kind::Managed).via_driver(driver))
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocPitch(
    dev_ptr: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
) -> c_int {
    runtime_call(Func::cudaMallocPitch, || {
        // SAFETY: the caller passes NULL or a pointer valid for writing a size_t.
        let pitch_out = unsafe { Out::new(pitch) };
        // SAFETY: the caller passes NULL or a pointer valid for writing a pointer.
        let out = unsafe { Out::new(dev_ptr) };
        let row = width.checked_next_multiple_of(PITCH_ALIGNMENT);
        let size = row.and_then(|r| r.checked_mul(height));
        let checked = match (&pitch_out, size) {
            (Err(e), _) => Err(*e),
            (Ok(_), None) => Err(MEMORY_ALLOCATION),
            (Ok(_), Some(_)) => out,
        };
        allocate(checked, size.unwrap_or(0), Request::device(Kind::Device))?;
        if let (Ok(p), Some(row)) = (pitch_out, row) {
            p.set(row);
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocHost(ptr: *mut *mut c_void, size: usize) -> c_int {
    runtime_call(Func::cudaMallocHost, || {
        // SAFETY: the caller passes NULL or a pointer valid for writing a pointer.
        let out = unsafe { Out::new(ptr) };
        let req = Request {
            kind: Kind::Host,
            on: On::Current,
            counted: false,
            latency: false,
            driver: false,
        };
        allocate(out, size, req)
    })
}

/// `cudaFree` and `cuMemFree_v2` (`driver`): waits for all work of the owning device, then
/// unmaps.
pub fn free(p: usize, driver: bool) -> CudaResult {
    let cfg = config::get()?;
    let current = current::get();
    if p == 0 {
        // Like the real `cudaFree(0)`, it creates the context.
        return with_state(|st| {
            st.use_device(current);
            Ok(())
        });
    }
    if cfg.free_us > 0 {
        timeline::sleep_until(timeline::now() + timeline::micros(cfg.free_us));
    }
    let deadline = with_state(|st| {
        let found = st
            .allocs
            .live_at(p)
            .filter(|a| a.kind != Kind::Host)
            .map(|a| {
                a.state = AllocState::Freeing;
                a.device
            });
        let d = found.unwrap_or(current);
        let counters = &mut st.use_device(d).counters;
        counters.free_calls += 1;
        counters.driver_frees += u64::from(driver);
        found.ok_or(INVALID_VALUE)?;
        let tail = st.device_tail(d);
        if tail > timeline::now() {
            st.devices[d].counters.implicit_syncs += 1;
        }
        Ok(tail)
    })?;
    timeline::sleep_until(deadline);
    with_state(|st| {
        // `cudaDeviceReset` may have dropped it meanwhile.
        if st.allocs.freeing_at(p) {
            st.destroy_allocation(p);
        }
        Ok(())
    })
}

/// Through the driver (`cuMemFree_v2`), except `cudaFree(NULL)`, which only makes the
/// context.
#[no_mangle]
pub unsafe extern "C" fn cudaFree(dev_ptr: *mut c_void) -> c_int {
    runtime_call(Func::cudaFree, || match link::driver() {
        // SAFETY: the driver's cuMemFree_v2.
        Some(d) if !dev_ptr.is_null() => link::result(unsafe { (d.mem_free)(dev_ptr as u64) }),
        _ => free(dev_ptr as usize, false),
    })
}

/// `cudaFreeAsync` and `cuMemFreeAsync` (`driver`).
pub fn free_async(p: usize, stream: usize, driver: bool) -> CudaResult {
    with_state(|st| {
        let id = st.stream(stream)?;
        if p == 0 {
            return Ok(());
        }
        let found = st
            .allocs
            .live_at(p)
            .filter(|a| a.kind != Kind::Host)
            .map(|a| {
                a.state = AllocState::PendingFree;
                a.device
            });
        let d = found.unwrap_or(st.streams.get(id).device);
        let counters = &mut st.use_device(d).counters;
        counters.free_calls += 1;
        counters.driver_frees += u64::from(driver);
        let device = found.ok_or(INVALID_VALUE)?;
        let at = st.streams.enqueue(id, timeline::now(), 0, 0);
        st.queue.push(at, Completion::AsyncFree { device, base: p });
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaFreeAsync(dev_ptr: *mut c_void, stream: CudaStream) -> c_int {
    runtime_call(Func::cudaFreeAsync, || match link::driver() {
        // SAFETY: the driver's cuMemFreeAsync.
        Some(d) => link::result(unsafe { (d.mem_free_async)(dev_ptr as u64, stream) }),
        None => free_async(dev_ptr as usize, stream as usize, false),
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaFreeHost(ptr: *mut c_void) -> c_int {
    runtime_call(Func::cudaFreeHost, || {
        let p = ptr as usize;
        if p == 0 {
            return Ok(());
        }
        with_state(|st| {
            st.allocs
                .live_at(p)
                .filter(|a| a.kind == Kind::Host)
                .ok_or(INVALID_VALUE)?;
            st.destroy_allocation(p);
            Ok(())
        })
    })
}

/// `cudaMemGetInfo` and `cuMemGetInfo_v2`: the current device's free and total bytes.
///
/// # Safety
/// `free` and `total` must be NULL or valid for writing a `size_t`.
pub unsafe fn mem_get_info(free: *mut usize, total: *mut usize) -> CudaResult {
    // SAFETY: forwarded from the caller.
    let (free, total) = unsafe { (Out::new(free)?, Out::new(total)?) };
    with_state(|st| {
        let d = current::get();
        st.use_device(d);
        free.set(st.free_bytes(d) as usize);
        total.set(st.cfg.capacity(d) as usize);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemGetInfo(free: *mut usize, total: *mut usize) -> c_int {
    runtime_call(Func::cudaMemGetInfo, || match link::driver() {
        // SAFETY: the driver's cuMemGetInfo_v2, given the caller's out-pointers.
        Some(d) => link::result(unsafe { (d.mem_get_info)(free, total) }),
        // SAFETY: the caller passes NULL or pointers valid for writing a size_t.
        None => unsafe { mem_get_info(free, total) },
    })
}

/// Runs a copy or a set as an operation of duration 0: synchronous ones (`stream` `None`) on
/// the legacy stream of the current context, the bytes moving once the host has waited for it;
/// asynchronous ones on their stream, the bytes moving at once. `valid` checks the device
/// ranges for the device doing the operation (again after the wait); `apply` moves the bytes,
/// under the lock.
fn byte_op(
    stream: Option<CudaStream>,
    valid: impl Fn(&mut State, usize) -> CudaResult,
    apply: impl FnOnce(),
) -> CudaResult {
    match stream {
        None => {
            let d = current::get();
            let deadline = with_state(|st| {
                valid(st, d)?;
                st.use_device(d);
                let legacy = st.legacy_stream()?;
                Ok(st.streams.enqueue(legacy, timeline::now(), 0, 0))
            })?;
            wait_until(deadline)?;
            with_state(|st| {
                valid(st, d)?;
                apply();
                Ok(())
            })
        }
        Some(raw) => with_state(|st| {
            let id = st.stream(raw as usize)?;
            let d = st.streams.get(id).device;
            valid(st, d)?;
            st.use_device(d);
            st.streams.enqueue(id, timeline::now(), 0, 0);
            apply();
            Ok(())
        }),
    }
}

/// Checks a copy and makes it (`cudaMemcpy`, and the driver's copies).
pub fn copy(
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    kind: c_int,
    stream: Option<CudaStream>,
) -> CudaResult {
    let (d, s) = (dst as usize, src as usize);
    // Which sides must be device memory: cudaMemcpyHostToHost, HostToDevice, DeviceToHost,
    // DeviceToDevice, Default (inferred: only reserved virtual memory is checked, since an
    // unmapped part of it would fault the host).
    let (dst_dev, src_dev) = match kind {
        0 | 4 => (false, false),
        1 => (true, false),
        2 => (false, true),
        3 => (true, true),
        _ => return Err(INVALID_VALUE),
    };
    if count > 0 && (d == 0 || s == 0) {
        return Err(INVALID_VALUE);
    }
    let valid = |st: &mut State, device: usize| {
        if count == 0 {
            return Ok(());
        }
        let inferred = kind == 4;
        if dst_dev || (inferred && st.vmm.reserved(d)) {
            st.check_device_range(d, count, device, true)?;
        }
        if src_dev || (inferred && st.vmm.reserved(s)) {
            st.check_device_range(s, count, device, false)?;
        }
        Ok(())
    };
    byte_op(stream, valid, || {
        if count > 0 {
            // SAFETY: the device sides were checked (under the lock) to lie in live mappings
            // the device may use;
            // the host sides are the caller's promise, as with the real runtime. `copy`
            // allows overlap.
            unsafe { std::ptr::copy(s as *const u8, d as *mut u8, count) };
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemcpy(
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    kind: c_int,
) -> c_int {
    runtime_call(Func::cudaMemcpy, || copy(dst, src, count, kind, None))
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemcpyAsync(
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    kind: c_int,
    stream: CudaStream,
) -> c_int {
    runtime_call(Func::cudaMemcpyAsync, || {
        copy(dst, src, count, kind, Some(stream))
    })
}

/// Checks a set of device memory and makes it.
fn set(dev_ptr: *mut c_void, value: c_int, count: usize, stream: Option<CudaStream>) -> CudaResult {
    let p = dev_ptr as usize;
    let valid = |st: &mut State, device: usize| {
        if count == 0 {
            return Ok(());
        }
        st.check_device_range(p, count, device, true)
    };
    byte_op(stream, valid, || {
        if count > 0 {
            // SAFETY: `[p, p + count)` was checked (under the lock) to lie in live, writable
            // mappings.
            unsafe { std::ptr::write_bytes(p as *mut u8, value as u8, count) };
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemset(dev_ptr: *mut c_void, value: c_int, count: usize) -> c_int {
    runtime_call(Func::cudaMemset, || set(dev_ptr, value, count, None))
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemsetAsync(
    dev_ptr: *mut c_void,
    value: c_int,
    count: usize,
    stream: CudaStream,
) -> c_int {
    runtime_call(Func::cudaMemsetAsync, || {
        set(dev_ptr, value, count, Some(stream))
    })
}

/// `enum cudaMemoryType`.
const MEMORY_TYPE_UNREGISTERED: c_int = 0;
const MEMORY_TYPE_HOST: c_int = 1;
const MEMORY_TYPE_DEVICE: c_int = 2;
const MEMORY_TYPE_MANAGED: c_int = 3;

/// `struct cudaPointerAttributes`.
#[repr(C)]
pub struct PointerAttributes {
    memory_type: c_int,
    device: c_int,
    device_pointer: *mut c_void,
    host_pointer: *mut c_void,
}

#[no_mangle]
pub unsafe extern "C" fn cudaPointerGetAttributes(
    attributes: *mut PointerAttributes,
    ptr: *const c_void,
) -> c_int {
    runtime_call(Func::cudaPointerGetAttributes, || {
        // SAFETY: the caller passes NULL or a pointer valid for writing the structure.
        let out = unsafe { Out::new(attributes)? };
        let p = ptr as *mut c_void;
        // Mapped virtual memory is device memory of its physical memory's device.
        let found = with_state(|st| {
            let a = st
                .allocs
                .live_containing(p as usize)
                .map(|a| (a.kind, a.device));
            let mapped = st
                .vmm
                .containing(p as usize)
                .map(|m| (Kind::Device, m.device));
            Ok(a.or(mapped))
        })?;
        out.set(match found {
            None => PointerAttributes {
                memory_type: MEMORY_TYPE_UNREGISTERED,
                device: -2,
                device_pointer: null_mut(),
                host_pointer: p,
            },
            Some((kind, device)) => {
                let (memory_type, host_pointer) = match kind {
                    Kind::Device => (MEMORY_TYPE_DEVICE, null_mut()),
                    Kind::Managed => (MEMORY_TYPE_MANAGED, p),
                    Kind::Host => (MEMORY_TYPE_HOST, p),
                };
                PointerAttributes {
                    memory_type,
                    device: device as c_int,
                    device_pointer: p,
                    host_pointer,
                }
            }
        });
        Ok(())
    })
}

/// `cudaIpcMemHandle_t`.
#[repr(C)]
pub struct IpcMemHandle {
    reserved: [u8; 64],
}

#[no_mangle]
pub unsafe extern "C" fn cudaIpcGetMemHandle(
    handle: *mut IpcMemHandle,
    dev_ptr: *mut c_void,
) -> c_int {
    // SAFETY: the caller passes NULL or a pointer valid for writing the structure.
    runtime_call(Func::cudaIpcGetMemHandle, || unsafe {
        ipc_get_mem_handle(handle, dev_ptr as usize)
    })
}

/// The handle of the allocation containing `addr`: its base and device (the driver's answer
/// names the whole allocation, as CUDA's does).
///
/// # Safety
/// `handle` must be NULL or valid for writing the structure.
pub unsafe fn ipc_get_mem_handle(handle: *mut IpcMemHandle, addr: usize) -> CudaResult {
    // SAFETY: forwarded from the caller.
    let out = unsafe { Out::new(handle)? };
    let a = with_state(|st| Ok(st.allocs.live_containing(addr).copied()))?
        .filter(|a| a.kind == Kind::Device)
        .ok_or(INVALID_VALUE)?;
    let mut reserved = [0u8; 64];
    reserved[..8].copy_from_slice(&(a.base as u64).to_ne_bytes());
    reserved[8..12].copy_from_slice(&(a.device as i32).to_ne_bytes());
    out.set(IpcMemHandle { reserved });
    Ok(())
}
