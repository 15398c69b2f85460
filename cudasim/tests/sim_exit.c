/* The runtime at exit, in NVIDIA's order: it registers its teardown at its first call, so an
 * atexit handler registered after that call runs first and is served (the context stack
 * outlives the thread-locals' destructors, which glibc runs before the handlers), while one
 * registered before the first call runs after the teardown and gets
 * cudaErrorCudartUnloading (4). Each handler prints what its calls returned. */
#include "check.h"

#include <stdlib.h>

static void *g_block;

static void report(const char *when)
{
    void *p = NULL;
    int malloc_code = (int)cudaMalloc(&p, 1 << 20);
    int free_code = (int)cudaFree(when[0] == 'a' ? g_block : p);
    cudasimStats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    cudasimGetStats(0, &st);
    printf("%s: cudaMalloc %d, cudaFree %d, live %llu\n", when, malloc_code, free_code,
           st.live_bytes);
    fflush(stdout);
}

static void registered_before(void)
{
    report("before");
}

static void registered_after(void)
{
    report("after");
}

int main(void)
{
    CHECK(atexit(registered_before) == 0, "atexit");
    EXPECT(cudaMalloc(&g_block, 1 << 20), cudaSuccess);
    CHECK(atexit(registered_after) == 0, "atexit");
    printf("sim_exit: main done\n");
    return 0;
}
