/* A driver-only program frees a 64 MiB block while a 300 ms kernel of its primary context still
 * fills it with 0x44 on a non-blocking stream, then synchronizes with CUDA 13's
 * cuCtxSynchronize_v2, and asks for the same size again. argv[1] says what it synchronizes:
 * "null" (NULL, the primary context current), "primary" (the primary context's handle), "own"
 * (the handle of a context the program made, the primary one current), "own-null" (NULL with
 * that context current), "green" (a green context's handle), "primary-from-green" (the
 * primary context's handle with a green context's current). argv[2] says how it reached the
 * function: "symbol" (-lcuda), "proc" (cuGetProcAddress_v2 of "cuCtxSynchronize_v2" at 13000)
 * or "dlsym". The new owner then writes 0x55 over its first 4 KiB with a synchronous copy,
 * which does not wait for the non-blocking stream; once all work is done its first byte is
 * read back. Prints "reused_same=0|1", "first_byte=N" and "driver_sync_v2 ok". */
#include <cuda.h>
#include <dlfcn.h>

#include "check.h"

#define MIB (1024ull * 1024ull)

typedef CUresult (*sync_v2_fn)(CUcontext);

static sync_v2_fn sync_v2_of(const char *how)
{
    void *f = NULL;
    CUdriverProcAddressQueryResult found;
    if (strcmp(how, "proc") == 0) {
        CHECK_CU(cuGetProcAddress_v2("cuCtxSynchronize_v2", &f, 13000, 0, &found));
    } else if (strcmp(how, "dlsym") == 0) {
        void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        CHECK(driver != NULL, "libcuda.so.1 is loaded");
        f = dlsym(driver, "cuCtxSynchronize_v2");
    } else {
        return cuCtxSynchronize_v2;
    }
    CHECK(f != NULL, "cuCtxSynchronize_v2 by %s", how);
    return (sync_v2_fn)f;
}

/* A green context on all of device 0's SMs, and its context handle. */
static CUgreenCtx make_green(CUcontext *ctx)
{
    CUdevResource all;
    CUdevResourceDesc desc = NULL;
    CUgreenCtx green = NULL;
    CHECK_CU(cuDeviceGetDevResource(0, &all, CU_DEV_RESOURCE_TYPE_SM));
    CHECK_CU(cuDevResourceGenerateDesc(&desc, &all, 1));
    CHECK_CU(cuGreenCtxCreate(&green, desc, 0, CU_GREEN_CTX_DEFAULT_STREAM));
    CHECK_CU(cuCtxFromGreenCtx(ctx, green));
    return green;
}

int main(int argc, char **argv)
{
    const char *what = argc > 1 ? argv[1] : "null";
    sync_v2_fn sync_v2;
    CUcontext primary = NULL, other = NULL;
    CUgreenCtx green = NULL;
    CUstream s;
    CUdeviceptr p, q;
    unsigned char bytes[4096], first = 0;

    CHECK_CU(cuInit(0));
    sync_v2 = sync_v2_of(argc > 2 ? argv[2] : "symbol");
    CHECK_CU(cuDevicePrimaryCtxRetain(&primary, 0));
    CHECK_CU(cuCtxSetCurrent(primary));
    CHECK_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CHECK_CU(cuMemAlloc(&p, 64 * MIB));
    CHECK_CU(cudasim_cu_launch_fill(p, 64 * MIB, 300000, 0x44, s));
    CHECK_CU(cuMemFree(p));
    if (strcmp(what, "null") == 0) {
        CHECK_CU(sync_v2(NULL));
    } else if (strcmp(what, "primary") == 0) {
        CHECK_CU(sync_v2(primary));
    } else if (strcmp(what, "own") == 0) {
        CHECK_CU(cuCtxCreate(&other, 0, 0));
        CHECK_CU(cuCtxSetCurrent(primary));
        CHECK_CU(sync_v2(other));
    } else if (strcmp(what, "own-null") == 0) {
        CHECK_CU(cuCtxCreate(&other, 0, 0));
        CHECK_CU(sync_v2(NULL));
        CHECK_CU(cuCtxSetCurrent(primary));
    } else if (strcmp(what, "green") == 0) {
        green = make_green(&other);
        CHECK_CU(sync_v2(other));
    } else if (strcmp(what, "primary-from-green") == 0) {
        green = make_green(&other);
        CHECK_CU(cuCtxPushCurrent(other));
        CHECK_CU(sync_v2(primary));
        CHECK_CU(cuCtxPopCurrent(&other));
    } else {
        CHECK(0, "unknown mode %s", what);
    }
    CHECK_CU(cuMemAlloc(&q, 64 * MIB));
    printf("reused_same=%d\n", q == p);
    memset(bytes, 0x55, sizeof bytes);
    CHECK_CU(cuMemcpyHtoD(q, bytes, sizeof bytes));
    /* The primary context's synchronization waits for every stream of it, the kernel's too. */
    CHECK_CU(cuCtxSynchronize());
    CHECK_CU(cuMemcpyDtoH(&first, q, 1));
    printf("first_byte=%d\n", first);
    CHECK_CU(cuMemFree(q));
    CHECK_CU(cuStreamDestroy(s));
    if (green != NULL)
        CHECK_CU(cuGreenCtxDestroy(green));
    else if (other != NULL)
        CHECK_CU(cuCtxDestroy(other));
    printf("driver_sync_v2 ok\n");
    return 0;
}
