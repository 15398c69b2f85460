//! Frameworks that keep a cache of their own above the pool, and the one setting the pool makes
//! for PyTorch at load.
//!
//! PyTorch picks its allocator when `libc10_cuda` loads, after a preloaded library's constructor
//! ran. Unless the user chose (any of its three variables set), the constructor sets
//! `PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync`: every tensor is then a `cudaMallocAsync`
//! the pool serves, and PyTorch's memory calls read the pool through the default memory pool's
//! calls (`mempool.rs`). A child process that inherits the variable without the preload is left
//! with PyTorch's own `cudaMallocAsync` backend, a sound allocator.
//!
//! The summary says which case holds, and names other frameworks whose cache sits above the
//! pool, with what turns each off (docs/pytorch.md).

use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

/// PyTorch's variables, in the order PyTorch reads them: `PYTORCH_ALLOC_CONF` first, then
/// `PYTORCH_CUDA_ALLOC_CONF` only when that is unset.
const ALLOC_CONF: &str = "PYTORCH_ALLOC_CONF";
const CUDA_ALLOC_CONF: &str = "PYTORCH_CUDA_ALLOC_CONF";
const NO_CACHING: &str = "PYTORCH_NO_CUDA_MEMORY_CACHING";
/// What the constructor sets.
pub const POOLED_SETTING: &str = "backend:cudaMallocAsync";
/// Set beside it, so that a child process (a wrapper script's program, `torchrun`'s workers)
/// knows the setting it inherited was the pool's.
const MARK: &str = "GPUPOOL_SET_PYTORCH_CUDA_ALLOC_CONF";

/// What the constructor found or did about PyTorch's allocator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum TorchChoice {
    /// Not decided at load (the library was loaded later, or off).
    Unknown = 0,
    /// The pool set `PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync`.
    SetByPool = 1,
    /// The user set one of the variables (read again at report time).
    User = 2,
    /// `libc10_cuda` was already loaded: too late to choose.
    TooLate = 3,
}

static CHOICE: AtomicU8 = AtomicU8::new(TorchChoice::Unknown as u8);

/// Whether the process's calls came to this copy at load (preloaded or linked). A copy opened
/// later is asked again at report time: one opened `RTLD_GLOBAL` serves what loads after it.
static SERVES_AT_LOAD: AtomicBool = AtomicBool::new(false);

/// Whether PyTorch's pluggable allocator (`gpupool_torch_malloc`) asked the pool for a tensor.
static PLUGGABLE: AtomicBool = AtomicBool::new(false);

/// A tensor came through `gpupool_torch_malloc`: PyTorch's allocator is the pool, whatever its
/// variables say (`CUDAPluggableAllocator` replaces the backend they choose).
pub fn note_pluggable() {
    // A load first: the flag is read on every tensor, written once.
    if !PLUGGABLE.load(Ordering::Relaxed) {
        PLUGGABLE.store(true, Ordering::Relaxed);
    }
}

/// What the constructor decided.
pub fn torch_choice() -> TorchChoice {
    match CHOICE.load(Ordering::Relaxed) {
        1 => TorchChoice::SetByPool,
        2 => TorchChoice::User,
        3 => TorchChoice::TooLate,
        _ => TorchChoice::Unknown,
    }
}

fn env(name: &str) -> Option<String> {
    let c = CString::new(name).ok()?;
    // SAFETY: getenv with a NUL-terminated name; the result is copied out at once.
    let v = unsafe { libc::getenv(c.as_ptr()) };
    if v.is_null() {
        return None;
    }
    // SAFETY: a non-NULL getenv result is a NUL-terminated string.
    Some(unsafe { CStr::from_ptr(v) }.to_string_lossy().into_owned())
}

