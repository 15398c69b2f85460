//! Finding the application's own CUDA runtime.
//!
//! In order: the next definition after this library (`dlsym(RTLD_NEXT)`, which works for
//! programs linked against libcudart); any libcudart already loaded into the process, found by
//! walking the loaded objects (Python extension modules load it `RTLD_LOCAL`, where
//! `RTLD_NEXT` cannot see it); and only when no runtime is loaded at all, `GPUPOOL_CUDART` or the
//! usual sonames. Loading a runtime by name while another is loaded would give the process two
//! runtimes with separate state, so that is never done.

use std::ffi::{c_int, c_void, CStr};

use libloading::os::unix::{Library, RTLD_LAZY, RTLD_LOCAL, RTLD_NOW};

use super::runtime::Runtime;

/// Where the runtime was found, for messages.
pub struct Located {
    pub runtime: Runtime,
    pub path: String,
    /// Kept open for the life of the process.
    _library: Option<Library>,
}

/// Find the runtime. A lookup that lands on this library's own hooks is recognised by the object
/// the symbol lives in: comparing addresses would not do, since a reference to an exported
/// function from inside a shared library binds through the global scope, and so to the
/// runtime's own `cudaMalloc` when the runtime was loaded first (PyTorch loading this library as
/// its pluggable allocator).
pub fn locate() -> Result<Located, String> {
    let own = own_object();
    if let Some(found) = via_rtld_next(own) {
        return Ok(found);
    }
    let loaded = loaded_runtimes();
    let mut why = Vec::new();
    for path in &loaded {
        match open_and_resolve(path, libc::RTLD_NOLOAD | RTLD_LAZY, own) {
            Ok(found) => return Ok(found),
            Err(e) => why.push(format!("{path}: {e}")),
        }
    }
    if !loaded.is_empty() {
        return Err(format!(
            "a CUDA runtime is loaded but could not be used ({})",
            why.join("; ")
        ));
    }
    let mut candidates: Vec<String> = Vec::new();
    if let Some(p) = crate::config::env_value("GPUPOOL_CUDART") {
        candidates.push(p.to_string_lossy().into_owned());
    }
    candidates.extend(
        ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]
            .iter()
            .map(|s| s.to_string()),
    );
    for name in &candidates {
        // A path to anything but a regular file (a FIFO, a terminal, `/dev/stdin`) is never
        // opened: the dynamic linker's open and read of it would wait forever.
        if name.contains('/') && !std::fs::metadata(name).is_ok_and(|m| m.is_file()) {
            continue;
        }
        if let Ok(found) = open_and_resolve(name, RTLD_NOW | RTLD_LOCAL, own) {
            return Ok(found);
        }
    }
    Err(format!(
        "no CUDA runtime is loaded and none could be opened (tried {})",
        candidates.join(", ")
    ))
}

/// The loaded object `addr` lies in: its load address and path.
fn object_of(addr: *const c_void) -> Option<(*mut c_void, String)> {
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr only reads the dynamic linker's tables; `info` is a valid out-parameter.
    if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr returned a NUL-terminated path owned by the dynamic linker.
    let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy();
    Some((info.dli_fbase, path.into_owned()))
}

/// This library's load address, found through a private function (not interposable).
pub(crate) fn own_object() -> *mut c_void {
    object_of(own_object as *const c_void).map_or(std::ptr::null_mut(), |o| o.0)
}

fn via_rtld_next(own: *mut c_void) -> Option<Located> {
    // SAFETY: glibc's dlsym, called from this library (RTLD_NEXT: the objects after it, not
    // after another preloaded library's dlsym), with a NUL-terminated name.
    let sym = unsafe { super::dl::real_dlsym(libc::RTLD_NEXT, c"cudaMalloc".as_ptr()) };
    if sym.is_null() {
        return None;
    }
    let (base, path) = object_of(sym)?;
    if base == own {
        return None;
    }
    open_and_resolve(&path, libc::RTLD_NOLOAD | RTLD_LAZY, own).ok()
}

/// Open the runtime at `path` (already loaded with `RTLD_NOLOAD`) and resolve its entry points,
/// unless its `cudaMalloc` is this library's (`own`, `own_object`).
pub(crate) fn open_and_resolve(
    path: &str,
    flags: c_int,
    own: *mut c_void,
) -> Result<Located, String> {
    // SAFETY: opening a library runs its initialisers; with RTLD_NOLOAD the library is already
    // loaded and initialised, and otherwise it is a CUDA runtime the program would load itself.
    let lib = unsafe { Library::open(Some(path), flags) }.map_err(|e| e.to_string())?;
    let lookup = |name: &[u8]| -> *mut c_void {
        // SAFETY: looking up a symbol address has no side effects; the address is only used
        // through the typed table `Runtime::resolve` builds.
        match unsafe { lib.get::<*mut c_void>(name) } {
            Ok(s) => s.into_raw(),
            Err(_) => std::ptr::null_mut(),
        }
    };
    let malloc = lookup(b"cudaMalloc\0");
    if malloc.is_null() {
        return Err("no cudaMalloc".into());
    }
    if object_of(malloc).is_some_and(|(base, _)| base == own) {
        return Err("its cudaMalloc is libgpupool's".into());
    }
    let runtime = Runtime::resolve(&lookup)?;
    Ok(Located {
        runtime,
        path: path.to_string(),
        _library: Some(lib),
    })
}

/// Paths of loaded objects whose file name starts with `libcudart.so`.
pub fn loaded_runtimes() -> Vec<String> {
    super::dl::loaded_objects()
        .into_iter()
        .filter(|name| {
            name.rsplit('/')
                .next()
                .unwrap_or("")
                .starts_with("libcudart.so")
        })
        .collect()
}
