/* cudaMallocAsync while the program's own memory pool is current (cudaDeviceSetMemPool): the
 * runtime serves it from that pool (the simulator counts what each pool served), its
 * cudaFreeAsync reaches the runtime, and a block the pool served before the switch frees fine
 * after it. Setting the default pool back, or destroying the program's current pool, makes
 * cudaMallocAsync the pool's again. A pool made current behind the hooks (the runtime's own
 * function, as before the library was loaded) is seen at the device's first cudaMallocAsync.
 * A request from the program's pool that the pool's cache stands in the way of still succeeds.
 * Runs with and without the pool, CUDASIM_DEVICES=2 CUDASIM_MEM=1GiB CUDASIM_CONTEXT_BYTES=0;
 * prints "default_pool_served=N" (what the runtime's default pools served: 0 under the pool),
 * "program_async=N" (the cudaMallocAsync calls from a default pool), "own_pool_async=N" and
 * "own_pool_bytes=N" (the cudaMallocAsync calls the program's own pools served, and their
 * bytes; cudaMallocFromPoolAsync, which names its pool, aside) and "custom_mempool ok". */
#define _GNU_SOURCE /* RTLD_NOLOAD */
#include <dlfcn.h>

#include "check.h"

#define MIB (1024ull * 1024ull)

typedef cudaError_t (*set_mem_pool_fn)(int, cudaMemPool_t);

static unsigned long long served(cudaMemPool_t pool)
{
    unsigned long long n = 0;
    CHECK(cudasimGetPoolMallocs(pool, &n) == 0, "cudasimGetPoolMallocs(%p)", (void *)pool);
    return n;
}

static unsigned long long used(cudaMemPool_t pool)
{
    unsigned long long v = 0;
    CHECK_CUDA(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &v));
    return v;
}

static cudaMemPool_t create_pool(int device, enum cudaMemAllocationHandleType handles)
{
    struct cudaMemPoolProps props;
    cudaMemPool_t pool = NULL;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = handles;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    CHECK_CUDA(cudaMemPoolCreate(&pool, &props));
    return pool;
}

