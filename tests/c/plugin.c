/* A plugin linked with -lgpupool: plugin_run allocates and frees 256 MiB through the pool's C
 * API. Loaded and unloaded again and again by plugin_host.c. */
#include "check.h"
#include "gpupool.h"

int plugin_run(void);

int plugin_run(void)
{
    void *p = NULL;
    CHECK(gpupool_malloc(&p, (size_t)256 << 20) == 0, "gpupool_malloc");
    CHECK(gpupool_free(p) == 0, "gpupool_free");
    return 0;
}
