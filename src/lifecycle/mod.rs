//! The process's life as the library sees it, above the state (`global`) and the reports: at
//! load (the constructor: libc-level work only), the first allocation (the exit hook, the
//! live-dump thread), and exit.

mod dump_thread;

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use crate::config::Config;
use crate::passed_through::{self, Reason};
use crate::{global, log, report};

static FIRST_ALLOCATION: AtomicBool = AtomicBool::new(false);
static OWNER_PID: AtomicI32 = AtomicI32::new(0);

/// Called after every allocation the pool served or passed through to CUDA, and every request
/// it answered out of memory; the first one arms the exit summary (for this process: a forked child inherits the flag, not the job).
#[inline]
pub fn note_allocation() {
    if !FIRST_ALLOCATION.load(Ordering::Relaxed) && !FIRST_ALLOCATION.swap(true, Ordering::AcqRel) {
        // SAFETY: getpid has no preconditions.
        OWNER_PID.store(unsafe { libc::getpid() }, Ordering::Relaxed);
        if let Some(p) = global::existing_process() {
            dump_thread::start(p);
        }
    }
}

/// CUDA's answer `status` to an allocation of `bytes` the pool left to it for `reason`: counted
/// when it succeeded, and then an allocation like a served one (a program whose every
/// allocation passed through writes its summary, which says where they went).
pub fn note_passed_through(reason: Reason, bytes: usize, status: i32) -> i32 {
    if passed_through::counted(reason, bytes, status) == 0 {
        note_allocation();
    }
    status
}

/// The pid that read `GPUPOOL_SUMMARY=always:...` (a summary even if the pool never runs); 0
/// when it was not asked.
static ALWAYS_PID: AtomicI32 = AtomicI32::new(0);

/// At load: note which files fd 1 and fd 2 are (the pool writes there only while they still
/// are the program's streams), the time (`always:` never replaces a newer summary), and whether
/// `always:` is asked. libc-level work only (fstat, clock_gettime, getenv), as a library
/// constructor must. (Not under Miri, which cannot call a constructor of the type the `ctor`
/// crate registers; `scripts/sanitize.sh` runs the pool's tests there.)
#[cfg_attr(not(miri), ctor::ctor)]
#[cfg_attr(miri, allow(dead_code))]
fn at_load() {
    log::note_streams_at_load();
    crate::load_time::note_now();
    crate::frameworks::choose_at_load();
    if crate::config::secure() {
        // `GPUPOOL_SUMMARY` names a file: ignored in secure mode (`config::NAMING_FILES`).
        return;
    }
    // SAFETY: getenv with a NUL-terminated name; the result is only read, before any thread
    // of the program could change the environment.
    let v = unsafe { libc::getenv(c"GPUPOOL_SUMMARY".as_ptr()) };
    // SAFETY: a non-NULL getenv result is a NUL-terminated string.
    let value = (!v.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(v) }.to_bytes());
    let after_always = value.and_then(crate::config::strip_always);
    let always = after_always.is_some();
    let dest = after_always.or(value).map(<[u8]>::trim_ascii);
    if let Some(fd) = dest.and_then(crate::config::descriptor_named_by) {
        log::note_summary_descriptor_at_load(fd);
    }
    if always {
        // SAFETY: getpid has no preconditions.
        ALWAYS_PID.store(unsafe { libc::getpid() }, Ordering::Relaxed);
    }
}

/// The exit hook, a destructor of this library. `exit` runs library destructors from one exit
/// handler glibc registers before `main`, so after every handler registered since: the
/// destructors of the program's C++ static objects, and of those in libraries loaded with
/// `dlopen`, which may free device memory. An `atexit` handler registered at the first
/// allocation ran before the destructors of objects made earlier.
#[cfg(not(miri))]
#[used]
#[link_section = ".fini_array"]
static EXIT_HOOK: extern "C" fn() = at_exit;

/// The exit summary of a process that allocated through the hooks; else, with `always:`, the
/// summary that says the pool never ran. Nothing in a process that did neither.
#[cfg_attr(miri, allow(dead_code))]
extern "C" fn at_exit() {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    if FIRST_ALLOCATION.load(Ordering::Acquire) {
        // A forked child runs this destructor too, but the job of reporting stays the parent's.
        if pid != OWNER_PID.load(Ordering::Relaxed) {
            return;
        }
        crate::guard::boundary((), || {
            if let Some(p) = global::existing_process() {
                if let Some(pool) = p.pool() {
                    pool.flush_trace();
                }
                report::write_exit_summary(&p.report_source());
            }
        });
    } else if pid == ALWAYS_PID.load(Ordering::Relaxed) {
        crate::guard::boundary((), || match global::existing_process() {
            Some(p) => report::write_exit_summary(&p.report_source()),
            None => {
                let (config, _) = Config::from_env();
                report::write_not_intercepted(&config.summary);
            }
        });
    }
}
