//! The process-wide state, made on the first CUDA call that reaches a hook (never at load time:
//! a process that does not use CUDA pays nothing and prints nothing).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Mutex, Once, OnceLock};

use crate::config::{Config, ReuseMode};
use crate::cuda::backend::CudaBackend;
use crate::cuda::loader;
use crate::cuda::runtime::Runtime;
use crate::cuda::types::{CudaStatus, ERROR_INSUFFICIENT_DRIVER};
use crate::log;
use crate::pool::cancel::uncancellable;
use crate::pool::{Policy, Pool, Settings};
use crate::report;

/// The process's pool and settings, made on the first CUDA call through either API (the
/// runtime's hooks, the driver's, the C API). Needs no runtime: a program that uses only the
/// driver is pooled on segments from the driver.
pub struct Process {
    /// `None` when `GPUPOOL_DISABLE=1`: every call passes through. Read it through `pool()`,
    /// which also answers `None` in a forked child.
    pool: Option<Pool<CudaBackend>>,
    pub config: Config,
}

/// The runtime's side of the state: the application's runtime, found on the first call of a
/// runtime hook, and the process's pool.
pub struct Global {
    pub runtime: Runtime,
    pub runtime_path: String,
    process: &'static Process,
    /// `process`'s pool, one load away for the hit path (`with_pool`), which reads it only
    /// while `WITH_POOL` points here: never in a forked child.
    hit_pool: Option<&'static Pool<CudaBackend>>,
    pub config: &'static Config,
}

static PROCESS: OnceLock<Process> = OnceLock::new();
/// A forked child's own `Process` when the parent was still making `PROCESS` (see `CHILD_GLOBAL`).
static CHILD_PROCESS: OnceLock<Process> = OnceLock::new();
/// `process()` once made with a pool, for the driver's hit path: one load.
static PROCESS_WITH_POOL: AtomicPtr<Process> = AtomicPtr::new(std::ptr::null_mut());

static GLOBAL: OnceLock<Global> = OnceLock::new();
/// The dynamic linker's count of loaded objects (`dl::objects_added`) at the last attempt that
/// found no runtime: the runtime is looked for again only once the program has loaded something
/// since. A failure is not final: a Python program may call `gpupool_*` (through
/// `import gpupool`) before it imports the framework that loads its runtime, and that runtime
/// must then serve the framework's calls. Held only to read or write it, never while looking.
static FAILED_AT: Mutex<Option<u64>> = Mutex::new(None);
/// The one warning that no runtime was found.
static WARNED_MISSING: AtomicBool = AtomicBool::new(false);
/// Set in a child made by `fork()` from a process whose pool existed (or was being made): the
/// child's copy of the pool is never used. Another thread of the parent may have held a device's
/// lock, or been in the middle of making the pool, at the moment of the fork; in the child that
/// thread does not exist, so the lock would stay taken forever. In the child every CUDA call
/// goes straight to the runtime, which gives it the runtime's own answer (a real CUDA runtime
/// does not support a child using its parent's context either).
static FORKED: AtomicBool = AtomicBool::new(false);
/// The state of a forked child whose parent had not made `GLOBAL` when it forked (still making
/// it, or found no runtime yet): `FAILED_AT` or `PROCESS`'s making may stay held forever in the
/// child by a thread it does not have, so the child makes its own, pool off, without them.
static CHILD_GLOBAL: OnceLock<Result<Global, String>> = OnceLock::new();

/// The state once it exists with a pool, for the hit path (`with_pool`): one load instead of
/// `get`'s checks and `Global::pool`'s. Null until then, without a pool, and in a forked child
/// (the fork handler clears it).
static WITH_POOL: AtomicPtr<Global> = AtomicPtr::new(std::ptr::null_mut());

/// `WITH_POOL` for runtime allocations (`allocating`), until the program makes a context of
/// its own (`cuCtxCreate`): from then on `OWN_CONTEXTS`, and each allocation asks which context
/// is current, off the hit path.
static ALLOCATING: AtomicPtr<Global> = AtomicPtr::new(std::ptr::null_mut());
/// `ALLOCATING` once the program made a context: an address no state has.
const OWN_CONTEXTS: *mut Global = std::ptr::dangling_mut();

