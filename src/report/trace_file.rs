//! The file `GPUPOOL_TRACE` names: the trace's magic, then the records the device pools hand
//! over in chunks.

use std::fs::File;
use std::io::Write;

use parking_lot::Mutex;

use crate::log;
use crate::pool::cancel::uncancellable;
use crate::pool::trace::{MAGIC, RECORD_SIZE};
use crate::pool::TraceSink;

pub struct TraceFile {
    file: File,
    path: String,
    /// Serializes the devices' chunks; true once a write failed (tracing then stops).
    failed: Mutex<bool>,
}

impl TraceFile {
    /// Create (or truncate) the regular file at `path`; a symbolic link there is refused, not
    /// followed, and so is anything but a regular file: chunks are written from inside the
    /// program's allocations, which a pipe without a reader (or a slow one) would stall.
    pub fn create(path: &[u8]) -> std::io::Result<TraceFile> {
        // Opening, truncating and writing are cancellation points, on the program's thread.
        uncancellable(|| {
            use std::os::unix::ffi::OsStrExt;
            use std::os::unix::fs::OpenOptionsExt;
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
            file.set_len(0)?;
            (&file).write_all(MAGIC)?;
            Ok(TraceFile {
                file,
                path: String::from_utf8_lossy(path).into_owned(),
                failed: Mutex::new(false),
            })
        })
    }
}

impl TraceSink for TraceFile {
    fn write(&self, bytes: &[u8]) {
        // From inside the program's allocations: the write is a cancellation point.
        uncancellable(|| {
            let mut failed = self.failed.lock();
            if *failed {
                return;
            }
            if let Err(e) = (&self.file).write_all(bytes) {
                // A chunk written in part (a full disk) would shift every later record: tracing
                // stops, and the file is cut back to its last whole record.
                *failed = true;
                if let Ok(meta) = self.file.metadata() {
                    let body = meta.len().saturating_sub(MAGIC.len() as u64);
                    let _ = self
                        .file
                        .set_len(MAGIC.len() as u64 + body - body % RECORD_SIZE as u64);
                }
                log::warn(&format!(
                    "writing the trace to {} failed: {e}; tracing stopped (the file keeps the \
                     records written before)",
                    self.path
                ));
            }
        })
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
        assert!(TraceFile::create(fifo.to_str().unwrap().as_bytes()).is_err());
        std::fs::remove_file(&fifo).unwrap();
        let _ = std::fs::remove_dir(fifo.parent().unwrap());
        let e = TraceFile::create(b"/dev/null").err().unwrap();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    }
}
