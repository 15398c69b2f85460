//! Streams, events and launches: the runtime's, on the same handles (a `CUstream` is a
//! `cudaStream_t`) and the same in-flight model.

use super::{driver_call, with_ptsz, CuEvent, CuFunction, CuGraph, CuResult, CuStream};
use crate::api::{event, kernel, stream};
use crate::context;
use crate::errors::INVALID_VALUE;
use crate::faults::Func;
use std::ffi::{c_int, c_uint, c_void};

/// `CU_STREAM_CAPTURE_MODE_GLOBAL`: the mode of CUDA 10.0's `cuStreamBeginCapture`.
const CU_STREAM_CAPTURE_MODE_GLOBAL: c_int = 0;

/// `CU_STREAM_DEFAULT` (0) or `CU_STREAM_NON_BLOCKING` (1), as the runtime's flags.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut CuStream, flags: c_uint) -> CuResult {
    driver_call(Func::cuStreamCreate, || {
        context::require_context()?;
        // SAFETY: the caller passes NULL or a pointer valid for writing a CUstream.
        unsafe { stream::create(stream, flags) }
    })
}

/// The priority is accepted and ignored.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    stream: *mut CuStream,
    flags: c_uint,
    _priority: c_int,
) -> CuResult {
    driver_call(Func::cuStreamCreateWithPriority, || {
        context::require_context()?;
        // SAFETY: the caller passes NULL or a pointer valid for writing a CUstream.
        unsafe { stream::create(stream, flags) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(stream: CuStream) -> CuResult {
    driver_call(Func::cuStreamDestroy_v2, || {
        context::require_context()?;
        stream::destroy(stream as usize)
    })
}

with_ptsz! {
    /// As `cudaStreamSynchronize` (counted in `stream_syncs`).
    fn cuStreamSynchronize / cuStreamSynchronize_ptsz (stream: CuStream; stream) {
        context::require_context()?;
        stream::synchronize_stream(stream)
    }
}

/// `CUDA_ERROR_NOT_READY` (600) while work is in flight.
#[no_mangle]
pub unsafe extern "C" fn cuStreamQuery(stream: CuStream) -> CuResult {
    driver_call(Func::cuStreamQuery, || {
        context::require_context()?;
        stream::query(stream as usize)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetFlags(stream: CuStream, flags: *mut c_uint) -> CuResult {
    driver_call(Func::cuStreamGetFlags, || {
        context::require_context()?;
        // SAFETY: the caller passes NULL or a pointer valid for writing an unsigned int.
        unsafe { stream::get_flags(stream as usize, flags) }
    })
}

/// As `cudaStreamGetId`: the stream's unique id, never reused.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetId(stream: CuStream, id: *mut u64) -> CuResult {
    driver_call(Func::cuStreamGetId, || {
        context::require_context()?;
        // SAFETY: the caller passes NULL or a pointer valid for writing an unsigned long long.
        unsafe { stream::get_id(stream as usize, id) }
    })
}

/// The stream's context: its device's primary one (`stream::get_context`).
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCtx(stream: CuStream, ctx: *mut super::CuContext) -> CuResult {
    driver_call(Func::cuStreamGetCtx, || {
        context::require_context()?;
        // SAFETY: the caller passes NULL or a pointer valid for writing a CUcontext.
        unsafe { stream::get_context(stream as usize, ctx) }
    })
}

/// As `cudaStreamIsCapturing`: `CU_STREAM_CAPTURE_STATUS_ACTIVE` (1) while capturing, else 0.
#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing(stream: CuStream, status: *mut c_int) -> CuResult {
    driver_call(Func::cuStreamIsCapturing, || {
        context::require_context()?;
        // SAFETY: the caller passes NULL or a pointer valid for writing the status enum.
        unsafe { stream::is_capturing(stream as usize, status) }
    })
}

with_ptsz! {
    /// CUDA 10.0's, with no mode: a capture in global mode.
    fn cuStreamBeginCapture / cuStreamBeginCapture_ptsz (stream: CuStream; stream) {
        context::require_context()?;
        stream::begin_capture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL, None)
    }
}

with_ptsz! {
    /// As `cudaStreamBeginCapture` (CUDA 10.1): the modes have the runtime's values.
    fn cuStreamBeginCapture_v2 / cuStreamBeginCapture_v2_ptsz (stream: CuStream, mode: c_int; stream) {
        context::require_context()?;
        stream::begin_capture(stream, mode, None)
    }
}

with_ptsz! {
    /// As `cudaStreamBeginCaptureToGraph` (CUDA 12.3).
    fn cuStreamBeginCaptureToGraph / cuStreamBeginCaptureToGraph_ptsz (
        stream: CuStream,
        graph: CuGraph,
        _dependencies: *const c_void,
        _edge_data: *const c_void,
        _count: usize,
        mode: c_int;
        stream
    ) {
        context::require_context()?;
        stream::begin_capture(stream, mode, Some(graph as usize))
    }
}

with_ptsz! {
    /// As `cudaStreamEndCapture`: `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` (901) and a NULL
    /// graph for a capture a refused call invalidated.
    fn cuStreamEndCapture / cuStreamEndCapture_ptsz (stream: CuStream, graph: *mut CuGraph; stream) {
        context::require_context()?;
        // SAFETY: the caller passes NULL or a pointer valid for writing a CUgraph.
        unsafe { stream::end_capture(stream, graph) }
    }
}

/// As `cudaGraphCreate`.
#[no_mangle]
pub unsafe extern "C" fn cuGraphCreate(graph: *mut CuGraph, flags: c_uint) -> CuResult {
    driver_call(Func::cuGraphCreate, || {
        context::require_context()?;
        // SAFETY: the caller passes NULL or a pointer valid for writing a CUgraph.
        unsafe { stream::create_graph(graph, flags) }
    })
}

/// As `cudaGraphDestroy`.
#[no_mangle]
pub unsafe extern "C" fn cuGraphDestroy(graph: CuGraph) -> CuResult {
    driver_call(Func::cuGraphDestroy, || {
        context::require_context()?;
        stream::destroy_graph(graph as usize)
    })
}

with_ptsz! {
    /// As `cudaStreamWaitEvent`.
    fn cuStreamWaitEvent / cuStreamWaitEvent_ptsz (stream: CuStream, event: CuEvent, flags: c_uint; stream) {
        context::require_context()?;
        stream::wait_event(stream, event as usize, flags)
    }
}

/// The flags have the runtime's values.
#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(event: *mut CuEvent, flags: c_uint) -> CuResult {
    driver_call(Func::cuEventCreate, || {
        context::require_context()?;
        // SAFETY: the caller passes NULL or a pointer valid for writing a CUevent.
        unsafe { event::create(event, flags) }
    })
}

with_ptsz! {
    /// As `cudaEventRecord`.
    fn cuEventRecord / cuEventRecord_ptsz (event: CuEvent, stream: CuStream; stream) {
        context::require_context()?;
        event::record(event as usize, stream)
    }
}

/// As `cudaEventSynchronize` (counted in `event_syncs`).
#[no_mangle]
pub unsafe extern "C" fn cuEventSynchronize(event: CuEvent) -> CuResult {
    driver_call(Func::cuEventSynchronize, || {
        context::require_context()?;
        event::synchronize_event(event as usize)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventQuery(event: CuEvent) -> CuResult {
    driver_call(Func::cuEventQuery, || {
        context::require_context()?;
        event::query(event as usize)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventDestroy_v2(event: CuEvent) -> CuResult {
    driver_call(Func::cuEventDestroy_v2, || {
        context::require_context()?;
        event::destroy(event as usize)
    })
}

with_ptsz! {
    /// The fill kernel's address is its `CUfunction` (any other: `CUDA_ERROR_INVALID_HANDLE`),
    /// its arguments in `kernelParams` as for `cudaLaunchKernel`; `extra` is not supported
    /// (`CUDA_ERROR_INVALID_VALUE`). Grid, block and shared memory are ignored.
    fn cuLaunchKernel / cuLaunchKernel_ptsz (
        f: CuFunction,
        _grid_x: c_uint,
        _grid_y: c_uint,
        _grid_z: c_uint,
        _block_x: c_uint,
        _block_y: c_uint,
        _block_z: c_uint,
        _shared_mem: c_uint,
        stream: CuStream,
        params: *mut *mut c_void,
        extra: *mut *mut c_void;
        stream
    ) {
        context::require_context()?;
        if !extra.is_null() {
            return Err(INVALID_VALUE);
        }
        // SAFETY: for the fill kernel, the caller passes its 4 arguments as documented.
        unsafe { kernel::launch_fill(f, params, stream as CuStream) }
    }
}
