//! Fault injection: a call counter per exported runtime and driver function, and the faults armed by
//! `CUDASIM_FAIL` or `cudasimFailNext`.
//!
//! A function's calls are counted from the first time a fault is armed for it: `CUDASIM_FAIL`
//! is armed before the first call of the process is counted, so its `N` counts from the
//! start; `cudasimFailNext` counts from the moment it is called. Until then a call costs one
//! relaxed load of a flag that is never written (no shared counter for the hot paths of
//! `cudaGetDevice`/`cudaSetDevice` to contend on). The fault list's lock is taken only while a
//! fault is armed for the function.

use crate::errors::{self, Code};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

macro_rules! functions {
    ($($name:ident),* $(,)?) => {
        /// Every exported runtime function that returns a `cudaError_t` and every driver
        /// function that returns a `CUresult`, named as in C.
        #[allow(non_camel_case_types, clippy::enum_variant_names)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Func { $($name),* }

        impl Func {
            pub const ALL: &'static [Func] = &[$(Func::$name),*];
            pub const COUNT: usize = Self::ALL.len();

            /// The C name of the function.
            pub fn name(self) -> &'static str {
                match self { $(Func::$name => stringify!($name)),* }
            }
        }
    };
}

functions!(
    cudaMalloc,
    cudaFree,
    cudaMallocAsync,
    cudaFreeAsync,
    cudaMallocManaged,
    cudaMallocPitch,
    cudaMallocHost,
    cudaFreeHost,
    cudaMemGetInfo,
    cudaMemcpy,
    cudaMemcpyAsync,
    cudaMemset,
    cudaMemsetAsync,
    cudaGetDevice,
    cudaSetDevice,
    cudaGetDeviceCount,
    cudaDeviceReset,
    cudaDeviceSynchronize,
    cudaStreamCreate,
    cudaStreamCreateWithFlags,
    cudaStreamCreateWithPriority,
    cudaDeviceGetExecutionCtx,
    cudaExecutionCtxGetDevice,
    cudaExecutionCtxStreamCreate,
    cudaStreamDestroy,
    cudaStreamSynchronize,
    cudaStreamQuery,
    cudaStreamGetFlags,
    cudaStreamGetId,
    cudaStreamIsCapturing,
    cudaStreamWaitEvent,
    cudaEventCreate,
    cudaEventCreateWithFlags,
    cudaEventRecord,
    cudaEventQuery,
    cudaEventSynchronize,
    cudaEventElapsedTime,
    cudaEventDestroy,
    cudaLaunchKernel,
    __cudaLaunchKernel,
    cudaPointerGetAttributes,
    cudaIpcGetMemHandle,
    cudaGetLastError,
    cudaPeekAtLastError,
    cudaDriverGetVersion,
    cudaRuntimeGetVersion,
    cudaDeviceGetDefaultMemPool,
    cudaMemPoolGetAttribute,
    cudaMemPoolSetAttribute,
    cudaMemPoolSetAccess,
    cudaMemPoolTrimTo,
    cudaMallocFromPoolAsync,
    cudaMemPoolCreate,
    cudaMemPoolDestroy,
    cudaDeviceSetMemPool,
    cudaDeviceGetMemPool,
    cudaStreamBeginCapture,
    cudaThreadExchangeStreamCaptureMode,
    cudaStreamEndCapture,
    cudaStreamBeginCaptureToGraph,
    cudaGraphCreate,
    cudaGraphDestroy,
    cudaStreamBeginCapture_ptsz,
    cudaStreamBeginCaptureToGraph_ptsz,
    cudaStreamEndCapture_ptsz,
    cudaStreamIsCapturing_ptsz,
    cudaGetDriverEntryPoint,
    cudaGetDriverEntryPointByVersion,
    cudaDeviceCanAccessPeer,
    cudaDeviceEnablePeerAccess,
    cudaDeviceDisablePeerAccess,
    cuInit,
    cuDriverGetVersion,
    cuDeviceGetCount,
    cuDeviceGet,
    cuDeviceGetAttribute,
    cuDevicePrimaryCtxRetain,
    cuDevicePrimaryCtxRelease_v2,
    cuDevicePrimaryCtxReset_v2,
    cuDevicePrimaryCtxGetState,
    cuCtxGetCurrent,
    cuCtxSetCurrent,
    cuCtxGetDevice,
    cuCtxSynchronize,
    cuCtxSynchronize_v2,
    cuCtxCreate_v2,
    cuCtxCreate_v3,
    cuCtxCreate_v4,
    cuCtxDestroy_v2,
    cuCtxPushCurrent_v2,
    cuCtxPopCurrent_v2,
    cuDeviceCanAccessPeer,
    cuCtxEnablePeerAccess,
    cuCtxDisablePeerAccess,
    cuDeviceGetDevResource,
    cuDevSmResourceSplitByCount,
    cuDevResourceGenerateDesc,
    cuGreenCtxCreate,
    cuGreenCtxDestroy,
    cuCtxFromGreenCtx,
    cuGreenCtxStreamCreate,
    cuMemAlloc_v2,
    cuMemAllocPitch_v2,
    cuMemFree_v2,
    cuMemAllocAsync,
    cuMemAllocAsync_ptsz,
    cuMemFreeAsync,
    cuMemFreeAsync_ptsz,
    cuMemAllocFromPoolAsync,
    cuMemAllocFromPoolAsync_ptsz,
    cuMemAllocManaged,
    cuMemPoolCreate,
    cuMemPoolDestroy,
    cuDeviceSetMemPool,
    cuDeviceGetMemPool,
    cuDeviceGetDefaultMemPool,
    cuMemPoolGetAttribute,
    cuMemPoolSetAttribute,
    cuMemPoolSetAccess,
    cuMemPoolTrimTo,
    cuMemGetInfo_v2,
    cuIpcGetMemHandle,
    cuMemGetAddressRange_v2,
    cuMemcpyHtoD_v2,
    cuMemcpyDtoH_v2,
    cuMemGetAllocationGranularity,
    cuMemAddressReserve,
    cuMemAddressFree,
    cuMemCreate,
    cuMemRelease,
    cuMemMap,
    cuMemUnmap,
    cuMemSetAccess,
    cuStreamCreate,
    cuStreamCreateWithPriority,
    cuStreamDestroy_v2,
    cuStreamSynchronize,
    cuStreamSynchronize_ptsz,
    cuStreamQuery,
    cuStreamGetFlags,
    cuStreamGetId,
    cuStreamGetCtx,
    cuStreamIsCapturing,
    cuStreamBeginCapture,
    cuStreamBeginCapture_ptsz,
    cuStreamBeginCapture_v2,
    cuStreamBeginCapture_v2_ptsz,
    cuStreamEndCapture,
    cuStreamEndCapture_ptsz,
    cuStreamBeginCaptureToGraph,
    cuStreamBeginCaptureToGraph_ptsz,
    cuGraphCreate,
    cuGraphDestroy,
    cuStreamWaitEvent,
    cuStreamWaitEvent_ptsz,
    cuEventCreate,
    cuEventRecord,
    cuEventRecord_ptsz,
    cuEventSynchronize,
    cuEventQuery,
    cuEventDestroy_v2,
    cuLaunchKernel,
    cuLaunchKernel_ptsz,
    cuGetErrorString,
    cuGetErrorName,
    cuGetExportTable,
    cuGetProcAddress,
    cuGetProcAddress_v2,
);

