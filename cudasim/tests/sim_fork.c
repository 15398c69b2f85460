/* cudasim in a forked child: a fork while another thread's first runtime call is still linking
 * the driver must leave the child a runtime that works. Run with CUDASIM_LINK_DELAY_MS=500, so
 * that the link takes half a second and the main thread forks in the middle of it. */
#include "check.h"

#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static int g_first_call = -1;

static void *first_call(void *arg)
{
    (void)arg;
    void *p = NULL;
    g_first_call = (int)cudaMalloc(&p, 1 << 20);
    if (g_first_call == 0)
        g_first_call = (int)cudaFree(p);
    return NULL;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The child's own calls; its exit status is the first that failed, 0 if none. */
static int child(void)
{
    void *p = NULL;
    if (cudaMalloc(&p, 1 << 20) != cudaSuccess)
        return 2;
    if (cudaMemset(p, 0x5A, 1 << 20) != cudaSuccess)
        return 3;
    if (cudaFree(p) != cudaSuccess)
        return 4;
    return 0;
}

int main(void)
{
    /* A call that needs no driver: the simulator reads its configuration and registers its fork
     * handlers here, so the fork below meets the link alone, not a thread's first set-up. */
    int devices = 0;
    CHECK(cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0, "cudaGetDeviceCount");
    pthread_t t;
    CHECK(pthread_create(&t, NULL, first_call, NULL) == 0, "thread");
    /* Well inside the 500 ms the link takes. */
    sleep_ms(100);
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0)
        _exit(child());
    int status = 0;
    for (int waited_ms = 0;; waited_ms += 10) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        CHECK(r >= 0, "waitpid");
        if (r == pid)
            break;
        if (waited_ms > 20000) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            CHECK(0, "the child did not finish in 20 s: it waits for a link no thread makes");
        }
        sleep_ms(10);
    }
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child failed: status %d", status);
    printf("check: a child forked while the driver was being linked uses the runtime\n");
    pthread_join(t, NULL);
    CHECK(g_first_call == 0, "the parent's first call returned %d", g_first_call);
    printf("sim_fork: all checks passed\n");
    return 0;
}
