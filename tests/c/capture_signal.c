/* A signal handler that begins a capture on a thread inside the pool's fence, or that allocates
 * on a thread inside a capture's begin. A thread frees 64 blocks of 1 MiB, which wait for a
 * fence, then asks for MIB MiB, which only they can serve on a small device: the pool fences,
 * and the simulator's CUDASIM_SYNC_DELAY_MS holds that synchronization. WAIT_MS after the
 * request began, the main thread sends SIGUSR1 to that thread, whose handler begins a capture on
 * a blocking stream ("fence": the handler runs on the thread that holds the pool's gate shared).
 * With "begin", the main thread begins the capture instead, and the handler, sent to the main
 * thread from a third thread while that begin waits for the fence, allocates a block of another
 * size (left to the process's exit: a free there would be refused). Usage: capture_signal MIB WAIT_MS fence|begin. Prints "handler_begin=CODE" or
 * "handler_malloc=CODE", "malloc=CODE", "begin=CODE", "end=CODE" and "capture_signal ok". */
#define _POSIX_C_SOURCE 200809L /* nanosleep, sigaction */
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t asking = PTHREAD_COND_INITIALIZER;
static int asked = 0;
static size_t request;
static int malloc_result = -1;
static cudaStream_t s;
static volatile sig_atomic_t handler_result = -1;
static volatile sig_atomic_t handler_began = 0;
static int begin_in_handler;
static pthread_t main_thread;
static long wait_ms;

static void on_usr1(int sig)
{
    (void)sig;
    if (begin_in_handler) {
        handler_result = (int)cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
        handler_began = handler_result == 0;
    } else {
        void *p = NULL;
        handler_result = (int)cudaMalloc(&p, 3 << 20);
    }
}

static void pause_ms(long ms)
{
    struct timespec pause = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&pause, NULL);
}

static void *allocate(void *arg)
{
    void *held[64], *p = NULL;
    (void)arg;
    for (int i = 0; i < 64; i++)
        CHECK_CUDA(cudaMalloc(&held[i], 1 << 20));
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

/* Signals the main thread once its begin waits for the fence. */
static void *signal_main(void *arg)
{
    (void)arg;
    pause_ms(wait_ms);
    pthread_kill(main_thread, SIGUSR1);
    return NULL;
}

int main(int argc, char **argv)
{
    CHECK(argc == 4 && (strcmp(argv[3], "fence") == 0 || strcmp(argv[3], "begin") == 0),
          "usage: capture_signal MIB WAIT_MS fence|begin");
    request = (size_t)atoi(argv[1]) << 20;
    wait_ms = atol(argv[2]);
    begin_in_handler = strcmp(argv[3], "fence") == 0;
    main_thread = pthread_self();
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    CHECK(sigaction(SIGUSR1, &sa, NULL) == 0, "sigaction");
    cudaGraph_t graph = NULL;
    pthread_t t, signaller;
    CHECK_CUDA(cudaStreamCreate(&s));
    /* The main thread's own first calls, before the race. */
    void *warm = NULL;
    CHECK_CUDA(cudaMalloc(&warm, 3 << 20));
    CHECK_CUDA(cudaFree(warm));
    CHECK(pthread_create(&t, NULL, allocate, NULL) == 0, "pthread_create");
    pthread_mutex_lock(&lock);
    while (!asked)
        pthread_cond_wait(&asking, &lock);
    pthread_mutex_unlock(&lock);
    int begin = -1;
    if (begin_in_handler) {
        pause_ms(wait_ms);
        pthread_kill(t, SIGUSR1);
        CHECK(pthread_join(t, NULL) == 0, "pthread_join");
        begin = handler_began ? 0 : -1;
        printf("handler_begin=%d\n", (int)handler_result);
    } else {
        pause_ms(wait_ms);
        CHECK(pthread_create(&signaller, NULL, signal_main, NULL) == 0, "pthread_create");
        begin = (int)cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
        CHECK(pthread_join(signaller, NULL) == 0, "pthread_join");
        CHECK(pthread_join(t, NULL) == 0, "pthread_join");
        printf("handler_malloc=%d\n", (int)handler_result);
    }
    int end = begin == 0 ? (int)cudaStreamEndCapture(s, &graph) : -1;
    if (graph)
        CHECK_CUDA(cudaGraphDestroy(graph));
    (void)cudaGetLastError();
    CHECK_CUDA(cudaStreamDestroy(s));
    printf("malloc=%d\nbegin=%d\nend=%d\n", malloc_result, begin, end);
    printf("capture_signal ok\n");
    return 0;
}
