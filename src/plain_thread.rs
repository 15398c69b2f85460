//! Threads the library starts with `pthread_create` itself, not `std::thread`: Rust's spawn
//! looks up `__pthread_get_minstack` with `dlsym` on the spawning thread at its first use,
//! which would throw away an error the program has yet to read with `dlerror()` (glibc starts
//! every `dl*` call by clearing the calling thread's error). Also `run_aside`: work that calls
//! `dlopen` or `dlsym` done on a thread of its own, whose error state is its own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

type Job = Box<dyn FnOnce() + Send>;

/// The threads' stack, as `std::thread` gives its threads: the default would be the program's
/// `RLIMIT_STACK`, which a program run under a small `ulimit -s` makes too small for a report.
const STACK: usize = 2 << 20;

/// Starts `f` on a detached thread named `name` (at most 15 bytes) that takes none of the
/// program's signals but the faults it could raise itself: a program that blocks a signal in
/// its threads to `sigwait` for it must not lose it to this one. Returns whether it started.
pub fn spawn(name: &'static std::ffi::CStr, f: impl FnOnce() + Send + 'static) -> bool {
    extern "C" fn start(arg: *mut libc::c_void) -> *mut libc::c_void {
        // SAFETY: `arg` is the `Box<Job>` leaked by `spawn` for this thread alone.
        let job = unsafe { Box::from_raw(arg as *mut Job) };
        crate::guard::boundary((), job);
        std::ptr::null_mut()
    }
    let job: *mut Job = Box::into_raw(Box::new(Box::new(f)));
    // SAFETY: signal sets on the stack, valid for the calls; the mask is the calling thread's
    // own, restored below.
    let saved = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        for sig in [
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGFPE,
            libc::SIGILL,
            libc::SIGTRAP,
            libc::SIGSYS,
        ] {
            libc::sigdelset(&mut all, sig);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        old
    };
    let mut thread: libc::pthread_t = 0;
    // SAFETY: `attr` is initialized before use and destroyed after; `start` takes the job's
    // ownership (the new thread inherits the mask just set). A stack size the system refuses
    // leaves its default.
    let r = unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        let made = libc::pthread_attr_init(&mut attr) == 0;
        if made {
            libc::pthread_attr_setstacksize(&mut attr, STACK);
        }
        let with: *const libc::pthread_attr_t = if made { &attr } else { std::ptr::null() };
        let r = libc::pthread_create(&mut thread, with, start, job.cast());
        if made {
            libc::pthread_attr_destroy(&mut attr);
        }
        r
    };
    // SAFETY: the calling thread's own mask, saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &saved, std::ptr::null_mut()) };
    if r != 0 {
        // SAFETY: no thread took the job.
        drop(unsafe { Box::from_raw(job) });
        return false;
    }
    // SAFETY: a thread just created, named and detached once; a failed naming is harmless.
    unsafe {
        libc::pthread_setname_np(thread, name.as_ptr());
        libc::pthread_detach(thread);
    }
    true
}

/// How long `run_aside` waits. The thread needs the dynamic linker's lock, which the calling
/// thread holds inside a library's constructor during `dlopen`: there it never finishes first.
const ASIDE_WAIT: Duration = Duration::from_millis(200);

/// Threads `run_aside` stopped waiting for that have not finished. While one is left, the next
/// `run_aside` does not start another: it would wait the same 200 ms for the same lock (a
/// constructor's driver calls look up the driver, then the functions behind the hooks).
static ABANDONED: AtomicUsize = AtomicUsize::new(0);

/// In a forked child (an atomic store, async-signal-safe): the parent's abandoned threads are
/// not in it.
pub fn forget_abandoned() {
    ABANDONED.store(0, Ordering::Relaxed);
}

/// Where a `run_aside` thread stands, as its caller and the thread see it.
#[derive(PartialEq)]
enum Aside {
    Running,
    Finished,
    /// The caller stopped waiting; counted in `ABANDONED` until the thread finishes.
    Abandoned,
}

/// Runs `f` on a thread of its own and waits for it. Returns false when no thread could start,
/// it did not finish within `ASIDE_WAIT` (it then finishes later, alone), or an earlier one has
/// yet to finish: the caller does the work itself. `f` must tolerate running twice at once.
pub fn run_aside(name: &'static std::ffi::CStr, f: fn()) -> bool {
    if ABANDONED.load(Ordering::Acquire) != 0 {
        return false;
    }
    let state = Arc::new((Mutex::new(Aside::Running), Condvar::new()));
    let theirs = Arc::clone(&state);
    let started = spawn(name, move || {
        crate::guard::boundary((), f);
        let (state, woken) = &*theirs;
        let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
        if *state == Aside::Abandoned {
            ABANDONED.fetch_sub(1, Ordering::AcqRel);
        }
        *state = Aside::Finished;
        woken.notify_one();
    });
    if !started {
        return false;
    }
    let (state, woken) = &*state;
    let guard = state.lock().unwrap_or_else(|e| e.into_inner());
    let (mut guard, _) = woken
        .wait_timeout_while(guard, ASIDE_WAIT, |s| *s == Aside::Running)
        .unwrap_or_else(|e| e.into_inner());
    if *guard == Aside::Running {
        // Under the state's lock, so the thread's decrement comes after this increment.
        ABANDONED.fetch_add(1, Ordering::AcqRel);
        *guard = Aside::Abandoned;
        return false;
    }
    true
}
