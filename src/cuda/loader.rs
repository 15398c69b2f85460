//! Finding the application's own CUDA runtime.
//!
//! In order: the next definition after this library (`dlsym(RTLD_NEXT)`, which works for
//! programs linked against libcudart); any libcudart already loaded into the process, found by
//! walking the loaded objects (Python extension modules load it `RTLD_LOCAL`, where
//! `RTLD_NEXT` cannot see it); and only when no runtime is loaded at all, `GPUPOOL_CUDART` or the
//! usual sonames. Loading a runtime by name while another is loaded would give the process two
//! runtimes with separate state, so that is never done.

use std::ffi::{c_char, c_int, c_void, CStr};

use libloading::os::unix::{Library, RTLD_LAZY, RTLD_LOCAL, RTLD_NOW};

use super::runtime::Runtime;

/// Where the runtime was found, for messages.
pub struct Located {
    pub runtime: Runtime,
    pub path: String,
    /// Kept open for the life of the process.
    _library: Option<Library>,
}

/// Find the runtime. `own` is the address of one of this library's exported hooks, so a lookup
/// that lands on ourselves is recognised.
pub fn locate(own: *const c_void) -> Result<Located, String> {
    if let Some(found) = via_rtld_next(own) {
        return Ok(found);
    }
    let loaded = loaded_runtimes();
    for path in &loaded {
        if let Some(found) = open_and_resolve(path, libc::RTLD_NOLOAD | RTLD_LAZY, own) {
            return Ok(found);
        }
    }
    if !loaded.is_empty() {
        return Err(format!(
            "a CUDA runtime is loaded ({}) but its entry points could not be resolved",
            loaded.join(", ")
        ));
    }
    let mut candidates: Vec<String> = Vec::new();
    if let Some(p) = std::env::var_os("GPUPOOL_CUDART") {
        candidates.push(p.to_string_lossy().into_owned());
    }
    candidates.extend(
        ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]
            .iter()
            .map(|s| s.to_string()),
    );
    for name in &candidates {
        if let Some(found) = open_and_resolve(name, RTLD_NOW | RTLD_LOCAL, own) {
            return Ok(found);
        }
    }
    Err(format!(
        "no CUDA runtime is loaded and none could be opened (tried {})",
        candidates.join(", ")
    ))
}

fn via_rtld_next(own: *const c_void) -> Option<Located> {
    // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name has no preconditions.
    let sym = unsafe { libc::dlsym(libc::RTLD_NEXT, c"cudaMalloc".as_ptr()) };
    if sym.is_null() || std::ptr::eq(sym, own) {
        return None;
    }
    let mut info: libc::Dl_info = unsafe_zeroed_dl_info();
    // SAFETY: `sym` is an address inside a loaded object; `info` is a valid out-parameter.
    if unsafe { libc::dladdr(sym, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr returned a NUL-terminated path owned by the dynamic linker.
    let path = unsafe { CStr::from_ptr(info.dli_fname) }
        .to_string_lossy()
        .into_owned();
    open_and_resolve(&path, libc::RTLD_NOLOAD | RTLD_LAZY, own)
}

fn unsafe_zeroed_dl_info() -> libc::Dl_info {
    libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    }
}

fn open_and_resolve(path: &str, flags: c_int, own: *const c_void) -> Option<Located> {
    // SAFETY: opening a library runs its initialisers; with RTLD_NOLOAD the library is already
    // loaded and initialised, and otherwise it is a CUDA runtime the program would load itself.
    let lib = unsafe { Library::open(Some(path), flags) }.ok()?;
    let lookup = |name: &[u8]| -> *mut c_void {
        // SAFETY: looking up a symbol address has no side effects; the address is only used
        // through the typed table `Runtime::resolve` builds.
        match unsafe { lib.get::<*mut c_void>(name) } {
            Ok(s) => s.into_raw(),
            Err(_) => std::ptr::null_mut(),
        }
    };
    let malloc = lookup(b"cudaMalloc\0");
    if malloc.is_null() || std::ptr::eq(malloc, own) {
        return None;
    }
    let runtime = Runtime::resolve(&lookup).ok()?;
    Some(Located {
        runtime,
        path: path.to_string(),
        _library: Some(lib),
    })
}

/// Paths of loaded objects whose file name starts with `libcudart.so`.
fn loaded_runtimes() -> Vec<String> {
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: the dynamic linker passes a valid `info` for the duration of the callback, and
        // `data` is the `Vec` passed to dl_iterate_phdr below.
        let (info, out) = unsafe { (&*info, &mut *(data as *mut Vec<String>)) };
        if info.dlpi_name.is_null() {
            return 0;
        }
        // SAFETY: dlpi_name is a NUL-terminated string owned by the dynamic linker.
        let name = unsafe { CStr::from_ptr(info.dlpi_name as *const c_char) }.to_string_lossy();
        let base = name.rsplit('/').next().unwrap_or("");
        if base.starts_with("libcudart.so") {
            out.push(name.into_owned());
        }
        0
    }
    let mut out: Vec<String> = Vec::new();
    // SAFETY: `visit` only reads `info` and appends to `out`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), &mut out as *mut Vec<String> as *mut c_void) };
    out
}
