// Patch 0024's hang outside llama.cpp: does cuBLAS's TF32 strided-batched SGEMM hang inside a CUDA graph?
//
// In the server's engine on an H200 (CUDA 13), with 0024's guard lifted, a decode of 8 sequences whose quantized V*P
// took 0011's GEMM path (dequantize V to F32, then cublasSgemmStridedBatched in TF32) never finished inside a CUDA
// graph, at the same step in every run; the same GEMM without TF32, or in F16, ran (benchmarks/RESULTS.md, round 6).
// This program issues that GEMM alone, with ggml-cuda's cuBLAS set-up (TF32 math, a 32 MiB workspace on Hopper, a
// non-blocking stream, relaxed capture) and its graph life cycle (capture each step; cudaGraphExecUpdate into the
// instance when the shapes changed, a new instance when that fails; launch), over the shapes a growing context gives:
//   m = 128 (V head), n = tokens x GQA, k = KV cells (multiples of 256), batch = KV heads;
//   MiMo's full layers at 5-8 sequences (n = 80..128, batch 4) and its SWA layers at 8 (n = 64, batch 8).
// Each step is launched --launches times; a launch not done after --timeout-s is a hang: the program prints the shape
// and exits 3 (the GPU may stay busy until the process is gone). Exit 0: no hang.
//
//   nvcc -O2 -std=c++17 -o /tmp/tf32-repro benchmarks/tf32_graph_repro.cu -lcublas
//   timeout 300 /tmp/tf32-repro            # TF32, in CUDA graphs (the engine's case)
//   timeout 300 /tmp/tf32-repro --fp32     # the same without TF32 (ran in the engine)
//   timeout 300 /tmp/tf32-repro --eager    # TF32 without graphs (ran in the engine)
// Options: --k-max N (cells, default 8192), --launches N (per step, default 16), --timeout-s S (default 5).

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <unistd.h>
#include <vector>

#define CHECK_CUDA(x)                                                                             \
    do {                                                                                          \
        cudaError_t err_ = (x);                                                                   \
        if (err_ != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(err_)); \
            exit(2);                                                                              \
        }                                                                                         \
    } while (0)

#define CHECK_CUBLAS(x)                                                                   \
    do {                                                                                  \
        cublasStatus_t st_ = (x);                                                         \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                               \
            fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #x, (int) st_); \
            exit(2);                                                                      \
        }                                                                                 \
    } while (0)

struct shape {
    int n;      // dst columns per V matrix: tokens x GQA
    int batch;  // V matrices: KV heads
    int k;      // KV cells
};

static const int M = 128;  // V head size (ne0)