impl Func {
    /// Whether it is a driver function (`cu*`, not `cuda*`).
    #[cfg(test)]
    pub fn is_driver(self) -> bool {
        !self.name().starts_with("cuda") && !self.name().starts_with("__cuda")
    }

    /// The function of that C name.
    pub fn from_name(name: &str) -> Option<Func> {
        Func::ALL.iter().copied().find(|f| f.name() == name)
    }
}

/// One fault: the `call`-th call (1-based, counted over the process) of `func` returns `error`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultSpec {
    pub func: Func,
    pub call: u64,
    pub error: Code,
}

/// Whether a function's calls are counted (a fault was armed for it once).
static COUNTING: [AtomicBool; Func::COUNT] = [const { AtomicBool::new(false) }; Func::COUNT];
/// Calls counted so far, per function.
static CALLS: [AtomicU64; Func::COUNT] = [const { AtomicU64::new(0) }; Func::COUNT];
/// Faults armed and not yet fired, per function: the fast path's only check.
static ARMED: [AtomicU32; Func::COUNT] = [const { AtomicU32::new(0) }; Func::COUNT];
/// The armed faults.
static FAULTS: Mutex<Vec<FaultSpec>> = Mutex::new(Vec::new());

/// Parses `NAME@N=ERR[,NAME@N=ERR...]`; `ERR` is a number or an error's name.
pub fn parse_spec(spec: &str) -> Result<Vec<FaultSpec>, String> {
    spec.split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| {
            let bad = || format!("{item:?} is not NAME@N=ERR");
            let (name, rest) = item.split_once('@').ok_or_else(bad)?;
            let (call, error) = rest.split_once('=').ok_or_else(bad)?;
            let func = Func::from_name(name.trim())
                .ok_or_else(|| format!("unknown function {:?}", name.trim()))?;
            let call = call.trim().parse::<u64>().ok().filter(|&n| n >= 1);
            let error = errors::parse(error.trim());
            match (call, error) {
                (Some(call), Some(error)) => Ok(FaultSpec { func, call, error }),
                _ => Err(bad()),
            }
        })
        .collect()
}