/// At load: set PyTorch's allocator to its `cudaMallocAsync` backend unless the user chose one,
/// the pool is off, PyTorch is already loaded, or this copy of the library does not serve the
/// process's calls (opened with `dlopen`, as `import gpupool` or a pluggable allocator does:
/// then it is not the preload's, and the setting would send tensors past the pool). A preloaded
/// library's constructor runs before any thread of the program. libc-level work only, as a
/// constructor must.
pub fn choose_at_load() {
    let inherited = env(MARK).is_some()
        && env(CUDA_ALLOC_CONF).as_deref() == Some(POOLED_SETTING)
        && env(ALLOC_CONF).is_none()
        && env(NO_CACHING).is_none();
    if env("GPUPOOL_DISABLE").is_some_and(|v| crate::config::parse_bool(v.as_bytes()) == Some(true))
    {
        // A disabled child of a pooled parent runs PyTorch as it would without the pool.
        if inherited {
            // SAFETY: NUL-terminated names; at load, before the program's threads.
            unsafe {
                libc::unsetenv(c"PYTORCH_CUDA_ALLOC_CONF".as_ptr());
                libc::unsetenv(c"GPUPOOL_SET_PYTORCH_CUDA_ALLOC_CONF".as_ptr());
            }
        }
        return;
    }
    if !serves_the_process() {
        return;
    }
    SERVES_AT_LOAD.store(true, Ordering::Relaxed);
    let choice = if inherited {
        TorchChoice::SetByPool
    } else if [ALLOC_CONF, CUDA_ALLOC_CONF, NO_CACHING]
        .iter()
        .any(|v| env(v).is_some())
    {
        TorchChoice::User
    } else if loaded_objects().iter().any(|o| is_torch(o)) {
        TorchChoice::TooLate
    } else {
        // SAFETY: both strings are NUL-terminated; no other thread runs yet, so nothing reads
        // the environment while it changes.
        let set = unsafe {
            libc::setenv(
                c"PYTORCH_CUDA_ALLOC_CONF".as_ptr(),
                c"backend:cudaMallocAsync".as_ptr(),
                0,
            ) == 0
                && libc::setenv(
                    c"GPUPOOL_SET_PYTORCH_CUDA_ALLOC_CONF".as_ptr(),
                    c"1".as_ptr(),
                    0,
                ) == 0
        };
        if set {
            TorchChoice::SetByPool
        } else {
            TorchChoice::Unknown
        }
    };
    CHOICE.store(choice as u8, Ordering::Relaxed);
}

/// PyTorch's allocator, as its variables make it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TorchAllocator {
    /// `backend:cudaMallocAsync`: tensors come to the pool one by one.
    Async,
    /// `PYTORCH_NO_CUDA_MEMORY_CACHING=1`: tensors come to the pool, PyTorch keeps no figures.
    Uncached,
    /// PyTorch's caching allocator: the pool sees its segments, not tensors.
    Caching,
}

/// The allocator PyTorch picks from these variables (`PYTORCH_ALLOC_CONF`,
/// `PYTORCH_CUDA_ALLOC_CONF`, `PYTORCH_NO_CUDA_MEMORY_CACHING`), and the variable that chose it.
pub fn torch_allocator(
    alloc_conf: Option<&str>,
    cuda_alloc_conf: Option<&str>,
    no_caching: Option<&str>,
) -> (TorchAllocator, &'static str) {
    let (conf, name) = match (alloc_conf, cuda_alloc_conf) {
        (Some(c), _) => (Some(c), ALLOC_CONF),
        (None, Some(c)) => (Some(c), CUDA_ALLOC_CONF),
        (None, None) => (None, NO_CACHING),
    };
    let backend_async = conf.is_some_and(|c| {
        c.split(',').any(|kv| {
            let mut it = kv.splitn(2, ':');
            it.next().map(str::trim) == Some("backend")
                && it.next().map(str::trim) == Some("cudaMallocAsync")
        })
    });
    if backend_async {
        (TorchAllocator::Async, name)
    } else if no_caching == Some("1") {
        (TorchAllocator::Uncached, NO_CACHING)
    } else {
        (TorchAllocator::Caching, name)
    }
}

/// A framework found in the process, and what its cache means for the pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameworkNote {
    pub name: &'static str,
    /// Whether its own cache sits above the pool.
    pub caches_above: bool,
    pub note: String,
}

