//! CUDA error codes (the runtime's `cudaError_t` and the driver's `CUresult`), their names and
//! strings, and the runtime's per-thread last error.

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
pub const CUDART_UNLOADING: Code = 4;
pub const INSUFFICIENT_DRIVER: Code = 35;
pub const INVALID_DEVICE_FUNCTION: Code = 98;
pub const NO_DEVICE: Code = 100;
pub const INVALID_DEVICE: Code = 101;
pub const INVALID_RESOURCE_HANDLE: Code = 400;
pub const SYMBOL_NOT_FOUND: Code = 500;
pub const ILLEGAL_STATE: Code = 401;
pub const NOT_READY: Code = 600;
pub const PEER_ACCESS_ALREADY_ENABLED: Code = 704;
pub const PEER_ACCESS_NOT_ENABLED: Code = 705;
pub const NOT_SUPPORTED: Code = 801;
pub const STREAM_CAPTURE_UNSUPPORTED: Code = 900;
pub const STREAM_CAPTURE_INVALIDATED: Code = 901;
pub const STREAM_CAPTURE_IMPLICIT: Code = 906;
pub const STREAM_CAPTURE_WRONG_THREAD: Code = 908;
pub const UNKNOWN: Code = 999;

/// Every code the simulator knows: (code, name, description).
const TABLE: &[(Code, &CStr, &CStr)] = &[
    (SUCCESS, c"cudaSuccess", c"no error"),
    (INVALID_VALUE, c"cudaErrorInvalidValue", c"invalid argument"),
    (
        SYMBOL_NOT_FOUND,
        c"cudaErrorSymbolNotFound",
        c"named symbol not found",
    ),
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
        CUDART_UNLOADING,
        c"cudaErrorCudartUnloading",
        c"driver shutting down",
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
        PEER_ACCESS_ALREADY_ENABLED,
        c"cudaErrorPeerAccessAlreadyEnabled",
        c"peer access is already enabled",
    ),
    (
        PEER_ACCESS_NOT_ENABLED,
        c"cudaErrorPeerAccessNotEnabled",
        c"peer access has not been enabled",
    ),
    (
        NOT_SUPPORTED,
        c"cudaErrorNotSupported",
        c"operation not supported",
    ),
    (
        STREAM_CAPTURE_UNSUPPORTED,
        c"cudaErrorStreamCaptureUnsupported",
        c"operation not permitted when stream is capturing",
    ),
    (
        STREAM_CAPTURE_INVALIDATED,
        c"cudaErrorStreamCaptureInvalidated",
        c"operation failed due to a previous error during capture",
    ),
    (
        STREAM_CAPTURE_IMPLICIT,
        c"cudaErrorStreamCaptureImplicit",
        c"operation would make the legacy stream depend on a capturing blocking stream",
    ),
    (
        STREAM_CAPTURE_WRONG_THREAD,
        c"cudaErrorStreamCaptureWrongThread",
        c"attempt to terminate a thread-local capture sequence from another thread",
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

/// Parses an error given by number (`2`) or by name (`cudaErrorMemoryAllocation`,
/// `CUDA_ERROR_OUT_OF_MEMORY`).
pub fn parse(text: &str) -> Option<Code> {
    if let Ok(n) = text.parse::<Code>() {
        return Some(n);
    }
    TABLE
        .iter()
        .chain(CU_TABLE)
        .find(|e| e.1.to_bytes() == text.as_bytes())
        .map(|e| e.0)
}

// The driver's `CUresult` values the simulator gives. Most share the runtime's number
// (`CUDA_ERROR_OUT_OF_MEMORY` = `cudaErrorMemoryAllocation` = 2), so the runtime passes a
// driver result through unchanged.
pub const CU_NOT_INITIALIZED: Code = 3;
pub const CU_INVALID_CONTEXT: Code = 201;
pub const CU_INVALID_HANDLE: Code = 400;
pub const CU_NOT_FOUND: Code = 500;
pub const CU_NOT_SUPPORTED: Code = 801;

/// Every `CUresult` the simulator knows: (code, name, description), as the driver gives them.
const CU_TABLE: &[(Code, &CStr, &CStr)] = &[
    (SUCCESS, c"CUDA_SUCCESS", c"no error"),
    (
        INVALID_VALUE,
        c"CUDA_ERROR_INVALID_VALUE",
        c"invalid argument",
    ),
    (
        MEMORY_ALLOCATION,
        c"CUDA_ERROR_OUT_OF_MEMORY",
        c"out of memory",
    ),
    (
        CU_NOT_INITIALIZED,
        c"CUDA_ERROR_NOT_INITIALIZED",
        c"initialization error",
    ),
    (
        NO_DEVICE,
        c"CUDA_ERROR_NO_DEVICE",
        c"no CUDA-capable device is detected",
    ),
    (
        INVALID_DEVICE,
        c"CUDA_ERROR_INVALID_DEVICE",
        c"invalid device ordinal",
    ),
    (
        CU_INVALID_CONTEXT,
        c"CUDA_ERROR_INVALID_CONTEXT",
        c"invalid device context",
    ),
    (
        CU_INVALID_HANDLE,
        c"CUDA_ERROR_INVALID_HANDLE",
        c"invalid resource handle",
    ),
    (
        ILLEGAL_STATE,
        c"CUDA_ERROR_ILLEGAL_STATE",
        c"the operation cannot be performed in the present state",
    ),
    (
        CU_NOT_FOUND,
        c"CUDA_ERROR_NOT_FOUND",
        c"named symbol not found",
    ),
    (NOT_READY, c"CUDA_ERROR_NOT_READY", c"device not ready"),
    (
        PEER_ACCESS_ALREADY_ENABLED,
        c"CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
        c"peer access is already enabled",
    ),
    (
        PEER_ACCESS_NOT_ENABLED,
        c"CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
        c"peer access has not been enabled",
    ),
    (
        CU_NOT_SUPPORTED,
        c"CUDA_ERROR_NOT_SUPPORTED",
        c"operation not supported",
    ),
    (
        STREAM_CAPTURE_UNSUPPORTED,
        c"CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
        c"operation not permitted when stream is capturing",
    ),
    (
        STREAM_CAPTURE_INVALIDATED,
        c"CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
        c"operation failed due to a previous error during capture",
    ),
    (
        STREAM_CAPTURE_IMPLICIT,
        c"CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
        c"operation would make the legacy stream depend on a capturing blocking stream",
    ),
    (
        STREAM_CAPTURE_WRONG_THREAD,
        c"CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
        c"attempt to terminate a thread-local capture sequence from another thread",
    ),
    (UNKNOWN, c"CUDA_ERROR_UNKNOWN", c"unknown error"),
];

/// The `CUresult` of a simulator result: the same number, except that an invalid function
/// (`cudaErrorInvalidDeviceFunction`) is an invalid handle to the driver.
pub fn to_cu(code: Code) -> Code {
    match code {
        INVALID_DEVICE_FUNCTION => CU_INVALID_HANDLE,
        c => c,
    }
}

/// `cuGetErrorName` and `cuGetErrorString`: the enumerator's name and the description, or
/// `None` for a code the driver does not know.
pub fn cu_name_and_description(code: Code) -> Option<(&'static CStr, &'static CStr)> {
    CU_TABLE.iter().find(|e| e.0 == code).map(|e| (e.1, e.2))
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
