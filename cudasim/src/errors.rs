//! CUDA error codes, their names and strings, and the thread's last error.

use std::cell::Cell;
use std::ffi::CStr;

/// `cudaError_t`: a C `int`.
pub type Code = i32;

/// The result of an operation of the simulator: `Err` carries a non-zero CUDA error code.
pub type CudaResult<T = ()> = Result<T, Code>;

pub const SUCCESS: Code = 0;
pub const INVALID_VALUE: Code = 1;
pub const MEMORY_ALLOCATION: Code = 2;
pub const INITIALIZATION_ERROR: Code = 3;
pub const INSUFFICIENT_DRIVER: Code = 35;
pub const INVALID_DEVICE_FUNCTION: Code = 98;
pub const NO_DEVICE: Code = 100;
pub const INVALID_DEVICE: Code = 101;
pub const INVALID_RESOURCE_HANDLE: Code = 400;
pub const ILLEGAL_STATE: Code = 401;
pub const NOT_READY: Code = 600;
pub const STREAM_CAPTURE_UNSUPPORTED: Code = 900;
pub const UNKNOWN: Code = 999;

/// Every code the simulator knows: (code, name, description).
const TABLE: &[(Code, &CStr, &CStr)] = &[
    (SUCCESS, c"cudaSuccess", c"no error"),
    (INVALID_VALUE, c"cudaErrorInvalidValue", c"invalid argument"),
    (
        MEMORY_ALLOCATION,
        c"cudaErrorMemoryAllocation",
        c"out of memory",
    ),
    (
        INITIALIZATION_ERROR,
        c"cudaErrorInitializationError",
        c"initialization error",
    ),
    (
        INSUFFICIENT_DRIVER,
        c"cudaErrorInsufficientDriver",
        c"CUDA driver version is insufficient for CUDA runtime version",
    ),
    (
        INVALID_DEVICE_FUNCTION,
        c"cudaErrorInvalidDeviceFunction",
        c"invalid device function",
    ),
    (
        NO_DEVICE,
        c"cudaErrorNoDevice",
        c"no CUDA-capable device is detected",
    ),
    (
        INVALID_DEVICE,
        c"cudaErrorInvalidDevice",
        c"invalid device ordinal",
    ),
    (
        INVALID_RESOURCE_HANDLE,
        c"cudaErrorInvalidResourceHandle",
        c"invalid resource handle",
    ),
    (
        ILLEGAL_STATE,
        c"cudaErrorIllegalState",
        c"the operation cannot be performed in the present state",
    ),
    (NOT_READY, c"cudaErrorNotReady", c"device not ready"),
    (
        STREAM_CAPTURE_UNSUPPORTED,
        c"cudaErrorStreamCaptureUnsupported",
        c"operation not permitted when stream is capturing",
    ),
    (UNKNOWN, c"cudaErrorUnknown", c"unknown error"),
];

const UNRECOGNIZED: &CStr = c"unrecognized error code";

/// `cudaGetErrorName`: the enumerator's name, or "unrecognized error code".
pub fn name(code: Code) -> &'static CStr {
    TABLE
        .iter()
        .find(|e| e.0 == code)
        .map_or(UNRECOGNIZED, |e| e.1)
}

/// `cudaGetErrorString`: the runtime's description, or "unrecognized error code".
pub fn description(code: Code) -> &'static CStr {
    TABLE
        .iter()
        .find(|e| e.0 == code)
        .map_or(UNRECOGNIZED, |e| e.2)
}

/// Parses an error given by number (`2`) or by name (`cudaErrorMemoryAllocation`).
pub fn parse(text: &str) -> Option<Code> {
    if let Ok(n) = text.parse::<Code>() {
        return Some(n);
    }
    TABLE
        .iter()
        .find(|e| e.1.to_bytes() == text.as_bytes())
        .map(|e| e.0)
}

thread_local! {
    static LAST: Cell<Code> = const { Cell::new(SUCCESS) };
}

/// Notes the result of a runtime call: a failure becomes the thread's last error.
/// `cudaErrorNotReady` is a status, not an error: like the real runtime, it is not recorded.
pub fn record(code: Code) {
    if code != SUCCESS && code != NOT_READY {
        // A thread being torn down has no last error to keep.
        let _ = LAST.try_with(|l| l.set(code));
    }
}

/// `cudaGetLastError`: returns the last error and resets it to `cudaSuccess`.
pub fn take_last() -> Code {
    LAST.try_with(|l| l.replace(SUCCESS)).unwrap_or(SUCCESS)
}

/// `cudaPeekAtLastError`: returns the last error and keeps it.
pub fn peek_last() -> Code {
    LAST.try_with(Cell::get).unwrap_or(SUCCESS)
}