fn arm(fault: FaultSpec) {
    let mut faults = FAULTS.lock().unwrap_or_else(PoisonError::into_inner);
    faults.push(fault);
    ARMED[fault.func as usize].fetch_add(1, Ordering::SeqCst);
}

/// Arms the faults of `CUDASIM_FAIL` (called once, when the configuration is read, before any
/// call is counted).
pub fn arm_from_config(faults: &[FaultSpec]) {
    for &fault in faults {
        COUNTING[fault.func as usize].store(true, Ordering::SeqCst);
        arm(fault);
    }
}

/// `cudasimFailNext`: the `nth` next call of `func` (1 = the very next) returns `error`.
pub fn fail_next(func: Func, nth: u64, error: Code) {
    COUNTING[func as usize].store(true, Ordering::SeqCst);
    let call = CALLS[func as usize].load(Ordering::SeqCst) + nth;
    arm(FaultSpec { func, call, error });
}

/// `cudasimCallCount`: the calls of `func` counted so far, counting from now on if it did not.
pub fn call_count(func: Func) -> u64 {
    COUNTING[func as usize].store(true, Ordering::SeqCst);
    CALLS[func as usize].load(Ordering::SeqCst)
}

/// Counts a call of `func`; returns the error to inject if a fault is armed for this call.
pub fn on_call(func: Func) -> Option<Code> {
    if !COUNTING[func as usize].load(Ordering::Relaxed) {
        return None;
    }
    let call = CALLS[func as usize].fetch_add(1, Ordering::SeqCst) + 1;
    if ARMED[func as usize].load(Ordering::SeqCst) == 0 {
        return None;
    }
    let mut faults = FAULTS.lock().unwrap_or_else(PoisonError::into_inner);
    let at = faults
        .iter()
        .position(|f| f.func == func && f.call == call)?;
    let fault = faults.swap_remove(at);
    ARMED[func as usize].fetch_sub(1, Ordering::SeqCst);
    Some(fault.error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for &f in Func::ALL {
            assert_eq!(Func::from_name(f.name()), Some(f));
        }
        assert_eq!(Func::from_name("cudaMallocc"), None);
    }

    #[test]
    fn parses_specs() {
        let faults = parse_spec("cudaMalloc@3=2, cudaFree@1=cudaErrorUnknown").unwrap();
        assert_eq!(
            faults,
            vec![
                FaultSpec {
                    func: Func::cudaMalloc,
                    call: 3,
                    error: 2
                },
                FaultSpec {
                    func: Func::cudaFree,
                    call: 1,
                    error: 999
                },
            ]
        );
        assert!(parse_spec("cudaMalloc@0=2").is_err());
        assert!(parse_spec("cudaMalloc=2").is_err());
        assert!(parse_spec("nope@1=2").is_err());
        assert!(parse_spec("cudaMalloc@1=cudaErrorNope").is_err());
        assert_eq!(parse_spec("").unwrap(), vec![]);
    }
}
