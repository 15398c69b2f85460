//! The process-wide state, made on the first CUDA call that reaches a hook (never at load time:
//! a process that does not use CUDA pays nothing and prints nothing).

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::OnceLock;

use crate::config::{Config, ReuseMode};
use crate::cuda::backend::CudaBackend;
use crate::cuda::loader;
use crate::cuda::runtime::Runtime;
use crate::cuda::types::{CudaStatus, ERROR_INSUFFICIENT_DRIVER};
use crate::log;
use crate::pool::{Policy, Pool, Settings};
use crate::report;

pub struct Global {
    pub runtime: Runtime,
    pub runtime_path: String,
    /// `None` when `GPUPOOL_DISABLE=1`: every call passes through.
    pub pool: Option<Pool<CudaBackend>>,
    pub config: Config,
}

static GLOBAL: OnceLock<Result<Global, String>> = OnceLock::new();

/// The state, made on first use; `None` when no runtime could be found.
pub fn get() -> Option<&'static Global> {
    GLOBAL.get_or_init(init).as_ref().ok()
}

/// The state if it was made already (for exit and reports).
pub fn existing() -> Option<&'static Global> {
    GLOBAL.get()?.as_ref().ok()
}

fn init() -> Result<Global, String> {
    let (config, warnings) = Config::from_env();
    for w in &warnings {
        log::warn(w);
    }
    let located = loader::locate().map_err(|why| {
        log::warn(&format!(
            "cannot find the CUDA runtime: {why}; CUDA calls fail with cudaErrorInsufficientDriver"
        ));
        why
    })?;
    let pool = (!config.disable).then(|| {
        Pool::new(
            CudaBackend::new(located.runtime),
            Settings {
                reuse: config.reuse,
                threshold: config.release_threshold,
                policy: Policy {
                    max_split_size: config.max_split_size,
                    fence_bytes: config.fence_bytes,
                },
                trace: open_trace(&config),
            },
        )
    });
    let runtime = located.runtime;
    let runtime_path = located.path.clone();
    // The library handle stays open for the life of the process.
    std::mem::forget(located);
    Ok(Global {
        runtime,
        runtime_path,
        pool,
        config,
    })
}

/// The trace file `GPUPOOL_TRACE` names, if it can be created (else one warning line).
fn open_trace(config: &Config) -> Option<std::sync::Arc<dyn crate::pool::TraceSink>> {
    let template = config.trace.as_ref()?;
    let path = report::expand_path(template);
    match report::trace_file::TraceFile::create(&path) {
        Ok(f) => Some(std::sync::Arc::new(f)),
        Err(e) => {
            log::warn(&format!(
                "cannot write the trace to {}: {e}; tracing is off",
                String::from_utf8_lossy(&path)
            ));
            None
        }
    }
}

/// What a hook returns when there is no runtime to call.
pub fn missing_runtime() -> CudaStatus {
    ERROR_INSUFFICIENT_DRIVER
}

/// The pool, when it is on.
pub fn pool() -> Option<(&'static Global, &'static Pool<CudaBackend>)> {
    let g = get()?;
    g.pool.as_ref().map(|p| (g, p))
}

impl Global {
    pub fn reuse(&self) -> ReuseMode {
        self.config.reuse
    }
}

static FIRST_ALLOCATION: AtomicBool = AtomicBool::new(false);
static OWNER_PID: AtomicI32 = AtomicI32::new(0);

/// Called after every allocation the pool served; the first one arms the exit summary.
#[inline]
pub fn note_allocation() {
    if !FIRST_ALLOCATION.load(Ordering::Relaxed) && !FIRST_ALLOCATION.swap(true, Ordering::AcqRel) {
        // SAFETY: getpid has no preconditions.
        OWNER_PID.store(unsafe { libc::getpid() }, Ordering::Relaxed);
        // SAFETY: registering a plain extern "C" function with atexit.
        unsafe { libc::atexit(at_exit) };
        if let Some(g) = existing() {
            report::dump::start(g);
        }
    }
}

/// The pid that registered the `always:` exit hook.
static ALWAYS_PID: AtomicI32 = AtomicI32::new(0);

/// At load: only when `GPUPOOL_SUMMARY=always:...` asks for a summary even if the pool never
/// runs, register the exit hook that writes it. libc-level work only (getenv, atexit), as a
/// library constructor must.
#[ctor::ctor]
fn register_always_summary() {
    // SAFETY: getenv with a NUL-terminated name; the result is only read, before any thread
    // of the program could change the environment.
    let v = unsafe { libc::getenv(c"GPUPOOL_SUMMARY".as_ptr()) };
    // SAFETY: a non-NULL getenv result is a NUL-terminated string.
    if !v.is_null()
        && unsafe { std::ffi::CStr::from_ptr(v) }
            .to_bytes()
            .starts_with(b"always:")
    {
        // SAFETY: getpid has no preconditions; atexit takes a plain extern "C" function.
        unsafe {
            ALWAYS_PID.store(libc::getpid(), Ordering::Relaxed);
            libc::atexit(at_exit_always);
        }
    }
}

extern "C" fn at_exit_always() {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    // The pool's own exit hook reports a process that allocated through it.
    if pid != ALWAYS_PID.load(Ordering::Relaxed) || FIRST_ALLOCATION.load(Ordering::Acquire) {
        return;
    }
    crate::guard::boundary((), || match existing() {
        Some(g) => report::write_exit_summary(g),
        None => {
            let (config, _) = Config::from_env();
            report::write_not_intercepted(&config.summary);
        }
    });
}

extern "C" fn at_exit() {
    // A forked child inherits the registration but not the job of reporting.
    // SAFETY: getpid has no preconditions.
    if unsafe { libc::getpid() } != OWNER_PID.load(Ordering::Relaxed) {
        return;
    }
    crate::guard::boundary((), || {
        if let Some(g) = existing() {
            if let Some(pool) = g.pool.as_ref() {
                pool.flush_trace();
            }
            report::write_exit_summary(g);
        }
    });
}
