//! Streams.

use super::{CudaEvent, CudaGraph, CudaStream};
use crate::context;
use crate::current;
use crate::errors::{
    CudaResult, ILLEGAL_STATE, INVALID_RESOURCE_HANDLE, INVALID_VALUE, NOT_READY,
    STREAM_CAPTURE_IMPLICIT, STREAM_CAPTURE_INVALIDATED, STREAM_CAPTURE_UNSUPPORTED,
    STREAM_CAPTURE_WRONG_THREAD,
};
use crate::faults::Func;
use crate::ffi::{runtime_call, Out};
use crate::handles::{self, GRAPH_MAGIC, STREAM_MAGIC};
use crate::link;
use crate::state::{synchronize, with_state};
use crate::timeline::{self, Capture, CaptureMode, Kind, Stream, StreamId};
use std::ffi::{c_int, c_uint};

/// `cudaStreamNonBlocking`.
const NON_BLOCKING: c_uint = 1;

/// Creates a stream of the current device (`cudaStreamCreate*`, `cuStreamCreate*`).
///
/// # Safety
/// `stream` must be NULL or valid for writing a `cudaStream_t`.
pub unsafe fn create(stream: *mut CudaStream, flags: c_uint) -> CudaResult {
    // SAFETY: forwarded from the caller.
    let out = unsafe { Out::new(stream)? };
    let kind = match flags {
        0 => Kind::Blocking,
        NON_BLOCKING => Kind::NonBlocking,
        _ => return Err(INVALID_VALUE),
    };
    with_state(|st| {
        let d = current::get();
        st.use_device(d);
        let h = handles::create(STREAM_MAGIC);
        st.streams.add(h, d, kind, context::created_current());
        out.set(h as CudaStream);
        Ok(())
    })
}

/// Through the driver (`cuStreamCreate`).
#[no_mangle]
pub unsafe extern "C" fn cudaStreamCreate(stream: *mut CudaStream) -> c_int {
    runtime_call(Func::cudaStreamCreate, || match link::driver() {
        // SAFETY: the driver's cuStreamCreate, given the caller's out-pointer.
        Some(d) => link::result(unsafe { (d.stream_create)(stream, 0) }),
        // SAFETY: the caller passes NULL or a pointer valid for writing a cudaStream_t.
        None => unsafe { create(stream, 0) },
    })
}

/// Through the driver (`cuStreamCreate`: its flags have the same values).
#[no_mangle]
pub unsafe extern "C" fn cudaStreamCreateWithFlags(
    stream: *mut CudaStream,
    flags: c_uint,
) -> c_int {
    runtime_call(Func::cudaStreamCreateWithFlags, || match link::driver() {
        // SAFETY: the driver's cuStreamCreate, given the caller's arguments.
        Some(d) => link::result(unsafe { (d.stream_create)(stream, flags) }),
        // SAFETY: the caller passes NULL or a pointer valid for writing a cudaStream_t.
        None => unsafe { create(stream, flags) },
    })
}

/// Through the driver (`cuStreamCreateWithPriority`). The priority is accepted and ignored.
#[no_mangle]
pub unsafe extern "C" fn cudaStreamCreateWithPriority(
    stream: *mut CudaStream,
    flags: c_uint,
    priority: c_int,
) -> c_int {
    runtime_call(Func::cudaStreamCreateWithPriority, || {
        match link::driver() {
            Some(d) => {
                // SAFETY: the driver's cuStreamCreateWithPriority, given the caller's arguments.
                link::result(unsafe { (d.stream_create_with_priority)(stream, flags, priority) })
            }
            // SAFETY: the caller passes NULL or a pointer valid for writing a cudaStream_t.
            None => unsafe { create(stream, flags) },
        }
    })
}

/// `cudaExecutionContext_t` (CUDA 13.1): an opaque pointer.
pub type CudaExecutionContext = *mut std::ffi::c_void;

