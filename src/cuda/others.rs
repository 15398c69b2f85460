//! Other CUDA runtimes in the process, for the launches of their kernels.
//!
//! The hooks are unversioned, so under the preload they catch the calls of every libcudart the
//! process loads (a framework built for CUDA 13 beside one built for CUDA 12, each with its own
//! runtime), and forward them to the one runtime the pool uses. For allocations and
//! synchronizations that is right (the runtimes share the device's primary context), but a
//! kernel is known only to the runtime its module registered it with: launched through another,
//! it fails with `cudaErrorInvalidDeviceFunction` (or, for CUDA 13's `__cudaLaunchKernel`, is
//! missing from a CUDA 12 runtime). Such a launch is tried again through the other runtimes
//! loaded, and the one that runs it is remembered for that kernel. Nothing of this runs in a
//! process with one runtime, apart from that failure path.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use libloading::os::unix::RTLD_LAZY;

use super::loader::{loaded_runtimes, open_and_resolve, own_object, Located};
use super::runtime::{LaunchKernelFn, Runtime, VoidFn};
use super::types::{CudaStatus, ERROR_INVALID_DEVICE_FUNCTION};
use crate::log;
use crate::pool::IntHasher;

/// A launch entry point: `cudaLaunchKernel`, or `__cudaLaunchKernel` (`<<<...>>>` since CUDA 13).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Entry {
    Public,
    Internal,
}

impl Entry {
    /// That entry point of `rt`, if it has it.
    pub fn of(self, rt: &Runtime) -> Option<LaunchKernelFn> {
        match self {
            Entry::Public => rt.launch_kernel,
            Entry::Internal => rt.launch_kernel_internal,
        }
    }
}

#[derive(Default)]
struct Known {
    /// The loaded runtimes' paths when `others` was made.
    scanned: Vec<String>,
    /// The other runtimes among them, resolved as the pool's own is (`loader`), kept open.
    others: Vec<Located>,
}

static KNOWN: Mutex<Option<Known>> = Mutex::new(None);
/// A runtime's launch entry point and its `cudaGetLastError`.
type Route = (LaunchKernelFn, VoidFn);
/// The kernels another runtime knows, by entry point and kernel. Not SipHash, whose keys come
/// from `getrandom`: a cancellation point (`pool::cancel`).
type Routes = HashMap<(Entry, usize), Route, BuildHasherDefault<IntHasher>>;
static ROUTES: Mutex<Option<Routes>> = Mutex::new(None);
/// A route exists: launches look in `ROUTES` first.
static ANY_ROUTE: AtomicBool = AtomicBool::new(false);
static REPORTED: AtomicBool = AtomicBool::new(false);

fn routes() -> std::sync::MutexGuard<'static, Option<Routes>> {
    ROUTES.lock().unwrap_or_else(|e| e.into_inner())
}

/// Launch `kernel` through the runtime that knew it before, if another runtime did. `None`
/// when there is no such route, or when that runtime no longer knows the kernel (another module
/// at the address of an unloaded one): the route is dropped and the launch takes the usual way.
pub fn launch_routed(
    entry: Entry,
    kernel: usize,
    launch: impl Fn(LaunchKernelFn) -> CudaStatus,
) -> Option<CudaStatus> {
    if !ANY_ROUTE.load(Ordering::Acquire) {
        return None;
    }
    let (f, get_last_error) = routes().as_ref()?.get(&(entry, kernel)).copied()?;
    let r = launch(f);
    if r != ERROR_INVALID_DEVICE_FUNCTION {
        return Some(r);
    }
    if let Some(map) = routes().as_mut() {
        map.remove(&(entry, kernel));
    }
    // SAFETY: no arguments.
    unsafe { get_last_error() };
    None
}

