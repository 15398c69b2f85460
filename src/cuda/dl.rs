//! glibc's own `dlsym`, which the library's exported `dlsym` (`interpose`) stands in front of:
//! every lookup the library makes for itself goes straight to it, never back through the hook.

use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// glibc's `dlsym`, once found: the library's own lookups.
static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// The `dlsym` a program's lookup goes on to when the exported one leaves it alone (read by its
/// tail call): the next definition after this library, another preloaded library's that stands
/// in front of glibc's, or glibc's own. Stored before `REAL_DLSYM`.
pub static NEXT_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// Find glibc's `dlsym`, once: by version after this library (`RTLD_NEXT`), else the one beside
/// glibc's `dlvsym` (`beside_dlvsym`). Also finds `NEXT_DLSYM`: a lookup by version passes over
/// an unversioned `dlsym` preloaded after this library, whose owner wants the program's lookups.
pub fn find_real_dlsym() -> *mut c_void {
    let p = REAL_DLSYM.load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    // SAFETY: a pseudo-handle.
    let mut found = unsafe { glibc_versioned(libc::RTLD_NEXT, c"dlsym") };
    if found.is_null() {
        found = beside_dlvsym();
    }
    let next = next_definition(found, c"dlsym");
    NEXT_DLSYM.store(if next.is_null() { found } else { next }, Ordering::Release);
    REAL_DLSYM.store(found, Ordering::Release);
    found
}

/// The next definition of `name` after this library (`RTLD_NEXT`, unversioned: another
/// preloaded library's interposer, or glibc's default version); null where there is none, as
/// where this library loads after libc.
pub fn next_after_this(name: &std::ffi::CStr) -> *mut c_void {
    next_definition(find_real_dlsym(), name)
}

/// `next_after_this`, asked of glibc's `dlsym` `real`.
fn next_definition(real: *mut c_void, name: &std::ffi::CStr) -> *mut c_void {
    if real.is_null() {
        return real;
    }
    // SAFETY: `real` is glibc's dlsym, of this signature, called from this library (so that
    // `RTLD_NEXT` names the definitions after it), with a NUL-terminated name.
    let next = unsafe {
        std::mem::transmute::<*mut c_void, DlsymFn>(real)(libc::RTLD_NEXT, name.as_ptr())
    };
    if next.is_null() {
        forget_lookup_error();
    }
    next
}

/// The C signature of `dlclose`.
pub type DlcloseFn = unsafe extern "C" fn(*mut c_void) -> libc::c_int;

/// glibc's `dlclose`, once found: the library's own handles.
static GLIBC_DLCLOSE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// glibc's `dlclose`, by version: `GLIBC_2.34` since glibc moved it into libc, else
/// `GLIBC_2.2.5`. The definition after this library; where there is none (this library loads
/// after libc), the process's first, libc's.
pub fn glibc_dlclose() -> Option<DlcloseFn> {
    let mut p = GLIBC_DLCLOSE.load(Ordering::Acquire);
    if p.is_null() {
        for handle in [libc::RTLD_NEXT, libc::RTLD_DEFAULT] {
            // SAFETY: a pseudo-handle.
            p = unsafe { glibc_versioned(handle, c"dlclose") };
            if !p.is_null() {
                break;
            }
        }
        GLIBC_DLCLOSE.store(p, Ordering::Release);
    }
    // SAFETY: glibc's dlclose has this signature.
    (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, DlcloseFn>(p) })
}

/// Closes a handle the library opened, with glibc's `dlclose`: not through the exported one,
/// nor another preloaded library's.
///
/// # Safety
/// `handle` is a live handle from `dlopen`, closed once.
pub unsafe fn close(handle: *mut c_void) {
    if let Some(f) = glibc_dlclose() {
        // SAFETY: the caller's live handle.
        unsafe { f(handle) };
    }
}

