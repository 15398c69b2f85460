/* A training-like allocation workload: the sequence of cudaMalloc/cudaFree calls one step of a
 * small transformer makes when a framework allocates every tensor directly (as PyTorch does
 * with PYTORCH_NO_CUDA_MEMORY_CACHING=1). Uses only the CUDA runtime API, so it runs on a GPU
 * and on the project's simulator alike.
 *
 * Parameters, gradients and two Adam states are allocated once; each step allocates per-layer
 * activations kept for the backward pass and short-lived temporaries, frees activations in
 * reverse order during backward, and allocates gradient buckets.
 *
 * usage: train_workload [STEPS] [LAYERS]   prints per-step time and the totals. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cuda_runtime.h>

#define CHECK(call)                                                                            \
    do {                                                                                       \
        cudaError_t e_ = (call);                                                               \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,               \
                    cudaGetErrorString(e_));                                                   \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

#define MAX_LAYERS 48
#define HIDDEN 768
#define SEQ 512
#define BATCH 4
#define FF (4 * HIDDEN)

static unsigned long long g_mallocs, g_frees;

static void *dev_alloc(size_t bytes)
{
    void *p;
    CHECK(cudaMalloc(&p, bytes));
    /* Touch a little of every block, as the first kernel writing to it would. */
    CHECK(cudaMemset(p, 0, bytes < 4096 ? bytes : 4096));
    g_mallocs++;
    return p;
}

static void dev_free(void *p)
{
    CHECK(cudaFree(p));
    g_frees++;
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 20;
    int layers = argc > 2 ? atoi(argv[2]) : 12;
    const size_t f = sizeof(float), tokens = (size_t)BATCH * SEQ;
    /* Per layer: attention (4 h*h) and MLP (2 h*ff) weights plus biases and layer norms. */
    const size_t w_attn = (size_t)HIDDEN * HIDDEN * f, w_mlp = (size_t)HIDDEN * FF * f;
    const size_t small = (size_t)HIDDEN * f;
    void *params[MAX_LAYERS][8], *grads[MAX_LAYERS][8], *adam[MAX_LAYERS][16];
    size_t sizes[8] = {w_attn, w_attn, w_attn, w_attn, w_mlp, w_mlp, small, (size_t)FF * f};
    void *acts[MAX_LAYERS][6];
    double t_total = 0, t_first = 0;
    int l, k, s;

    if (layers < 1 || layers > MAX_LAYERS || steps < 1) {
        fprintf(stderr, "usage: train_workload [STEPS>=1] [LAYERS 1..%d]\n", MAX_LAYERS);
        return 2;
    }
    CHECK(cudaFree(NULL)); /* create the context */
    for (l = 0; l < layers; l++)
        for (k = 0; k < 8; k++) {
            params[l][k] = dev_alloc(sizes[k]);
            adam[l][2 * k] = dev_alloc(sizes[k]);
            adam[l][2 * k + 1] = dev_alloc(sizes[k]);
        }
    void *embed = dev_alloc((size_t)50257 * HIDDEN * f);
    for (s = 0; s < steps; s++) {
        double t0 = now_ms();
        void *x = dev_alloc(tokens * HIDDEN * f);
        /* Forward: per layer, keep activations for backward; temporaries die at once. */
        for (l = 0; l < layers; l++) {
            acts[l][0] = dev_alloc(tokens * HIDDEN * f);           /* ln1 out */
            acts[l][1] = dev_alloc(tokens * 3 * HIDDEN * f);       /* qkv */
            void *scores = dev_alloc((size_t)BATCH * 12 * SEQ * SEQ * f);
            acts[l][2] = dev_alloc((size_t)BATCH * 12 * SEQ * SEQ * f / 2); /* probs (bf16) */
            dev_free(scores);
            acts[l][3] = dev_alloc(tokens * HIDDEN * f);           /* attn out */
            acts[l][4] = dev_alloc(tokens * FF * f);               /* mlp hidden */
            void *gelu_tmp = dev_alloc(tokens * FF * f);
            dev_free(gelu_tmp);
            acts[l][5] = dev_alloc(tokens * HIDDEN * f);           /* residual */
        }
        void *logits = dev_alloc(tokens * 50257 * 2); /* bf16 logits */
        void *loss = dev_alloc(f);
        dev_free(logits);
        /* Backward: gradients per layer (reverse), activations released as they are used. */
        void *dx = dev_alloc(tokens * HIDDEN * f);
        for (l = layers - 1; l >= 0; l--) {
            for (k = 0; k < 8; k++)
                grads[l][k] = dev_alloc(sizes[k]);
            void *tmp = dev_alloc(tokens * FF * f);
            for (k = 5; k >= 0; k--)
                dev_free(acts[l][k]);
            dev_free(tmp);
        }
        /* Gradient buckets for the all-reduce, 25 MiB each. */
        void *bucket[8];
        for (k = 0; k < 8; k++)
            bucket[k] = dev_alloc(25u << 20);
        for (k = 0; k < 8; k++)
            dev_free(bucket[k]);
        /* Optimizer step frees the gradients (set_to_none). */
        for (l = 0; l < layers; l++)
            for (k = 0; k < 8; k++)
                dev_free(grads[l][k]);
        dev_free(dx);
        dev_free(loss);
        dev_free(x);
        CHECK(cudaDeviceSynchronize());
        double dt = now_ms() - t0;
        if (s == 0)
            t_first = dt;
        else
            t_total += dt;
    }
    for (l = 0; l < layers; l++)
        for (k = 0; k < 8; k++) {
            dev_free(params[l][k]);
            dev_free(adam[l][2 * k]);
            dev_free(adam[l][2 * k + 1]);
        }
    dev_free(embed);
    printf("steps %d, layers %d: %llu cudaMalloc and %llu cudaFree calls\n", steps, layers,
           g_mallocs, g_frees);
    printf("first step %.2f ms, later steps %.3f ms each\n", t_first,
           steps > 1 ? t_total / (steps - 1) : 0.0);
    return 0;
}
