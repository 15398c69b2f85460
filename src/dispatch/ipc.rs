//! IPC handles of the pool's memory (`cudaIpcGetMemHandle`, `cuIpcGetMemHandle`). A handle
//! names a whole allocation of `cudaMalloc`: for a block inside a classic segment the importer
//! would map the segment's start, and a block of an expandable segment is CUDA virtual memory,
//! which the driver refuses to name (`CUDA_ERROR_INVALID_VALUE`). Both are refused with that
//! error rather than a handle that maps something else, said once on stderr with the variable
//! that helps, and counted for the summary. Why no shareable handles: docs/design-notes.md.

use std::ffi::c_void;
use std::sync::atomic::AtomicBool;

use super::{forward, runtime};
use crate::cuda::types::*;
use crate::log;
use crate::pool::{Backend, IpcRefusal, Pool};

static INSIDE_SEGMENT: AtomicBool = AtomicBool::new(false);
static MAPPED: AtomicBool = AtomicBool::new(false);

/// Whether an IPC handle for `addr` must be refused; `what` names the call.
pub(crate) fn ipc_refused<B: Backend>(pool: &Pool<B>, addr: u64, what: &str) -> bool {
    let Some(why) = pool.ipc_refusal(addr) else {
        return false;
    };
    pool.note_ipc_refused(why);
    match why {
        IpcRefusal::Mapped => log::warn_once(&MAPPED, || {
            format!(
                "{what}(0x{addr:x}): the pointer is a pool block in CUDA virtual memory \
                 (expandable segments), which IPC handles cannot name; returned an invalid-value \
                 error, as the driver does for such memory (run with GPUPOOL_EXPANDABLE=0 for \
                 classic segments, whose blocks at a segment's start can be shared, or with \
                 GPUPOOL_DISABLE=1) (reported once)"
            )
        }),
        // CUDA refuses freed memory a handle too: nothing to say.
        IpcRefusal::Freed => {}
        IpcRefusal::InsideSegment => log::warn_once(&INSIDE_SEGMENT, || {
            format!(
                "{what}(0x{addr:x}): the pointer is sub-allocated inside a pool segment, and an \
                 IPC handle would map the segment's start instead; returned an invalid-value \
                 error (run with GPUPOOL_DISABLE=1 for IPC-heavy programs)"
            )
        }),
    }
    true
}

/// # Safety
/// As `cudaIpcGetMemHandle`.
pub unsafe fn ipc_get_mem_handle(handle: *mut IpcMemHandle, ptr: *mut c_void) -> CudaStatus {
    let g = match runtime() {
        Ok(g) => g,
        Err(e) => return e,
    };
    // SAFETY: the caller's arguments, passed on unchanged.
    let pass = || forward(g.runtime.ipc_get_mem_handle, |f| unsafe { f(handle, ptr) });
    // No handle to write: the runtime's own refusal, the pool's memory or not.
    match g.pool().filter(|_| !handle.is_null()) {
        Some(pool) if ipc_refused(pool, ptr as u64, "cudaIpcGetMemHandle") => {
            // The runtime's refusal would also be the program's last error: so is this one,
            // set by a call the runtime refuses with the same code and no other effect.
            // SAFETY: a NULL out-pointer, which the runtime refuses with cudaErrorInvalidValue.
            unsafe { (g.runtime.get_device)(std::ptr::null_mut()) };
            ERROR_INVALID_VALUE
        }
        _ => pass(),
    }
}
