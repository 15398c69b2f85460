//! Events.

use super::{CudaEvent, CudaStream};
use crate::current;
use crate::errors::{
    CudaResult, INVALID_RESOURCE_HANDLE, INVALID_VALUE, NOT_READY, STREAM_CAPTURE_IMPLICIT,
};
use crate::faults::Func;
use crate::ffi::{runtime_call, Out};
use crate::handles::{self, EVENT_MAGIC};
use crate::link;
use crate::state::{synchronize, with_state, Event};
use crate::timeline;
use std::ffi::{c_int, c_uint};

/// `cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess`.
const KNOWN_FLAGS: c_uint = 0x7;
/// `cudaEventDisableTiming`.
const DISABLE_TIMING: c_uint = 0x2;

/// Creates an event of the current device (`cudaEventCreate*`, `cuEventCreate`: the flags
/// have the same values).
///
/// # Safety
/// `event` must be NULL or valid for writing a `cudaEvent_t`.
pub unsafe fn create(event: *mut CudaEvent, flags: c_uint) -> CudaResult {
    // SAFETY: forwarded from the caller.
    let out = unsafe { Out::new(event)? };
    if flags & !KNOWN_FLAGS != 0 {
        return Err(INVALID_VALUE);
    }
    with_state(|st| {
        let device = current::get();
        st.use_device(device);
        let h = handles::create(EVENT_MAGIC);
        st.events.insert(
            h,
            Event {
                device,
                flags,
                time: None,
            },
        );
        out.set(h as CudaEvent);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaEventCreate(event: *mut CudaEvent) -> c_int {
    // SAFETY: the caller passes NULL or a pointer valid for writing a cudaEvent_t.
    runtime_call(Func::cudaEventCreate, || unsafe { create(event, 0) })
}

#[no_mangle]
pub unsafe extern "C" fn cudaEventCreateWithFlags(event: *mut CudaEvent, flags: c_uint) -> c_int {
    // SAFETY: the caller passes NULL or a pointer valid for writing a cudaEvent_t.
    runtime_call(Func::cudaEventCreateWithFlags, || unsafe {
        create(event, flags)
    })
}

/// `cudaEventRecord` and `cuEventRecord`.
pub fn record(event: usize, stream: usize) -> CudaResult {
    with_state(|st| {
        let event_device = st.event(event)?.device;
        let id = st.stream(stream)?;
        // CUDA: the event and the stream must belong to the same device (context).
        if st.streams.get(id).device != event_device {
            return Err(INVALID_RESOURCE_HANDLE);
        }
        if st.streams.refuse_legacy_use(id) {
            return Err(STREAM_CAPTURE_IMPLICIT);
        }
        let time = st.streams.enqueue(id, timeline::now(), 0, 0);
        if let Some(e) = st.events.get_mut(&event) {
            e.time = Some(time);
        }
        let d = st.streams.get(id).device;
        st.use_device(d).counters.event_records += 1;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaEventRecord(event: CudaEvent, stream: CudaStream) -> c_int {
    runtime_call(Func::cudaEventRecord, || {
        record(event as usize, stream as usize)
    })
}

/// `cudaEventQuery` and `cuEventQuery`.
pub fn query(event: usize) -> CudaResult {
    with_state(|st| match st.event(event)?.time {
        Some(t) if t > timeline::now() => Err(NOT_READY),
        _ => Ok(()),
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaEventQuery(event: CudaEvent) -> c_int {
    runtime_call(Func::cudaEventQuery, || query(event as usize))
}

/// `cudaEventSynchronize` and `cuEventSynchronize`.
pub fn synchronize_event(event: usize) -> CudaResult {
    let deadline = with_state(|st| {
        let e = st.event(event)?;
        st.use_device(e.device).counters.event_syncs += 1;
        Ok((e.time.unwrap_or(0), e.device))
    })?;
    synchronize(deadline.0, deadline.1)
}

/// Through the driver (`cuEventSynchronize`).
#[no_mangle]
pub unsafe extern "C" fn cudaEventSynchronize(event: CudaEvent) -> c_int {
    runtime_call(Func::cudaEventSynchronize, || match link::driver() {
        // SAFETY: the driver's cuEventSynchronize.
        Some(d) => link::result(unsafe { (d.event_synchronize)(event) }),
        None => synchronize_event(event as usize),
    })
}

/// Both events must be recorded and timed (`cudaErrorInvalidResourceHandle` otherwise) and
/// complete (`cudaErrorNotReady` otherwise).
#[no_mangle]
pub unsafe extern "C" fn cudaEventElapsedTime(
    ms: *mut f32,
    start: CudaEvent,
    end: CudaEvent,
) -> c_int {
    runtime_call(Func::cudaEventElapsedTime, || {
        // SAFETY: the caller passes NULL or a pointer valid for writing a float.
        let out = unsafe { Out::new(ms)? };
        with_state(|st| {
            let (a, b) = (st.event(start as usize)?, st.event(end as usize)?);
            if (a.flags | b.flags) & DISABLE_TIMING != 0 {
                return Err(INVALID_RESOURCE_HANDLE);
            }
            let (Some(ta), Some(tb)) = (a.time, b.time) else {
                return Err(INVALID_RESOURCE_HANDLE);
            };
            if ta.max(tb) > timeline::now() {
                return Err(NOT_READY);
            }
            out.set(((tb as f64 - ta as f64) / 1e6) as f32);
            Ok(())
        })
    })
}

/// `cudaEventDestroy` and `cuEventDestroy_v2`.
pub fn destroy(event: usize) -> CudaResult {
    with_state(|st| {
        st.event(event)?;
        st.events.remove(&event);
        // SAFETY: the handle was registered, and is now removed from the registry.
        unsafe { handles::destroy(event) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaEventDestroy(event: CudaEvent) -> c_int {
    runtime_call(Func::cudaEventDestroy, || destroy(event as usize))
}
