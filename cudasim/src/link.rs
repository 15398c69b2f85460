//! How the runtime reaches the driver, as NVIDIA's runtime does: at its first call that needs
//! the driver it opens `libcuda.so.1`, takes `cuGetProcAddress_v2` (and `cuDriverGetVersion`)
//! with `dlsym`, asks `cuGetProcAddress_v2` for `cuGetProcAddress` itself, and makes every
//! later lookup through that answer: by base name, CUDA version and flags (0: the legacy
//! default stream). Then it calls `cuInit(0)`.
//!
//! The driver is the simulator's own driver face: `libcuda.so.1` names this very file (a link
//! in `simlib/`), and glibc gives the loaded object again for a second name of the same file,
//! so there is one state. An object found under that name that is not this simulator (NVIDIA's
//! driver on a machine with a GPU) is closed again, and the file next to this one is used.
//!
//! `CUDASIM_NO_DRIVER=1` (or a driver that cannot be reached) leaves the runtime calling its
//! internals directly, as a runtime with no driver behind it.

use crate::api::device::VERSION;
use crate::config;
use crate::context;
use crate::errors::{CudaResult, SUCCESS};
use crate::state;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::sync::{Mutex, OnceLock, PoisonError};

type Stream = *mut c_void;
type GetProc =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> c_int;

/// The driver entry points the runtime calls.
pub struct Driver {
    pub mem_alloc: unsafe extern "C" fn(*mut u64, usize) -> c_int,
    pub mem_free: unsafe extern "C" fn(u64) -> c_int,
    pub mem_alloc_async: unsafe extern "C" fn(*mut u64, usize, Stream) -> c_int,
    pub mem_free_async: unsafe extern "C" fn(u64, Stream) -> c_int,
    pub mem_get_info: unsafe extern "C" fn(*mut usize, *mut usize) -> c_int,
    pub ctx_synchronize: unsafe extern "C" fn() -> c_int,
    pub stream_synchronize: unsafe extern "C" fn(Stream) -> c_int,
    pub event_synchronize: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub stream_create: unsafe extern "C" fn(*mut Stream, c_uint) -> c_int,
    pub stream_create_with_priority: unsafe extern "C" fn(*mut Stream, c_uint, c_int) -> c_int,
    pub ctx_enable_peer_access: unsafe extern "C" fn(*mut c_void, c_uint) -> c_int,
    pub ctx_disable_peer_access: unsafe extern "C" fn(*mut c_void) -> c_int,
    #[allow(clippy::type_complexity)]
    pub launch_kernel: unsafe extern "C" fn(
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
    ) -> c_int,
}

static DRIVER: OnceLock<Option<Driver>> = OnceLock::new();

/// Held while the driver is linked, and by a fork's prepare handler (`state.rs`): linking opens
/// the driver and takes ~20 entry points, long enough for another thread to fork in the middle,
/// and a child would then wait forever for a link no thread of its own is making.
pub static LINKING: Mutex<()> = Mutex::new(());

/// The driver, for a runtime call that goes through it (`None`: call the internals). The
/// calling thread then has a current context: its device's primary one unless it set another.
pub fn driver() -> Option<&'static Driver> {
    let linked = match DRIVER.get() {
        Some(linked) => linked,
        None => {
            state::watch_forks();
            let _linking = LINKING.lock().unwrap_or_else(PoisonError::into_inner);
            DRIVER.get_or_init(load)
        }
    };
    let driver = linked.as_ref()?;
    context::bind_runtime();
    Some(driver)
}

/// A driver result as the runtime's: the numbers the runtime path can meet are the same.
pub fn result(code: c_int) -> CudaResult {
    match code {
        SUCCESS => Ok(()),
        e => Err(e),
    }
}

fn load() -> Option<Driver> {
    // A bad configuration: the internals answer `cudaErrorInitializationError`, as today.
    let cfg = config::get().ok()?;
    if cfg.no_driver {
        return None;
    }
    std::thread::sleep(std::time::Duration::from_millis(cfg.link_delay_ms));
    let linked = open().and_then(|h| {
        // SAFETY: `h` is a live handle from dlopen.
        unsafe { link(h) }
    });
    if let Err(why) = &linked {
        eprintln!("cudasim: the runtime does not reach the driver ({why}); it calls its internals");
    }
    linked.ok()
}

/// Opens the driver: `libcuda.so.1` by name, else the file next to this one of that name,
/// else this file itself; only an object that is this simulator is kept.
fn open() -> Result<*mut c_void, String> {
    let own = own_path().ok_or("dladdr found no path for the simulator")?;
    let next_to = own
        .rsplit_once('/')
        .map(|(dir, _)| format!("{dir}/libcuda.so.1"));
    let names = [Some("libcuda.so.1".to_string()), next_to, Some(own)];
    for name in names.into_iter().flatten() {
        let c = CString::new(name).map_err(|e| e.to_string())?;
        // SAFETY: dlopen with a NUL-terminated name; the handle is checked below.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW) };
        if h.is_null() {
            continue;
        }
        if is_self(h) {
            return Ok(h);
        }
        // SAFETY: `h` came from dlopen above and nothing of it is kept.
        unsafe { libc::dlclose(h) };
    }
    Err("no libcuda.so.1 that is this simulator".into())
}