/// glibc's `name` (`dlsym`, `dlclose`) as `handle` finds it, by version: `GLIBC_2.34` since
/// glibc moved it into libc, else `GLIBC_2.2.5`.
///
/// # Safety
/// `handle` is a live handle or a pseudo-handle.
unsafe fn glibc_versioned(handle: *mut c_void, name: &std::ffi::CStr) -> *mut c_void {
    for version in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
        // SAFETY: NUL-terminated name and version; the caller's handle.
        let found = unsafe { libc::dlvsym(handle, name.as_ptr(), version.as_ptr()) };
        if !found.is_null() {
            return found;
        }
    }
    std::ptr::null_mut()
}

/// glibc's `dlsym` from the object that defines `dlvsym` (libc, or libdl before glibc 2.34),
/// which this library does not export. Needed where this library comes after libc in the lookup
/// order, as it does when a library the program links links it: nothing after it then
/// defines `dlsym`.
fn beside_dlvsym() -> *mut c_void {
    // The dynamic linker's name: `dladdr` would name a non-PIE program by its `argv[0]` (its
    // stub of `dlvsym` lies there), which may name a FIFO that opening blocks on. For that
    // stub (an empty name), libc by its soname.
    let path = match linked_object_of(libc::dlvsym as *const () as usize) {
        // SAFETY: a NUL-terminated name owned by the dynamic linker.
        Some((_, path)) if unsafe { *path } != 0 => path,
        _ => c"libc.so.6".as_ptr(),
    };
    // SAFETY: the dynamic linker's name of a loaded object; RTLD_NOLOAD opens only what is
    // loaded already.
    let h = unsafe { libc::dlopen(path, libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
    if h.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: a live handle.
    let found = unsafe { glibc_versioned(h, c"dlsym") };
    // SAFETY: the handle just opened, closed once (libc stays loaded).
    unsafe { close(h) };
    found
}

/// glibc's `dlsym(handle, name)`, as if this library had called it (so `RTLD_NEXT` is relative
/// to this library). Null when not found (glibc then has an error for `dlerror`).
///
/// # Safety
/// `handle` is a handle from `dlopen` or a pseudo-handle; `name` is NUL-terminated.
pub unsafe fn real_dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let f = find_real_dlsym();
    if f.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: `f` is glibc's dlsym, of this signature; the arguments are the caller's.
    unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(f)(handle, name) }
}

/// Clears the error a failed lookup of the library's own left behind, so that the program's
/// next `dlerror()` reads as it would without the library.
pub fn forget_lookup_error() {
    // SAFETY: dlerror has no preconditions; the string it returns is not used.
    unsafe { libc::dlerror() };
}

