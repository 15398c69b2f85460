//! The exported C API: thin `extern "C"` functions that check their arguments and call into
//! the simulator. One module per family.

mod control;
pub mod device;
mod entry_point;
mod error;
pub mod event;
pub mod kernel;
pub mod memory;
pub mod mempool;
pub mod peer;
pub mod stream;

use std::ffi::c_void;

/// `cudaStream_t`: an opaque pointer (0x0/0x1: legacy stream, 0x2: per-thread stream).
pub type CudaStream = *mut c_void;
/// `cudaEvent_t`: an opaque pointer.
pub type CudaEvent = *mut c_void;
/// `cudaMemPool_t`: an opaque pointer.
pub type CudaMemPool = *mut c_void;
/// `cudaGraph_t`: an opaque pointer.
pub type CudaGraph = *mut c_void;
