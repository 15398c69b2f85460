//! Stream-ordered allocation, and each device's default memory pool answered from the pool.
//!
//! PyTorch's `cudaMallocAsync` backend (which `frameworks.rs` chooses at load) makes every
//! tensor a `cudaMallocAsync` and frees it with `cudaFreeAsync`. The pool serves both. PyTorch
//! then reads its figures from the device's default memory pool: `memory_reserved()` and
//! `memory_allocated()` are `cudaMemPoolGetAttribute`'s reserved and used bytes,
//! `reset_peak_memory_stats()` resets their high-water marks, and `empty_cache()` is
//! `cudaDeviceSynchronize` then `cudaMemPoolTrimTo(pool, 0)`. For a device's default pool each
//! answer adds the pool's part to the runtime's own (what passed through, such as allocations
//! made during graph capture), and the release threshold read is the pool's:
//! `dispatch::default_pool`, which the driver's calls share.
//!
//! Passed through untouched: allocations while the device's current memory pool is one the
//! program made current (`cudaDeviceSetMemPool`: it chose that pool's semantics;
//! `dispatch::current_pool` keeps which pool is current), on a stream being captured into a
//! graph (the graph owns them), on a stream of another device than the current one, and every
//! call about a pool other than a default one (`cudaMallocFromPoolAsync` and `cudaMallocManaged`
//! only get the pool's cache back when they run out of memory). The summary counts the
//! allocations (`passed_through`).

use std::ffi::c_void;

use crate::cuda::backend::CudaBackend;
use crate::cuda::driver::MemAccessDesc;
use crate::cuda::last_error;
use crate::cuda::runtime::Runtime;
use crate::cuda::types::*;
use crate::dispatch::current_pool;
use crate::dispatch::default_pool::{self, Concerns, RESERVED_CURRENT};
use crate::dispatch::{
    async_stream_key, current_device, forward, malloc_with, one_device, runtime, OnStream, Promise,
};
use crate::global;
use crate::guard;
use crate::lifecycle::note_passed_through;
use crate::passed_through::Reason;
use crate::pool::{Origin, Pool};
use crate::report::oom::RequestApi;

/// `cudaMallocAsync`: served by the pool on the current device, in stream order.
///
/// # Safety
/// As `cudaMallocAsync`.
pub unsafe fn malloc_async(
    dev_ptr: *mut *mut c_void,
    size: usize,
    stream: Stream,
    origin: Origin,
) -> CudaStatus {
    let Some((g, pool)) = global::with_pool() else {
        return global::missing_runtime();
    };
    let rt = &g.runtime;
    // SAFETY: the caller's arguments, passed on unchanged.
    let pass = |rt: &Runtime| forward(rt.malloc_async, |f| unsafe { f(dev_ptr, size, stream) });
    // A call from inside the pool passes through in `malloc_with`, which enters the guard.
    let (Some(pooled), false, false) = (pool, dev_ptr.is_null(), size == 0) else {
        return pass(rt);
    };
    let Some(dev) = current_device(rt) else {
        return pass(rt);
    };
    if !current_pool::is_default(dev, || current_is_default(rt, dev)) {
        return note_passed_through(
            Reason::OwnMemoryPool,
            size,
            never_worse(rt, pool, dev, Lacking::Here, pass),
        );
    }
    if !is_legacy(stream) {
        // SAFETY: the caller's arguments; `dev` is current; `pass` as below.
        return unsafe {
            malloc_async_created(dev_ptr, size, stream, (rt, pooled, dev), origin, pass)
        };
    }
    // The legacy stream, PyTorch's: never captured (CUDA refuses to), of every device, and
    // named without a question.
    let stream = Some(OnStream::Ask(stream, Promise::Runtime));
    // SAFETY: the caller's arguments; `dev` is current; `pass` makes the runtime's own call.
    unsafe {
        malloc_with(
            dev_ptr,
            size,
            stream,
            Some(dev),
            origin,
            RequestApi::RuntimeAsync,
            pass,
        )
    }
}

/// `malloc_async` on another stream than the legacy one: asked once whether it is being
/// captured into a graph (the allocation then passes through), an answer that also names it.
///
/// # Safety
/// As `malloc_async`; `on` is the runtime, the pool and the current device; `pass` makes the
/// runtime's own call.
#[inline(never)]
unsafe fn malloc_async_created(
    dev_ptr: *mut *mut c_void,
    size: usize,
    stream: Stream,
    on: (&Runtime, &Pool<CudaBackend>, u32),
    origin: Origin,
    pass: impl Fn(&Runtime) -> CudaStatus + Copy,
) -> CudaStatus {
    let (rt, pool, dev) = on;
    let Some(key) = async_stream_key(rt, pool, stream) else {
        return note_passed_through(Reason::GraphCapture, size, pass(rt));
    };
    if !on_device(rt, stream, dev) {
        return note_passed_through(Reason::UnplacedStream, size, pass(rt));
    }
    let stream = Some(OnStream::Asked(stream, key));
    // SAFETY: the caller's arguments and contract.
    unsafe {
        malloc_with(
            dev_ptr,
            size,
            stream,
            Some(dev),
            origin,
            RequestApi::RuntimeAsync,
            pass,
        )
    }
}