/// `kernel` failed to launch through the pool's runtime (`own`, at `own_path`) for want of
/// knowing it: `launch` it through each other runtime loaded until one knows it. That one's
/// answer is the program's (success, or its own refusal with its last error); `None` when no
/// other runtime knows the kernel.
pub fn relaunch(
    entry: Entry,
    kernel: usize,
    own_path: &str,
    own: Option<LaunchKernelFn>,
    launch: impl Fn(LaunchKernelFn) -> CudaStatus,
) -> Option<CudaStatus> {
    for (path, f, get_last_error) in candidates(entry, own_path, own) {
        let r = launch(f);
        if r == ERROR_INVALID_DEVICE_FUNCTION {
            // Not its kernel either: the failed attempt is not the program's concern.
            // SAFETY: no arguments.
            unsafe { get_last_error() };
            continue;
        }
        routes()
            .get_or_insert_with(Routes::default)
            .insert((entry, kernel), (f, get_last_error));
        ANY_ROUTE.store(true, Ordering::Release);
        log::warn_once(&REPORTED, || {
            format!(
                "this process has more than one CUDA runtime: a kernel that {own_path} does not \
                 know was launched through {path}, which knows it (kernels are routed to the \
                 runtime that knows them; allocations and synchronizations go through \
                 {own_path}; reported once)"
            )
        });
        return Some(r);
    }
    None
}

/// The other runtimes' entry points for `entry`, rescanning when the loaded runtimes changed.
fn candidates(
    entry: Entry,
    own_path: &str,
    own: Option<LaunchKernelFn>,
) -> Vec<(String, LaunchKernelFn, VoidFn)> {
    let loaded = loaded_runtimes();
    let stale = {
        let known = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
        known.as_ref().is_none_or(|k| k.scanned != loaded)
    };
    if stale {
        // Opened outside the lock: dlopen and dladdr take the dynamic linker's lock, which a
        // thread inside a library's initialiser holds while it may launch.
        let mine = own_object();
        let others: Vec<Located> = loaded
            .iter()
            .filter(|p| p.as_str() != own_path)
            .filter_map(|p| open_and_resolve(p, libc::RTLD_NOLOAD | RTLD_LAZY, mine).ok())
            .collect();
        let mut known = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
        *known = Some(Known {
            scanned: loaded,
            others,
        });
    }
    let known = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
    let Some(k) = known.as_ref() else {
        return Vec::new();
    };
    k.others
        .iter()
        .filter_map(|o| {
            let f = entry.of(&o.runtime)?;
            // The pool's own runtime under another name is not another runtime.
            (Some(f as usize) != own.map(|g| g as usize))
                .then(|| (o.path.clone(), f, o.runtime.get_last_error))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::types::Dim3;
    use std::ffi::c_void;

    unsafe extern "C" fn no_error() -> CudaStatus {
        0
    }

    unsafe extern "C" fn stand_in(
        _: *const c_void,
        _: Dim3,
        _: Dim3,
        _: *mut *mut c_void,
        _: usize,
        _: *mut c_void,
    ) -> CudaStatus {
        0
    }

    #[test]
    fn a_route_that_stops_working_is_dropped() {
        let kernel = 0x5eed_0000;
        routes().get_or_insert_with(Routes::default).insert(
            (Entry::Public, kernel),
            (stand_in as LaunchKernelFn, no_error as VoidFn),
        );
        ANY_ROUTE.store(true, Ordering::Release);
        // The runtime still knows the kernel: its answer, whatever it is.
        assert_eq!(launch_routed(Entry::Public, kernel, |_| 1), Some(1));
        assert_eq!(launch_routed(Entry::Internal, kernel, |_| 0), None);
        // It no longer does: the launch takes the usual way, now and from then on.
        assert_eq!(
            launch_routed(Entry::Public, kernel, |_| ERROR_INVALID_DEVICE_FUNCTION),
            None
        );
        let called = std::cell::Cell::new(false);
        assert_eq!(
            launch_routed(Entry::Public, kernel, |_| {
                called.set(true);
                0
            }),
            None
        );
        assert!(!called.get(), "the dropped route was used");
    }
}
