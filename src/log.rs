//! Messages to stderr, written with one `write(2)` each so lines never interleave, and only from
//! processes that used CUDA (every caller is on a CUDA path).

use std::sync::atomic::{AtomicBool, Ordering};

/// Write raw bytes to a file descriptor, retrying short writes; errors are dropped.
pub fn write_fd(fd: i32, bytes: &[u8]) {
    let _ = write_all_fd(fd, bytes);
}

/// Write raw bytes to a file descriptor, retrying short writes and interruptions.
pub fn write_all_fd(fd: i32, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: the pointer and length describe a live slice.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        bytes = &bytes[n as usize..];
    }
    Ok(())
}

/// One line `gpupool: MSG` on stderr.
pub fn warn(msg: &str) {
    let line = format!("gpupool: {msg}\n");
    write_fd(2, line.as_bytes());
}

/// `warn`, at most once per `flag`.
pub fn warn_once(flag: &AtomicBool, msg: impl FnOnce() -> String) {
    if !flag.swap(true, Ordering::Relaxed) {
        warn(&msg());
    }
}