/// The loaded object the address `addr` lies in: its load address and path.
pub fn object_of(addr: usize) -> Option<(*mut c_void, *const c_char)> {
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr only reads the dynamic linker's tables; `info` is a valid out-parameter.
    if unsafe { libc::dladdr(addr as *const c_void, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    Some((info.dli_fbase, info.dli_fname))
}

/// `struct link_map`'s public head (`<link.h>`).
#[repr(C)]
struct LinkMapHead {
    l_addr: usize,
    l_name: *const c_char,
}

/// `RTLD_DL_LINKMAP`: `dladdr1` also gives the object's `struct link_map`.
const RTLD_DL_LINKMAP: libc::c_int = 2;

/// The loaded object the address `addr` lies in: its load address and the dynamic linker's own
/// name for it, the path it opened, empty for the main program (which `dladdr` names by
/// `argv[0]`, which may name any file, or none).
pub fn linked_object_of(addr: usize) -> Option<(*mut c_void, *const c_char)> {
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    let mut map: *mut c_void = std::ptr::null_mut();
    // SAFETY: dladdr1 only reads the dynamic linker's tables; `info` and `map` are valid
    // out-parameters, `map` of a pointer as RTLD_DL_LINKMAP writes.
    if unsafe { libc::dladdr1(addr as *const c_void, &mut info, &mut map, RTLD_DL_LINKMAP) } == 0
        || map.is_null()
    {
        return None;
    }
    // SAFETY: a live `struct link_map`, whose head is public ABI.
    let name = unsafe { (*(map as *const LinkMapHead)).l_name };
    (!name.is_null()).then_some((info.dli_fbase, name))
}

/// A loaded object as `dlclose` finds it: its load address, the addresses its loadable
/// segments span, and the dynamic linker's name for it.
#[derive(PartialEq, Eq)]
pub struct LoadedObject {
    pub base: usize,
    pub range: std::ops::Range<usize>,
    pub name: std::ffi::CString,
}

/// Every loaded object with a name (the main program left out), in load order. `dlclose`
/// takes this list before and after it unloads: one `dlclose` may unload the libraries the
/// closed one linked as well, and their blocks need their names too.
pub fn loaded_with_ranges() -> Vec<LoadedObject> {
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> libc::c_int {
        // SAFETY: the dynamic linker passes a valid `info` for the duration of the callback, and
        // `data` is the `Vec` passed to dl_iterate_phdr below.
        let (info, out) = unsafe { (&*info, &mut *(data as *mut Vec<LoadedObject>)) };
        // SAFETY: dlpi_name, when not NULL, is a NUL-terminated string owned by the dynamic
        // linker.
        if info.dlpi_name.is_null() || unsafe { *info.dlpi_name } == 0 {
            return 0;
        }
        let (mut lo, mut hi) = (usize::MAX, 0);
        for i in 0..info.dlpi_phnum as usize {
            // SAFETY: `dlpi_phdr` points at `dlpi_phnum` program headers.
            let ph = unsafe { &*info.dlpi_phdr.add(i) };
            if ph.p_type == libc::PT_LOAD {
                lo = lo.min(ph.p_vaddr as usize);
                hi = hi.max((ph.p_vaddr + ph.p_memsz) as usize);
            }
        }
        if lo < hi {
            let base = info.dlpi_addr as usize;
            out.push(LoadedObject {
                base,
                range: base + lo..base + hi,
                // SAFETY: as above.
                name: unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }.to_owned(),
            });
        }
        0
    }
    let mut out: Vec<LoadedObject> = Vec::new();
    // SAFETY: `visit` only reads `info` and appends to `out`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&raw mut out).cast()) };
    out
}

/// The paths of the loaded objects, in load order (the main program's empty name left out).
pub fn loaded_objects() -> Vec<String> {
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> libc::c_int {
        // SAFETY: the dynamic linker passes a valid `info` for the duration of the callback, and
        // `data` is the `Vec` passed to dl_iterate_phdr below.
        let (info, out) = unsafe { (&*info, &mut *(data as *mut Vec<String>)) };
        if !info.dlpi_name.is_null() {
            // SAFETY: dlpi_name is a NUL-terminated string owned by the dynamic linker.
            let name = unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }.to_string_lossy();
            if !name.is_empty() {
                out.push(name.into_owned());
            }
        }
        0
    }
    let mut out: Vec<String> = Vec::new();
    // SAFETY: `visit` only reads `info` and appends to `out`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), &mut out as *mut Vec<String> as *mut c_void) };
    out
}

/// How many objects the dynamic linker has loaded since the process started (`dlpi_adds`): it
/// grows with every `dlopen` that loads something, so an unchanged count means nothing was
/// loaded in between.
pub fn objects_added() -> u64 {
    unsafe extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        size: usize,
        data: *mut c_void,
    ) -> libc::c_int {
        // SAFETY: the dynamic linker passes a valid `info` of `size` bytes for the duration of
        // the callback, and `data` is the `u64` passed to dl_iterate_phdr below.
        unsafe {
            let adds_end = std::mem::offset_of!(libc::dl_phdr_info, dlpi_adds)
                + std::mem::size_of::<libc::c_ulonglong>();
            if size >= adds_end {
                *(data as *mut u64) = (*info).dlpi_adds;
            }
        }
        1
    }
    let mut adds: u64 = 0;
    // SAFETY: `first` only reads `info` and writes `adds`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(first), &mut adds as *mut u64 as *mut c_void) };
    adds
}