/// Where the memory an allocation the pool leaves to the runtime lacks may sit in the pool's
/// cache.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lacking {
    /// On the current device only: the program's own current pool, which `cudaDeviceSetMemPool`
    /// requires to be that device's.
    Here,
    /// On any device: a memory pool the program names, or managed memory.
    Anywhere,
}

/// The runtime's answer to an allocation the pool leaves to it (`pass`). Never worse on
/// memory: when the runtime is out of memory, the pool's cache on `dev` goes back to the driver
/// and the runtime is asked again (the pool's cache could be what the request lacks). Still out
/// of memory, and where the memory may be elsewhere (`Lacking::Anywhere`), the other devices'
/// caches go back too and the runtime is asked once more.
fn never_worse(
    rt: &Runtime,
    pool: Option<&Pool<CudaBackend>>,
    dev: u32,
    lacking: Lacking,
    pass: impl Fn(&Runtime) -> CudaStatus,
) -> CudaStatus {
    let unread = last_error::unread(rt);
    let mut r = pass(rt);
    let (Some(pool), ERROR_MEMORY_ALLOCATION) = (pool, r) else {
        return r;
    };
    let others = || match lacking {
        Lacking::Here => Vec::new(),
        Lacking::Anywhere => pool
            .used_devices()
            .into_iter()
            .filter(|&d| d != dev)
            .collect(),
    };
    for devices in [vec![dev], others()] {
        if r != ERROR_MEMORY_ALLOCATION {
            break;
        }
        if release_caches(pool, &devices) == 0 {
            continue;
        }
        // The failed attempt's error is not the program's to see: it reads what it left there.
        last_error::restore(rt, unread);
        r = pass(rt);
    }
    r
}

/// Give the caches of `devices` back to the driver for an allocation the pool does not serve.
/// The bytes released; 0 from inside the pool.
fn release_caches(pool: &Pool<CudaBackend>, devices: &[u32]) -> u64 {
    let Some(inside) = guard::enter() else {
        return 0;
    };
    devices
        .iter()
        .map(|&d| {
            crate::dispatch::ready_for_backend(&inside, pool, d);
            pool.release_for_others(d)
        })
        .sum()
}

/// `cudaMallocFromPoolAsync`: the runtime serves it from the pool the program names, never
/// worse on memory (`never_unserved`).
///
/// # Safety
/// As `cudaMallocFromPoolAsync`.
pub unsafe fn malloc_from_pool_async(
    dev_ptr: *mut *mut c_void,
    size: usize,
    mem_pool: MemPool,
    stream: Stream,
) -> CudaStatus {
    never_unserved(|rt| {
        // SAFETY: the caller's arguments, passed on unchanged.
        forward(rt.malloc_from_pool_async, |f| unsafe {
            f(dev_ptr, size, mem_pool, stream)
        })
    })
}

/// `cudaMallocManaged`: the runtime's own, never worse on memory (`never_unserved`).
///
/// # Safety
/// As `cudaMallocManaged`.
pub unsafe fn malloc_managed(dev_ptr: *mut *mut c_void, size: usize, flags: u32) -> CudaStatus {
    never_unserved(|rt| {
        // SAFETY: the caller's arguments, passed on unchanged.
        forward(rt.malloc_managed, |f| unsafe { f(dev_ptr, size, flags) })
    })
}

/// An allocation the pool leaves to the runtime (`pass`, the runtime's own call): when the
/// runtime is out of memory, the pool's cache on the current device, which may be what the
/// request lacks, goes back and the runtime is asked again (`never_worse`).
fn never_unserved(pass: impl Fn(&Runtime) -> CudaStatus) -> CudaStatus {
    let g = match runtime() {
        Ok(g) => g,
        Err(e) => return e,
    };
    let rt = &g.runtime;
    match (g.pool(), current_device(rt)) {
        (Some(pool), Some(dev)) => never_worse(rt, Some(pool), dev, Lacking::Anywhere, pass),
        _ => pass(rt),
    }
}

