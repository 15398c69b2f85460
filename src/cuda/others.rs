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
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use libloading::os::unix::{Library, RTLD_LAZY};

use super::loader::{loaded_runtimes, object_of, own_object};
use super::runtime::{LaunchKernelFn, VoidFn};
use super::types::{CudaStatus, SUCCESS};
use crate::log;

/// A launch entry point: `cudaLaunchKernel`, or `__cudaLaunchKernel` (`<<<...>>>` since CUDA 13).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Entry {
    Public,
    Internal,
}

impl Entry {
    fn symbol(self) -> &'static [u8] {
        match self {
            Entry::Public => b"cudaLaunchKernel\0",
            Entry::Internal => b"__cudaLaunchKernel\0",
        }
    }
}

/// A runtime other than the pool's, with its launch entry points.
struct Other {
    path: String,
    public: Option<LaunchKernelFn>,
    internal: Option<LaunchKernelFn>,
    get_last_error: Option<VoidFn>,
    /// Kept open: the entry points stay valid for the life of the process.
    _library: Library,
}

#[derive(Default)]
struct Known {
    /// The loaded runtimes' paths when `others` was made.
    scanned: Vec<String>,
    others: Vec<Other>,
}

static KNOWN: Mutex<Option<Known>> = Mutex::new(None);
/// The kernels another runtime ran, by entry point and kernel, with that runtime's entry point.
static ROUTES: Mutex<Option<HashMap<(Entry, usize), LaunchKernelFn>>> = Mutex::new(None);
/// A route exists: launches look in `ROUTES` first.
static ANY_ROUTE: AtomicBool = AtomicBool::new(false);
static REPORTED: AtomicBool = AtomicBool::new(false);

/// The entry point of the runtime that ran `kernel` before, if another runtime did.
pub fn route(entry: Entry, kernel: usize) -> Option<LaunchKernelFn> {
    if !ANY_ROUTE.load(Ordering::Acquire) {
        return None;
    }
    let routes = ROUTES.lock().unwrap_or_else(|e| e.into_inner());
    routes.as_ref()?.get(&(entry, kernel)).copied()
}

/// `kernel` failed to launch through the pool's runtime (`own`, at `own_path`): `launch` it
/// through each other runtime loaded until one runs it. Returns that launch's status, or `None`
/// when no other runtime did.
pub fn relaunch(
    entry: Entry,
    kernel: usize,
    own_path: &str,
    own: Option<LaunchKernelFn>,
    launch: impl Fn(LaunchKernelFn) -> CudaStatus,
) -> Option<CudaStatus> {
    for (path, f, get_last_error) in candidates(entry, own_path, own) {
        let r = launch(f);
        if r == SUCCESS {
            let mut routes = ROUTES.lock().unwrap_or_else(|e| e.into_inner());
            routes
                .get_or_insert_with(HashMap::new)
                .insert((entry, kernel), f);
            ANY_ROUTE.store(true, Ordering::Release);
            log::warn_once(&REPORTED, || {
                format!(
                    "this process has more than one CUDA runtime: a kernel that {own_path} does \
                     not know was launched through {path}, where it runs (kernels are routed to \
                     the runtime that runs them; allocations and synchronizations go through \
                     {own_path}; reported once)"
                )
            });
            return Some(r);
        }
        // That runtime's own last error is not the program's concern: it did not make the call.
        if let Some(clear) = get_last_error {
            // SAFETY: no arguments.
            unsafe { clear() };
        }
    }
    None
}

/// The other runtimes' entry points for `entry`, rescanning when the loaded runtimes changed.
fn candidates(
    entry: Entry,
    own_path: &str,
    own: Option<LaunchKernelFn>,
) -> Vec<(String, LaunchKernelFn, Option<VoidFn>)> {
    let loaded = loaded_runtimes();
    let mut known = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
    let k = known.get_or_insert_with(Known::default);
    if k.scanned != loaded {
        let mine = own_object();
        k.others = loaded
            .iter()
            .filter(|p| p.as_str() != own_path)
            .filter_map(|p| open(p, mine))
            .collect();
        k.scanned = loaded;
    }
    k.others
        .iter()
        .filter_map(|o| {
            let f = match entry {
                Entry::Public => o.public,
                Entry::Internal => o.internal,
            }?;
            // The pool's own runtime under another name is not another runtime.
            (Some(f as usize) != own.map(|g| g as usize))
                .then(|| (o.path.clone(), f, o.get_last_error))
        })
        .collect()
}

/// A loaded runtime's launch entry points (none that resolve to this library's hooks).
fn open(path: &str, mine: *mut c_void) -> Option<Other> {
    // SAFETY: the library is loaded already (RTLD_NOLOAD): opening it runs no initialiser.
    let lib = unsafe { Library::open(Some(path), libc::RTLD_NOLOAD | RTLD_LAZY) }.ok()?;
    let lookup = |name: &[u8]| -> Option<*mut c_void> {
        // SAFETY: looking up a symbol address has no side effects.
        let p = unsafe { lib.get::<*mut c_void>(name) }.ok()?.into_raw();
        let ours = object_of(p).is_some_and(|(base, _)| base == mine);
        (!p.is_null() && !ours).then_some(p)
    };
    let launch_fn = |name: &[u8]| {
        // SAFETY: a non-NULL launch entry point of a CUDA runtime, which has this C signature.
        lookup(name).map(|p| unsafe { std::mem::transmute::<*mut c_void, LaunchKernelFn>(p) })
    };
    let public = launch_fn(Entry::Public.symbol());
    let internal = launch_fn(Entry::Internal.symbol());
    // SAFETY: a non-NULL cudaGetLastError, which has this C signature.
    let get_last_error = lookup(b"cudaGetLastError\0")
        .map(|p| unsafe { std::mem::transmute::<*mut c_void, VoidFn>(p) });
    (public.is_some() || internal.is_some()).then(|| Other {
        path: path.to_string(),
        public,
        internal,
        get_last_error,
        _library: lib,
    })
}
