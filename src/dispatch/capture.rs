//! The calls that begin and end a graph capture, the runtime's and the driver's: passed on, and
//! noted in `cuda::captures`, so the pool takes no fence or barrier that would invalidate the
//! capture. The runtime and the driver answer with the same numbers here.

use crate::cuda::captures;
use crate::cuda::types::*;

use super::{forward, runtime};

/// Error 401, `cudaErrorIllegalState` and `CUDA_ERROR_ILLEGAL_STATE`: the stream was not
/// capturing, nothing ended.
const ERROR_ILLEGAL_STATE: i32 = 401;

/// A begin that answered `r` on `stream`: a capture from now on if it succeeded.
pub fn after_begin(r: i32, stream: Stream) -> i32 {
    if r == SUCCESS {
        captures::began(stream);
    }
    r
}

/// An end that answered `r` on `stream`. Success and an invalidated capture (901) both end it;
/// a NULL graph pointer or a stream not capturing end nothing.
pub fn after_end(r: i32, stream: Stream) -> i32 {
    if r != ERROR_INVALID_VALUE && r != ERROR_ILLEGAL_STATE {
        captures::ended(stream);
    }
    r
}

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
    after_begin(r, stream)
}

/// # Safety
/// As `cudaStreamBeginCaptureToGraph`.
pub unsafe fn stream_begin_capture_to_graph(
    stream: Stream,
    graph: Graph,
    dependencies: *const std::ffi::c_void,
    edge_data: *const std::ffi::c_void,
    count: usize,
    mode: i32,
) -> CudaStatus {
    let g = match runtime() {
        Ok(g) => g,
        Err(e) => return e,
    };
    // SAFETY: the caller's arguments, passed on unchanged.
    let r = forward(g.runtime.stream_begin_capture_to_graph, |f| unsafe {
        f(stream, graph, dependencies, edge_data, count, mode)
    });
    after_begin(r, stream)
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
    after_end(r, stream)
}