/// The runtime's state, made on first use; `None` when no runtime could be found.
pub fn get() -> Option<&'static Global> {
    if FORKED.load(Ordering::Relaxed) {
        return forked_child();
    }
    let g = match GLOBAL.get() {
        Some(g) => g,
        None => make()?,
    };
    if g.process.pool.is_some() && WITH_POOL.load(Ordering::Relaxed).is_null() {
        let g = g as *const Global as *mut Global;
        WITH_POOL.store(g, Ordering::Release);
        // Fails once the program made a context: that stays.
        let _ = ALLOCATING.compare_exchange(
            std::ptr::null_mut(),
            g,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }
    Some(g)
}

thread_local! {
    /// How deep the calling thread is in `make` (no destructor: nothing registered at a
    /// thread's first use).
    static MAKING: Cell<u8> = const { Cell::new(0) };
}

/// Makes `GLOBAL`, unless the last attempt found no runtime and nothing was loaded since.
///
/// No lock is held while the runtime is looked for: the search calls `dlsym`, `dladdr` and
/// `dlopen`, which take the dynamic linker's lock, and a thread inside `dlopen` holds that lock
/// while its library's constructor calls CUDA and comes here (docs/design-notes.md, "Note: the
/// loader lock"). Threads that come at once each look; the first state made is kept, the
/// others' handles stay open (the runtime stays loaded anyway).
///
/// A runtime being opened calls CUDA by name from its constructor, and the dynamic linker sends
/// that call to the pool's hook: the thread comes back here while it looks. The search runs once
/// more inside it, and finds that runtime loaded by now, so the call is served; a further
/// re-entry gets `None` (the hook's error).
#[cold]
fn make() -> Option<&'static Global> {
    let depth = MAKING.with(|m| m.get());
    if depth >= 2 {
        return None;
    }
    // Read before looking: a runtime loaded while the search runs is looked for next time.
    let added = crate::cuda::dl::objects_added();
    if depth == 0 && *failed_at() == Some(added) {
        return None;
    }
    MAKING.with(|m| m.set(depth + 1));
    // Loading the runtime, reading files: cancellation points, on the program's thread.
    let made = uncancellable(|| init(depth == 0));
    MAKING.with(|m| m.set(depth));
    match made {
        Ok(g) => Some(GLOBAL.get_or_init(|| {
            // Before the state is published: a thread that finds it may grow a segment at once,
            // and the pool's own calls need the runtime by then.
            crate::cuda::backend::runtime_found(g.runtime);
            g
        })),
        Err(_) => {
            if depth == 0 {
                *failed_at() = Some(added);
            }
            GLOBAL.get()
        }
    }
}

fn failed_at() -> std::sync::MutexGuard<'static, Option<u64>> {
    FAILED_AT.lock().unwrap_or_else(|e| e.into_inner())
}

/// `get`, with `Global::pool`: the state and its pool when it is on.
#[inline(always)]
pub fn with_pool() -> Option<(&'static Global, Option<&'static Pool<CudaBackend>>)> {
    let g = WITH_POOL.load(Ordering::Acquire);
    if g.is_null() {
        return with_pool_slow();
    }
    // SAFETY: `WITH_POOL` only ever points at the state inside `GLOBAL`, which is never dropped
    // nor moved once made.
    let g = unsafe { &*g };
    Some((g, g.hit_pool))
}

/// `with_pool`'s fast way alone: `None` until the state is made with its pool, and in a
/// forked child; the caller then takes `with_pool`, out of line.
#[inline(always)]
pub fn with_pool_made() -> Option<(&'static Global, Option<&'static Pool<CudaBackend>>)> {
    let g = WITH_POOL.load(Ordering::Acquire);
    if g.is_null() {
        return None;
    }
    // SAFETY: as in `with_pool`.
    let g = unsafe { &*g };
    Some((g, g.hit_pool))
}