/// What the frameworks loaded in the process do above the pool, for the summary.
pub fn notes() -> Vec<FrameworkNote> {
    let objects = loaded_objects();
    let mut out = Vec::new();
    let torch = objects.iter().any(|o| is_torch(o));
    if PLUGGABLE.load(Ordering::Relaxed) {
        out.push(pluggable_note());
    } else if torch && !SERVES_AT_LOAD.load(Ordering::Relaxed) && !serves_the_process() {
        out.push(bypassed_note());
    } else if torch {
        out.push(torch_note(
            torch_choice(),
            env(ALLOC_CONF).as_deref(),
            env(CUDA_ALLOC_CONF).as_deref(),
            env(NO_CACHING).as_deref(),
        ));
    }
    if objects
        .iter()
        .any(|o| o.contains("/cupy/") || o.contains("/cupy_backends/"))
    {
        out.push(FrameworkNote {
            name: "cupy",
            caches_above: true,
            note: "CuPy's default memory pool caches above the pool unless the program calls \
                   cupy.cuda.set_allocator(None)"
                .into(),
        });
    }
    if objects
        .iter()
        .any(|o| o.contains("xla_extension") || o.contains("/jaxlib/"))
    {
        out.push(jax_note(
            env("XLA_PYTHON_CLIENT_PREALLOCATE").as_deref(),
            env("XLA_PYTHON_CLIENT_ALLOCATOR").as_deref(),
            crate::config::driver_hooks(),
        ));
    }
    out
}

/// The summary's line about PyTorch when the pool is its pluggable allocator.
pub fn pluggable_note() -> FrameworkNote {
    FrameworkNote {
        name: "pytorch",
        caches_above: false,
        note: "tensors pooled through PyTorch's pluggable allocator (gpupool_torch_malloc, as \
               gpupool.torch.use() installs it); PyTorch's allocator variables do not apply"
            .into(),
    }
}

/// The summary's line about PyTorch when this copy of the pool does not serve the process's
/// calls (opened with `dlopen`, as `import gpupool` without the preload opens one): whatever
/// PyTorch's variables say, its calls go past the pool.
pub fn bypassed_note() -> FrameworkNote {
    FrameworkNote {
        name: "pytorch",
        caches_above: false,
        note: "PyTorch allocates past the pool: this copy of the library serves none of the \
               process's CUDA calls (it was not preloaded; `import gpupool` without the preload \
               opens one of its own); preload it (python -m gpupool, or LD_PRELOAD), or call \
               gpupool.torch.use() before the first CUDA tensor, to pool tensors"
            .into(),
    }
}

