/* cublas_loop: cuBLAS's own allocations under the pool. cuBLAS carries its own static CUDA
 * runtime, so its workspaces reach the pool only through the driver hooks (dlsym and
 * cuGetProcAddress). This program makes no cudaMalloc of its own: its matrices are managed
 * memory, which the pool passes through. So every allocation the pool's summary counts is
 * cuBLAS's. Each round creates a handle, runs SGEMMs of several sizes on a stream, checks one
 * result element, and destroys the handle.
 *
 * usage: cublas_loop [ROUNDS]   Prints rounds=, gemms=, max_error=, then "cublas_loop=ok".
 *
 * The four cuBLAS functions it calls are declared here, with cuBLAS's ABI names, rather than
 * taken from cublas_v2.h: scripts/cu-build-check.sh compiles it where cuBLAS is not installed. */
#include "common.cuh"

typedef struct cublasContext *cublasHandle_t;
typedef int cublasStatus_t;
#define CUBLAS_STATUS_SUCCESS 0
#define CUBLAS_OP_N 0
extern "C" {
cublasStatus_t cublasCreate_v2(cublasHandle_t *handle);
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle);
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, int transa, int transb, int m, int n, int k,
                              const float *alpha, const float *a, int lda, const float *b,
                              int ldb, const float *beta, float *c, int ldc);
}

#define CHECK_BLAS(call)                                                                       \
    do {                                                                                       \
        cublasStatus_t s_ = (call);                                                            \
        REQUIRE(s_ == CUBLAS_STATUS_SUCCESS, "%s returned %d", #call, (int)s_);                 \
    } while (0)

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 20;
    const int sizes[] = {256, 512, 1024, 2048};
    const int n_max = 2048;
    float *a, *b, *c;
    float one = 1.0f, zero = 0.0f, max_error = 0.0f;
    long gemms = 0;
    cudaStream_t stream;

    CHECK(cudaMallocManaged(&a, sizeof(float) * n_max * n_max));
    CHECK(cudaMallocManaged(&b, sizeof(float) * n_max * n_max));
    CHECK(cudaMallocManaged(&c, sizeof(float) * n_max * n_max));
    for (long i = 0; i < (long)n_max * n_max; i++) {
        a[i] = 1.0f;
        b[i] = 2.0f;
    }
    CHECK(cudaStreamCreate(&stream));
    for (int r = 0; r < rounds; r++) {
        cublasHandle_t h;
        CHECK_BLAS(cublasCreate_v2(&h));
        CHECK_BLAS(cublasSetStream_v2(h, stream));
        for (unsigned k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            int n = sizes[k];
            CHECK_BLAS(cublasSgemm_v2(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, n, b, n, &zero,
                                      c, n));
            gemms++;
            CHECK(cudaStreamSynchronize(stream));
            /* Every element of A*B is the sum of n products 1*2. */
            float err = c[(long)(n / 2) * n + n / 3] - 2.0f * n;
            if (err < 0)
                err = -err;
            if (err > max_error)
                max_error = err;
        }
        CHECK_BLAS(cublasDestroy_v2(h));
    }
    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    CHECK(cudaFree(c));
    printf("rounds=%d\ngemms=%ld\nmax_error=%g\n", rounds, gemms, max_error);
    REQUIRE(max_error == 0.0f, "SGEMM gave a wrong result (error %g)", max_error);
    printf("cublas_loop=ok\n");
    return 0;
}