/// Whether device `dev`'s current memory pool is its default one, as the runtime says (`None`
/// when it cannot).
fn current_is_default(rt: &Runtime, dev: u32) -> Option<bool> {
    let current = mem_pool_of(rt, rt.device_get_mem_pool?, dev)?;
    Some(Some(current) == default_mem_pool(rt, dev))
}

/// Device `dev`'s default memory pool, as the runtime says.
fn default_mem_pool(rt: &Runtime, dev: u32) -> Option<MemPool> {
    mem_pool_of(rt, rt.device_get_default_mem_pool?, dev)
}

/// What `get` (`cudaDeviceGetMemPool` or `cudaDeviceGetDefaultMemPool`) gives for `dev`; a
/// failure leaves no error behind.
fn mem_pool_of(
    rt: &Runtime,
    get: crate::cuda::runtime::DeviceGetDefaultMemPoolFn,
    dev: u32,
) -> Option<MemPool> {
    let mut p: MemPool = std::ptr::null_mut();
    // SAFETY: a valid out-pointer and a device the pool serves.
    (last_error::own_call(rt, || unsafe { get(&mut p, dev as i32) }) == SUCCESS).then_some(p)
}

/// `cudaDeviceSetMemPool`: after the runtime's own call succeeded, whether the pool set is the
/// device's default one decides whether its `cudaMallocAsync`s are pooled.
///
/// # Safety
/// As `cudaDeviceSetMemPool`.
pub unsafe fn device_set_mem_pool(device: i32, mem_pool: MemPool) -> CudaStatus {
    let g = match runtime() {
        Ok(g) => g,
        Err(e) => return e,
    };
    let rt = &g.runtime;
    // SAFETY: the caller's arguments, passed on unchanged.
    let r = forward(rt.device_set_mem_pool, |f| unsafe { f(device, mem_pool) });
    if r == SUCCESS {
        let default = u32::try_from(device)
            .ok()
            .and_then(|d| default_mem_pool(rt, d));
        current_pool::note_set(device, default.map(|p| p == mem_pool));
    }
    r
}

/// `cudaMemPoolDestroy`: destroying a device's current pool makes its default one current.
///
/// # Safety
/// As `cudaMemPoolDestroy`.
pub unsafe fn mem_pool_destroy(mem_pool: MemPool) -> CudaStatus {
    let g = match runtime() {
        Ok(g) => g,
        Err(e) => return e,
    };
    // SAFETY: the caller's argument, passed on unchanged.
    let r = forward(g.runtime.mem_pool_destroy, |f| unsafe { f(mem_pool) });
    if r == SUCCESS {
        current_pool::note_destroyed();
    }
    r
}

/// Whether `stream` belongs to device `dev` (the current one): the default streams do; with one
/// device every stream does; else the runtime is asked (`cudaStreamGetDevice`, CUDA 12.8), or
/// before 12.8 the driver (the stream's context against the current one). Where neither can
/// say, the allocation passes through.
fn on_device(rt: &Runtime, stream: Stream, dev: u32) -> bool {
    let s = stream as usize;
    if s == 0 || s == STREAM_LEGACY || s == STREAM_PER_THREAD || one_device(rt) {
        return true;
    }
    let Some(get_device) = rt.stream_get_device else {
        return crate::cuda::driver::loaded_here().is_some_and(|l| {
            crate::dispatch::driver::in_current_context(&l.driver, stream) == Some(true)
        });
    };
    let mut d = -1;
    // SAFETY: a stream handle the program passed, and a valid out-pointer.
    last_error::own_call(rt, || unsafe { get_device(stream, &mut d) }) == SUCCESS && d == dev as i32
}

/// The devices the runtime sees (0 when it cannot say; no error is left behind).
fn device_count(rt: &Runtime) -> usize {
    let Some(count) = rt.get_device_count else {
        return 0;
    };
    let mut n = 0;
    // SAFETY: a valid out-pointer.
    match last_error::own_call(rt, || unsafe { count(&mut n) }) {
        SUCCESS => n.max(0) as usize,
        _ => 0,
    }
}

/// A call about `mem_pool`: the runtime's own (`call` with its entry point `f`), then, when it
/// succeeded and `mem_pool` is the default pool of a device the call `concerns`, `then` on the
/// runtime, the pool and that device, inside the pool. Returns the runtime's status.
fn on_default_pool<F: Copy>(
    mem_pool: MemPool,
    f: impl FnOnce(&Runtime) -> Option<F>,
    call: impl FnOnce(F) -> CudaStatus,
    concerns: Concerns,
    then: impl FnOnce(&Runtime, &Pool<CudaBackend>, u32),
) -> CudaStatus {
    let g = match runtime() {
        Ok(g) => g,
        Err(e) => return e,
    };
    let rt = &g.runtime;
    let r = forward(f(rt), call);
    if r != SUCCESS || concerns == Concerns::Nothing {
        return r;
    }
    let Some(_inside) = guard::enter() else {
        return r;
    };
    let (Some(pool), Some(get)) = (g.pool(), rt.device_get_default_mem_pool) else {
        return r;
    };
    let count = match concerns {
        Concerns::AnyDevice => device_count(rt),
        _ => 0,
    };
    let devices = default_pool::candidates(pool, concerns, count);
    let default_of = |dev: u32| mem_pool_of(rt, get, dev).map(|p| p as usize);
    if let Some(dev) = default_pool::device_of(mem_pool as usize, devices, default_of) {
        then(rt, pool, dev);
    }
    r
}

