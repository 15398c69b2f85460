//! Messages to stderr, written with one `write(2)` each so lines never interleave, and only from
//! processes that used CUDA (every caller is on a CUDA path). Every write the pool makes to a
//! descriptor goes through `write_all_fd`, which never raises `SIGPIPE` in the program.
//!
//! fd 1 and fd 2 are written only while they are still the program's stdout and stderr: a
//! daemon that closed fd 2 and opened a data file (which became fd 2) gets no line in its data.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8, Ordering};

use crate::pool::cancel::uncancellable;

/// The program's standard output streams, as the pool writes to them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout = 1,
    Stderr = 2,
}

/// What a stream's descriptor was when the library was loaded.
struct AtLoad {
    state: AtomicU8,
    dev: AtomicU64,
    ino: AtomicU64,
}

/// Not recorded (no load-time constructor ran): the stream is written as it is.
const UNKNOWN: u8 = 0;
const CLOSED: u8 = 1;
const OPEN: u8 = 2;

static AT_LOAD: [AtLoad; 2] = [const {
    AtLoad {
        state: AtomicU8::new(UNKNOWN),
        dev: AtomicU64::new(0),
        ino: AtomicU64::new(0),
    }
}; 2];

fn at_load(s: Stream) -> &'static AtLoad {
    &AT_LOAD[s as usize - 1]
}

/// The summary's own descriptor (`GPUPOOL_SUMMARY=/dev/fd/N`), -1 for none, and what it was
/// when the library was loaded.
static SUMMARY_FD: AtomicI32 = AtomicI32::new(-1);
static SUMMARY_AT_LOAD: AtLoad = AtLoad {
    state: AtomicU8::new(UNKNOWN),
    dev: AtomicU64::new(0),
    ino: AtomicU64::new(0),
};

impl AtLoad {
    /// Note which file `fd` is now.
    fn note(&self, fd: i32) {
        match identity(fd) {
            Some((dev, ino, _)) => {
                self.dev.store(dev, Ordering::Relaxed);
                self.ino.store(ino, Ordering::Relaxed);
                self.state.store(OPEN, Ordering::Release);
            }
            None => self.state.store(CLOSED, Ordering::Release),
        }
    }

    /// Whether `fd` is open on the file it was open on at load (any pipe, with `any_pipe`);
    /// true where nothing was noted.
    fn still(&self, fd: i32, any_pipe: bool) -> bool {
        let Some((dev, ino, pipe)) = identity(fd) else {
            return false;
        };
        match self.state.load(Ordering::Acquire) {
            UNKNOWN => true,
            OPEN => {
                let same = (dev, ino)
                    == (
                        self.dev.load(Ordering::Relaxed),
                        self.ino.load(Ordering::Relaxed),
                    );
                same || (any_pipe && pipe)
            }
            _ => false,
        }
    }
}

/// The file open at `fd`: (device, inode, is a pipe), or `None` when `fd` is closed.
fn identity(fd: i32) -> Option<(u64, u64, bool)> {
    // SAFETY: fstat writes into the zeroed stat buffer on the stack.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::fstat(fd, &mut st) == 0).then_some((
            st.st_dev as u64,
            st.st_ino as u64,
            st.st_mode & libc::S_IFMT == libc::S_IFIFO,
        ))
    }
}

/// At load (a library constructor: libc-level work only): note which files fd 1 and fd 2 are.
/// Nothing is kept open: a `dup` would keep a pipe or terminal alive after the program closed
/// it.
pub fn note_streams_at_load() {
    for s in [Stream::Stdout, Stream::Stderr] {
        at_load(s).note(s as i32);
    }
}

/// At load, likewise: note which file `fd`, the summary's descriptor, is.
pub fn note_summary_descriptor_at_load(fd: i32) {
    SUMMARY_AT_LOAD.note(fd);
    SUMMARY_FD.store(fd, Ordering::Release);
}

/// Whether `s`'s descriptor is still the program's stream: the same file as at load, or a pipe
/// put there since (a framework capturing the output of C code, as Jupyter does). Not when it
/// is closed, was closed at load, or is now another file, socket or device: one the program
/// opened itself after closing the descriptor.
fn still_the_stream(s: Stream) -> bool {
    at_load(s).still(s as i32, true)
}

