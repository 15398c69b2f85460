//! The few CUDA runtime types and constants the library needs, with the runtime's values.
//!
//! Declared here rather than taken from `cudarc`: its bindings need a CUDA-version feature and
//! bring thousands of declarations for the dozen we use.

use std::ffi::c_void;

/// `cudaError_t`.
pub type CudaStatus = i32;
pub type Stream = *mut c_void;
/// `cudaGraph_t`.
pub type Graph = *mut c_void;
pub type Event = *mut c_void;
/// `cudaMemPool_t`.
pub type MemPool = *mut c_void;

pub const SUCCESS: CudaStatus = 0;
pub const ERROR_INVALID_VALUE: CudaStatus = 1;
pub const ERROR_MEMORY_ALLOCATION: CudaStatus = 2;
pub const ERROR_INSUFFICIENT_DRIVER: CudaStatus = 35;
pub const ERROR_INVALID_DEVICE_FUNCTION: CudaStatus = 98;
pub const ERROR_INVALID_DEVICE: CudaStatus = 101;
pub const ERROR_INVALID_RESOURCE_HANDLE: CudaStatus = 400;
pub const ERROR_PEER_ACCESS_ALREADY_ENABLED: CudaStatus = 704;
pub const ERROR_UNKNOWN: CudaStatus = 999;

/// `cudaStreamLegacy` and `cudaStreamPerThread`; `0` also means the legacy stream.
pub const STREAM_LEGACY: usize = 0x1;
pub const STREAM_PER_THREAD: usize = 0x2;
/// `cudaStreamNonBlocking`.
pub const STREAM_NON_BLOCKING: u32 = 0x1;
/// `cudaEventDisableTiming`.
pub const EVENT_DISABLE_TIMING: u32 = 0x2;

/// `dim3`, passed by value to `cudaLaunchKernel`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Dim3 {
    pub x: u32,
    pub y: u32,
    pub z: u32,
}

/// `cudaIpcMemHandle_t`.
#[repr(C)]
pub struct IpcMemHandle {
    pub reserved: [u8; 64],
}

/// Whether `stream` is the legacy default stream.
pub fn is_legacy(stream: Stream) -> bool {
    let s = stream as usize;
    s == 0 || s == STREAM_LEGACY
}
