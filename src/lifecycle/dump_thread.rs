//! The live dump's thread: `kill -USR1 PID` writes the current summary without stopping the
//! program, and `GPUPOOL_SUMMARY_INTERVAL` writes it periodically. The signal handler does only
//! async-signal-safe work (`getpid`, `write` of one byte to a pipe); a thread started with the
//! pool's first allocation reads the pipe and writes the summary.

use std::ffi::c_int;
use std::sync::atomic::{AtomicI32, Ordering};

use crate::global::Process;
use crate::{log, report};

/// The pipe's write end, for the handler.
static PIPE_WRITE: AtomicI32 = AtomicI32::new(-1);
/// The process that installed the handler: a forked child inherits it but not the thread.
static OWNER: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(_: c_int) {
    // SAFETY: errno is thread-local; saved and restored around the async-signal-safe calls.
    let saved = unsafe { *libc::__errno_location() };
    let fd = PIPE_WRITE.load(Ordering::Relaxed);
    // SAFETY: getpid, write, signal and raise are async-signal-safe; a full pipe (a dump
    // already pending) just drops the byte, since the pipe is non-blocking.
    unsafe {
        if libc::getpid() != OWNER.load(Ordering::Relaxed) {
            // A forked child, which has no dump thread: the program's own disposition was the
            // default (`install_handler` takes the signal only then), so the child takes the
            // signal as it would without the pool. Raised now, it is delivered once the handler
            // returns and the signal is unblocked: the default action ends the child.
            libc::signal(libc::SIGUSR1, libc::SIG_DFL);
            libc::raise(libc::SIGUSR1);
        } else if fd >= 0 {
            libc::write(fd, b"!".as_ptr().cast(), 1);
        }
        *libc::__errno_location() = saved;
    }
}

/// Install the `SIGUSR1` handler (unless the program handles the signal itself) and start the
/// dump thread when there is anything for it to do.
pub fn start(g: &'static Process) {
    let mut fds = [-1; 2];
    // SAFETY: `fds` has room for the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        log::warn("cannot create the live-dump pipe; SIGUSR1 dumps are off");
        return;
    }
    let handler = install_handler(fds[1]);
    let interval = g.config.summary_interval_ns;
    if !handler && interval.is_none() {
        // SAFETY: closing the descriptors just made, used by nothing.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        return;
    }
    let read_fd = fds[0];
    if !crate::plain_thread::spawn(c"gpupool-dump", move || run(g, read_fd, interval)) {
        // No thread would read the pipe: the signal goes back to the program (its default
        // action, as without the pool).
        if handler {
            uninstall_handler();
            // A handler already running on another thread may still write to the pipe: both
            // ends stay open (two descriptors, once), so that the byte lands in the pipe, not
            // in a file that reused the number, and raises no SIGPIPE.
        } else {
            // SAFETY: closing the descriptors just made; no handler knows them.
            unsafe {
                libc::close(fds[0]);
                libc::close(fds[1]);
            }
        }
        log::warn("cannot start the live-dump thread; SIGUSR1 and periodic dumps are off");
    }
}

/// Give `SIGUSR1` its default disposition back, if the handler is still the pool's.
fn uninstall_handler() {
    // SAFETY: reading the current disposition into a zeroed sigaction, then setting the default
    // one.
    unsafe {
        let mut now: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGUSR1, std::ptr::null(), &mut now) == 0
            && now.sa_sigaction == on_signal as extern "C" fn(c_int) as usize
        {
            libc::signal(libc::SIGUSR1, libc::SIG_DFL);
        }
    }
    PIPE_WRITE.store(-1, Ordering::Relaxed);
}

/// Install the handler if `SIGUSR1` has its default disposition (the program does not handle or
/// ignore it). Returns whether it did.
fn install_handler(write_fd: i32) -> bool {
    // SAFETY: reading the current disposition into a zeroed sigaction.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGUSR1, std::ptr::null(), &mut old) != 0
            || old.sa_sigaction != libc::SIG_DFL
        {
            return false;
        }
        PIPE_WRITE.store(write_fd, Ordering::Relaxed);
        OWNER.store(libc::getpid(), Ordering::Relaxed);
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as extern "C" fn(c_int) as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()) == 0
    }
}

fn run(g: &'static Process, read_fd: i32, interval_ns: Option<u64>) {
    let timeout_ms = interval_ns.map_or(-1, |ns| (ns / 1_000_000).min(i32::MAX as u64) as i32);
    loop {
        let mut pfd = libc::pollfd {
            fd: read_fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if n > 0 {
            // Several signals before this wake-up make one dump.
            let mut buf = [0u8; 64];
            // SAFETY: reading into a local buffer from our non-blocking pipe.
            while unsafe { libc::read(read_fd, buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
        }
        crate::guard::boundary((), || report::dump::dump(&g.report_source()));
    }
}