/// Write the summary to descriptor `fd`, only while it is the file it was at load: a program
/// that closed it may have opened a file of its own there since. A descriptor not noted at
/// load (the variable was set later) is written as it is.
pub fn write_summary_descriptor(fd: i32, bytes: &[u8]) -> std::io::Result<()> {
    let usable = if SUMMARY_FD.load(Ordering::Acquire) == fd {
        SUMMARY_AT_LOAD.still(fd, false)
    } else {
        identity(fd).is_some()
    };
    if !usable {
        return Err(std::io::Error::other(
            "the descriptor is closed, or no longer the file it was when the program started",
        ));
    }
    write_all_fd(fd, bytes)
}

/// Write to the program's stdout or stderr, if `s` still is that stream; errors are dropped.
pub fn write_stream(s: Stream, bytes: &[u8]) {
    if still_the_stream(s) {
        let _ = write_all_fd(s as i32, bytes);
    }
}

/// Write raw bytes to a file descriptor, retrying short writes and interruptions. A reader that
/// left (`./job 2>&1 | head -1`) makes it fail with `EPIPE`, without the `SIGPIPE` that would
/// end the program, and no `pthread_cancel` acts inside it. Async-signal-safe: no allocation,
/// no lock (glibc's cancel state is an atomic of the thread), `errno` left as the write set it.
pub fn write_all_fd(fd: i32, bytes: &[u8]) -> std::io::Result<()> {
    uncancellable(|| without_sigpipe(|| write_loop(fd, bytes)))
}

/// How long one write waits in all for a non-blocking pipe's reader to make room (a named pipe
/// the summary is opened on without waiting, a stderr another process made non-blocking)
/// before it gives up: a slow collector gets the whole summary, a stalled one cannot keep the
/// program from exiting.
const ROOM_WAIT_MS: i64 = 5000;

/// Milliseconds on the monotonic clock (async-signal-safe).
fn monotonic_ms() -> i64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid out-parameter.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec * 1000 + t.tv_nsec / 1_000_000
}

fn write_loop(fd: i32, mut bytes: &[u8]) -> std::io::Result<()> {
    let mut deadline = None;
    while !bytes.is_empty() {
        // SAFETY: the pointer and length describe a live slice.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            match e.kind() {
                std::io::ErrorKind::Interrupted => continue,
                std::io::ErrorKind::WouldBlock => {
                    let now = monotonic_ms();
                    let left = *deadline.get_or_insert(now + ROOM_WAIT_MS) - now;
                    if left > 0 && room_within(fd, left as libc::c_int) {
                        continue;
                    }
                    return Err(e);
                }
                _ => return Err(e),
            }
        }
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        bytes = &bytes[n as usize..];
    }
    Ok(())
}

/// Whether non-blocking `fd` can take more bytes within `ms` milliseconds. `errno` is left as
/// the write that found it full set it, for the caller's error. Async-signal-safe (`poll`).
fn room_within(fd: i32, ms: libc::c_int) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: errno is thread-local; `p` is one valid pollfd.
    unsafe {
        let errno = *libc::__errno_location();
        let ready = loop {
            match libc::poll(&mut p, 1, ms) {
                -1 if *libc::__errno_location() == libc::EINTR => continue,
                n => break n,
            }
        };
        *libc::__errno_location() = errno;
        // A reader that left shows as POLLERR: the next write fails with EPIPE.
        ready > 0 && p.revents & (libc::POLLOUT | libc::POLLERR | libc::POLLHUP) != 0
    }
}