/// `cudaDeviceGetExecutionCtx` (CUDA 13.1): the device's primary context, as CUDA documents.
/// Its handle is the driver's primary context handle.
#[no_mangle]
pub unsafe extern "C" fn cudaDeviceGetExecutionCtx(
    ctx: *mut CudaExecutionContext,
    device: c_int,
) -> c_int {
    runtime_call(Func::cudaDeviceGetExecutionCtx, || {
        // SAFETY: the caller passes NULL or a pointer valid for writing a cudaExecutionContext_t.
        let out = unsafe { Out::new(ctx)? };
        let d = super::mempool::device_index(device)?;
        out.set(context::primary(d) as CudaExecutionContext);
        Ok(())
    })
}

/// `cudaExecutionCtxGetDevice` (CUDA 13.1): the device of a primary execution context. Green
/// execution contexts are not simulated: anything else is `cudaErrorInvalidValue`.
#[no_mangle]
pub unsafe extern "C" fn cudaExecutionCtxGetDevice(
    device: *mut c_int,
    ctx: CudaExecutionContext,
) -> c_int {
    runtime_call(Func::cudaExecutionCtxGetDevice, || {
        // SAFETY: the caller passes NULL or a pointer valid for writing an int.
        let out = unsafe { Out::new(device)? };
        let d = primary_of(ctx)?;
        out.set(d as c_int);
        Ok(())
    })
}

/// The device whose primary execution context `ctx` is, or `cudaErrorInvalidValue`.
fn primary_of(ctx: CudaExecutionContext) -> CudaResult<usize> {
    let devices = crate::config::get()?.devices;
    (0..devices)
        .find(|&d| context::primary(d) == ctx as usize)
        .ok_or(INVALID_VALUE)
}

/// `cudaExecutionCtxStreamCreate` (CUDA 13.1) in a device's primary execution context,
/// whatever context is current: blocking for `cudaStreamDefault`, non-blocking with
/// `cudaStreamNonBlocking`. Made here, not through a driver call: nothing says NVIDIA's runtime
/// makes it through one that a library could see. The priority is accepted and ignored.
#[no_mangle]
pub unsafe extern "C" fn cudaExecutionCtxStreamCreate(
    stream: *mut CudaStream,
    ctx: CudaExecutionContext,
    flags: c_uint,
    _priority: c_int,
) -> c_int {
    runtime_call(Func::cudaExecutionCtxStreamCreate, || {
        // SAFETY: the caller passes NULL or a pointer valid for writing a cudaStream_t.
        let out = unsafe { Out::new(stream)? };
        let d = primary_of(ctx)?;
        let kind = match flags {
            0 => Kind::Blocking,
            NON_BLOCKING => Kind::NonBlocking,
            _ => return Err(INVALID_VALUE),
        };
        with_state(|st| {
            // The stream's context is the primary one, which it keeps active.
            st.activate_primary(d);
            let h = handles::create(STREAM_MAGIC);
            st.streams.add(h, d, kind, None);
            out.set(h as CudaStream);
            Ok(())
        })
    })
}