/// The summary's line about PyTorch, as its variables make its allocator.
pub fn torch_note(
    choice: TorchChoice,
    alloc_conf: Option<&str>,
    cuda_alloc_conf: Option<&str>,
    no_caching: Option<&str>,
) -> FrameworkNote {
    let (allocator, var) = torch_allocator(alloc_conf, cuda_alloc_conf, no_caching);
    // The pool's only if the variable PyTorch read still holds what the pool set: a program may
    // set its own after the pool chose at load, before PyTorch loads (`os.environ[...]`).
    let pools = var == CUDA_ALLOC_CONF && cuda_alloc_conf == Some(POOLED_SETTING);
    let by = if choice == TorchChoice::SetByPool && pools {
        "set by the pool"
    } else {
        "set in the environment"
    };
    // Where the backend is chosen: PyTorch reads PYTORCH_CUDA_ALLOC_CONF only while
    // PYTORCH_ALLOC_CONF is unset, so advice to change it names the one PyTorch reads.
    let (backend_var, conf_read) = if alloc_conf.is_some() {
        (ALLOC_CONF, alloc_conf)
    } else {
        (CUDA_ALLOC_CONF, cuda_alloc_conf)
    };
    let (caches_above, note) = match allocator {
        // PYTORCH_NO_CUDA_MEMORY_CACHING=1 set beside it (a script sets it at its top, after the
        // pool chose at load) is PyTorch's caching allocator's, which this backend replaces.
        TorchAllocator::Async if no_caching == Some("1") => (
            false,
            format!(
                "tensors pooled through PyTorch's cudaMallocAsync backend ({var}={}, {by}); \
                 {NO_CACHING}=1 has no effect on this backend: for PyTorch's uncached allocator \
                 set {backend_var}=backend:native beside it",
                conf_read.unwrap_or(POOLED_SETTING)
            ),
        ),
        TorchAllocator::Async => (
            false,
            format!(
                "tensors pooled through PyTorch's cudaMallocAsync backend ({var}={}, {by}); \
                 torch.cuda.empty_cache() and memory_reserved() read the pool; for what that \
                 backend refuses (memory snapshots, CUDA tensors shared between processes) set \
                 {backend_var}=backend:native",
                conf_read.unwrap_or(POOLED_SETTING)
            ),
        ),
        TorchAllocator::Uncached => (
            false,
            format!(
                "tensors pooled uncached ({NO_CACHING}=1): torch.cuda.memory_* read 0 and \
                 empty_cache() does nothing; {}set {backend_var}={POOLED_SETTING} to pool \
                 through the cudaMallocAsync backend",
                // Unset alone, a configuration of PyTorch's keeps its caching allocator.
                if (alloc_conf, cuda_alloc_conf) == (None, None) {
                    "unset it, or "
                } else {
                    ""
                }
            ),
        ),
        TorchAllocator::Caching => (
            true,
            match choice {
                TorchChoice::TooLate => "PyTorch's caching allocator sits above the pool (PyTorch \
                     was loaded before the pool could choose): the pool sees its segments, not \
                     tensors; preload the pool to pool tensors"
                    .into(),
                // None of the variables is set (the program removed the pool's before PyTorch
                // loaded): nothing to unset.
                _ if (alloc_conf, cuda_alloc_conf, no_caching) == (None, None, None) => format!(
                    "PyTorch's caching allocator sits above the pool (PyTorch's default: none of \
                     {ALLOC_CONF}, {CUDA_ALLOC_CONF}, {NO_CACHING} is set): the pool sees its \
                     segments, not tensors, and empty_cache() returns them to the pool's cache; \
                     set {CUDA_ALLOC_CONF}={POOLED_SETTING} to pool tensors"
                ),
                _ => format!(
                    "PyTorch's caching allocator sits above the pool (its choice, {var} {by}): the \
                     pool sees its segments, not tensors, and empty_cache() returns them to the \
                     pool's cache; unset it, or set {backend_var}={POOLED_SETTING}, to pool \
                     tensors"
                ),
            },
        ),
    };
    FrameworkNote {
        name: "pytorch",
        caches_above,
        note,
    }
}

/// The summary's line about JAX (XLA's allocator, which preallocates unless told not to).
/// `driver_hooks`: whether the pool serves the driver's allocations, where XLA's own
/// allocator (`platform`) puts each buffer.
pub fn jax_note(
    preallocate: Option<&str>,
    allocator: Option<&str>,
    driver_hooks: bool,
) -> FrameworkNote {
    let platform = allocator.is_some_and(|a| a.trim().eq_ignore_ascii_case("platform"));
    let cuda_async = allocator.is_some_and(|a| a.trim().eq_ignore_ascii_case("cuda_async"));
    let prealloc = !preallocate.is_some_and(|p| p.trim().eq_ignore_ascii_case("false"));
    let remedy = if driver_hooks {
        "XLA_PYTHON_CLIENT_ALLOCATOR=platform makes each buffer a driver allocation, which the \
         pool serves"
    } else {
        "XLA_PYTHON_CLIENT_ALLOCATOR=platform makes each buffer a driver allocation, which the \
         pool serves with its driver hooks on (GPUPOOL_DRIVER_HOOKS=0 turns them off here)"
    };
    let note = match (platform, prealloc) {
        (true, _) if driver_hooks => "JAX hands each buffer to the driver \
             (XLA_PYTHON_CLIENT_ALLOCATOR=platform), whose allocations the pool serves"
            .to_string(),
        (true, _) => "JAX hands each buffer to the driver (XLA_PYTHON_CLIENT_ALLOCATOR=platform), \
             whose allocations the pool leaves alone under GPUPOOL_DRIVER_HOOKS=0"
            .to_string(),
        // XLA's `cudaMallocAsync` allocator: `cuMemAllocFromPoolAsync` from a CUDA memory
        // pool, which the pool leaves to the driver.
        (false, _) if cuda_async => format!(
            "JAX allocates from a CUDA memory pool (XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async), which \
             caches beside the pool; {remedy}"
        ),
        (false, true) => format!(
            "JAX's BFC allocator preallocates most of each device and caches above the pool; \
             {remedy}"
        ),
        (false, false) => format!(
            "JAX's BFC allocator caches above the pool (XLA_PYTHON_CLIENT_PREALLOCATE=false \
             only delays it); {remedy}"
        ),
    };
    FrameworkNote {
        name: "jax",
        caches_above: !platform,
        note,
    }
}

