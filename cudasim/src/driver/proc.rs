//! `cuGetProcAddress`/`_v2` (entry points by base name, version and flags), the error names and
//! strings, and `cuGetExportTable` (the private tables are never emulated).

use super::context::*;
use super::green::*;
use super::memory::*;
use super::mempool::*;
use super::stream::*;
use super::vmm::*;
use super::{driver_call, CuResult};
use crate::errors::{self, CudaResult, CU_NOT_FOUND, CU_NOT_SUPPORTED, INVALID_VALUE};
use crate::faults::Func;
use crate::ffi::Out;
use std::ffi::{c_char, c_int, c_void, CStr};

/// `CUdriverProcAddressQueryResult`.
const SUCCESS: c_int = 0;
const SYMBOL_NOT_FOUND: c_int = 1;
const VERSION_NOT_SUFFICIENT: c_int = 2;

/// `CUdriverProcAddress_flags`: `CU_GET_PROC_ADDRESS_LEGACY_STREAM` (1) is what 0 means here;
/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM` (2) asks for the `_ptsz` variants.
const LEGACY_STREAM: u64 = 1;
const PER_THREAD_DEFAULT_STREAM: u64 = 2;

/// One ABI of a base name: the CUDA version that introduced it, the function, and its
/// per-thread default stream variant if it has one.
type Version = (c_int, usize, Option<usize>);

/// The ABIs of `name`, oldest first. The simulator has one ABI per name (the `_v2` where CUDA
/// has several), except `cuGetProcAddress`, `cuCtxCreate` and `cuStreamBeginCapture` (10.0's
/// has no mode); a version below the first is not sufficient.
fn versions(name: &[u8]) -> Vec<Version> {
    macro_rules! one {
        ($v:expr, $f:expr) => {
            vec![($v, $f as *const () as usize, None)]
        };
        ($v:expr, $f:expr, $ptsz:expr) => {
            vec![(
                $v,
                $f as *const () as usize,
                Some($ptsz as *const () as usize),
            )]
        };
    }
    match name {
        b"cuInit" => one!(2000, cuInit),
        b"cuDriverGetVersion" => one!(2020, cuDriverGetVersion),
        b"cuDeviceGetCount" => one!(2000, cuDeviceGetCount),
        b"cuDeviceGet" => one!(2000, cuDeviceGet),
        b"cuDeviceGetAttribute" => one!(2000, cuDeviceGetAttribute),
        b"cuDevicePrimaryCtxRetain" => one!(7000, cuDevicePrimaryCtxRetain),
        b"cuDevicePrimaryCtxRelease" => one!(11000, cuDevicePrimaryCtxRelease_v2),
        b"cuDevicePrimaryCtxReset" => one!(11000, cuDevicePrimaryCtxReset_v2),
        b"cuDevicePrimaryCtxGetState" => one!(7000, cuDevicePrimaryCtxGetState),
        b"cuCtxGetCurrent" => one!(4000, cuCtxGetCurrent),
        b"cuCtxSetCurrent" => one!(4000, cuCtxSetCurrent),
        b"cuCtxGetDevice" => one!(2000, cuCtxGetDevice),
        b"cuCtxSynchronize" => one!(2000, cuCtxSynchronize),
        // CUDA 13 names the context-taking ABI by its own base name, not a later "cuCtxSynchronize".
        b"cuCtxSynchronize_v2" => one!(13000, cuCtxSynchronize_v2),
        b"cuCtxCreate" => vec![
            (3020, cuCtxCreate_v2 as *const () as usize, None),
            (11040, cuCtxCreate_v3 as *const () as usize, None),
            (12050, cuCtxCreate_v4 as *const () as usize, None),
        ],
        b"cuCtxDestroy" => one!(4000, cuCtxDestroy_v2),
        b"cuCtxPushCurrent" => one!(4000, cuCtxPushCurrent_v2),
        b"cuCtxPopCurrent" => one!(4000, cuCtxPopCurrent_v2),
        b"cuDeviceCanAccessPeer" => one!(4000, cuDeviceCanAccessPeer),
        b"cuCtxEnablePeerAccess" => one!(4000, cuCtxEnablePeerAccess),
        b"cuCtxDisablePeerAccess" => one!(4000, cuCtxDisablePeerAccess),
        b"cuDeviceGetDevResource" => one!(12040, cuDeviceGetDevResource),
        b"cuDevSmResourceSplitByCount" => one!(12040, cuDevSmResourceSplitByCount),
        b"cuDevResourceGenerateDesc" => one!(12040, cuDevResourceGenerateDesc),
        b"cuGreenCtxCreate" => one!(12040, cuGreenCtxCreate),
        b"cuGreenCtxDestroy" => one!(12040, cuGreenCtxDestroy),
        b"cuCtxFromGreenCtx" => one!(12040, cuCtxFromGreenCtx),
        b"cuGreenCtxStreamCreate" => one!(12050, cuGreenCtxStreamCreate),
        b"cuMemAlloc" => one!(3020, cuMemAlloc_v2),
        b"cuMemAllocPitch" => one!(3020, cuMemAllocPitch_v2),
        b"cuMemFree" => one!(3020, cuMemFree_v2),
        b"cuMemAllocAsync" => one!(11020, cuMemAllocAsync, cuMemAllocAsync_ptsz),
        b"cuMemFreeAsync" => one!(11020, cuMemFreeAsync, cuMemFreeAsync_ptsz),
        b"cuMemAllocFromPoolAsync" => {
            one!(11020, cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz)
        }
        b"cuMemAllocManaged" => one!(6000, cuMemAllocManaged),
        b"cuMemPoolCreate" => one!(11020, cuMemPoolCreate),
        b"cuMemPoolDestroy" => one!(11020, cuMemPoolDestroy),
        b"cuDeviceSetMemPool" => one!(11020, cuDeviceSetMemPool),
        b"cuDeviceGetMemPool" => one!(11020, cuDeviceGetMemPool),
        b"cuDeviceGetDefaultMemPool" => one!(11020, cuDeviceGetDefaultMemPool),
        b"cuMemPoolGetAttribute" => one!(11020, cuMemPoolGetAttribute),
        b"cuMemPoolSetAttribute" => one!(11020, cuMemPoolSetAttribute),
        b"cuMemPoolSetAccess" => one!(11020, cuMemPoolSetAccess),
        b"cuMemPoolTrimTo" => one!(11020, cuMemPoolTrimTo),
        b"cuMemGetInfo" => one!(3020, cuMemGetInfo_v2),
        b"cuIpcGetMemHandle" => one!(4010, cuIpcGetMemHandle),
        b"cuMemGetAddressRange" => one!(3020, cuMemGetAddressRange_v2),
        b"cuMemcpyHtoD" => one!(3020, cuMemcpyHtoD_v2),
        b"cuMemcpyDtoH" => one!(3020, cuMemcpyDtoH_v2),
        b"cuMemGetAllocationGranularity" => one!(10020, cuMemGetAllocationGranularity),
        b"cuMemAddressReserve" => one!(10020, cuMemAddressReserve),
        b"cuMemAddressFree" => one!(10020, cuMemAddressFree),
        b"cuMemCreate" => one!(10020, cuMemCreate),
        b"cuMemRelease" => one!(10020, cuMemRelease),
        b"cuMemMap" => one!(10020, cuMemMap),
        b"cuMemUnmap" => one!(10020, cuMemUnmap),
        b"cuMemSetAccess" => one!(10020, cuMemSetAccess),
        b"cuStreamCreate" => one!(2000, cuStreamCreate),
        b"cuStreamCreateWithPriority" => one!(5050, cuStreamCreateWithPriority),
        b"cuStreamDestroy" => one!(4000, cuStreamDestroy_v2),
        b"cuStreamSynchronize" => one!(2000, cuStreamSynchronize, cuStreamSynchronize_ptsz),
        b"cuStreamQuery" => one!(2000, cuStreamQuery),
        b"cuStreamGetFlags" => one!(5050, cuStreamGetFlags),
        b"cuStreamGetId" => one!(12000, cuStreamGetId),
        b"cuStreamGetCtx" => one!(9020, cuStreamGetCtx),
        b"cuStreamIsCapturing" => one!(10000, cuStreamIsCapturing),
        b"cuStreamBeginCapture" => vec![
            (
                10000,
                cuStreamBeginCapture as *const () as usize,
                Some(cuStreamBeginCapture_ptsz as *const () as usize),
            ),
            (
                10010,
                cuStreamBeginCapture_v2 as *const () as usize,
                Some(cuStreamBeginCapture_v2_ptsz as *const () as usize),
            ),
        ],
        b"cuStreamEndCapture" => one!(10000, cuStreamEndCapture, cuStreamEndCapture_ptsz),
        b"cuStreamBeginCaptureToGraph" => one!(
            12030,
            cuStreamBeginCaptureToGraph,
            cuStreamBeginCaptureToGraph_ptsz
        ),
        b"cuGraphCreate" => one!(10000, cuGraphCreate),
        b"cuGraphDestroy" => one!(10000, cuGraphDestroy),
        b"cuStreamWaitEvent" => one!(3020, cuStreamWaitEvent, cuStreamWaitEvent_ptsz),
        b"cuEventCreate" => one!(2000, cuEventCreate),
        b"cuEventRecord" => one!(2000, cuEventRecord, cuEventRecord_ptsz),
        b"cuEventSynchronize" => one!(2000, cuEventSynchronize),
        b"cuEventQuery" => one!(2000, cuEventQuery),
        b"cuEventDestroy" => one!(4000, cuEventDestroy_v2),
        b"cuLaunchKernel" => one!(4000, cuLaunchKernel, cuLaunchKernel_ptsz),
        b"cuGetErrorString" => one!(6000, cuGetErrorString),
        b"cuGetErrorName" => one!(6000, cuGetErrorName),
        b"cuGetExportTable" => one!(3000, cuGetExportTable),
        b"cuGetProcAddress" => vec![
            (11030, cuGetProcAddress as *const () as usize, None),
            (12000, cuGetProcAddress_v2 as *const () as usize, None),
        ],
        _ => Vec::new(),
    }
}

/// The driver function of base name `symbol` at `version` with `flags`, as `cuGetProcAddress`
/// finds it: for the runtime's `cudaGetDriverEntryPoint`.
pub(crate) fn lookup(symbol: &[u8], version: c_int, flags: u64) -> Result<usize, c_int> {
    find(symbol, version, flags)
}

/// Looks `symbol` up: the function, or the query result that says why not.
fn find(symbol: &[u8], version: c_int, flags: u64) -> Result<usize, c_int> {
    let all = versions(symbol);
    let (_, legacy, ptsz) =
        all.iter()
            .rev()
            .find(|v| v.0 <= version)
            .copied()
            .ok_or(if all.is_empty() {
                SYMBOL_NOT_FOUND
            } else {
                VERSION_NOT_SUFFICIENT
            })?;
    Ok(match flags {
        PER_THREAD_DEFAULT_STREAM => ptsz.unwrap_or(legacy),
        _ => legacy,
    })
}

/// Both versions of `cuGetProcAddress`: `CUDA_ERROR_NOT_FOUND` (and `*pfn` NULL) for a name
/// the driver does not have or a version below its first.
///
/// # Safety
/// `symbol` must be NULL or a NUL-terminated string; `pfn` NULL or writable; `status` NULL or
/// writable.
unsafe fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CudaResult {
    // SAFETY: forwarded from the caller.
    let out = unsafe { Out::new(pfn)? };
    if symbol.is_null() || flags > LEGACY_STREAM | PER_THREAD_DEFAULT_STREAM {
        return Err(INVALID_VALUE);
    }
    // SAFETY: not NULL, and by the caller's contract NUL-terminated.
    let name = unsafe { CStr::from_ptr(symbol) };
    let found = find(name.to_bytes(), version, flags);
    out.set(found.map_or(std::ptr::null_mut(), |f| f as *mut c_void));
    if !status.is_null() {
        // SAFETY: not NULL, and writable by the caller's contract.
        unsafe { status.write(found.err().unwrap_or(SUCCESS)) };
    }
    found.map(drop).map_err(|_| CU_NOT_FOUND)
}

/// CUDA 11.3's signature. Callable before `cuInit`.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CuResult {
    driver_call(Func::cuGetProcAddress, || {
        // SAFETY: the caller's arguments, as documented.
        unsafe { get_proc_address(symbol, pfn, cuda_version, flags, std::ptr::null_mut()) }
    })
}

/// CUDA 12.0's: also says why a lookup failed (`symbolStatus` may be NULL). Callable before
/// `cuInit`.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    symbol_status: *mut c_int,
) -> CuResult {
    driver_call(Func::cuGetProcAddress_v2, || {
        // SAFETY: the caller's arguments, as documented.
        unsafe { get_proc_address(symbol, pfn, cuda_version, flags, symbol_status) }
    })
}

/// The runtime's private tables: never emulated.
#[no_mangle]
pub unsafe extern "C" fn cuGetExportTable(
    table: *mut *const c_void,
    _id: *const c_void,
) -> CuResult {
    driver_call(Func::cuGetExportTable, || {
        if !table.is_null() {
            // SAFETY: not NULL, and the caller passes a pointer valid for writing a pointer.
            unsafe { table.write(std::ptr::null()) };
        }
        Err(CU_NOT_SUPPORTED)
    })
}

/// Writes the name or description of `error` to `out`; an unknown code gives
/// `CUDA_ERROR_INVALID_VALUE` and NULL.
///
/// # Safety
/// `out` must be NULL or valid for writing a pointer.
unsafe fn describe(error: CuResult, out: *mut *const c_char, name: bool) -> CudaResult {
    // SAFETY: forwarded from the caller.
    let out = unsafe { Out::new(out)? };
    match errors::cu_name_and_description(error) {
        Some((n, d)) => {
            out.set(if name { n } else { d }.as_ptr());
            Ok(())
        }
        None => {
            out.set(std::ptr::null());
            Err(INVALID_VALUE)
        }
    }
}

/// Callable before `cuInit`.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(error: CuResult, text: *mut *const c_char) -> CuResult {
    // SAFETY: the caller passes NULL or a pointer valid for writing a pointer.
    driver_call(Func::cuGetErrorString, || unsafe {
        describe(error, text, false)
    })
}

/// Callable before `cuInit`.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(error: CuResult, text: *mut *const c_char) -> CuResult {
    // SAFETY: the caller passes NULL or a pointer valid for writing a pointer.
    driver_call(Func::cuGetErrorName, || unsafe {
        describe(error, text, true)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_by_version_and_flags() {
        assert_eq!(find(b"cuMemAlloc", 3010, 0), Err(VERSION_NOT_SUFFICIENT));
        assert_eq!(find(b"cuMemAlloc_v2", 12080, 0), Err(SYMBOL_NOT_FOUND));
        assert_eq!(find(b"cuNope", 12080, 0), Err(SYMBOL_NOT_FOUND));
        // (name, version, flags, the function found). CUDA 13's cuCtxCreate is 12.5's ABI.
        macro_rules! at {
            ($f:expr) => {
                $f as *const () as usize
            };
        }
        let capture: &[u8] = b"cuStreamBeginCapture";
        let found: [(&[u8], c_int, u64, usize); 13] = [
            (b"cuMemAlloc", 3020, 0, at!(cuMemAlloc_v2)),
            (b"cuMemAllocAsync", 12080, 2, at!(cuMemAllocAsync_ptsz)),
            (b"cuMemAllocAsync", 12080, 1, at!(cuMemAllocAsync)),
            (b"cuMemAlloc", 12080, 2, at!(cuMemAlloc_v2)),
            (capture, 10000, 2, at!(cuStreamBeginCapture_ptsz)),
            (capture, 12080, 0, at!(cuStreamBeginCapture_v2)),
            (capture, 12080, 2, at!(cuStreamBeginCapture_v2_ptsz)),
            (b"cuGetProcAddress", 11080, 0, at!(cuGetProcAddress)),
            (b"cuGetProcAddress", 12000, 0, at!(cuGetProcAddress_v2)),
            (b"cuCtxCreate", 3020, 0, at!(cuCtxCreate_v2)),
            (b"cuCtxCreate", 11030, 0, at!(cuCtxCreate_v2)),
            (b"cuCtxCreate", 12040, 0, at!(cuCtxCreate_v3)),
            (b"cuCtxCreate", 13000, 0, at!(cuCtxCreate_v4)),
        ];
        for (name, version, flags, f) in found {
            assert_eq!(find(name, version, flags), Ok(f), "{name:?} at {version}");
        }
    }

    /// Every driver function fault injection knows is reachable by its base name.
    #[test]
    fn every_driver_function_is_offered() {
        for f in Func::ALL.iter().filter(|f| f.is_driver()) {
            let name = f.name();
            let base = name
                .strip_suffix("_ptsz")
                .unwrap_or(name)
                .trim_end_matches("_v2")
                .trim_end_matches("_v3")
                .trim_end_matches("_v4");
            let base = if name == "cuGetProcAddress_v2" {
                "cuGetProcAddress"
            } else {
                base
            };
            assert!(!versions(base.as_bytes()).is_empty(), "{name} not offered");
        }
    }

    /// The header and the link-time stub name exactly the driver functions there are.
    #[test]
    fn header_and_stub_list_every_driver_function() {
        let mut exported: Vec<&str> = Func::ALL
            .iter()
            .filter(|f| f.is_driver())
            .map(|f| f.name())
            .collect();
        exported.sort_unstable();
        let stub = include_str!("../../stub/libcuda.c");
        let mut stubs: Vec<&str> = stub
            .lines()
            .filter_map(|l| l.strip_prefix("STUB(")?.strip_suffix(')'))
            .filter(|n| !n.starts_with("cudasim"))
            .collect();
        stubs.sort_unstable();
        assert_eq!(stubs, exported);
        let header = include_str!("../../include/cuda.h");
        let mut declared: Vec<&str> = header
            .lines()
            .filter_map(|l| l.strip_prefix("CUresult ")?.split('(').next())
            .collect();
        declared.sort_unstable();
        assert_eq!(declared, exported);
    }
}
