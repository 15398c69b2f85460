//! Streams.

use super::{CudaEvent, CudaGraph, CudaStream};
use crate::current;
use crate::errors::{
    CudaResult, ILLEGAL_STATE, INVALID_RESOURCE_HANDLE, INVALID_VALUE, NOT_READY,
    STREAM_CAPTURE_UNSUPPORTED,
};
use crate::faults::Func;
use crate::ffi::{runtime_call, Out};
use crate::handles::{self, GRAPH_MAGIC, STREAM_MAGIC};
use crate::state::{synchronize, with_state};
use crate::timeline::{self, Capture, CaptureMode, Kind, Stream, StreamId};
use std::ffi::{c_int, c_uint};

/// `cudaStreamNonBlocking`.
const NON_BLOCKING: c_uint = 1;

/// Creates a stream of the current device.
///
/// # Safety
/// `stream` must be NULL or valid for writing a `cudaStream_t`.
unsafe fn create(stream: *mut CudaStream, flags: c_uint) -> CudaResult {
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
        st.streams.add(h, d, kind);
        out.set(h as CudaStream);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamCreate(stream: *mut CudaStream) -> c_int {
    // SAFETY: the caller passes NULL or a pointer valid for writing a cudaStream_t.
    runtime_call(Func::cudaStreamCreate, || unsafe { create(stream, 0) })
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamCreateWithFlags(
    stream: *mut CudaStream,
    flags: c_uint,
) -> c_int {
    // SAFETY: the caller passes NULL or a pointer valid for writing a cudaStream_t.
    runtime_call(Func::cudaStreamCreateWithFlags, || unsafe {
        create(stream, flags)
    })
}

/// The priority is accepted and ignored.
#[no_mangle]
pub unsafe extern "C" fn cudaStreamCreateWithPriority(
    stream: *mut CudaStream,
    flags: c_uint,
    _priority: c_int,
) -> c_int {
    // SAFETY: the caller passes NULL or a pointer valid for writing a cudaStream_t.
    runtime_call(Func::cudaStreamCreateWithPriority, || unsafe {
        create(stream, flags)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamDestroy(stream: CudaStream) -> c_int {
    runtime_call(Func::cudaStreamDestroy, || {
        with_state(|st| match st.stream(stream as usize)? {
            StreamId::User(h) => {
                // Work already enqueued still completes: its completions are queued apart.
                st.streams.remove(h);
                // SAFETY: `h` was a registered stream handle, now removed from the registry.
                unsafe { handles::destroy(h) };
                Ok(())
            }
            StreamId::Legacy(_) | StreamId::PerThread(..) => Err(INVALID_RESOURCE_HANDLE),
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamSynchronize(stream: CudaStream) -> c_int {
    runtime_call(Func::cudaStreamSynchronize, || {
        let deadline = with_state(|st| {
            let id = st.stream(stream as usize)?;
            let s = *st.streams.get(id);
            st.use_device(s.device).counters.stream_syncs += 1;
            Ok((s.tail, s.device))
        })?;
        synchronize(deadline.0, deadline.1)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamQuery(stream: CudaStream) -> c_int {
    runtime_call(Func::cudaStreamQuery, || {
        with_state(|st| {
            let id = st.stream(stream as usize)?;
            let s = st.streams.get(id);
            if s.tail > timeline::now() {
                Err(NOT_READY)
            } else {
                Ok(())
            }
        })
    })
}

/// Writes what `get` reads of `stream` to `out`: the stream queries below.
///
/// # Safety
/// `out` must be NULL or valid for writing a `T`.
unsafe fn stream_property<T>(
    func: Func,
    stream: CudaStream,
    out: *mut T,
    get: impl FnOnce(&Stream) -> T,
) -> c_int {
    // SAFETY: forwarded from the caller.
    runtime_call(func, || unsafe {
        let out = Out::new(out)?;
        with_state(|st| {
            let id = st.stream(stream as usize)?;
            out.set(get(st.streams.get(id)));
            Ok(())
        })
    })
}

/// The flags a stream was created with: `cudaStreamNonBlocking` for a non-blocking stream,
/// else 0 (also for the legacy and per-thread default streams).
#[no_mangle]
pub unsafe extern "C" fn cudaStreamGetFlags(stream: CudaStream, flags: *mut c_uint) -> c_int {
    // SAFETY: the caller passes NULL or a pointer valid for writing an unsigned int.
    unsafe {
        stream_property(Func::cudaStreamGetFlags, stream, flags, |s| {
            if s.kind == Kind::NonBlocking {
                NON_BLOCKING
            } else {
                0
            }
        })
    }
}

/// The stream's unique id (`cudaStreamGetId`, CUDA 12): never reused, also after the stream is
/// destroyed and its handle's address is given to a new stream. The legacy default stream has
/// one per device, and each thread's per-thread default stream one per device it used.
#[no_mangle]
pub unsafe extern "C" fn cudaStreamGetId(stream: CudaStream, id: *mut u64) -> c_int {
    // SAFETY: the caller passes NULL or a pointer valid for writing an unsigned long long.
    unsafe { stream_property(Func::cudaStreamGetId, stream, id, |s| s.id) }
}

/// `cudaStreamCaptureStatusActive` (1) between `cudaStreamBeginCapture` and
/// `cudaStreamEndCapture`, else `cudaStreamCaptureStatusNone` (0).
#[no_mangle]
pub unsafe extern "C" fn cudaStreamIsCapturing(stream: CudaStream, status: *mut c_int) -> c_int {
    // SAFETY: the caller passes NULL or a pointer valid for writing the status enum (an int).
    unsafe {
        stream_property(Func::cudaStreamIsCapturing, stream, status, |s| {
            c_int::from(s.capture.is_some())
        })
    }
}

/// Begins a capture (modes 0–2, else 1). The legacy stream cannot be captured (900); a stream
/// already capturing gives 401. Work enqueued during the capture still runs as usual: the
/// graph records nothing (see the README).
#[no_mangle]
pub unsafe extern "C" fn cudaStreamBeginCapture(stream: CudaStream, mode: c_int) -> c_int {
    runtime_call(Func::cudaStreamBeginCapture, || {
        let mode = match mode {
            0 => CaptureMode::Global,
            1 => CaptureMode::ThreadLocal,
            2 => CaptureMode::Relaxed,
            _ => return Err(INVALID_VALUE),
        };
        with_state(|st| {
            let id = st.stream(stream as usize)?;
            if let StreamId::Legacy(_) = id {
                return Err(STREAM_CAPTURE_UNSUPPORTED);
            }
            if st.streams.get(id).capture.is_some() {
                return Err(ILLEGAL_STATE);
            }
            let capture = Capture {
                mode,
                thread: current::thread_key(),
            };
            st.streams.set_capture(id, Some(capture));
            Ok(())
        })
    })
}

/// Ends the stream's capture and gives a new (empty) graph; 401 if it is not capturing.
#[no_mangle]
pub unsafe extern "C" fn cudaStreamEndCapture(stream: CudaStream, graph: *mut CudaGraph) -> c_int {
    runtime_call(Func::cudaStreamEndCapture, || {
        // SAFETY: the caller passes NULL or a pointer valid for writing a cudaGraph_t.
        let out = unsafe { Out::new(graph)? };
        with_state(|st| {
            let id = st.stream(stream as usize)?;
            if st.streams.get(id).capture.is_none() {
                return Err(ILLEGAL_STATE);
            }
            st.streams.set_capture(id, None);
            let h = handles::create(GRAPH_MAGIC);
            st.graphs.insert(h);
            out.set(h as CudaGraph);
            Ok(())
        })
    })
}

/// Destroys a graph of `cudaStreamEndCapture` (NULL: 1; any other unknown handle: 400).
#[no_mangle]
pub unsafe extern "C" fn cudaGraphDestroy(graph: CudaGraph) -> c_int {
    runtime_call(Func::cudaGraphDestroy, || {
        if graph.is_null() {
            return Err(INVALID_VALUE);
        }
        with_state(|st| {
            if !st.graphs.remove(&(graph as usize)) {
                return Err(INVALID_RESOURCE_HANDLE);
            }
            // SAFETY: a handle made by `handles::create`, now removed from its registry.
            unsafe { handles::destroy(graph as usize) };
            Ok(())
        })
    })
}

/// `flags` must be `cudaEventWaitDefault` (0) or `cudaEventWaitExternal` (1).
#[no_mangle]
pub unsafe extern "C" fn cudaStreamWaitEvent(
    stream: CudaStream,
    event: CudaEvent,
    flags: c_uint,
) -> c_int {
    runtime_call(Func::cudaStreamWaitEvent, || {
        if flags > 1 {
            return Err(INVALID_VALUE);
        }
        with_state(|st| {
            let id = st.stream(stream as usize)?;
            // An event never recorded is an empty set of work (CUDA's documentation of
            // cudaEventRecord): waiting on it is taken to order nothing, not even as an action on
            // the legacy stream. The documentation does not say either way; the stricter reading
            // keeps a program (or the pool) from depending on it.
            if let Some(dep) = st.event(event as usize)?.time {
                st.streams.enqueue(id, timeline::now(), 0, dep);
            }
            let d = st.streams.get(id).device;
            st.use_device(d).counters.stream_wait_events += 1;
            Ok(())
        })
    })
}