int main(void)
{
    cudaMemPool_t def0, def1, mine, other, late;
    /* A stream the pool knows is the current device's without asking (with two devices, a
     * created one is placed through the driver's cuStreamGetCtx). */
    cudaStream_t s = cudaStreamPerThread;
    void *before, *a, *b;
    unsigned long long mine_served, frees;
    unsigned long long threshold = 64 * MIB;
    int program_async = 0;
    unsigned long long own_async = 0, own_bytes = 0;

    CHECK_CUDA(cudaDeviceGetDefaultMemPool(&def0, 0));
    CHECK_CUDA(cudaDeviceGetDefaultMemPool(&def1, 1));
    /* The program's own pool: IPC-exportable, its own release threshold. */
    mine = create_pool(0, cudaMemHandleTypePosixFileDescriptor);
    other = create_pool(1, cudaMemHandleTypeNone);
    CHECK_CUDA(cudaMemPoolSetAttribute(mine, cudaMemPoolAttrReleaseThreshold, &threshold));

    /* The default pool is current: the request is the pool's. */
    CHECK_CUDA(cudaMallocAsync(&before, MIB, s));
    program_async++;

    /* A pool of another device is refused, as without the pool, and changes nothing. */
    CHECK(cudaDeviceSetMemPool(0, other) == cudaErrorInvalidValue, "another device's pool");
    CHECK(cudaGetLastError() == cudaErrorInvalidValue, "the refusal is the last error");

    CHECK_CUDA(cudaDeviceSetMemPool(0, mine));
    frees = sim_stats(0).free_calls;
    CHECK_CUDA(cudaMallocAsync(&a, MIB, s));
    CHECK_CUDA(cudaMallocAsync(&b, 3 * MIB, 0));
    own_async += 2;
    own_bytes += 4 * MIB;
    CHECK(served(mine) == 2, "the program's pool served %llu of 2 requests", served(mine));
    CHECK(used(mine) == 4 * MIB, "the program's pool holds %llu bytes", used(mine));
    tag_block(a, MIB, 0x5a);
    check_tag(a, MIB, 0x5a);
    /* Their frees reach the runtime; the block from before the switch is the pool's. */
    CHECK_CUDA(cudaFreeAsync(a, s));
    CHECK_CUDA(cudaFree(b));
    CHECK_CUDA(cudaFreeAsync(before, s));
    CHECK(sim_stats(0).free_calls - frees >= 2, "the runtime saw %llu frees",
          sim_stats(0).free_calls - frees);
    CHECK_CUDA(cudaStreamSynchronize(s));
    CHECK(used(mine) == 0, "the program's pool still holds %llu bytes", used(mine));
    /* cudaMallocFromPoolAsync names the pool: the runtime's, as always. */
    CHECK_CUDA(cudaMallocFromPoolAsync(&a, MIB, mine, s));
    CHECK(served(mine) == 3, "cudaMallocFromPoolAsync did not reach the program's pool");
    CHECK_CUDA(cudaFreeAsync(a, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    CHECK_CUDA(cudaMemPoolTrimTo(mine, 0));

    /* The default pool set back: the pool's again. */
    CHECK_CUDA(cudaDeviceSetMemPool(0, def0));
    mine_served = served(mine);
    CHECK_CUDA(cudaMallocAsync(&a, MIB, s));
    program_async++;
    CHECK(served(mine) == mine_served, "the program's pool served after the default came back");
    CHECK_CUDA(cudaFreeAsync(a, s));

    /* Destroying the program's current pool makes the default current: the pool's again. */
    CHECK_CUDA(cudaDeviceSetMemPool(0, mine));
    CHECK_CUDA(cudaMallocAsync(&a, MIB, s));
    own_async++;
    own_bytes += MIB;
    CHECK(served(mine) == mine_served + 1, "the program's pool did not serve");
    CHECK_CUDA(cudaFreeAsync(a, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    CHECK_CUDA(cudaMemPoolDestroy(mine));
    CHECK_CUDA(cudaMallocAsync(&a, MIB, s));
    program_async++;
    CHECK_CUDA(cudaFreeAsync(a, s));

    /* Out of memory in the program's pool while the pool caches a segment: never worse. */
    CHECK_CUDA(cudaMallocAsync(&a, 600 * MIB, s));
    program_async++;
    CHECK_CUDA(cudaFreeAsync(a, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    mine = create_pool(0, cudaMemHandleTypeNone);
    CHECK_CUDA(cudaDeviceSetMemPool(0, mine));
    /* An error left unread outlives the retry, as it would without the pool. */
    CHECK(cudaGetDevice(NULL) == cudaErrorInvalidValue, "cudaGetDevice(NULL)");
    CHECK_CUDA(cudaMallocAsync(&a, 600 * MIB, s));
    own_async++;
    own_bytes += 600 * MIB;
    cudaError_t last = cudaGetLastError();
    CHECK(last == cudaErrorInvalidValue, "after a retried request the last error is %d", last);
    CHECK(cudaGetLastError() == cudaSuccess, "a retried request left an error behind");
    CHECK_CUDA(cudaFreeAsync(a, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    CHECK_CUDA(cudaMemPoolDestroy(mine));

    /* Device 1: its own pool made current with the runtime's own function, which no hook
     * sees, before its first cudaMallocAsync. */
    {
        void *rt = dlopen("libcudart.so.12", RTLD_NOW | RTLD_NOLOAD);
        set_mem_pool_fn set_real;
        CHECK(rt != NULL, "the runtime is not loaded: %s", dlerror());
        *(void **)&set_real = dlsym(rt, "cudaDeviceSetMemPool");
        CHECK(set_real != NULL, "no cudaDeviceSetMemPool in the runtime");
        late = create_pool(1, cudaMemHandleTypeNone);
        CHECK_CUDA(set_real(1, late));
        CHECK_CUDA(cudaSetDevice(1));
        CHECK_CUDA(cudaMallocAsync(&a, MIB, 0));
        own_async++;
        own_bytes += MIB;
        CHECK(served(late) == 1, "device 1's own pool served %llu", served(late));
        CHECK_CUDA(cudaFreeAsync(a, 0));
        CHECK_CUDA(cudaDeviceSetMemPool(1, def1));
        CHECK_CUDA(cudaMallocAsync(&a, MIB, 0));
        program_async++;
        CHECK_CUDA(cudaFreeAsync(a, 0));
        CHECK_CUDA(cudaDeviceSynchronize());
        CHECK_CUDA(cudaMemPoolDestroy(late));
        CHECK_CUDA(cudaSetDevice(0));
        dlclose(rt);
    }
    CHECK_CUDA(cudaMemPoolDestroy(other));
    CHECK_CUDA(cudaDeviceSynchronize());

    printf("default_pool_served=%llu\n", served(def0) + served(def1));
    printf("program_async=%d\n", program_async);
    printf("own_pool_async=%llu\n", own_async);
    printf("own_pool_bytes=%llu\n", own_bytes);
    printf("custom_mempool ok\n");
    return 0;
}
