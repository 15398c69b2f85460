//! The driver API face (`libcuda.so.1` is a second name of this library): the `cu*` functions
//! of `include/cuda.h`, on the same state as the runtime. Every one goes through
//! [`driver_call`]; none touches the runtime's last error (the driver has none).

mod context;
mod green;
mod memory;
mod mempool;
pub(crate) mod proc;
mod stream;
mod vmm;

use crate::config;
use crate::errors::{self, CudaResult, UNKNOWN};
use crate::faults::{self, Func};
use crate::ffi::boundary;
use std::ffi::c_void;

/// `CUresult`.
pub type CuResult = std::ffi::c_int;
/// `CUdevice`.
pub type CuDevice = std::ffi::c_int;
/// `CUdeviceptr`: an `unsigned long long`.
pub type CuDevicePtr = u64;
/// `CUcontext`, `CUstream`, `CUevent`, `CUfunction`: opaque pointers. A `CUstream` is a
/// `cudaStream_t` and a `CUevent` a `cudaEvent_t`, as in CUDA.
pub type CuContext = *mut c_void;
pub type CuStream = *mut c_void;
pub type CuEvent = *mut c_void;
pub type CuFunction = *mut c_void;
/// `CUgraph`: a `cudaGraph_t`.
pub type CuGraph = *mut c_void;

/// Runs the body of the driver function `func`: counts the call for fault injection (an
/// injected fault returns its error as is and skips the body), turns a panic into
/// `CUDA_ERROR_UNKNOWN`, and gives the simulator's error as a `CUresult`.
pub fn driver_call(func: Func, body: impl FnOnce() -> CudaResult) -> CuResult {
    boundary(UNKNOWN, || {
        // Reading the configuration arms `CUDASIM_FAIL` before the first call is counted.
        let _ = config::get();
        match faults::on_call(func) {
            Some(injected) => injected,
            None => body().err().map_or(errors::SUCCESS, errors::to_cu),
        }
    })
}

/// The stream a `_ptsz` variant means: NULL is the calling thread's per-thread default stream
/// (`CU_STREAM_PER_THREAD`), not the legacy one.
fn per_thread(stream: CuStream) -> usize {
    match stream as usize {
        0 => 2,
        s => s,
    }
}

/// Defines a driver function and its `_ptsz` variant, which differ only in the meaning of a
/// NULL stream: `$stream` is bound to the stream's raw value in `$body`.
macro_rules! with_ptsz {
    (
        $(#[$doc:meta])*
        fn $name:ident / $ptsz:ident ($($arg:ident: $ty:ty),* ; $stream:ident) $body:block
    ) => {
        $(#[$doc])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> crate::driver::CuResult {
            let $stream = $stream as usize;
            crate::driver::driver_call(crate::faults::Func::$name, || $body)
        }

        /// The per-thread default stream variant.
        #[no_mangle]
        pub unsafe extern "C" fn $ptsz($($arg: $ty),*) -> crate::driver::CuResult {
            let $stream = crate::driver::per_thread($stream);
            crate::driver::driver_call(crate::faults::Func::$ptsz, || $body)
        }
    };
}
use with_ptsz;
