//! About the library: version, whether the pool is on, the summary.

use std::ffi::{c_char, c_int};

use super::context::{report_patience, run};
use super::{GPUPOOL_ERROR_INVALID_VALUE, GPUPOOL_ERROR_UNKNOWN};
use crate::guard::boundary;
use crate::log;
use crate::report::summary::{render_text, Report};
use crate::report::{none_intercepted, render, Format};

/// Major version of this header (the version it describes; compare `GPUPOOL_VERSION_NUMBER`
/// with `gpupool_version_number()`, the version of the library loaded at run time).
pub const GPUPOOL_VERSION_MAJOR: u32 = 0;
/// Minor version of this header.
pub const GPUPOOL_VERSION_MINOR: u32 = 1;
/// Patch version of this header.
pub const GPUPOOL_VERSION_PATCH: u32 = 0;
/// `MAJOR * 10000 + MINOR * 100 + PATCH`.
pub const GPUPOOL_VERSION_NUMBER: u32 =
    GPUPOOL_VERSION_MAJOR * 10000 + GPUPOOL_VERSION_MINOR * 100 + GPUPOOL_VERSION_PATCH;

const fn number(s: &str) -> u32 {
    let b = s.as_bytes();
    let mut i = 0;
    let mut n = 0;
    while i < b.len() {
        n = n * 10 + (b[i] - b'0') as u32;
        i += 1;
    }
    n
}

const _: () = assert!(
    GPUPOOL_VERSION_MAJOR == number(env!("CARGO_PKG_VERSION_MAJOR"))
        && GPUPOOL_VERSION_MINOR == number(env!("CARGO_PKG_VERSION_MINOR"))
        && GPUPOOL_VERSION_PATCH == number(env!("CARGO_PKG_VERSION_PATCH")),
    "GPUPOOL_VERSION_* must match the version in Cargo.toml"
);

/// The library's version as text, such as "0.1.0" (a static string: do not free it).
#[no_mangle]
pub extern "C" fn gpupool_version() -> *const c_char {
    boundary(std::ptr::null(), || {
        concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
    })
}

/// The library's version as `MAJOR * 10000 + MINOR * 100 + PATCH` (0.1.0 is 100).
#[no_mangle]
pub extern "C" fn gpupool_version_number() -> u32 {
    boundary(0, || GPUPOOL_VERSION_NUMBER)
}

/// 1 when the pool serves allocations; 0 when it is disabled (`GPUPOOL_DISABLE=1`: every call
/// goes to the CUDA runtime) or no CUDA runtime could be found. Where it serves the driver's
/// allocations (a program with the driver loaded and no runtime, as XLA's), 1 without looking
/// for a runtime, which would load one. Otherwise the first call finds the runtime, as any
/// other call of the library does.
#[no_mangle]
pub extern "C" fn gpupool_enabled() -> c_int {
    boundary(0, || {
        c_int::from(crate::dispatch::driver::serves() || crate::global::pool().is_some())
    })
}

/// Where a call goes with the pool off: the CUDA library found, or before any, the runtime.
fn calls_go_to(process: &crate::global::Process) -> &str {
    if crate::global::existing().is_none() && crate::cuda::driver::loaded_here().is_none() {
        return "the CUDA runtime";
    }
    process.cuda_path()
}

