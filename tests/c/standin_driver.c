/* A library that exports a driver name itself, as a stand-in or a wrapper of the driver does,
 * for tests/c/driver_standin.c. Its answers are its own: 42 and 43. */
typedef unsigned long long CUdeviceptr;
int cuMemAlloc_v2(CUdeviceptr *dptr, unsigned long bytes);
int cuMemFree_v2(CUdeviceptr dptr);

int cuMemAlloc_v2(CUdeviceptr *dptr, unsigned long bytes)
{
    (void)bytes;
    if (dptr)
        *dptr = 0x4200;
    return 42;
}

int cuMemFree_v2(CUdeviceptr dptr)
{
    (void)dptr;
    return 43;
}
