//! The file `GPUPOOL_TRACE` names: the trace's magic, then the records the device pools hand
//! over in chunks. It is created with the first chunk, so a process that never allocated (one
//! that only asked the pool's API, a worker that only counted devices) writes no file and
//! leaves another process's trace alone.

use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use crate::log;
use crate::pool::cancel::uncancellable;
use crate::pool::trace::{MAGIC, RECORD_SIZE};
use crate::pool::TraceSink;

pub struct TraceFile {
    path: Vec<u8>,
    /// Serializes the devices' chunks; the file once the first chunk opened it.
    state: Mutex<State>,
    /// `state` is `Off`: read without the lock by the pool (`TraceSink::on`).
    off: AtomicBool,
}

enum State {
    /// No chunk yet.
    Unopened,
    Open(File),
    /// The file could not be made, or a write failed: tracing stopped.
    Off,
}

impl TraceFile {
    /// The trace for `path`, created at the first chunk (`open`).
    pub fn new(path: &[u8]) -> TraceFile {
        TraceFile {
            path: path.to_vec(),
            state: Mutex::new(State::Unopened),
            off: AtomicBool::new(false),
        }
    }

    fn shown_path(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.path)
    }
}

/// Create (or truncate) the regular file at `path`, with the trace's magic; a symbolic link
/// there is refused, not followed, and so is anything but a regular file: chunks are written
/// from inside the program's allocations, which a pipe without a reader (or a slow one) would
/// stall. A file another process is writing its trace to is refused too (an advisory lock,
/// held for the life of the file): truncated, it would lose that trace's start, and both
/// processes' records would interleave.
fn open(path: &[u8]) -> std::io::Result<File> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::AsRawFd;
    // Non-blocking: opening a FIFO for writing would otherwise wait for a reader.
    let file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(std::ffi::OsStr::from_bytes(path))?;
    // Checked before truncating: a device or FIFO is left as it is.
    if !file.metadata()?.file_type().is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    // SAFETY: flock on a descriptor `file` owns; it waits for nothing (LOCK_NB).
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        // A file system without locks (ENOLCK, EINVAL) cannot tell: the trace is written.
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::ResourceBusy,
                "another process is writing its trace there (put %p in the name)",
            ));
        }
    }
    file.set_len(0)?;
    (&file).write_all(MAGIC)?;
    Ok(file)
}

impl TraceSink for TraceFile {
    fn write(&self, bytes: &[u8]) {
        // From inside the program's allocations: opening, truncating and writing are
        // cancellation points.
        uncancellable(|| {
            let mut state = self.state.lock();
            if let State::Unopened = *state {
                *state = match open(&self.path) {
                    Ok(file) => State::Open(file),
                    Err(e) => {
                        log::warn(&format!(
                            "cannot write the trace to {}: {e}; tracing is off",
                            self.shown_path()
                        ));
                        self.off.store(true, Ordering::Relaxed);
                        State::Off
                    }
                };
            }
            let State::Open(file) = &*state else {
                return;
            };
            let Err(e) = (&*file).write_all(bytes) else {
                return;
            };
            // A chunk written in part (a full disk) would shift every later record: tracing
            // stops, and the file is cut back to its last whole record.
            if let Ok(meta) = file.metadata() {
                let body = meta.len().saturating_sub(MAGIC.len() as u64);
                let _ = file.set_len(MAGIC.len() as u64 + body - body % RECORD_SIZE as u64);
            }
            log::warn(&format!(
                "writing the trace to {} failed: {e}; tracing stopped (the file keeps the \
                 records written before)",
                self.shown_path()
            ));
            self.off.store(true, Ordering::Relaxed);
            *state = State::Off;
        })
    }

    fn on(&self) -> bool {
        !self.off.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;

    fn scratch(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("gpupool-trace-file-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d.join(name)
    }

    #[test]
    fn a_fifo_or_a_device_is_refused_without_blocking() {
        let fifo = scratch("fifo");
        let c = CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // No reader: the open fails at once (ENXIO) rather than waiting for one.
        assert!(open(fifo.to_str().unwrap().as_bytes()).is_err());
        std::fs::remove_file(&fifo).unwrap();
        let e = open(b"/dev/null").err().unwrap();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    }

    #[test]
    fn a_trace_another_writer_holds_is_left_whole() {
        let path = scratch("held.trace");
        let bytes = path.to_str().unwrap().as_bytes();
        let first = open(bytes).unwrap();
        (&first).write_all(&[7; RECORD_SIZE]).unwrap();
        // A second open file description, as another process's, finds the lock taken.
        let e = open(bytes).err().unwrap();
        assert_eq!(e.kind(), std::io::ErrorKind::ResourceBusy);
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            (MAGIC.len() + RECORD_SIZE) as u64
        );
        drop(first);
        // Its writer gone, the path takes a new trace.
        open(bytes).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), MAGIC.len() as u64);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn nothing_is_created_before_the_first_chunk() {
        let path = scratch("lazy.trace");
        let trace = TraceFile::new(path.to_str().unwrap().as_bytes());
        assert!(!path.exists());
        trace.write(&[1; RECORD_SIZE]);
        let written = std::fs::read(&path).unwrap();
        assert_eq!(&written[..MAGIC.len()], MAGIC);
        assert_eq!(written.len(), MAGIC.len() + RECORD_SIZE);
        std::fs::remove_file(&path).unwrap();
    }
}