// wait for the stream, at most timeout_s; false: still running
static bool wait_done(cudaStream_t stream, double timeout_s) {
    const auto t0 = std::chrono::steady_clock::now();
    while (true) {
        const cudaError_t q = cudaStreamQuery(stream);
        if (q == cudaSuccess) {
            return true;
        }
        if (q != cudaErrorNotReady) {
            fprintf(stderr, "cudaStreamQuery: %s\n", cudaGetErrorString(q));
            exit(2);
        }
        const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (dt > timeout_s) {
            return false;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
}

int main(int argc, char ** argv) {
    bool fp32 = false, eager = false;
    int k_max = 8192, launches = 16;
    double timeout_s = 5.0;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--fp32")) {
            fp32 = true;
        } else if (!strcmp(argv[i], "--eager")) {
            eager = true;
        } else if (!strcmp(argv[i], "--k-max") && i + 1 < argc) {
            k_max = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--launches") && i + 1 < argc) {
            launches = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--timeout-s") && i + 1 < argc) {
            timeout_s = atof(argv[++i]);
        } else {
            fprintf(stderr, "unknown argument %s (see the header of this file)\n", argv[i]);
            return 2;
        }
    }

    int dev = 0, cc_major = 0, cc_minor = 0, cublas_ver = 0;
    CHECK_CUDA(cudaSetDevice(dev));
    CHECK_CUDA(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, dev));
    CHECK_CUDA(cudaDeviceGetAttribute(&cc_minor, cudaDevAttrComputeCapabilityMinor, dev));

    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cublasHandle_t handle;
    CHECK_CUBLAS(cublasCreate(&handle));
    CHECK_CUBLAS(cublasGetVersion(handle, &cublas_ver));
    CHECK_CUBLAS(cublasSetMathMode(handle, fp32 ? CUBLAS_DEFAULT_MATH : CUBLAS_TF32_TENSOR_OP_MATH));
    CHECK_CUBLAS(cublasSetStream(handle, stream));
    const size_t ws_size = cc_major >= 9 ? 32u << 20 : 4u << 20;  // as ggml-cuda
    void * ws = nullptr;
    CHECK_CUDA(cudaMalloc(&ws, ws_size));
    CHECK_CUBLAS(cublasSetWorkspace(handle, ws, ws_size));

    // the shapes of a growing context, in the order the engine meets them
    std::vector<shape> shapes;
    for (int k = 256; k <= k_max; k += 256) {
        for (int n : {128, 112, 96, 80}) {
            shapes.push_back({n, 4, k});
        }
        shapes.push_back({64, 8, k});
    }

    // buffers for the largest shape: A = V (m x k per matrix), B = P (k x n per matrix), C = dst (m x n per matrix)
    size_t na = 0, nb = 0, nc = 0;
    for (const shape & s : shapes) {
        na = std::max(na, (size_t) M * s.k * s.batch);
        nb = std::max(nb, (size_t) s.k * s.n * s.batch);
        nc = std::max(nc, (size_t) M * s.n * s.batch);
    }
    float *a = nullptr, *b = nullptr, *c = nullptr;
    CHECK_CUDA(cudaMalloc(&a, na * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&b, nb * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&c, nc * sizeof(float)));
    {
        std::vector<float> h(std::max(na, nb));
        unsigned x = 12345;
        for (float & v : h) {
            x = x * 1664525u + 1013904223u;
            v = (float) (x >> 8) / (float) (1u << 24) - 0.5f;
        }
        CHECK_CUDA(cudaMemcpy(a, h.data(), na * sizeof(float), cudaMemcpyHostToDevice));
        for (float & v : h) {
            v = v + 0.5f;  // non-negative, like a softmax
        }
        CHECK_CUDA(cudaMemcpy(b, h.data(), nb * sizeof(float), cudaMemcpyHostToDevice));
    }

    printf("cuBLAS %d, sm_%d%d, %s, %s, %zu shapes x %d launches\n", cublas_ver, cc_major, cc_minor,
           fp32 ? "F32 math" : "TF32 math", eager ? "eager" : "CUDA graphs", shapes.size(), launches);
    fflush(stdout);

    const float alpha = 1.0f, beta = 0.0f;
    cudaGraphExec_t instance = nullptr;
    int updates = 0, instantiations = 0;
    for (const shape & s : shapes) {
        auto issue = [&]() {
            // as 0011's out_prod_q_gemm: C[m x n] = A[m x k] * B[k x n] per matrix, column-major
            CHECK_CUDA(cudaMemsetAsync(c, 0, (size_t) M * s.n * s.batch * sizeof(float), stream));
            CHECK_CUBLAS(cublasSgemmStridedBatched(handle, CUBLAS_OP_N, CUBLAS_OP_N, M, s.n, s.k, &alpha,
                                                   a, M, (long long) s.k * M, b, s.k, (long long) s.n * s.k, &beta,
                                                   c, M, (long long) s.n * M, s.batch));
        };
        if (!eager) {
            cudaGraph_t graph;
            CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
            issue();
            CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
            bool updated = false;
            if (instance != nullptr) {
                cudaGraphExecUpdateResultInfo info;
                updated = cudaGraphExecUpdate(instance, graph, &info) == cudaSuccess;
                if (!updated) {
                    (void) cudaGetLastError();  // clear the failed update, as ggml-cuda does
                    CHECK_CUDA(cudaGraphExecDestroy(instance));
                    instance = nullptr;
                }
            }
            if (instance == nullptr) {
                CHECK_CUDA(cudaGraphInstantiate(&instance, graph, 0));
                ++instantiations;
            } else {
                ++updates;
            }
            CHECK_CUDA(cudaGraphDestroy(graph));
        }
        for (int r = 0; r < launches; ++r) {
            if (eager) {
                issue();
            } else {
                CHECK_CUDA(cudaGraphLaunch(instance, stream));
            }
            if (!wait_done(stream, timeout_s)) {
                printf("HANG: n %d, batch %d, k %d, launch %d of this shape (%d updates, %d instantiations so far)\n",
                       s.n, s.batch, s.k, r, updates, instantiations);
                fflush(stdout);
                _exit(3);
            }
        }
    }
    printf("no hang: %zu shapes, %d graph updates, %d instantiations\n", shapes.size(), updates, instantiations);
    return 0;
}