/// `cudaStreamDestroy` and `cuStreamDestroy_v2`.
pub fn destroy(stream: usize) -> CudaResult {
    with_state(|st| match st.stream(stream)? {
        StreamId::User(h) => {
            // Work already enqueued still completes: its completions are queued apart.
            st.streams.remove(h);
            // SAFETY: `h` was a registered stream handle, now removed from the registry.
            unsafe { handles::destroy(h) };
            Ok(())
        }
        StreamId::Legacy(..) | StreamId::PerThread(..) => Err(INVALID_RESOURCE_HANDLE),
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamDestroy(stream: CudaStream) -> c_int {
    runtime_call(Func::cudaStreamDestroy, || destroy(stream as usize))
}

/// `cudaStreamSynchronize` and `cuStreamSynchronize`.
pub fn synchronize_stream(stream: usize) -> CudaResult {
    let deadline = with_state(|st| {
        let id = st.stream(stream)?;
        let s = *st.streams.get(id);
        st.use_device(s.device).counters.stream_syncs += 1;
        Ok((s.tail, s.device))
    })?;
    synchronize(deadline.0, deadline.1)
}

/// Through the driver (`cuStreamSynchronize`).
#[no_mangle]
pub unsafe extern "C" fn cudaStreamSynchronize(stream: CudaStream) -> c_int {
    runtime_call(Func::cudaStreamSynchronize, || match link::driver() {
        // SAFETY: the driver's cuStreamSynchronize.
        Some(d) => link::result(unsafe { (d.stream_synchronize)(stream) }),
        None => synchronize_stream(stream as usize),
    })
}

/// `cudaStreamQuery` and `cuStreamQuery`: `NOT_READY` while work is in flight.
pub fn query(stream: usize) -> CudaResult {
    with_state(|st| {
        let id = st.stream(stream)?;
        let s = st.streams.get(id);
        if s.tail > timeline::now() {
            Err(NOT_READY)
        } else {
            Ok(())
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamQuery(stream: CudaStream) -> c_int {
    runtime_call(Func::cudaStreamQuery, || query(stream as usize))
}

/// Writes what `get` reads of `stream` to `out`: the stream queries below.
///
/// # Safety
/// `out` must be NULL or valid for writing a `T`.
unsafe fn stream_property<T>(
    stream: usize,
    out: *mut T,
    get: impl FnOnce(&Stream) -> T,
) -> CudaResult {
    // SAFETY: forwarded from the caller.
    let out = unsafe { Out::new(out)? };
    with_state(|st| {
        let id = st.stream(stream)?;
        out.set(get(st.streams.get(id)));
        Ok(())
    })
}

/// The flags a stream was created with (`cudaStreamGetFlags`, `cuStreamGetFlags`):
/// `cudaStreamNonBlocking` for a non-blocking stream, else 0 (also for the legacy and
/// per-thread default streams).
///
/// # Safety
/// `flags` must be NULL or valid for writing an unsigned int.
pub unsafe fn get_flags(stream: usize, flags: *mut c_uint) -> CudaResult {
    // SAFETY: forwarded from the caller.
    unsafe {
        stream_property(stream, flags, |s| {
            if s.kind == Kind::NonBlocking {
                NON_BLOCKING
            } else {
                0
            }
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamGetFlags(stream: CudaStream, flags: *mut c_uint) -> c_int {
    // SAFETY: the caller passes NULL or a pointer valid for writing an unsigned int.
    runtime_call(Func::cudaStreamGetFlags, || unsafe {
        get_flags(stream as usize, flags)
    })
}

/// The stream's unique id (`cudaStreamGetId`, CUDA 12): never reused, also after the stream is
/// destroyed and its handle's address is given to a new stream. The legacy default stream has
/// one per context, and each thread's per-thread default stream one per context it used.
#[no_mangle]
pub unsafe extern "C" fn cudaStreamGetId(stream: CudaStream, id: *mut u64) -> c_int {
    // SAFETY: the caller passes NULL or a pointer valid for writing an unsigned long long.
    runtime_call(Func::cudaStreamGetId, || unsafe {
        get_id(stream as usize, id)
    })
}

/// `cudaStreamGetId`'s answer, also `cuStreamGetId`'s.
///
/// # Safety
/// `id` must be NULL or valid for writing a `u64`.
pub unsafe fn get_id(stream: usize, id: *mut u64) -> CudaResult {
    // SAFETY: forwarded from the caller.
    unsafe { stream_property(stream, id, |s| s.id) }
}

/// The context of `stream` (`cuStreamGetCtx`): its device's primary one. A stream made while a
/// created context was current answers the primary one too (the simulator orders it in its
/// own context, but does not say so here); the default streams answer the current device's.
///
/// # Safety
/// `ctx` must be NULL or valid for writing a `CUcontext`.
pub unsafe fn get_context(stream: usize, ctx: *mut *mut std::ffi::c_void) -> CudaResult {
    // SAFETY: forwarded from the caller.
    unsafe {
        stream_property(stream, ctx, |s| {
            crate::context::primary(s.device) as *mut std::ffi::c_void
        })
    }
}

/// `cudaStreamIsCapturing`'s answer, also `cuStreamIsCapturing`'s.
///
/// # Safety
/// `status` must be NULL or valid for writing an int.
/// 0 none, 1 active, 2 invalidated; the legacy stream while a blocking stream of its device is
/// being captured gives 906 (`cudaErrorStreamCaptureImplicit`), invalidating nothing.
pub unsafe fn is_capturing(stream: usize, status: *mut c_int) -> CudaResult {
    let implicit = with_state(|st| {
        let id = st.stream(stream)?;
        Ok(st.streams.legacy_implicitly_captured(id))
    })?;
    if implicit {
        return Err(STREAM_CAPTURE_IMPLICIT);
    }
    // SAFETY: forwarded from the caller.
    unsafe {
        stream_property(stream, status, |s| match s.capture {
            None => 0,
            Some(c) => 1 + c_int::from(c.invalidated),
        })
    }
}

/// `cudaStreamCaptureStatusActive` (1) between `cudaStreamBeginCapture` and
/// `cudaStreamEndCapture`, else `cudaStreamCaptureStatusNone` (0).
#[no_mangle]
pub unsafe extern "C" fn cudaStreamIsCapturing(stream: CudaStream, status: *mut c_int) -> c_int {
    // SAFETY: the caller passes NULL or a pointer valid for writing the status enum (an int).
    runtime_call(Func::cudaStreamIsCapturing, || unsafe {
        is_capturing(stream as usize, status)
    })
}

thread_local! {
    /// The calling thread's capture mode (`cudaThreadExchangeStreamCaptureMode`): global at
    /// first, as in CUDA.
    static THREAD_MODE: std::cell::Cell<CaptureMode> = const { std::cell::Cell::new(CaptureMode::Global) };
}

/// The calling thread's capture mode (global for a thread being torn down).
pub fn thread_capture_mode() -> CaptureMode {
    THREAD_MODE
        .try_with(|m| m.get())
        .unwrap_or(CaptureMode::Global)
}

/// Swaps the calling thread's capture mode with `*mode` (0 global, 1 thread-local, 2 relaxed;
/// anything else, or NULL → 1).
#[no_mangle]
pub unsafe extern "C" fn cudaThreadExchangeStreamCaptureMode(mode: *mut c_int) -> c_int {
    runtime_call(Func::cudaThreadExchangeStreamCaptureMode, || {
        if mode.is_null() {
            return Err(INVALID_VALUE);
        }
        // SAFETY: not NULL, and by the caller's contract valid for reading and writing an int.
        let wanted = capture_mode(unsafe { mode.read() })?;
        let old = THREAD_MODE
            .try_with(|m| m.replace(wanted))
            .map_err(|_| INVALID_VALUE)?;
        // SAFETY: as above.
        unsafe { mode.write(old as c_int) };
        Ok(())
    })
}

/// A capture mode's number (0 global, 1 thread-local, 2 relaxed; else 1).
fn capture_mode(mode: c_int) -> Result<CaptureMode, crate::errors::Code> {
    match mode {
        0 => Ok(CaptureMode::Global),
        1 => Ok(CaptureMode::ThreadLocal),
        2 => Ok(CaptureMode::Relaxed),
        _ => Err(INVALID_VALUE),
    }
}

/// Begins a capture on `stream`, the runtime's and the driver's alike, into the program's graph
/// `into` (one `create_graph` made) or, at the end, a new one. The legacy stream cannot be
/// captured (900); a stream already capturing gives 401; an unknown graph 1. Work enqueued
/// during the capture still runs as usual: the graph records nothing (see the README).
pub fn begin_capture(stream: usize, mode: c_int, into: Option<usize>) -> CudaResult {
    let mode = capture_mode(mode)?;
    with_state(|st| {
        let id = st.stream(stream)?;
        if into.is_some_and(|g| !st.graphs.contains(&g)) {
            return Err(INVALID_VALUE);
        }
        if let StreamId::Legacy(..) = id {
            return Err(STREAM_CAPTURE_UNSUPPORTED);
        }
        if st.streams.get(id).capture.is_some() {
            return Err(ILLEGAL_STATE);
        }
        let capture = Capture {
            mode,
            thread: current::thread_key(),
            invalidated: false,
            into,
        };
        st.streams.set_capture(id, Some(capture));
        Ok(())
    })
}

/// Ends `stream`'s capture and gives its graph: the program's for a capture into one, else a new
/// (empty) one; 401 if it is not capturing, 901 and a NULL graph if a call CUDA forbids
/// invalidated it. A capture not begun in relaxed mode must end on the thread that began it, as
/// CUDA documents: another thread gets 908 (`cudaErrorStreamCaptureWrongThread`) and the
/// capture goes on. The runtime's and the driver's alike.
///
/// # Safety
/// `graph` must be NULL or valid for writing a graph handle.
pub unsafe fn end_capture(stream: usize, graph: *mut CudaGraph) -> CudaResult {
    // SAFETY: forwarded from the caller.
    let out = unsafe { Out::new(graph)? };
    with_state(|st| {
        let id = st.stream(stream)?;
        let Some(capture) = st.streams.get(id).capture else {
            return Err(ILLEGAL_STATE);
        };
        if capture.mode != CaptureMode::Relaxed && capture.thread != current::thread_key() {
            return Err(STREAM_CAPTURE_WRONG_THREAD);
        }
        st.streams.set_capture(id, None);
        if capture.invalidated {
            // The capture ends, with no graph.
            out.set(std::ptr::null_mut());
            return Err(STREAM_CAPTURE_INVALIDATED);
        }
        let h = capture.into.unwrap_or_else(|| new_graph(st));
        out.set(h as CudaGraph);
        Ok(())
    })
}

fn new_graph(st: &mut crate::state::State) -> usize {
    let h = handles::create(GRAPH_MAGIC);
    st.graphs.insert(h);
    h
}

/// `cudaGraphCreate` and `cuGraphCreate`: an empty graph (flags must be 0).
///
/// # Safety
/// `graph` must be NULL or valid for writing a graph handle.
pub unsafe fn create_graph(graph: *mut CudaGraph, flags: c_uint) -> CudaResult {
    // SAFETY: forwarded from the caller.
    let out = unsafe { Out::new(graph)? };
    if flags != 0 {
        return Err(INVALID_VALUE);
    }
    with_state(|st| {
        out.set(new_graph(st) as CudaGraph);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaGraphCreate(graph: *mut CudaGraph, flags: c_uint) -> c_int {
    // SAFETY: the caller passes NULL or a pointer valid for writing a cudaGraph_t.
    runtime_call(Func::cudaGraphCreate, || unsafe {
        create_graph(graph, flags)
    })
}

/// `begin_capture` (modes 0–2, else 1).
#[no_mangle]
pub unsafe extern "C" fn cudaStreamBeginCapture(stream: CudaStream, mode: c_int) -> c_int {
    runtime_call(Func::cudaStreamBeginCapture, || {
        begin_capture(stream as usize, mode, None)
    })
}

/// `begin_capture` into the program's `graph` (CUDA 12.3). The dependencies are not modelled.
#[no_mangle]
pub unsafe extern "C" fn cudaStreamBeginCaptureToGraph(
    stream: CudaStream,
    graph: CudaGraph,
    _dependencies: *const std::ffi::c_void,
    _edge_data: *const std::ffi::c_void,
    _count: usize,
    mode: c_int,
) -> c_int {
    runtime_call(Func::cudaStreamBeginCaptureToGraph, || {
        begin_capture(stream as usize, mode, Some(graph as usize))
    })
}

/// `end_capture`.
#[no_mangle]
pub unsafe extern "C" fn cudaStreamEndCapture(stream: CudaStream, graph: *mut CudaGraph) -> c_int {
    // SAFETY: the caller passes NULL or a pointer valid for writing a cudaGraph_t.
    runtime_call(Func::cudaStreamEndCapture, || unsafe {
        end_capture(stream as usize, graph)
    })
}

/// The stream a runtime `_ptsz` form means (`nvcc --default-stream per-thread` compiles the
/// plain names to them): NULL is the calling thread's per-thread default stream
/// (`cudaStreamPerThread`), not the legacy one.
fn per_thread(stream: CudaStream) -> usize {
    match stream as usize {
        0 => 2,
        s => s,
    }
}

/// `cudaStreamBeginCapture` with a NULL stream meaning the per-thread default stream.
#[no_mangle]
pub unsafe extern "C" fn cudaStreamBeginCapture_ptsz(stream: CudaStream, mode: c_int) -> c_int {
    runtime_call(Func::cudaStreamBeginCapture_ptsz, || {
        begin_capture(per_thread(stream), mode, None)
    })
}

/// `cudaStreamBeginCaptureToGraph` with a NULL stream meaning the per-thread default stream.
#[no_mangle]
pub unsafe extern "C" fn cudaStreamBeginCaptureToGraph_ptsz(
    stream: CudaStream,
    graph: CudaGraph,
    _dependencies: *const std::ffi::c_void,
    _edge_data: *const std::ffi::c_void,
    _count: usize,
    mode: c_int,
) -> c_int {
    runtime_call(Func::cudaStreamBeginCaptureToGraph_ptsz, || {
        begin_capture(per_thread(stream), mode, Some(graph as usize))
    })
}

/// `cudaStreamEndCapture` with a NULL stream meaning the per-thread default stream.
#[no_mangle]
pub unsafe extern "C" fn cudaStreamEndCapture_ptsz(
    stream: CudaStream,
    graph: *mut CudaGraph,
) -> c_int {
    // SAFETY: the caller passes NULL or a pointer valid for writing a cudaGraph_t.
    runtime_call(Func::cudaStreamEndCapture_ptsz, || unsafe {
        end_capture(per_thread(stream), graph)
    })
}

/// `cudaStreamIsCapturing` with a NULL stream meaning the per-thread default stream.
#[no_mangle]
pub unsafe extern "C" fn cudaStreamIsCapturing_ptsz(
    stream: CudaStream,
    status: *mut c_int,
) -> c_int {
    // SAFETY: the caller passes NULL or a pointer valid for writing the status enum (an int).
    runtime_call(Func::cudaStreamIsCapturing_ptsz, || unsafe {
        is_capturing(per_thread(stream), status)
    })
}

/// Destroys a graph of a capture's end (NULL: 1; any other unknown handle: 400), the runtime's
/// and the driver's alike.
pub fn destroy_graph(graph: usize) -> CudaResult {
    if graph == 0 {
        return Err(INVALID_VALUE);
    }
    with_state(|st| {
        if !st.graphs.remove(&graph) {
            return Err(INVALID_RESOURCE_HANDLE);
        }
        // SAFETY: a handle made by `handles::create`, now removed from its registry.
        unsafe { handles::destroy(graph) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaGraphDestroy(graph: CudaGraph) -> c_int {
    runtime_call(Func::cudaGraphDestroy, || destroy_graph(graph as usize))
}

/// `cudaStreamWaitEvent` and `cuStreamWaitEvent`: `flags` must be `cudaEventWaitDefault` (0)
/// or `cudaEventWaitExternal` (1).
pub fn wait_event(stream: usize, event: usize, flags: c_uint) -> CudaResult {
    if flags > 1 {
        return Err(INVALID_VALUE);
    }
    with_state(|st| {
        let id = st.stream(stream)?;
        if st.streams.refuse_legacy_use(id) {
            return Err(STREAM_CAPTURE_IMPLICIT);
        }
        // An event never recorded is an empty set of work (CUDA's documentation of
        // cudaEventRecord): waiting on it is taken to order nothing, not even as an action on
        // the legacy stream. The documentation does not say either way; the stricter reading
        // keeps a program (or the pool) from depending on it.
        if let Some(dep) = st.event(event)?.time {
            st.streams.enqueue(id, timeline::now(), 0, dep);
        }
        let d = st.streams.get(id).device;
        st.use_device(d).counters.stream_wait_events += 1;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamWaitEvent(
    stream: CudaStream,
    event: CudaEvent,
    flags: c_uint,
) -> c_int {
    runtime_call(Func::cudaStreamWaitEvent, || {
        wait_event(stream as usize, event as usize, flags)
    })
}
