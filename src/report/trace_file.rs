//! The file `GPUPOOL_TRACE` names: the trace's magic, then the records the device pools hand
//! over in chunks.

use std::ffi::CString;

use crate::log;
use crate::pool::trace::MAGIC;
use crate::pool::TraceSink;

pub struct TraceFile {
    fd: i32,
}

impl TraceFile {
    /// Create (or truncate) the file at `path`; a symbolic link there is refused, not followed.
    pub fn create(path: &[u8]) -> std::io::Result<TraceFile> {
        let c = CString::new(path).map_err(|_| std::io::ErrorKind::InvalidInput)?;
        let flags = libc::O_WRONLY
            | libc::O_CREAT
            | libc::O_TRUNC
            | libc::O_APPEND
            | libc::O_NOFOLLOW
            | libc::O_CLOEXEC;
        // SAFETY: a NUL-terminated path and plain flags.
        let fd = unsafe { libc::open(c.as_ptr(), flags, 0o644) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        log::write_all_fd(fd, MAGIC)?;
        Ok(TraceFile { fd })
    }
}

impl TraceSink for TraceFile {
    fn write(&self, bytes: &[u8]) {
        // One write(2) per chunk with O_APPEND: chunks of different devices never interleave.
        let _ = log::write_all_fd(self.fd, bytes);
    }
}
