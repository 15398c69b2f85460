//! The file `GPUPOOL_TRACE` names: the trace's magic, then the records the device pools hand
//! over in chunks.

use std::ffi::CString;

use parking_lot::Mutex;

use crate::log;
use crate::pool::trace::{MAGIC, RECORD_SIZE};
use crate::pool::TraceSink;

pub struct TraceFile {
    fd: i32,
    path: String,
    /// Serializes the devices' chunks; true once a write failed (tracing then stops).
    failed: Mutex<bool>,
}

impl TraceFile {
    /// Create (or truncate) the regular file at `path`; a symbolic link there is refused, not
    /// followed, and so is anything but a regular file: chunks are written from inside the
    /// program's allocations, which a pipe without a reader (or a slow one) would stall.
    pub fn create(path: &[u8]) -> std::io::Result<TraceFile> {
        let c = CString::new(path).map_err(|_| std::io::ErrorKind::InvalidInput)?;
        // Non-blocking: opening a FIFO for writing would otherwise wait for a reader.
        let flags = libc::O_WRONLY
            | libc::O_CREAT
            | libc::O_APPEND
            | libc::O_NOFOLLOW
            | libc::O_CLOEXEC
            | libc::O_NONBLOCK;
        // SAFETY: a NUL-terminated path and plain flags.
        let fd = unsafe { libc::open(c.as_ptr(), flags, 0o644) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let file = TraceFile {
            fd,
            path: String::from_utf8_lossy(path).into_owned(),
            failed: Mutex::new(false),
        };
        // Checked before truncating: a device or FIFO is left as it is.
        // SAFETY: an all-zero `stat` is a valid value for fstat to fill in.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is open; `st` is a valid out-pointer.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a regular file",
            ));
        }
        // SAFETY: `fd` is an open regular file.
        if unsafe { libc::ftruncate(fd, 0) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        log::write_all_fd(fd, MAGIC)?;
        Ok(file)
    }
}

impl Drop for TraceFile {
    fn drop(&mut self) {
        // SAFETY: the descriptor this value owns, closed once.
        unsafe { libc::close(self.fd) };
    }
}

impl TraceSink for TraceFile {
    fn write(&self, bytes: &[u8]) {
        let mut failed = self.failed.lock();
        if *failed {
            return;
        }
        if let Err(e) = log::write_all_fd(self.fd, bytes) {
            // A chunk written in part (a full disk) would shift every later record: tracing
            // stops, and the file is cut back to its last whole record.
            *failed = true;
            // SAFETY: an all-zero `stat` is a valid value for fstat to fill in.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: `fd` is open; `st` is a valid out-pointer.
            if unsafe { libc::fstat(self.fd, &mut st) } == 0 {
                let body = (st.st_size as u64).saturating_sub(MAGIC.len() as u64);
                let whole = MAGIC.len() as u64 + body - body % RECORD_SIZE as u64;
                // SAFETY: `fd` is an open regular file; shrinking it loses only the cut record.
                unsafe { libc::ftruncate(self.fd, whole as libc::off_t) };
            }
            log::warn(&format!(
                "writing the trace to {} failed: {e}; tracing stopped (the file keeps the \
                 records written before)",
                self.path
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(TraceFile::create(fifo.to_str().unwrap().as_bytes()).is_err());
        std::fs::remove_file(&fifo).unwrap();
        let _ = std::fs::remove_dir(fifo.parent().unwrap());
        let e = TraceFile::create(b"/dev/null").err().unwrap();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    }
}
