//! The driver's graph captures (`cuStreamBeginCapture`, `_v2`, `cuStreamBeginCaptureToGraph`
//! and their `_ptsz` forms, `cuStreamEndCapture`):
//! XLA, TensorFlow and the static runtime capture through these. Each is passed on, and noted
//! for the pool (`dispatch::capture`), so the pool takes no fence or barrier that would
//! invalidate the capture. A `_ptsz` form's NULL stream is the thread's own.

#![allow(non_snake_case)]

use std::ffi::{c_int, c_void};

use crate::cuda::driver::*;
use crate::cuda::hooked::{real_fn, Hooked};
use crate::cuda::types::{Graph, Stream};
use crate::dispatch::capture::{after_end, begin};
use crate::guard::boundary;

use super::per_thread;

/// `cuStreamBeginCapture` (CUDA 10.0, no mode) and its `_ptsz` form.
type BeginFn = unsafe extern "C" fn(Stream) -> CuResult;
/// `cuStreamBeginCapture_v2` (CUDA 10.1, a mode) and its `_ptsz` form.
type BeginV2Fn = unsafe extern "C" fn(Stream, c_int) -> CuResult;
/// `cuStreamBeginCaptureToGraph` (CUDA 12.3: stream, graph, dependencies, their edge data,
/// their number, mode) and its `_ptsz` form.
type BeginToGraphFn =
    unsafe extern "C" fn(Stream, Graph, *const c_void, *const c_void, usize, c_int) -> CuResult;
/// `cuStreamEndCapture` and its `_ptsz` form.
type EndFn = unsafe extern "C" fn(Stream, *mut Graph) -> CuResult;

/// # Safety
/// As `cuStreamBeginCapture`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture(stream: Stream) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        begin(stream, || real!(StreamBeginCapture, BeginFn, |f| f(stream)))
    })
}

/// # Safety
/// As `cuStreamBeginCapture_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_ptsz(stream: Stream) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        begin(per_thread(stream), || {
            real!(StreamBeginCapturePtsz, BeginFn, |f| f(stream))
        })
    })
}

/// # Safety
/// As `cuStreamBeginCapture_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2(stream: Stream, mode: c_int) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        begin(stream, || {
            real!(StreamBeginCaptureV2, BeginV2Fn, |f| f(stream, mode))
        })
    })
}

/// # Safety
/// As `cuStreamBeginCapture_v2_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2_ptsz(stream: Stream, mode: c_int) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        begin(per_thread(stream), || {
            real!(StreamBeginCaptureV2Ptsz, BeginV2Fn, |f| f(stream, mode))
        })
    })
}

/// # Safety
/// As `cuStreamBeginCaptureToGraph`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCaptureToGraph(
    stream: Stream,
    graph: Graph,
    dependencies: *const c_void,
    edge_data: *const c_void,
    count: usize,
    mode: c_int,
) -> CuResult {
    let args = (stream, graph, dependencies, edge_data, count, mode);
    begin_to_graph(Hooked::StreamBeginCaptureToGraph, stream, args)
}

/// # Safety
/// As `cuStreamBeginCaptureToGraph_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCaptureToGraph_ptsz(
    stream: Stream,
    graph: Graph,
    dependencies: *const c_void,
    edge_data: *const c_void,
    count: usize,
    mode: c_int,
) -> CuResult {
    let args = (stream, graph, dependencies, edge_data, count, mode);
    begin_to_graph(
        Hooked::StreamBeginCaptureToGraphPtsz,
        per_thread(stream),
        args,
    )
}

/// The arguments of `cuStreamBeginCaptureToGraph`, in its order.
type ToGraphArgs = (Stream, Graph, *const c_void, *const c_void, usize, c_int);

/// Either form of `cuStreamBeginCaptureToGraph` (`h`), noted for `stream`, the capture's own.
fn begin_to_graph(h: Hooked, stream: Stream, (s, g, d, e, n, m): ToGraphArgs) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        // SAFETY: `BeginToGraphFn` is the C signature of both forms.
        begin(stream, || match unsafe { real_fn::<BeginToGraphFn>(h) } {
            // SAFETY: the driver's own function, called with the hook's arguments unchanged.
            Some(f) => unsafe { f(s, g, d, e, n, m) },
            None => CU_ERROR_NOT_INITIALIZED,
        })
    })
}

/// # Safety
/// As `cuStreamEndCapture`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(stream: Stream, graph: *mut Graph) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        let r = real!(StreamEndCapture, EndFn, |f| f(stream, graph));
        after_end(r, stream)
    })
}

/// # Safety
/// As `cuStreamEndCapture_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture_ptsz(stream: Stream, graph: *mut Graph) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        let r = real!(StreamEndCapturePtsz, EndFn, |f| f(stream, graph));
        after_end(r, per_thread(stream))
    })
}
