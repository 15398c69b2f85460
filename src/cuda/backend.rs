//! The pool's backend on the real runtime.

use std::ffi::c_void;
use std::sync::atomic::{AtomicPtr, Ordering};

use super::runtime::Runtime;
use super::types::{Event, EVENT_DISABLE_TIMING, SUCCESS};
use crate::pool::{Addr, Backend, CudaError, MAX_DEVICES};

pub struct CudaBackend {
    rt: Runtime,
    /// One event per device for the barrier: recorded on the legacy stream, then waited on
    /// there. Each is an action on the legacy stream, which waits for all earlier work of the
    /// blocking streams while their later work waits for it (CUDA's stream synchronization
    /// behavior names `cudaStreamWaitEvent`; the programming guide, any command to the NULL
    /// stream). Not a wait alone on an event never recorded: such an event is an empty set of
    /// work, and nothing documents that waiting on it orders anything.
    barrier_events: Vec<AtomicPtr<c_void>>,
    /// Taken to make one: thread caches take barriers outside the device's lock.
    making_event: parking_lot::Mutex<()>,
}

impl CudaBackend {
    pub fn new(rt: Runtime) -> Self {
        CudaBackend {
            rt,
            barrier_events: (0..MAX_DEVICES)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
            making_event: parking_lot::Mutex::new(()),
        }
    }

    /// `cudaDeviceReset` destroyed the device's context and its events with it: the next barrier
    /// makes a new event.
    pub fn forget_device(&self, device: u32) {
        if let Some(slot) = self.barrier_events.get(device as usize) {
            // Not while another thread makes one (it would store it after this).
            let _making = self.making_event.lock();
            slot.store(std::ptr::null_mut(), Ordering::Release);
        }
    }

    fn barrier_event(&self, device: u32) -> Result<Event, CudaError> {
        let slot = &self.barrier_events[device as usize];
        let e = slot.load(Ordering::Acquire);
        if !e.is_null() {
            return Ok(e);
        }
        // One thread makes it (barriers come from the device's lock and from thread caches).
        let _making = self.making_event.lock();
        let e = slot.load(Ordering::Acquire);
        if !e.is_null() {
            return Ok(e);
        }
        let mut e: Event = std::ptr::null_mut();
        // SAFETY: `e` is a valid out-pointer; the device is current (the pool calls barriers
        // from the allocating thread).
        self.check_internal(unsafe {
            (self.rt.event_create_with_flags)(&mut e, EVENT_DISABLE_TIMING)
        })?;
        slot.store(e, Ordering::Release);
        Ok(e)
    }
}

fn check(status: i32) -> Result<(), CudaError> {
    if status == SUCCESS {
        Ok(())
    } else {
        Err(CudaError(status))
    }
}

impl CudaBackend {
    /// `check` for a call the pool made on its own (a fence, a barrier, a segment's release, a
    /// memory sample): the program did not make it, so a failure must not stay behind in its
    /// `cudaGetLastError`. The pool carries on without what the call would have given it; a
    /// sticky error fails the program's next runtime call anyway, with the runtime's own code.
    fn check_internal(&self, status: i32) -> Result<(), CudaError> {
        if status != SUCCESS {
            // SAFETY: no arguments.
            unsafe { (self.rt.get_last_error)() };
        }
        check(status)
    }
}

impl Backend for CudaBackend {
    fn alloc_segment(&self, _device: u32, bytes: u64) -> Result<Addr, CudaError> {
        let bytes = usize::try_from(bytes).map_err(|_| CudaError::MEMORY_ALLOCATION)?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer for the call.
        let status = unsafe { (self.rt.malloc)(&mut p, bytes) };
        if status == SUCCESS {
            return Ok(p as Addr);
        }
        if status == CudaError::MEMORY_ALLOCATION.0 {
            // The pool may recover from this failure; the program must not find it later in
            // cudaGetLastError. When the pool gives up, the hook asks the runtime once more,
            // which sets the error again. Any other error goes back to the program as the
            // result of its cudaMalloc, with the runtime's last error, as without the pool.
            // SAFETY: no arguments.
            unsafe { (self.rt.get_last_error)() };
        }
        Err(CudaError(status))
    }

    fn free_segment(&self, _device: u32, addr: Addr) -> Result<(), CudaError> {
        // SAFETY: `addr` is a segment this backend allocated and the pool no longer uses.
        self.check_internal(unsafe { (self.rt.free)(addr as *mut c_void) })
    }

    fn fence(&self, _device: u32) -> Result<(), CudaError> {
        // SAFETY: no arguments; synchronizes the current device, which is `device`.
        self.check_internal(unsafe { (self.rt.device_synchronize)() })
    }

    fn barrier(&self, device: u32) -> Result<(), CudaError> {
        let e = self.barrier_event(device)?;
        let legacy = std::ptr::null_mut();
        // SAFETY: an event of the current device, and the legacy stream (null).
        let recorded = self.check_internal(unsafe { (self.rt.event_record)(e, legacy) });
        let r = recorded.and_then(|()| {
            // SAFETY: the same event, just recorded, and the legacy stream.
            self.check_internal(unsafe { (self.rt.stream_wait_event)(legacy, e, 0) })
        });
        if r.is_err() {
            // An event a reset destroyed meanwhile: the next barrier makes a new one.
            let _ = self.barrier_events[device as usize].compare_exchange(
                e,
                std::ptr::null_mut(),
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
        r
    }

    fn memory_info(&self, _device: u32) -> Result<(u64, u64), CudaError> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: both out-pointers are valid for the call.
        self.check_internal(unsafe { (self.rt.mem_get_info)(&mut free, &mut total) })?;
        Ok((free as u64, total as u64))
    }
}
