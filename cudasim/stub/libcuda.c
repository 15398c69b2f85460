/*
 * The link-time stub of cudasim's driver face, as NVIDIA's stubs/libcuda.so: a program linked
 * with -lcuda against it records libcuda.so.1 (this stub's soname), which at run time is the
 * simulator itself (simlib/libcuda.so.1, a link to libcudasim.so). The simulator's own soname
 * is libcudart.so.12, so linking against it directly would record the runtime's name.
 * The test harness builds it: cc -shared -fPIC -Wl,-soname,libcuda.so.1. Never run.
 */
#define STUB(name) \
    void name(void); \
    void name(void) {}

STUB(cuInit)
STUB(cuDriverGetVersion)
STUB(cuDeviceGetCount)
STUB(cuDeviceGet)
STUB(cuDevicePrimaryCtxRetain)
STUB(cuDevicePrimaryCtxRelease_v2)
STUB(cuDevicePrimaryCtxReset_v2)
STUB(cuDevicePrimaryCtxGetState)
STUB(cuCtxGetCurrent)
STUB(cuCtxSetCurrent)
STUB(cuCtxGetDevice)
STUB(cuCtxSynchronize)
STUB(cuCtxCreate_v2)
STUB(cuCtxDestroy_v2)
STUB(cuCtxPushCurrent_v2)
STUB(cuCtxPopCurrent_v2)
STUB(cuMemAlloc_v2)
STUB(cuMemFree_v2)
STUB(cuMemAllocAsync)
STUB(cuMemAllocAsync_ptsz)
STUB(cuMemFreeAsync)
STUB(cuMemFreeAsync_ptsz)
STUB(cuMemGetInfo_v2)
STUB(cuIpcGetMemHandle)
STUB(cuMemGetAddressRange_v2)
STUB(cuMemcpyHtoD_v2)
STUB(cuMemcpyDtoH_v2)
STUB(cuStreamCreate)
STUB(cuStreamCreateWithPriority)
STUB(cuStreamDestroy_v2)
STUB(cuStreamSynchronize)
STUB(cuStreamSynchronize_ptsz)
STUB(cuStreamQuery)
STUB(cuStreamGetFlags)
STUB(cuStreamGetId)
STUB(cuStreamIsCapturing)
STUB(cuStreamWaitEvent)
STUB(cuStreamWaitEvent_ptsz)
STUB(cuEventCreate)
STUB(cuEventRecord)
STUB(cuEventRecord_ptsz)
STUB(cuEventSynchronize)
STUB(cuEventQuery)
STUB(cuEventDestroy_v2)
STUB(cuLaunchKernel)
STUB(cuLaunchKernel_ptsz)
STUB(cuGetErrorString)
STUB(cuGetErrorName)
STUB(cuGetProcAddress)
STUB(cuGetProcAddress_v2)
STUB(cuGetExportTable)

/* The simulator's control API (cudasim.h), for driver programs' tests. */
STUB(cudasimGetStats)
STUB(cudasimResetStats)
STUB(cudasimRangeBusy)
STUB(cudasimFailNext)
STUB(cudasim_fill_kernel)