/// Our own file as the dynamic linker loaded it (the path of a link, if through one).
fn own_path() -> Option<String> {
    static ANCHOR: u8 = 0;
    // SAFETY: an all-zero Dl_info is a valid out-parameter.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the loader's tables for an address inside this object.
    let found = unsafe { libc::dladdr(&ANCHOR as *const u8 as *const c_void, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(name.to_string_lossy().into_owned())
}

/// Whether the object `h` is this simulator: its `cudasimGetStats` lies in our own object.
/// (A symbol nothing hooks: a library that wraps `dlsym` may answer for the driver's names.)
fn is_self(h: *mut c_void) -> bool {
    let base = |addr: *const c_void| {
        // SAFETY: an all-zero Dl_info is a valid out-parameter.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: dladdr only reads the loader's tables.
        let found = unsafe { libc::dladdr(addr, &mut info) };
        (found != 0).then_some(info.dli_fbase as usize)
    };
    static ANCHOR: u8 = 0;
    // SAFETY: dlsym on a live handle with a NUL-terminated name.
    let theirs = unsafe { libc::dlsym(h, c"cudasimGetStats".as_ptr()) };
    !theirs.is_null() && base(theirs) == base(&ANCHOR as *const u8 as *const c_void)
}

/// Takes `name` from `h` with `dlsym`.
fn sym(h: *mut c_void, name: &CStr) -> Result<*mut c_void, String> {
    // SAFETY: dlsym on a live handle with a NUL-terminated name.
    let p = unsafe { libc::dlsym(h, name.as_ptr()) };
    if p.is_null() {
        Err(format!("no {name:?} in the driver"))
    } else {
        Ok(p)
    }
}

/// The lookups, as NVIDIA's runtime makes them.
///
/// # Safety
/// `h` must be a live handle of the simulator's driver face.
unsafe fn link(h: *mut c_void) -> Result<Driver, String> {
    let first = sym(h, c"cuGetProcAddress_v2")?;
    let version = sym(h, c"cuDriverGetVersion")?;
    // SAFETY: the driver's cuDriverGetVersion has this signature.
    let version: unsafe extern "C" fn(*mut c_int) -> c_int = unsafe { as_fn(version) };
    let mut driver_version = 0;
    // SAFETY: a valid out-pointer.
    if unsafe { version(&mut driver_version) } != SUCCESS || driver_version < VERSION {
        return Err(format!("driver version {driver_version} below {VERSION}"));
    }
    // SAFETY: the driver's cuGetProcAddress_v2 has this signature.
    let first: GetProc = unsafe { as_fn(first) };
    // SAFETY: `first` is the driver's cuGetProcAddress_v2; the answer at 12000 and above is
    // the cuGetProcAddress_v2 signature too.
    let get_proc: GetProc = unsafe { as_fn(lookup(first, c"cuGetProcAddress")?) };
    let get = |name: &CStr| lookup(get_proc, name);
    // SAFETY: each answer is the driver's function of that base name at this version, whose
    // signature is the field's.
    unsafe {
        let init: unsafe extern "C" fn(c_uint) -> c_int = as_fn(get(c"cuInit")?);
        let driver = Driver {
            mem_alloc: as_fn(get(c"cuMemAlloc")?),
            mem_free: as_fn(get(c"cuMemFree")?),
            mem_alloc_async: as_fn(get(c"cuMemAllocAsync")?),
            mem_free_async: as_fn(get(c"cuMemFreeAsync")?),
            mem_get_info: as_fn(get(c"cuMemGetInfo")?),
            ctx_synchronize: as_fn(get(c"cuCtxSynchronize")?),
            stream_synchronize: as_fn(get(c"cuStreamSynchronize")?),
            event_synchronize: as_fn(get(c"cuEventSynchronize")?),
            stream_create: as_fn(get(c"cuStreamCreate")?),
            stream_create_with_priority: as_fn(get(c"cuStreamCreateWithPriority")?),
            launch_kernel: as_fn(get(c"cuLaunchKernel")?),
            ctx_enable_peer_access: as_fn(get(c"cuCtxEnablePeerAccess")?),
            ctx_disable_peer_access: as_fn(get(c"cuCtxDisablePeerAccess")?),
        };
        match init(0) {
            SUCCESS => Ok(driver),
            e => Err(format!("cuInit gave {e}")),
        }
    }
}

/// The function pointer `p` as the type `F`.
///
/// # Safety
/// `F` must be the type of a function pointer to what `p` points to.
unsafe fn as_fn<F: Copy>(p: *mut c_void) -> F {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: same size (checked), and by the caller's contract `F` is `p`'s type.
    unsafe { std::mem::transmute_copy(&p) }
}

/// One lookup: `name` at the runtime's version with flags 0.
fn lookup(get_proc: GetProc, name: &CStr) -> Result<*mut c_void, String> {
    let mut p = std::ptr::null_mut();
    let mut status = -1;
    // SAFETY: valid name and out-pointers for the driver's cuGetProcAddress_v2.
    let code = unsafe { get_proc(name.as_ptr(), &mut p, VERSION, 0, &mut status) };
    if code != SUCCESS || p.is_null() {
        return Err(format!(
            "cuGetProcAddress({name:?}) gave {code}, status {status}"
        ));
    }
    Ok(p)
}