/// `with_pool` for a runtime allocation: `None` until the state is made, in a forked child,
/// and once the program made a context of its own (`program_made_a_context`). The caller then
/// takes `with_pool` and asks which context is current.
#[inline(always)]
pub fn allocating() -> Option<(&'static Global, Option<&'static Pool<CudaBackend>>)> {
    let g = ALLOCATING.load(Ordering::Acquire);
    if g as usize <= OWN_CONTEXTS as usize {
        return None;
    }
    // SAFETY: `ALLOCATING` only ever points at the state inside `GLOBAL`, as `WITH_POOL`.
    let g = unsafe { &*g };
    Some((g, g.hit_pool))
}

/// The program made a context of its own: runtime allocations leave `allocating`'s way for good.
pub fn program_made_a_context() {
    ALLOCATING.store(OWN_CONTEXTS, Ordering::Release);
}

#[inline(never)]
fn with_pool_slow() -> Option<(&'static Global, Option<&'static Pool<CudaBackend>>)> {
    let g = get()?;
    Some((g, g.pool()))
}

/// The runtime's state if it was made already.
pub fn existing() -> Option<&'static Global> {
    if FORKED.load(Ordering::Relaxed) {
        if let Some(child) = CHILD_GLOBAL.get() {
            return child.as_ref().ok();
        }
    }
    GLOBAL.get()
}

/// The process's state, made on first use (by either API).
pub fn process() -> &'static Process {
    if FORKED.load(Ordering::Relaxed) {
        if let Some(p) = PROCESS.get() {
            return p;
        }
        return CHILD_PROCESS.get_or_init(|| Process {
            pool: None,
            config: Config::from_env().0,
        });
    }
    let p = PROCESS.get_or_init(|| uncancellable(make_process));
    if p.pool.is_some() && PROCESS_WITH_POOL.load(Ordering::Relaxed).is_null() {
        PROCESS_WITH_POOL.store(p as *const Process as *mut Process, Ordering::Release);
    }
    p
}

/// The pool when it is on, for the driver's hooks: one load once it exists.
#[inline(always)]
pub fn process_pool() -> Option<&'static Pool<CudaBackend>> {
    let p = PROCESS_WITH_POOL.load(Ordering::Acquire);
    if p.is_null() {
        return process().pool();
    }
    // SAFETY: `PROCESS_WITH_POOL` only ever points at the state inside `PROCESS`, never dropped
    // nor moved once made.
    unsafe { &*p }.pool.as_ref()
}

/// The process's state if it was made already (for exit and reports).
pub fn existing_process() -> Option<&'static Process> {
    if FORKED.load(Ordering::Relaxed) {
        return CHILD_PROCESS.get().or(PROCESS.get());
    }
    PROCESS.get()
}

/// `get()` in a forked child: the parent's state if it was complete (its pool is then never
/// used: see `Global::pool`), else a pass-through state of the child's own. Never takes the
/// parent's `FAILED_AT`.
fn forked_child() -> Option<&'static Global> {
    if let Some(g) = GLOBAL.get() {
        return Some(g);
    }
    CHILD_GLOBAL
        .get_or_init(|| {
            let process = process();
            let mut located = loader::locate()?;
            let g = Global {
                runtime: located.runtime,
                runtime_path: std::mem::take(&mut located.path),
                process,
                hit_pool: process.pool.as_ref(),
                config: &process.config,
            };
            std::mem::forget(located);
            Ok(g)
        })
        .as_ref()
        .ok()
}

/// `pthread_atfork`'s child handler: async-signal-safe (atomic stores only).
extern "C" fn after_fork_in_child() {
    FORKED.store(true, Ordering::Relaxed);
    WITH_POOL.store(std::ptr::null_mut(), Ordering::Relaxed);
    ALLOCATING.store(std::ptr::null_mut(), Ordering::Relaxed);
    PROCESS_WITH_POOL.store(std::ptr::null_mut(), Ordering::Relaxed);
    crate::plain_thread::forget_abandoned();
}

/// Register the fork handler, once, when the pool starts being made or a capture begins (not
/// at load time: a process that never calls CUDA registers nothing).
pub(crate) fn watch_forks() {
    static REGISTERED: Once = Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: registering a plain extern "C" function that only stores an atomic.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    });
}

