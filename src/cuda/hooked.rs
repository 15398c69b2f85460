//! The driver entry points the library hooks, by index, and the driver's real functions behind
//! them: looked up once, by versioned name, in the driver the process loaded (or, for a program
//! linked with `-lcuda` whose calls reach the hooks by symbol, the next definition after this
//! library).

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use super::{dl, driver};

/// One hooked driver entry point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Hooked {
    GetProcAddress,
    GetProcAddressV2,
    MemAlloc,
    MemFree,
    MemAllocAsync,
    MemAllocAsyncPtsz,
    MemFreeAsync,
    MemFreeAsyncPtsz,
    MemGetInfo,
    CtxSynchronize,
    CtxSynchronizeV2,
    StreamSynchronize,
    StreamSynchronizePtsz,
    EventSynchronize,
    StreamCreate,
    StreamCreateWithPriority,
    LaunchKernel,
    LaunchKernelPtsz,
    PrimaryCtxReset,
    PrimaryCtxRelease,
    IpcGetMemHandle,
    CtxEnablePeerAccess,
    MemGetAddressRange,
    CtxSetCurrent,
    CtxPushCurrent,
    DeviceSetMemPool,
    MemPoolDestroy,
    MemPoolTrimTo,
    MemPoolGetAttribute,
    MemPoolSetAttribute,
    MemAllocPitch,
    CtxCreate,
    CtxCreateV3,
    CtxCreateV4,
    StreamBeginCapture,
    StreamBeginCapturePtsz,
    StreamBeginCaptureV2,
    StreamBeginCaptureV2Ptsz,
    StreamEndCapture,
    StreamEndCapturePtsz,
    StreamBeginCaptureToGraph,
    StreamBeginCaptureToGraphPtsz,
    MemCreate,
    CtxDestroy,
    CtxPopCurrent,
    GreenCtxCreate,
    GreenCtxStreamCreate,
    MemPoolSetAccess,
    MemAllocManaged,
    MemAllocFromPoolAsync,
    MemAllocFromPoolAsyncPtsz,
}

pub const COUNT: usize = Hooked::MemAllocFromPoolAsyncPtsz as usize + 1;

/// The versioned names, in `Hooked`'s order: what the library exports, and what it looks up.
pub const NAMES: [&CStr; COUNT] = [
    c"cuGetProcAddress",
    c"cuGetProcAddress_v2",
    c"cuMemAlloc_v2",
    c"cuMemFree_v2",
    c"cuMemAllocAsync",
    c"cuMemAllocAsync_ptsz",
    c"cuMemFreeAsync",
    c"cuMemFreeAsync_ptsz",
    c"cuMemGetInfo_v2",
    c"cuCtxSynchronize",
    c"cuCtxSynchronize_v2",
    c"cuStreamSynchronize",
    c"cuStreamSynchronize_ptsz",
    c"cuEventSynchronize",
    c"cuStreamCreate",
    c"cuStreamCreateWithPriority",
    c"cuLaunchKernel",
    c"cuLaunchKernel_ptsz",
    c"cuDevicePrimaryCtxReset_v2",
    c"cuDevicePrimaryCtxRelease_v2",
    c"cuIpcGetMemHandle",
    c"cuCtxEnablePeerAccess",
    c"cuMemGetAddressRange_v2",
    c"cuCtxSetCurrent",
    c"cuCtxPushCurrent_v2",
    c"cuDeviceSetMemPool",
    c"cuMemPoolDestroy",
    c"cuMemPoolTrimTo",
    c"cuMemPoolGetAttribute",
    c"cuMemPoolSetAttribute",
    c"cuMemAllocPitch_v2",
    c"cuCtxCreate_v2",
    c"cuCtxCreate_v3",
    c"cuCtxCreate_v4",
    c"cuStreamBeginCapture",
    c"cuStreamBeginCapture_ptsz",
    c"cuStreamBeginCapture_v2",
    c"cuStreamBeginCapture_v2_ptsz",
    c"cuStreamEndCapture",
    c"cuStreamEndCapture_ptsz",
    c"cuStreamBeginCaptureToGraph",
    c"cuStreamBeginCaptureToGraph_ptsz",
    c"cuMemCreate",
    c"cuCtxDestroy_v2",
    c"cuCtxPopCurrent_v2",
    c"cuGreenCtxCreate",
    c"cuGreenCtxStreamCreate",
    c"cuMemPoolSetAccess",
    c"cuMemAllocManaged",
    c"cuMemAllocFromPoolAsync",
    c"cuMemAllocFromPoolAsync_ptsz",
];