/// Whether the process's `cudaMallocAsync` is this library's: the copy in the global scope
/// (preloaded or linked; at load, not one being opened with `dlopen`, which only an
/// `RTLD_GLOBAL` open adds there, once it returns). The lookup goes through the program's
/// handle, which searches the global scope only: `RTLD_DEFAULT` searches the caller's own scope
/// too, and from a library opened with `RTLD_LOCAL` it finds the library's own symbol.
fn serves_the_process() -> bool {
    // SAFETY: dlopen(NULL) returns the program's handle (never loads anything, and is never
    // closed: it needs no dlclose); glibc's dlsym (not the exported one, which another preloaded
    // library's follows) and dladdr with a NUL-terminated name and addresses only read the
    // loader's tables; `Dl_info` is plain data the calls fill.
    unsafe {
        let program = libc::dlopen(std::ptr::null(), libc::RTLD_LAZY);
        if program.is_null() {
            return false;
        }
        let found = crate::cuda::dl::real_dlsym(program, c"cudaMallocAsync".as_ptr());
        if found.is_null() {
            // The program's dlerror() reads nothing after a dlopen of this library that worked.
            crate::cuda::dl::forget_lookup_error();
            return false;
        }
        let (mut theirs, mut ours): (libc::Dl_info, libc::Dl_info) =
            (std::mem::zeroed(), std::mem::zeroed());
        let own = serves_the_process as *const () as *const libc::c_void;
        libc::dladdr(found, &mut theirs) != 0
            && libc::dladdr(own, &mut ours) != 0
            && theirs.dli_fbase == ours.dli_fbase
    }
}

fn is_torch(object: &str) -> bool {
    object
        .rsplit('/')
        .next()
        .is_some_and(|f| f.starts_with("libc10_cuda.so"))
}