/// Whether this process is a child forked after the pool was made (for tests and reports).
pub fn is_forked_child() -> bool {
    FORKED.load(Ordering::Relaxed)
}

fn make_process() -> Process {
    // First, so that a fork while the rest of this runs is seen by the child.
    watch_forks();
    crate::guard::quiet_panics();
    let (config, warnings) = Config::from_env();
    for w in &warnings {
        log::warn(w);
    }
    let pool = (!config.disable).then(|| {
        Pool::new(
            CudaBackend::new(),
            Settings {
                reuse: config.reuse,
                threshold: config.release_threshold,
                limit: config.limit,
                policy: Policy {
                    max_split_size: config.max_split_size,
                    fence_bytes: config.fence_bytes,
                    mapped_slack_permille: config.expandable_slack_permille,
                },
                trace: open_trace(&config),
                thread_cache: config.thread_cache,
                cache_contention: crate::pool::tcache::CONTENTION,
                expandable: config.expandable,
            },
        )
    });
    Process { pool, config }
}

/// Finds the runtime and makes the state; `warn` says why on stderr when none is found.
fn init(warn: bool) -> Result<Global, String> {
    let process = process();
    let mut located = loader::locate().inspect_err(|why| {
        if warn {
            log::warn_once(&WARNED_MISSING, || {
                format!(
                    "cannot find the CUDA runtime: {why}; CUDA calls fail with \
                     cudaErrorInsufficientDriver"
                )
            });
        }
    })?;
    let runtime = located.runtime;
    // Taken, not cloned: `located` is forgotten below, and a copy left in it would leak.
    let runtime_path = std::mem::take(&mut located.path);
    // The library handle stays open for the life of the process.
    std::mem::forget(located);
    Ok(Global {
        runtime,
        runtime_path,
        process,
        hit_pool: process.pool.as_ref(),
        config: &process.config,
    })
}

/// The trace file `GPUPOOL_TRACE` names, made at the pool's first chunk of records.
fn open_trace(config: &Config) -> Option<std::sync::Arc<dyn crate::pool::TraceSink>> {
    let template = config.trace.as_ref()?;
    let path = report::expand_path(template);
    Some(std::sync::Arc::new(report::trace_file::TraceFile::new(
        &path,
    )))
}

/// What a hook returns when there is no runtime to call.
pub fn missing_runtime() -> CudaStatus {
    ERROR_INSUFFICIENT_DRIVER
}

/// The pool, when it is on.
pub fn pool() -> Option<(&'static Global, &'static Pool<CudaBackend>)> {
    let g = get()?;
    g.pool().map(|p| (g, p))
}

impl Process {
    /// The pool, when it is on: not with `GPUPOOL_DISABLE=1`, and never in a forked child.
    #[inline]
    pub fn pool(&self) -> Option<&Pool<CudaBackend>> {
        if FORKED.load(Ordering::Relaxed) {
            return None;
        }
        self.pool.as_ref()
    }

    /// The CUDA library the pool's calls go to, for reports: the runtime when one was found,
    /// else the driver.
    pub fn cuda_path(&self) -> &str {
        if let Some(g) = existing() {
            return &g.runtime_path;
        }
        crate::cuda::driver::loaded_here().map_or("no CUDA library", |d| d.path.as_str())
    }

    /// What a report reads of this state.
    pub fn report_source(&self) -> report::Source<'_> {
        report::Source {
            pool: self.pool(),
            config: &self.config,
            runtime_path: self.cuda_path(),
        }
    }
}

impl Global {
    /// The pool, when it is on: not with `GPUPOOL_DISABLE=1`, and never in a forked child.
    #[inline]
    pub fn pool(&self) -> Option<&Pool<CudaBackend>> {
        self.process.pool()
    }

    pub fn reuse(&self) -> ReuseMode {
        self.config.reuse
    }

    /// What a report reads of this state.
    pub fn report_source(&self) -> report::Source<'_> {
        report::Source {
            pool: self.pool(),
            config: self.config,
            runtime_path: &self.runtime_path,
        }
    }
}
