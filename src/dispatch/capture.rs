//! The calls that begin and end a graph capture, the runtime's and the driver's: passed on, and
//! noted in `cuda::captures`, so the pool takes no fence or barrier that would invalidate the
//! capture. The runtime and the driver answer with the same numbers here.

use crate::cuda::captures;
use crate::cuda::types::*;
use crate::guard;

use super::{forward, runtime};

/// Error 901, `cudaErrorStreamCaptureInvalidated` and `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`:
/// the capture ended, with no graph.
const ERROR_STREAM_CAPTURE_INVALIDATED: i32 = 901;

/// A begin on `stream` (`call`, its answer): made once the pool's fences and barriers in
/// progress end (`cuda::capture_gate`, a second at most), and a capture from then on if it
/// succeeded (`captures::begin`). A forked child has no pool to fence, and the gate may have
/// been in use by a thread of the parent at the fork. The begin is a call into the pool
/// (`guard`): a signal handler that interrupts it, while it waits at the gate or is past it,
/// reaches CUDA alone, never a pool lock that a thread at the gate may hold. A begin from
/// inside the pool waits for no gate (`captures::begin_inside`).
pub fn begin(stream: Stream, call: impl FnOnce() -> i32) -> i32 {
    // A child must know it is one even where no pool was made before the fork (a driver-only
    // process whose first pool call was a begin).
    crate::global::watch_forks();
    if crate::global::is_forked_child() {
        return call();
    }
    match guard::enter() {
        Some(_inside) => captures::begin(stream, call),
        None => captures::begin_inside(stream, call),
    }
}

/// An end that answered `r` on `stream`. Success and an invalidated capture (901) end it. Any
/// other refusal is not taken for an end: one from another thread than the capture's, which CUDA
/// refuses (908) outside relaxed mode, leaves the capture running, and the pool's next fence
/// would invalidate it. A capture kept noted that did end is dropped when CUDA says so
/// (`captures::underway` asks before each fence).
pub fn after_end(r: i32, stream: Stream) -> i32 {
    let ended = r == SUCCESS || r == ERROR_STREAM_CAPTURE_INVALIDATED;
    if ended && !crate::global::is_forked_child() {
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
    begin(stream, || {
        // SAFETY: the caller's arguments, passed on unchanged.
        forward(g.runtime.stream_begin_capture, |f| unsafe {
            f(stream, mode)
        })
    })
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
    begin(stream, || {
        // SAFETY: the caller's arguments, passed on unchanged.
        forward(g.runtime.stream_begin_capture_to_graph, |f| unsafe {
            f(stream, graph, dependencies, edge_data, count, mode)
        })
    })
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
