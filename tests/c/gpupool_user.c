/* A library linked with -lgpupool, for tests/c/driver_late.c: a program that links it loads its
 * own libraries (libc among them) first and libgpupool after them. */
int gpupool_enabled(void);
int gpupool_user_enabled(void);

int gpupool_user_enabled(void)
{
    return gpupool_enabled();
}