/// Whether the driver's lookups and calls are interposed (`config::driver_hooks`).
pub fn swapping() -> bool {
    crate::config::driver_hooks()
}

static REALS: [AtomicUsize; COUNT] = [const { AtomicUsize::new(0) }; COUNT];
static RESOLVED: AtomicBool = AtomicBool::new(false);
/// `objects_added` at the last resolution that found no driver; `u64::MAX` before any.
static MISSED_AT: AtomicU64 = AtomicU64::new(u64::MAX);

/// The driver's own functions behind the hooks, in `Hooked`'s order (0: the driver has none).
/// Looked up on first use, on a thread of its own (`plain_thread::run_aside`): a hook's first
/// call must not clear an error the program has yet to read with `dlerror()`, and every
/// `dlsym` clears the calling thread's. With the hooks off (`swapping`), on the calling
/// thread: the pool then starts no thread. Again later while no driver was found, once something
/// was loaded since (it may be the driver).
pub fn reals() -> &'static [AtomicUsize; COUNT] {
    if !RESOLVED.load(Ordering::Acquire)
        && worth_resolving()
        && (!swapping() || !crate::plain_thread::run_aside(c"gpupool-lookup", resolve))
    {
        resolve();
    }
    &REALS
}

/// `reals`, looked up on the calling thread: for the exported `dlsym`, inside the program's own
/// lookup, whose error state glibc sets when it returns. Taken before its answer is swapped, so
/// that the first call of the hook it hands out finds the function already.
pub fn resolve_here() {
    if !RESOLVED.load(Ordering::Acquire) && worth_resolving() {
        resolve();
    }
}

/// Whether a resolution could find what the last one missed: something was loaded since.
fn worth_resolving() -> bool {
    MISSED_AT.load(Ordering::Acquire) != dl::objects_added()
}

/// The real function behind `h`, or 0.
#[inline]
pub fn real(h: Hooked) -> usize {
    reals()[h as usize].load(Ordering::Relaxed)
}

fn resolve() {
    // No lock (this runs inside `dlsym`, maybe under the dynamic linker's own lock in another
    // thread's `dlopen`): threads may resolve at once, and a function found is never replaced
    // by a miss, so a lookup made while no driver was found cannot undo one that found it.
    let added = dl::objects_added();
    let located = driver::loaded_here();
    let mut missed = false;
    for (name, slot) in NAMES.iter().zip(&REALS) {
        let p = match located {
            Some(d) => d.symbol(name),
            // SAFETY: a pseudo-handle and a NUL-terminated name.
            None => unsafe { dl::real_dlsym(libc::RTLD_NEXT, name.as_ptr()) },
        };
        missed |= p.is_null();
        if !p.is_null() {
            slot.store(p as usize, Ordering::Relaxed);
        }
    }
    if missed {
        dl::forget_lookup_error();
    }
    if located.is_some() {
        RESOLVED.store(true, Ordering::Release);
    } else {
        MISSED_AT.store(added, Ordering::Release);
    }
}

/// Reinterpret the real function behind `h` as `F`.
///
/// # Safety
/// `F` must be the C signature of the driver function `NAMES[h]`.
pub unsafe fn real_fn<F: Copy>(h: Hooked) -> Option<F> {
    let p = real(h);
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: non-zero, the driver's function of that name; the caller vouches for `F`.
    (p != 0).then(|| unsafe { std::mem::transmute_copy::<usize, F>(&p) })
}
