/* A capture that begins while the pool fences must survive it. CUDA refuses a device
 * synchronization, and a use of the legacy stream, while a blocking stream of the device is
 * being captured, and invalidates the capture. A thread frees 64 blocks of 1 MiB, which wait for
 * a fence (strict) or a barrier, then asks for MIB MiB, which only they can serve on a small
 * device: the pool fences. The simulator's CUDASIM_SYNC_DELAY_MS holds that synchronization
 * before it looks at the captures. Meanwhile, WAIT_MS after the request began, the main thread
 * begins a capture in global mode on a blocking stream; it ends it once the request is served.
 * With "fork", the main thread forks first, and the child begins a capture: a forked child has
 * no pool, and the parent's fence in progress must not hold it ("child_begin=CODE"). With
 * "long", a 3 s kernel on a freed block makes the fence's synchronization long: the begin waits
 * a second at most, not for the whole fence ("begun_during_fence=1").
 * Usage: capture_race MIB WAIT_MS [fork]. Prints "malloc=CODE", "begin=CODE", "end=CODE" and
 * "capture_race ok". */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <pthread.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t asking = PTHREAD_COND_INITIALIZER;
static int asked = 0;
static size_t request;
static volatile int malloc_result = -1;
static int long_kernel = 0;

static void *allocate(void *arg)
{
    void *held[64], *p = NULL;
    (void)arg;
    for (int i = 0; i < 64; i++)
        CHECK_CUDA(cudaMalloc(&held[i], 1 << 20));
    if (long_kernel) {
        cudaStream_t k;
        CHECK_CUDA(cudaStreamCreateWithFlags(&k, cudaStreamNonBlocking));
        CHECK_CUDA(cudasim_launch_fill(held[0], 1 << 20, 3000000, -1, k));
        CHECK_CUDA(cudaStreamDestroy(k));
    }
    for (int i = 0; i < 64; i++)
        CHECK_CUDA(cudaFree(held[i]));
    pthread_mutex_lock(&lock);
    asked = 1;
    pthread_cond_signal(&asking);
    pthread_mutex_unlock(&lock);
    malloc_result = (int)cudaMalloc(&p, request);
    if (malloc_result == 0)
        CHECK_CUDA(cudaFree(p));
    (void)cudaGetLastError();
    return NULL;
}

int main(int argc, char **argv)
{
    int forking = argc == 4 && strcmp(argv[3], "fork") == 0;
    long_kernel = argc == 4 && strcmp(argv[3], "long") == 0;
    CHECK(argc == 3 || forking || long_kernel, "usage: capture_race MIB WAIT_MS [fork|long]");
    request = (size_t)atoi(argv[1]) << 20;
    long wait_ms = atol(argv[2]);
    cudaStream_t s;
    cudaGraph_t graph = NULL;
    pthread_t t;
    CHECK_CUDA(cudaStreamCreate(&s));
    CHECK(pthread_create(&t, NULL, allocate, NULL) == 0, "pthread_create");
    pthread_mutex_lock(&lock);
    while (!asked)
        pthread_cond_wait(&asking, &lock);
    pthread_mutex_unlock(&lock);
    struct timespec pause = {wait_ms / 1000, (wait_ms % 1000) * 1000000L};
    nanosleep(&pause, NULL);
    if (forking) {
        fflush(stdout);
        pid_t child = fork();
        CHECK(child >= 0, "fork");
        if (child == 0) {
            printf("child_begin=%d\n", (int)cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
            fflush(stdout);
            _exit(0);
        }
        int status = 0;
        CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status), "the child");
    }
    int begin = (int)cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    int begun_during_fence = malloc_result == -1;
    CHECK(pthread_join(t, NULL) == 0, "pthread_join");
    int end = begin == 0 ? (int)cudaStreamEndCapture(s, &graph) : -1;
    if (graph)
        CHECK_CUDA(cudaGraphDestroy(graph));
    (void)cudaGetLastError();
    CHECK_CUDA(cudaStreamDestroy(s));
    printf("malloc=%d\nbegin=%d\nend=%d\n", malloc_result, begin, end);
    if (long_kernel)
        printf("begun_during_fence=%d\n", begun_during_fence);
    printf("capture_race ok\n");
    return 0;
}
