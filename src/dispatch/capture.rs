//! `cudaStreamBeginCapture` and `cudaStreamEndCapture`: passed on, and noted in
//! `cuda::captures`, so the pool takes no fence or barrier that would invalidate the capture.

use crate::cuda::captures;
use crate::cuda::types::*;

use super::{forward, runtime};

/// Error 401, `cudaErrorIllegalState`: the stream was not capturing, nothing ended.
const ERROR_ILLEGAL_STATE: CudaStatus = 401;

/// # Safety
/// As `cudaStreamBeginCapture`.
pub unsafe fn stream_begin_capture(stream: Stream, mode: i32) -> CudaStatus {
    let g = match runtime() {
        Ok(g) => g,
        Err(e) => return e,
    };
    // SAFETY: the caller's arguments, passed on unchanged.
    let r = forward(g.runtime.stream_begin_capture, |f| unsafe {
        f(stream, mode)
    });
    if r == SUCCESS {
        captures::began(stream);
    }
    r
}

/// # Safety
/// As `cudaStreamEndCapture`.
pub unsafe fn stream_end_capture(stream: Stream, graph: *mut Graph) -> CudaStatus {
    let g = match runtime() {
        Ok(g) => g,
        Err(e) => return e,
    };
    // SAFETY: the caller's arguments, passed on unchanged.
    let r = forward(g.runtime.stream_end_capture, |f| unsafe {
        f(stream, graph)
    });
    // Success and an invalidated capture (901) both end it; a NULL `graph` or a stream not
    // capturing end nothing.
    if r != ERROR_INVALID_VALUE && r != ERROR_ILLEGAL_STATE {
        captures::ended(stream);
    }
    r
}