/// Run `write` with `SIGPIPE` blocked in this thread, and take back the one signal its `EPIPE`
/// raised. The signal is thread-directed, so blocking it here is enough; the program's
/// disposition is never touched. A `SIGPIPE` already pending before is the program's: it stays.
fn without_sigpipe(write: impl FnOnce() -> std::io::Result<()>) -> std::io::Result<()> {
    // SAFETY: signal sets on the stack, valid for each call; sigpending, pthread_sigmask and
    // sigtimedwait are plain system calls, safe in a signal handler too. errno is thread-local.
    unsafe {
        let mut pipe: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut pipe);
        libc::sigaddset(&mut pipe, libc::SIGPIPE);
        let mut pending: libc::sigset_t = std::mem::zeroed();
        let was_pending =
            libc::sigpending(&mut pending) == 0 && libc::sigismember(&pending, libc::SIGPIPE) == 1;
        let mut old: libc::sigset_t = std::mem::zeroed();
        let blocked = libc::pthread_sigmask(libc::SIG_BLOCK, &pipe, &mut old) == 0;
        let result = write();
        if blocked {
            let errno = *libc::__errno_location();
            let broke = matches!(&result, Err(e) if e.raw_os_error() == Some(libc::EPIPE));
            if broke && !was_pending {
                let now = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                while libc::sigtimedwait(&pipe, std::ptr::null_mut(), &now) < 0
                    && *libc::__errno_location() == libc::EINTR
                {}
            }
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            *libc::__errno_location() = errno;
        }
        result
    }
}

/// One line `gpupool: MSG` on stderr.
pub fn warn(msg: &str) {
    let line = format!("gpupool: {msg}\n");
    write_stream(Stream::Stderr, line.as_bytes());
}

/// `warn`, at most once per `flag`.
pub fn warn_once(flag: &AtomicBool, msg: impl FnOnce() -> String) {
    if !flag.swap(true, Ordering::Relaxed) {
        warn(&msg());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SIGPIPE is pending for this thread (it blocks it).
    fn sigpipe_pending() -> bool {
        // SAFETY: a signal set on the stack.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            assert_eq!(libc::sigpending(&mut set), 0);
            libc::sigismember(&set, libc::SIGPIPE) == 1
        }
    }

    /// This thread's signal mask: whether SIGPIPE is blocked.
    fn sigpipe_blocked() -> bool {
        // SAFETY: a signal set on the stack; a NULL new mask only reads the current one.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut set);
            libc::sigismember(&set, libc::SIGPIPE) == 1
        }
    }

    /// A pipe whose reader is closed: its write end.
    fn broken_pipe() -> i32 {
        let mut fds = [-1; 2];
        // SAFETY: room for two descriptors; the reader is closed at once.
        unsafe {
            assert_eq!(libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC), 0);
            libc::close(fds[0]);
        }
        fds[1]
    }

    #[test]
    fn a_write_to_a_broken_pipe_fails_with_epipe_and_leaves_no_sigpipe() {
        // On a thread of its own: the test changes its signal mask.
        std::thread::spawn(|| {
            let fd = broken_pipe();
            let e = write_all_fd(fd, b"lost\n").unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EPIPE));
            // SAFETY: errno is thread-local.
            assert_eq!(unsafe { *libc::__errno_location() }, libc::EPIPE);
            assert!(!sigpipe_blocked(), "the mask was not restored");
            // With SIGPIPE blocked by the thread (a pending one would then show): none raised.
            // SAFETY: a signal set on the stack.
            unsafe {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, libc::SIGPIPE);
                libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            }
            write_all_fd(fd, b"lost\n").unwrap_err();
            assert!(!sigpipe_pending(), "the write left a SIGPIPE pending");
            assert!(sigpipe_blocked(), "the thread's own mask was not kept");
            // A SIGPIPE the program had pending already stays pending.
            // SAFETY: signalling this thread, which blocks the signal.
            let sent = unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGPIPE) };
            assert_eq!(sent, 0);
            assert!(sigpipe_pending());
            write_all_fd(fd, b"lost\n").unwrap_err();
            assert!(sigpipe_pending(), "the program's own SIGPIPE was taken");
            // SAFETY: taking the pending signal back, then closing our descriptor.
            unsafe {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, libc::SIGPIPE);
                let mut sig = 0;
                assert_eq!(libc::sigwait(&set, &mut sig), 0);
                libc::close(fd);
            }
        })
        .join()
        .unwrap();
    }
}
