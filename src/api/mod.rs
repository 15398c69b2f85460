//! The `gpupool_*` C API (`include/gpupool.h`, generated from this module by cbindgen) and the
//! PyTorch pluggable-allocator entry points.
//!
//! Rules every function follows, as the hooks do:
//! - it runs inside the one panic boundary (`guard::boundary`): a bug gives
//!   `GPUPOOL_ERROR_UNKNOWN` (999), a NULL pointer or a no-op, never an unwind into C;
//! - results are `cudaError_t` values (0 success, 1 invalid value, 2 out of memory,
//!   35 no CUDA runtime, 101 invalid device, 999 internal error);
//! - NULL pointer arguments give 1, except where NULL is documented as meaning "none";
//! - out-parameters are written only on success.
//!
//! The library state is made by the first call, whichever comes first: a hooked CUDA call or a
//! `gpupool_*` call. The runtime is the application's own (`crate::cuda::loader`), or, in a
//! program that links only libgpupool, one loaded by name.
//!
//! Module map: `memory` (allocate and free), `cache` (empty the cache, release threshold),
//! `stats` (counters into a caller's struct), `info` (version, state, summary), `torch`
//! (`CUDAPluggableAllocator` entry points), `context` (the device and state helpers they share).

// In the header's order (cbindgen follows the declarations; blank lines keep rustfmt from
// sorting them).
mod memory;

mod cache;

mod stats;

mod info;

mod torch;

mod context;

pub use cache::*;
pub use info::*;
pub use memory::*;
pub use stats::*;
pub use torch::*;

use std::ffi::c_int;

use crate::cuda::types as cuda;

/// `cudaStream_t`. The header declares it as the CUDA runtime does (`struct CUstream_st *`), only
/// when `cuda_runtime.h` has not declared it already.
#[allow(non_camel_case_types)]
pub type cudaStream_t = cuda::Stream;

/// `ssize_t`, as PyTorch's pluggable allocator passes sizes.
#[allow(non_camel_case_types)]
pub type ssize_t = isize;

/// Success.
pub const GPUPOOL_SUCCESS: c_int = 0;
/// An argument is invalid: a NULL pointer, a bad size, a pointer that is not a live allocation.
pub const GPUPOOL_ERROR_INVALID_VALUE: c_int = 1;
/// Out of device memory, after the pool released what it had cached.
pub const GPUPOOL_ERROR_MEMORY_ALLOCATION: c_int = 2;
/// No CUDA runtime could be found or loaded (one line on stderr says why).
pub const GPUPOOL_ERROR_NO_RUNTIME: c_int = 35;
/// The device ordinal is not a device of this machine (or, for -1, not allowed here).
pub const GPUPOOL_ERROR_INVALID_DEVICE: c_int = 101;
/// An internal error (a bug, reported once on stderr) or a failed write.
pub const GPUPOOL_ERROR_UNKNOWN: c_int = 999;

/// Device argument meaning "every device", where a function allows it.
#[allow(clippy::unnecessary_cast)] // the cast makes the header's macro `(int)-1`, safe to use
pub const GPUPOOL_ALL_DEVICES: c_int = -1 as c_int;
/// Release threshold meaning "keep everything cached" (`GPUPOOL_RELEASE_THRESHOLD=none`).
pub const GPUPOOL_KEEP_ALL: u64 = u64::MAX;

const _: () = {
    assert!(GPUPOOL_SUCCESS == cuda::SUCCESS);
    assert!(GPUPOOL_ERROR_INVALID_VALUE == cuda::ERROR_INVALID_VALUE);
    assert!(GPUPOOL_ERROR_MEMORY_ALLOCATION == cuda::ERROR_MEMORY_ALLOCATION);
    assert!(GPUPOOL_ERROR_NO_RUNTIME == cuda::ERROR_INSUFFICIENT_DRIVER);
    assert!(GPUPOOL_ERROR_INVALID_DEVICE == cuda::ERROR_INVALID_DEVICE);
    assert!(GPUPOOL_ERROR_UNKNOWN == cuda::ERROR_UNKNOWN);
};