/// Writes the summary (the table `GPUPOOL_SUMMARY` prints at exit: memory requested, allocated
/// and reserved, hits and misses, driver calls, releases, live blocks) to the file descriptor
/// `fd`, after flushing the program's stdio buffers so that its own output comes first. With
/// the pool disabled, one line says so. Waits while another thread holds a device's pool; not
/// async-signal-safe (from a thread inside the pool, a device it may hold is listed as not
/// read after 200 ms).
///
/// Needs no runtime and never looks for one: before the program's first CUDA call the summary
/// says that nothing was intercepted.
///
/// Returns 0, 1 (`fd` is negative or not open for writing), or 999 (the write failed; see
/// `errno`).
#[no_mangle]
pub extern "C" fn gpupool_write_summary(fd: c_int) -> c_int {
    run(|| {
        if fd < 0 {
            return Err(GPUPOOL_ERROR_INVALID_VALUE);
        }
        let process = crate::global::process();
        let (_inside, patience) = report_patience();
        let text = match process.pool() {
            Some(pool) => render_text(&Report::collect(pool, process.cuda_path(), patience)),
            None if crate::global::is_forked_child() => format!(
                "gpupool: off in this forked child (the parent's pool is the parent's); every \
                 call goes to {}\n",
                calls_go_to(process)
            ),
            None => format!(
                "gpupool: disabled (GPUPOOL_DISABLE=1); every call goes to {}\n",
                calls_go_to(process)
            ),
        };
        // SAFETY: fflush(NULL) flushes every open stdio output stream; a cancellation point.
        crate::pool::cancel::uncancellable(|| unsafe { libc::fflush(std::ptr::null_mut()) });
        log::write_all_fd(fd, text.as_bytes()).map_err(|e| match e.raw_os_error() {
            Some(libc::EBADF) => GPUPOOL_ERROR_INVALID_VALUE,
            _ => GPUPOOL_ERROR_UNKNOWN,
        })
    })
}

/// The summary as text (`format` 0, what `gpupool_write_summary` writes), JSON (1, what a
/// `GPUPOOL_SUMMARY` path ending in `.json` gets) or Prometheus's text format (2), copied into
/// `buf`: at most `size - 1` bytes and a NUL, as `snprintf` does. `*length` receives the
/// whole summary's length without the NUL, so a caller whose `buf` was too small
/// (`*length >= size`) calls again with `*length + 1` bytes; `buf` may be NULL when `size` is
/// 0. Does not flush stdio. Waits as `gpupool_write_summary` does, and as it needs no runtime.
///
/// Returns 0, or 1 (`length` is NULL, `buf` is NULL with `size` above 0, or `format` is not 0,
/// 1 or 2).
///
/// # Safety
/// `buf` points to `size` writable bytes; `length` to a `size_t`.
#[no_mangle]
pub unsafe extern "C" fn gpupool_get_summary(
    format: c_int,
    buf: *mut c_char,
    size: usize,
    length: *mut usize,
) -> c_int {
    run(|| {
        let format = match format {
            0 => Format::Text,
            1 => Format::Json,
            2 => Format::Prometheus,
            _ => return Err(GPUPOOL_ERROR_INVALID_VALUE),
        };
        if length.is_null() || (buf.is_null() && size > 0) {
            return Err(GPUPOOL_ERROR_INVALID_VALUE);
        }
        let process = crate::global::process();
        let (_inside, patience) = report_patience();
        let text = match process.pool() {
            Some(pool) => render(
                &Report::collect(pool, process.cuda_path(), patience),
                format,
            ),
            None => none_intercepted(
                format,
                &format!(
                    "the pool is off; every call goes to {}",
                    calls_go_to(process)
                ),
            ),
        };
        if size > 0 {
            let n = text.len().min(size - 1);
            // SAFETY: the caller gives `size` writable bytes at `buf`; `n + 1 <= size`.
            unsafe {
                std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
                *buf.add(n) = 0;
            }
        }
        // SAFETY: `length` is not NULL and points to a `size_t` (the caller's promise).
        unsafe { *length = text.len() };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_string_and_number_agree() {
        // SAFETY: a static NUL-terminated string.
        let text = unsafe { std::ffi::CStr::from_ptr(gpupool_version()) };
        assert_eq!(text.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
        let n = gpupool_version_number();
        let parts: Vec<u32> = env!("CARGO_PKG_VERSION")
            .split('.')
            .map(|p| p.parse().unwrap())
            .collect();
        assert_eq!(n, parts[0] * 10000 + parts[1] * 100 + parts[2]);
    }
}