/// The paths of the shared objects loaded in the process.
fn loaded_objects() -> Vec<String> {
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: `data` is the `Vec` passed below, and `info` the loader's record for one
        // object, whose name is NULL or a NUL-terminated string.
        unsafe {
            let names = &mut *data.cast::<Vec<String>>();
            let name = (*info).dlpi_name;
            if !name.is_null() {
                let s = CStr::from_ptr(name).to_string_lossy();
                if !s.is_empty() {
                    names.push(s.into_owned());
                }
            }
        }
        0
    }
    let mut names: Vec<String> = Vec::new();
    // SAFETY: the callback only reads the loader's records and pushes onto `names`, which
    // outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(each), (&mut names as *mut Vec<String>).cast()) };
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pytorchs_variables_are_read_as_pytorch_reads_them() {
        use TorchAllocator::*;
        let a = |x, y, z| torch_allocator(x, y, z).0;
        assert_eq!(a(None, None, None), Caching);
        assert_eq!(a(None, Some("backend:cudaMallocAsync"), None), Async);
        assert_eq!(
            a(
                None,
                Some("expandable_segments:True, backend: cudaMallocAsync"),
                None
            ),
            Async
        );
        // PYTORCH_ALLOC_CONF wins; PYTORCH_CUDA_ALLOC_CONF is read only when it is unset.
        assert_eq!(
            a(
                Some("backend:native"),
                Some("backend:cudaMallocAsync"),
                None
            ),
            Caching
        );
        assert_eq!(
            a(
                Some("backend:cudaMallocAsync"),
                Some("backend:native"),
                None
            ),
            Async
        );
        // Only exactly 1 turns caching off.
        assert_eq!(a(None, None, Some("1")), Uncached);
        assert_eq!(a(None, None, Some("true")), Caching);
        assert_eq!(a(None, Some("backend:native"), Some("1")), Uncached);
    }

    #[test]
    fn the_summary_says_whose_choice_and_what_turns_a_cache_off() {
        let n = torch_note(TorchChoice::SetByPool, None, Some(POOLED_SETTING), None);
        assert!(!n.caches_above);
        assert!(n.note.contains("set by the pool"), "{}", n.note);
        let n = torch_note(TorchChoice::User, None, Some("max_split_size_mb:128"), None);
        assert!(n.caches_above);
        assert!(
            n.note
                .contains("PYTORCH_CUDA_ALLOC_CONF set in the environment"),
            "{}",
            n.note
        );
        assert!(
            n.note
                .contains("PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync"),
            "{}",
            n.note
        );
        let n = torch_note(TorchChoice::User, None, None, Some("1"));
        assert!(n.note.contains("read 0"), "{}", n.note);
        // The pool chose at load, then the program set its own value before PyTorch loaded
        // (`os.environ[...]` at a script's top): the setting PyTorch read is the program's.
        for (alloc, cuda) in [
            (None, Some("expandable_segments:True")),
            (Some("backend:cudaMallocAsync"), Some(POOLED_SETTING)),
            (Some("backend:native"), Some(POOLED_SETTING)),
        ] {
            let n = torch_note(TorchChoice::SetByPool, alloc, cuda, None);
            assert!(
                n.note.contains("set in the environment") && !n.note.contains("by the pool"),
                "{alloc:?} {cuda:?}: {}",
                n.note
            );
        }
        // The pool set its variable at load, and the program removed it: nothing is set.
        for choice in [TorchChoice::SetByPool, TorchChoice::Unknown] {
            let n = torch_note(choice, None, None, None);
            assert!(n.caches_above, "{}", n.note);
            assert!(
                n.note.contains("none of") && !n.note.contains("set in the environment"),
                "{}",
                n.note
            );
        }
        let n = torch_note(TorchChoice::TooLate, None, None, None);
        assert!(n.caches_above && n.note.contains("preload"), "{}", n.note);

        assert!(jax_note(None, None, true).caches_above);
        assert!(jax_note(Some("false"), None, true).note.contains("delays"));
        // XLA's own allocator puts each buffer in a driver allocation: pooled with the driver
        // hooks on, and the line says which.
        let platform = jax_note(None, Some("platform"), true);
        assert!(!platform.caches_above);
        assert!(
            platform.note.contains("the pool serves"),
            "{}",
            platform.note
        );
        let off = jax_note(None, Some("platform"), false);
        assert!(off.note.contains("GPUPOOL_DRIVER_HOOKS=0"), "{}", off.note);
        assert!(!off.note.contains("the pool serves"), "{}", off.note);
        let remedy = jax_note(None, None, true).note;
        assert!(remedy.ends_with("which the pool serves"), "{remedy}");
        let remedy = jax_note(None, None, false).note;
        assert!(remedy.contains("driver hooks on"), "{remedy}");
        // XLA's `cuda_async` allocator is no BFC allocator, but caches all the same.
        let pool = jax_note(None, Some("cuda_async"), true);
        assert!(
            pool.caches_above && pool.note.contains("CUDA memory pool"),
            "{}",
            pool.note
        );
        assert!(!pool.note.contains("BFC"), "{}", pool.note);
    }

    #[test]
    fn the_loaded_objects_include_libc() {
        assert!(loaded_objects().iter().any(|o| o.contains("libc.so")));
    }
}