/// `cudaMemPoolTrimTo`: the runtime trims its pool; for a default pool, the pool then gives
/// back its cache until the two together reserve at most `keep` bytes (or nothing more can
/// go), as the program reads them back (`get_attribute`).
///
/// # Safety
/// As `cudaMemPoolTrimTo`.
pub unsafe fn trim_to(mem_pool: MemPool, keep: usize) -> CudaStatus {
    on_default_pool(
        mem_pool,
        |rt| rt.mem_pool_trim_to,
        // SAFETY: the caller's arguments, passed on unchanged.
        |f| unsafe { f(mem_pool, keep) },
        Concerns::UsedDevices,
        |rt, pool, dev| {
            default_pool::trimmed(pool, dev, keep as u64, runtime_reserved(rt, mem_pool))
        },
    )
}

/// The bytes the runtime's own part of `mem_pool` reserves (`None` when it cannot say; no error
/// is left behind).
fn runtime_reserved(rt: &Runtime, mem_pool: MemPool) -> Option<u64> {
    let get = rt.mem_pool_get_attribute?;
    let mut v = 0u64;
    // SAFETY: a pool the runtime just accepted, and an out-pointer to the attribute's type.
    let r = last_error::own_call(rt, || unsafe {
        get(mem_pool, RESERVED_CURRENT, (&mut v as *mut u64).cast())
    });
    (r == SUCCESS).then_some(v)
}

/// `cudaMemPoolGetAttribute`: for a default pool, the reserved and used bytes and their
/// high-water marks include the pool's, and the release threshold is the pool's
/// (`default_pool::answer_read`).
///
/// # Safety
/// As `cudaMemPoolGetAttribute`.
pub unsafe fn get_attribute(mem_pool: MemPool, attr: i32, value: *mut c_void) -> CudaStatus {
    on_default_pool(
        mem_pool,
        |rt| rt.mem_pool_get_attribute,
        // SAFETY: the caller's arguments, passed on unchanged.
        |f| unsafe { f(mem_pool, attr, value) },
        default_pool::read_concerns(attr, value),
        // SAFETY: the runtime just wrote the attribute's `cuuint64_t` at `value`, non-NULL.
        |_, pool, dev| unsafe { default_pool::answer_read(pool, dev, attr, value) },
    )
}

/// `cudaMemPoolSetAttribute`: for a default pool, resetting a high-water mark resets the pool's,
/// and a release threshold becomes the pool's (`default_pool::attribute_set`).
///
/// # Safety
/// As `cudaMemPoolSetAttribute`.
pub unsafe fn set_attribute(mem_pool: MemPool, attr: i32, value: *mut c_void) -> CudaStatus {
    on_default_pool(
        mem_pool,
        |rt| rt.mem_pool_set_attribute,
        // SAFETY: the caller's arguments, passed on unchanged.
        |f| unsafe { f(mem_pool, attr, value) },
        default_pool::set_concerns(attr, value),
        // SAFETY: the runtime just read the attribute's `cuuint64_t` at `value`, non-NULL.
        |_, pool, dev| unsafe { default_pool::attribute_set(pool, dev, attr, value) },
    )
}

/// `cudaMemPoolSetAccess`: for a device's default pool, each other device given access is a
/// peer of that device (`default_pool::access_set`).
///
/// # Safety
/// As `cudaMemPoolSetAccess`: `descs` NULL or `count` readable descriptors.
pub unsafe fn set_access(
    mem_pool: MemPool,
    descs: *const MemAccessDesc,
    count: usize,
) -> CudaStatus {
    on_default_pool(
        mem_pool,
        |rt| rt.mem_pool_set_access,
        // SAFETY: the caller's arguments, passed on unchanged.
        |f| unsafe { f(mem_pool, descs, count) },
        default_pool::access_concerns(descs, count),
        // SAFETY: not NULL and `count` long (`access_concerns`); the runtime just read them.
        |_, pool, dev| unsafe {
            default_pool::access_set(pool, dev, descs, count, "cudaMemPoolSetAccess")
        },
    )
}
