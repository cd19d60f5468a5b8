// llama-vq: OUT_PROD with a quantized src0 (q4_0, q4_1, q5_0, q5_1, q8_0, iq4_nl) for ggml-cuda and ggml-hip, and
// with a contiguous f16 src0 (the split attention's V, dequantized once for all of its chunks: F16 GEMM).
// Hooked in by patch 0005-cuda-out-prod-quantized: out-prod.cuh includes out-prod-q.cuh, ggml_cuda_out_prod hands a
// quantized or f16 src0 to ggml_cuda_out_prod_q, ggml-cuda.cu's supports_op and CUDA-graph check ask the two predicates.
// The split attention's SOFT_MAX -> TRANSPOSE -> OUT_PROD as one pass (ggml_cuda_out_prod_q_softmax) is matched by
// attn-fusion.cu.

#include "out-prod-q.cuh"
#include "dequantize-x8.cuh"
#include "mma-f16.cuh"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

// OUT_PROD with a quantized src0, typically a row-major quantized V cache:
//   src0 [ne00 = n_embd_v, ne01 = n_kv, ne02 = n_head_kv, ne03]
//   src1 [ne10 = n_tokens, ne11 = n_kv, ne12 = n_head,    ne13] (usually the transposed softmax(KQ))
//   dst  [ne0  = n_embd_v, ne1  = n_tokens, ne2 = n_head, ne3], dst[i0,i1,i2,i3] = sum_k src0[i0,k,i2/dps2,i3/dps3]*src1[i1,k,i2,i3]
// Each thread dequantizes 8 values of a src0 row (a quarter of a 32-value block) and accumulates them into up to
// OUT_PROD_Q_MAX_COLS dst columns (the i1 x dps2 x dps3 columns that share the src0 matrix), so the quantized data
// is read once. Larger batches dequantize src0 once (F32 for TF32 GEMMs on NVIDIA, F16 elsewhere) and use cuBLAS.

#define OUT_PROD_Q_NTHREADS   128
#define OUT_PROD_Q_VPT        8  // values per thread and row
#define OUT_PROD_Q_MAX_COLS   32 // largest number of dst columns per src0 matrix that always uses the vector kernel
#define OUT_PROD_Q_MIN_ROWS   128

// grid: x = chunk of src0 rows (k), y = src0 matrix (i02 + ne02*i03), z = tile of ncols dst columns
// dst columns of a src0 matrix are ordered (i1, i2 % dps2, i3 % dps3), i1 fastest
// with gridDim.x > 1 each chunk writes a partial dst to tmp (contiguous, chunk-major), combined afterwards
template <ggml_type type, int ncols>
static __global__ void __launch_bounds__(OUT_PROD_Q_NTHREADS) k_out_prod_q_vec(
        const char * __restrict__ src0, const float * __restrict__ src1, float * __restrict__ dst,
        const int ne00, const int ne01, const int ne02,
        const int ne1, const int ne2, const int ne3, const int dps2, const int dps3,
        const int64_t nb01, const int64_t nb02, const int64_t nb03,
        const int64_t s10, const int64_t s11, const int64_t s12, const int64_t s13,
        const int64_t s1, const int64_t s2, const int64_t s3,
        const int chunk_rows) {
    constexpr int qr = ggml_cuda_type_traits<type>::qr;
    constexpr int U  = ncols >= 8 ? 2 : 4; // rows in flight per thread

    __shared__ float buf[OUT_PROD_Q_NTHREADS*OUT_PROD_Q_VPT];

    const int tid = threadIdx.x;
    const int tpr = ne00/OUT_PROD_Q_VPT;        // threads per row
    const int rpi = OUT_PROD_Q_NTHREADS/tpr;    // rows per iteration
    const int rg  = tid/tpr;
    const int j   = tid%tpr;
    const bool active = rg < rpi;

    const int im  = blockIdx.y;
    const int i03 = im/ne02;
    const int i02 = im%ne02;

    const int ncols_total = ne1*dps2*dps3;

    // src1 and dst offsets of this thread's columns
    int64_t off1[ncols];
    int64_t offd[ncols];
    bool    valid[ncols];
#pragma unroll
    for (int c = 0; c < ncols; ++c) {
        const int ic = min((int) blockIdx.z*ncols + c, ncols_total - 1);
        valid[c] = (int) blockIdx.z*ncols + c < ncols_total;

        const int i1 = ic % ne1;
        const int i2 = i02*dps2 + (ic/ne1) % dps2;
        const int i3 = i03*dps3 +  ic/(ne1*dps2);

        off1[c] = i1*s10 + i2*s12 + i3*s13;
        offd[c] = i1*s1  + i2*s2  + i3*s3;
    }

    const int k0 = blockIdx.x*chunk_rows;
    const int k1 = min(k0 + chunk_rows, ne01);

    src0 += i02*nb02 + i03*nb03;

    float acc[ncols][OUT_PROD_Q_VPT] = {{0.0f}};

    if (active) {
        for (int kb = k0 + rg; kb < k1; kb += U*rpi) {
            float v[U][OUT_PROD_Q_VPT];
            float p[U][ncols];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int  k  = kb + u*rpi;
                const bool ok = k < k1;
                const int  kc = ok ? k : k0;
                dequantize_x8<type>(src0 + kc*nb01, j, v[u]);
#pragma unroll
                for (int c = 0; c < ncols; ++c) {
                    p[u][c] = ok ? src1[off1[c] + kc*s11] : 0.0f;
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
#pragma unroll
                for (int c = 0; c < ncols; ++c) {
#pragma unroll
                    for (int l = 0; l < OUT_PROD_Q_VPT; ++l) {
                        acc[c][l] += v[u][l]*p[u][c];
                    }
                }
            }
        }
    }

    if (gridDim.x > 1) {
        dst += (int64_t) blockIdx.x*ne00*ne1*ne2*ne3;
    }

    // sum the rpi row groups of each column
#pragma unroll
    for (int c = 0; c < ncols; ++c) {
        if (c > 0) {
            __syncthreads();
        }
        if (active) {
#pragma unroll
            for (int l = 0; l < OUT_PROD_Q_VPT; ++l) {
                buf[rg*ne00 + dequantize_x8_pos<qr>(j, l)] = acc[c][l];
            }
        }
        __syncthreads();
        if (valid[c]) {
            for (int i0 = tid; i0 < ne00; i0 += OUT_PROD_Q_NTHREADS) {
                float sum = 0.0f;
                for (int r = 0; r < rpi; ++r) {
                    sum += buf[r*ne00 + i0];
                }
                dst[offd[c] + i0] = sum;
            }
        }
    }
}

// dst[i] = sum over the nchunks partials tmp[c*ne + i], in a fixed order (deterministic): a block sums 32 elements,
// each with OUT_PROD_Q_COMBINE_LANES threads that take every LANES-th partial, then the lanes are added in order
#define OUT_PROD_Q_COMBINE_LANES 8
static __global__ void __launch_bounds__(32*OUT_PROD_Q_COMBINE_LANES) k_out_prod_q_combine(
        const float * __restrict__ tmp, float * __restrict__ dst, const int64_t ne, const int nchunks) {
    __shared__ float buf[OUT_PROD_Q_COMBINE_LANES][32];

    const int     e    = threadIdx.x % 32;
    const int     lane = threadIdx.x / 32;
    const int64_t i    = (int64_t) blockIdx.x*32 + e;

    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (i < ne) {
        int c = lane;
        for (; c + 3*OUT_PROD_Q_COMBINE_LANES < nchunks; c += 4*OUT_PROD_Q_COMBINE_LANES) {
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                sum[q] += tmp[(int64_t) (c + q*OUT_PROD_Q_COMBINE_LANES)*ne + i];
            }
        }
        for (; c < nchunks; c += OUT_PROD_Q_COMBINE_LANES) {
            sum[0] += tmp[(int64_t) c*ne + i];
        }
    }
    buf[lane][e] = (sum[0] + sum[1]) + (sum[2] + sum[3]);
    __syncthreads();
    if (lane == 0 && i < ne) {
        float total = 0.0f;
#pragma unroll
        for (int q = 0; q < OUT_PROD_Q_COMBINE_LANES; ++q) {
            total += buf[q][e];
        }
        dst[i] = total;
    }
}

// the tensor-core V*P for the split attention's chunks (k_out_prod_q_mma, out_prod_q_mma_chunk_rows)
#include "out-prod-q-mma.cuh"

// The split attention's chunk, SOFT_MAX -> [RESHAPE ->] TRANSPOSE -> OUT_PROD(V, .), where V*P takes the GEMM path with
// an F16 GEMM (HIP's; NVIDIA's under LLAMA_VQ_CUDA_FORCE_F16_GEMM): each row of raw scores x becomes the f16 P that GEMM
// reads, softmax(x*scale + mask) with the sink in the sum (out_prod_q_softmax_args; sm.ml unused), where the softmax's
// output would have been, in two passes over x (an online max and sum, then the normalized exps) instead of the
// softmax's three and P's conversion. A row with every cell masked and no sink becomes 0s. One block per row; a
// block-wide tree in shared memory and no warp shuffles, so one form for 32-lane warps and 64-lane wavefronts.
#define OUT_PROD_Q_SOFTMAX_NT 256

// (m, s) and (m2, s2), each a running max and the sum of exp(x - max) under it, as one pair
static __device__ __forceinline__ void out_prod_q_softmax_merge(float & m, float & s, const float m2, const float s2) {
    const float mn = fmaxf(m, m2);
    if (mn == -INFINITY) {
        return;
    }
    s = s*expf(m - mn) + s2*expf(m2 - mn);
    m = mn;
}

static __global__ void __launch_bounds__(OUT_PROD_Q_SOFTMAX_NT) k_out_prod_q_softmax_f16(
        const float * __restrict__ x, const float * __restrict__ sinks, half * __restrict__ p, const int ncells,
        const out_prod_q_softmax_args sm) {
    __shared__ float red[2][OUT_PROD_Q_SOFTMAX_NT];

    const int64_t row = blockIdx.x;
    const int r1 = (int) (row % sm.ns1);
    const int r2 = (int) ((row/sm.ns1) % sm.ns2);
    const int r3 = (int) (row/((int64_t) sm.ns1*sm.ns2));
    const float * xr = x + row*sm.srow;
    const half  * mr = sm.mask ? sm.mask + r1*sm.mnb1 + (r2 % sm.mne2)*sm.mnb2 + (r3 % sm.mne3)*sm.mnb3 : nullptr;
    half        * pr = p + row*sm.srow;

    float m = -INFINITY;
    float s = 0.0f;
    for (int c = threadIdx.x; c < ncells; c += OUT_PROD_Q_SOFTMAX_NT) {
        const float v = xr[c]*sm.scale + (mr ? __half2float(mr[c]) : 0.0f);
        if (v > m) {
            s = s*expf(m - v) + 1.0f;
            m = v;
        } else if (v != -INFINITY) {
            s += expf(v - m);
        }
    }
    red[0][threadIdx.x] = m;
    red[1][threadIdx.x] = s;
    __syncthreads();
    for (int h = OUT_PROD_Q_SOFTMAX_NT/2; h > 0; h >>= 1) {
        if (threadIdx.x < h) {
            m = red[0][threadIdx.x];
            s = red[1][threadIdx.x];
            out_prod_q_softmax_merge(m, s, red[0][threadIdx.x + h], red[1][threadIdx.x + h]);
            red[0][threadIdx.x] = m;
            red[1][threadIdx.x] = s;
        }
        __syncthreads();
    }
    float M = red[0][0];
    float S = red[1][0];
    if (sinks != nullptr) {
        out_prod_q_softmax_merge(M, S, sinks[r2], 1.0f);
    }
    const float inv = M == -INFINITY ? 0.0f : 1.0f/S;
    for (int c = threadIdx.x; c < ncells; c += OUT_PROD_Q_SOFTMAX_NT) {
        const float v = xr[c]*sm.scale + (mr ? __half2float(mr[c]) : 0.0f);
        pr[c] = __float2half(M == -INFINITY ? 0.0f : expf(v - M)*inv);
    }
}

static void out_prod_q_combine_cuda(const float * tmp, float * dst, const int64_t ne, const int nchunks, cudaStream_t stream) {
    k_out_prod_q_combine<<<(ne + 31)/32, 32*OUT_PROD_Q_COMBINE_LANES, 0, stream>>>(tmp, dst, ne, nchunks);
    CUDA_CHECK(cudaGetLastError());
}

bool ggml_cuda_out_prod_q_supported(const ggml_tensor * src0) {
    if (src0->type == GGML_TYPE_F16) {
        return ggml_is_contiguous(src0); // the GEMM path reads it in place
    }
    return dequantize_x8_type_supported(src0->type) && src0->nb[0] == ggml_type_size(src0->type);
}

// llama-vq: on NVIDIA the vector kernel takes up to OUT_PROD_Q_MID_COLS columns at any V length, and up to
// OUT_PROD_Q_SHORT_COLS columns of a short V (at most OUT_PROD_Q_SHORT_KV cells). The decode of 3-4 sequences at GQA 16
// (MiMo's full-attention layers: 48-64 columns) then keeps its CUDA graph, which the GEMM path loses (see
// ggml_cuda_graph_check_compability); measured on an H200 (benchmarks/RESULTS.md: LLAMA_VQ_CUDA_OUT_PROD_SHORT_KV). HIP keeps 32:
// unmeasured there, and ggml's HIP build runs without CUDA graphs.
#if defined(GGML_USE_HIP) || defined(GGML_USE_MUSA)
#define OUT_PROD_Q_MID_COLS   OUT_PROD_Q_MAX_COLS
#define OUT_PROD_Q_SHORT_KV   0
#else
#define OUT_PROD_Q_MID_COLS   48
#define OUT_PROD_Q_SHORT_KV   4096
#endif
#define OUT_PROD_Q_SHORT_COLS 64

// whether the vector kernel takes ncols dst columns per src0 matrix of ne00 x n_k values
static bool out_prod_q_use_vec(const int64_t ncols, const int64_t ne00, const int64_t n_k) {
    if (ne00 > OUT_PROD_Q_NTHREADS*OUT_PROD_Q_VPT) {
        return false;
    }
    return ncols <= OUT_PROD_Q_MID_COLS || (ncols <= OUT_PROD_Q_SHORT_COLS && n_k <= OUT_PROD_Q_SHORT_KV);
}

// ~128 x 128 dst tiles of the GEMM path's nmat GEMMs of m x n
static int64_t out_prod_q_gemm_tiles(const int64_t m, const int64_t n, const int64_t nmat) {
    return ((m + 127)/128)*((n + 127)/128)*nmat;
}

// whether the tensor-core kernel (k_out_prod_q_mma) takes a quantized src0's dst that the vector kernel does not.
// LLAMA_VQ_CUDA_OUT_PROD_MMA: unset or 1 (the default) the split attention's chunks at long contexts: more than
// OUT_PROD_Q_MMA_MIN_COLS dst columns per V matrix (decode batches, up to 8 sequences at GQA 16, keep their paths) in at
// most OUT_PROD_Q_MMA_MAX_TILES 128 x 128 dst tiles, too few for the GEMM path's cuBLAS call to fill the GPU; 0 never
// (the GEMM path); 2 every shape the kernel takes (tests).
// The bound: on an H200 this kernel alone ran pp512's largest chunk's V*P 2.0x faster than the GEMM path at 8 tiles,
// tied at 16 and lost at ~50; but the chunk's softmax rides along only where this kernel takes the chunk, and end to
// end the pair wins up to 64 tiles (pp512 on an H100 5-16 % faster than the bound 16 from 8K cells, equal at 0-2K) while
// 256 loses at short contexts, where a chunk's many tiles fill the GPU through cuBLAS (benchmarks/RESULTS.md, "the
// tensor-core V*P's tile bound end to end").
#define OUT_PROD_Q_MMA_MIN_COLS  128
#define OUT_PROD_Q_MMA_MAX_TILES 64
static bool out_prod_q_use_mma(const ggml_tensor * dst) {
    static const int mode = [] {
        const char * env = getenv("LLAMA_VQ_CUDA_OUT_PROD_MMA");
        return env == nullptr ? 1 : atoi(env);
    }();
    const ggml_tensor * src0 = dst->src[0];
    const ggml_tensor * src1 = dst->src[1];
    if (mode == 0 || !ggml_is_quantized(src0->type) || src0->ne[0] % OUT_PROD_Q_MMA_M != 0) {
        return false;
    }
    const auto & info = ggml_cuda_info().devices[ggml_cuda_get_device()];
    if (!ampere_mma_available(info.cc)) {
        return false;
    }
    // src1 read k-fastest in runs of 4 floats, at 32-bit offsets
    if (src1->nb[1] != sizeof(float) || src1->nb[0] % 16 != 0 || src1->nb[2] % 16 != 0 || src1->nb[3] % 16 != 0 ||
            (uintptr_t) src1->data % 16 != 0 || ggml_nbytes(src1) > (size_t) INT_MAX*sizeof(float)) {
        return false;
    }
    const int64_t dps2  = dst->ne[2]/src0->ne[2];
    const int64_t ncols = dst->ne[1]*dps2*(dst->ne[3]/src0->ne[3]);
    if (mode >= 2) {
        return true;
    }
    const int64_t tiles = out_prod_q_gemm_tiles(dst->ne[0], dst->ne[1]*dps2, src0->ne[2]*dst->ne[3]);
    return ncols > OUT_PROD_Q_MMA_MIN_COLS && tiles <= OUT_PROD_Q_MMA_MAX_TILES;
}

// llama-vq: whether out_prod_q_cuda takes its GEMM path (dequantize + cuBLAS) for this dst, i.e. neither the vector
// kernel nor the tensor-core one
bool ggml_cuda_out_prod_q_uses_gemm(const ggml_tensor * dst) {
    const ggml_tensor * src0 = dst->src[0];
    if (src0->type == GGML_TYPE_F16) {
        return true;
    }
    const int64_t ncols_total = dst->ne[1]*(dst->ne[2]/src0->ne[2])*(dst->ne[3]/src0->ne[3]);
    return !out_prod_q_use_vec(ncols_total, src0->ne[0], src0->ne[1]) && !out_prod_q_use_mma(dst);
}

// k_out_prod_q_mma's grid for dst: dst columns per src0 matrix from dims 2 and 3 (dps2, dps3), the matrices, the
// (column tile x row block) tiles of each, and the segments of k (out_prod_q_mma_chunk_rows)
struct out_prod_q_mma_plan {
    int64_t dps2, dps3, nmat, nz, nseg;
    int     chunk_rows;
};

static out_prod_q_mma_plan out_prod_q_mma_plan_for(const ggml_tensor * dst) {
    const ggml_tensor * src0 = dst->src[0];
    out_prod_q_mma_plan p;
    p.dps2 = dst->ne[2]/src0->ne[2];
    p.dps3 = dst->ne[3]/src0->ne[3];
    p.nmat = src0->ne[2]*src0->ne[3];
    const int64_t ncols = dst->ne[1]*p.dps2*p.dps3;
    p.nz = (src0->ne[0]/OUT_PROD_Q_MMA_M)*((ncols + OUT_PROD_Q_MMA_N - 1)/OUT_PROD_Q_MMA_N);
    GGML_ASSERT(p.nmat <= 65535 && p.nz <= 65535 && src0->ne[1] <= INT_MAX);
    p.chunk_rows = out_prod_q_mma_chunk_rows(src0->ne[1], p.nmat*p.nz, ggml_cuda_info().devices[ggml_cuda_get_device()].nsm);
    p.nseg = (src0->ne[1] + p.chunk_rows - 1)/p.chunk_rows;
    return p;
}

// k_out_prod_q_mma over segments of k (out_prod_q_mma_chunk_rows), their partial dst summed by k_out_prod_q_combine
template <ggml_type type>
static void out_prod_q_mma_cuda(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * src0 = dst->src[0];
    const ggml_tensor * src1 = dst->src[1];

    GGML_TENSOR_BINARY_OP_LOCALS

    cudaStream_t stream = ctx.stream();

    const out_prod_q_mma_plan p = out_prod_q_mma_plan_for(dst);
    const int64_t nseg = p.nseg;
    const int64_t ne   = ggml_nelements(dst);

    ggml_cuda_pool_alloc<float> tmp(ctx.pool());
    float * out = (float *) dst->data;
    if (nseg > 1) {
        GGML_ASSERT(ggml_is_contiguous(dst));
        out = tmp.alloc(nseg*ne);
    }
    const int64_t s1 = nseg > 1 ? ne0           : nb1/sizeof(float);
    const int64_t s2 = nseg > 1 ? ne0*ne1       : nb2/sizeof(float);
    const int64_t s3 = nseg > 1 ? ne0*ne1*ne2   : nb3/sizeof(float);

    k_out_prod_q_mma<type><<<dim3(nseg, p.nmat, p.nz), OUT_PROD_Q_MMA_NT, 0, stream>>>(
        (const char *) src0->data, (const float *) src1->data, out, ne00, ne01, ne02, ne1, p.dps2, p.dps3,
        nb01, nb02, nb03, nb10/sizeof(float), nb12/sizeof(float), nb13/sizeof(float), s1, s2, s3,
        nseg > 1 ? ne : 0, p.chunk_rows);
    CUDA_CHECK(cudaGetLastError());

    if (nseg > 1) {
        out_prod_q_combine_cuda(out, (float *) dst->data, ne, (int) nseg, stream);
    }
}

// the softmax's mask, its rows' layout and its scale as the fused kernels read them (sm.ml left to the caller)
static out_prod_q_softmax_args out_prod_q_softmax_args_for(const ggml_tensor * softmax) {
    const ggml_tensor * mask = softmax->src[1];
    out_prod_q_softmax_args sm;
    sm.mask  = mask ? (const half *) mask->data : nullptr;
    sm.mnb1  = mask ? mask->nb[1]/sizeof(half) : 0;
    sm.mnb2  = mask ? mask->nb[2]/sizeof(half) : 0;
    sm.mnb3  = mask ? mask->nb[3]/sizeof(half) : 0;
    sm.mne2  = mask ? (int) mask->ne[2] : 1;
    sm.mne3  = mask ? (int) mask->ne[3] : 1;
    sm.ns1   = (int) softmax->ne[1];
    sm.ns2   = (int) softmax->ne[2];
    sm.srow  = (int) (softmax->nb[1]/sizeof(float));
    memcpy(&sm.scale, (const float *) softmax->op_params + 0, sizeof(float));
    sm.ml    = nullptr;
    return sm;
}

// SOFT_MAX -> [RESHAPE ->] TRANSPOSE -> OUT_PROD(V, .) as one pass over the raw scores: k_out_prod_q_mma<type, true>
// (out_prod_q_softmax_args) over the segments out_prod_q_mma_cuda would plan, then k_out_prod_q_softmax_combine
template <ggml_type type>
static void out_prod_q_softmax_cuda(ggml_backend_cuda_context & ctx, const ggml_tensor * softmax, ggml_tensor * dst) {
    const ggml_tensor * src0  = dst->src[0];
    const ggml_tensor * src1  = dst->src[1];
    const ggml_tensor * sinks = softmax->src[2];

    GGML_TENSOR_BINARY_OP_LOCALS

    cudaStream_t stream = ctx.stream();

    const out_prod_q_mma_plan p = out_prod_q_mma_plan_for(dst);
    const int64_t nseg      = p.nseg;
    const int64_t ne        = ggml_nelements(dst);
    const int64_t ncols_all = ne1*ne2*ne3;

    ggml_cuda_pool_alloc<float> tmp(ctx.pool(), nseg*ne + 2*nseg*ncols_all);

    out_prod_q_softmax_args sm = out_prod_q_softmax_args_for(softmax);
    sm.ml = tmp.get() + nseg*ne;

    // the raw scores, at the offsets of the softmax's output that src1 views
    const float * scores = (const float *) softmax->src[0]->data;
    k_out_prod_q_mma<type, true><<<dim3(nseg, p.nmat, p.nz), OUT_PROD_Q_MMA_NT, 0, stream>>>(
        (const char *) src0->data, scores, tmp.get(), ne00, ne01, ne02, ne1, p.dps2, p.dps3,
        nb01, nb02, nb03, nb10/sizeof(float), nb12/sizeof(float), nb13/sizeof(float), ne0, ne0*ne1, ne0*ne1*ne2, ne,
        p.chunk_rows, sm);
    CUDA_CHECK(cudaGetLastError());

    k_out_prod_q_softmax_combine<<<(ne + 255)/256, 256, 0, stream>>>(tmp.get(), sm.ml,
        sinks ? (const float *) sinks->data : nullptr, (float *) dst->data, ne, (int) ne0, ncols_all, (int) nseg,
        (int) ne1, (int) ne2, nb10/sizeof(float), nb12/sizeof(float), nb13/sizeof(float), sm.srow, sm.ns1, sm.ns2);
    CUDA_CHECK(cudaGetLastError());
}

template <ggml_type type, int ncols>
static void out_prod_q_vec_launch(
        const dim3 & grid, const char * src0_d, const float * src1_d, float * dst_d,
        const int64_t ne00, const int64_t ne01, const int64_t ne02, const int64_t ne1, const int64_t ne2, const int64_t ne3,
        const int64_t dps2, const int64_t dps3, const int64_t nb01, const int64_t nb02, const int64_t nb03,
        const int64_t s10, const int64_t s11, const int64_t s12, const int64_t s13,
        const int64_t s1, const int64_t s2, const int64_t s3, const int chunk_rows, cudaStream_t stream) {
    k_out_prod_q_vec<type, ncols><<<grid, OUT_PROD_Q_NTHREADS, 0, stream>>>(
        src0_d, src1_d, dst_d, ne00, ne01, ne02, ne1, ne2, ne3, dps2, dps3,
        nb01, nb02, nb03, s10, s11, s12, s13, s1, s2, s3, chunk_rows);
}

// k segments of the GEMM path (1: none): enough ~128 x 128 dst tiles for two per SM, each segment at least
// OUT_PROD_Q_SPLIT_K_MIN values of k long, at most OUT_PROD_Q_SPLIT_K_MAX segments
#define OUT_PROD_Q_SPLIT_K_MIN 2048
#define OUT_PROD_Q_SPLIT_K_MAX 64
static int64_t out_prod_q_gemm_splits(const int64_t m, const int64_t n, const int64_t k, const int64_t nmat, const int nsm) {
    const int64_t tiles = out_prod_q_gemm_tiles(m, n, nmat);
    if (tiles >= 2*nsm || k < 2*OUT_PROD_Q_SPLIT_K_MIN) {
        return 1;
    }
    const int64_t want = (2*nsm + tiles - 1)/tiles;
    return std::max<int64_t>(1, std::min({want, k/OUT_PROD_Q_SPLIT_K_MIN, (int64_t) OUT_PROD_Q_SPLIT_K_MAX}));
}

// src1_ready: src1 already as T, k fastest, laid out as a k-contiguous src1 (out_prod_q_softmax_gemm_cuda's P), or nullptr
template <typename T>
static void out_prod_q_gemm(ggml_backend_cuda_context & ctx, ggml_tensor * dst, const T * src1_ready = nullptr) {
    const ggml_tensor * src0 = dst->src[0];
    const ggml_tensor * src1 = dst->src[1];

    GGML_TENSOR_BINARY_OP_LOCALS

    cudaStream_t stream = ctx.stream();

    const int64_t dps2 = ne2 / ne02;
    const int64_t dps3 = ne3 / ne03;

    // src0 as T: dequantized here, or an f16 src0 (contiguous: ggml_cuda_out_prod_q_supported) read in place
    ggml_cuda_pool_alloc<T> src0_alloc(ctx.pool());
    const T * src0_t = nullptr;
    if (src0->type == GGML_TYPE_F16) {
        GGML_ASSERT((std::is_same_v<T, half>));
        src0_t = (const T *) src0->data;
    } else {
        src0_alloc.alloc(ggml_nelements(src0));
        dequantize_x8_rows_cuda<T>(src0->type, src0->data, src0_alloc.get(), ne00, ne01, ne02, ne03, nb01, nb02, nb03, stream);
        src0_t = src0_alloc.get();
    }

    // src1 with k fastest: the transposed view of a contiguous [ne11, ne10, ne12, ne13] tensor (kq) already is
    const bool src1_k_contiguous = nb11 == sizeof(float) && nb10 == ne11*nb11 && nb12 == ne10*nb10 && nb13 == ne12*nb12;

    const T * src1_t_ptr = nullptr;
    ggml_cuda_pool_alloc<T> src1_t(ctx.pool());
    if (src1_ready != nullptr) {
        GGML_ASSERT(src1_k_contiguous);
        src1_t_ptr = src1_ready;
    } else if (std::is_same_v<T, float> && src1_k_contiguous) {
        src1_t_ptr = (const T *) src1->data;
    } else if (std::is_same_v<T, half> && src1_k_contiguous) {
        src1_t.alloc(ggml_nelements(src1));
        ggml_get_to_fp16_cuda(GGML_TYPE_F32)(src1->data, (half *) src1_t.get(), ggml_nelements(src1), stream);
        src1_t_ptr = src1_t.get();
    } else {
        src1_t.alloc(ggml_nelements(src1));
        copy_strided_f32_cuda<T>((const float *) src1->data, src1_t.get(), ne11, ne10, ne12, ne13,
                nb11/sizeof(float), nb10/sizeof(float), nb12/sizeof(float), nb13/sizeof(float), stream);
        src1_t_ptr = src1_t.get();
    }

    cublasHandle_t handle = ctx.cublas_handle();
    const int64_t nsplit = out_prod_q_gemm_splits(ne0, ne1*dps2, ne01, ne02*ne3, ggml_cuda_info().devices[ggml_cuda_get_device()].nsm);
    if (nsplit == 1) {
        for (int64_t i3 = 0; i3 < ne3; ++i3) {
            gemm_strided_batched_cuda<T>(handle, false, ne0, ne1*dps2, ne01,
                    src0_t       + (i3/dps3)*ne02*ne01*ne00, ne00, ne01*ne00,
                    src1_t_ptr   +  i3*ne2*ne1*ne11,         ne11, dps2*ne1*ne11,
                    (float *) dst->data + i3*ne2*ne1*ne0,    ne0,  dps2*ne1*ne0,
                    ne02);
        }
        return;
    }

    // split-K: few dst tiles over a long k (the split attention's chunk: 128 x 256 per KV head over 64K-128K cells)
    // would leave most SMs idle, so k is cut into nsplit segments, one partial dst per segment (one strided-batched
    // GEMM per src0 matrix over its segments, the last segment's remainder its own GEMM), summed afterwards
    const int64_t ne    = ggml_nelements(dst);
    const int64_t kseg  = (ne01 + nsplit - 1)/nsplit;
    const int64_t nfull = ne01/kseg;
    const int64_t krem  = ne01 - nfull*kseg;
    const int64_t nseg  = nfull + (krem > 0);
    ggml_cuda_pool_alloc<float> part(ctx.pool(), nseg*ne);
    for (int64_t i3 = 0; i3 < ne3; ++i3) {
        for (int64_t i02 = 0; i02 < ne02; ++i02) {
            const T * a = src0_t       + ((i3/dps3)*ne02 + i02)*ne01*ne00;
            const T * b = src1_t_ptr   + i3*ne2*ne1*ne11 + i02*dps2*ne1*ne11;
            float   * c = part.get()   + i3*ne2*ne1*ne0  + i02*dps2*ne1*ne0;
            gemm_strided_batched_cuda<T>(handle, false, ne0, ne1*dps2, kseg,
                    a, ne00, kseg*ne00, b, ne11, kseg, c, ne0, ne, nfull);
            if (krem > 0) {
                gemm_strided_batched_cuda<T>(handle, false, ne0, ne1*dps2, krem,
                        a + nfull*kseg*ne00, ne00, 0, b + nfull*kseg, ne11, 0, c + nfull*ne, ne0, 0, 1);
            }
        }
    }
    out_prod_q_combine_cuda(part.get(), (float *) dst->data, ne, (int) nseg, stream);
}

// SOFT_MAX -> [RESHAPE ->] TRANSPOSE -> OUT_PROD(V, .) where V*P takes the F16 GEMM path: k_out_prod_q_softmax_f16 writes
// P as f16 into a buffer laid out as the softmax's output, which the GEMM reads in place of P's conversion
static void out_prod_q_softmax_gemm_cuda(ggml_backend_cuda_context & ctx, const ggml_tensor * softmax, ggml_tensor * dst) {
    const ggml_tensor * sinks = softmax->src[2];
    const out_prod_q_softmax_args sm = out_prod_q_softmax_args_for(softmax);
    const int64_t nrows = ggml_nrows(softmax);
    GGML_ASSERT(nrows <= INT_MAX && softmax->ne[0] <= INT_MAX);
    ggml_cuda_pool_alloc<half> p(ctx.pool(), ggml_nelements(softmax));
    k_out_prod_q_softmax_f16<<<(unsigned) nrows, OUT_PROD_Q_SOFTMAX_NT, 0, ctx.stream()>>>(
        (const float *) softmax->src[0]->data, sinks ? (const float *) sinks->data : nullptr, p.get(),
        (int) softmax->ne[0], sm);
    CUDA_CHECK(cudaGetLastError());
    out_prod_q_gemm<half>(ctx, dst, p.get());
}

template <ggml_type type>
static void out_prod_q_cuda(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * src0 = dst->src[0];
    const ggml_tensor * src1 = dst->src[1];

    GGML_TENSOR_BINARY_OP_LOCALS

    cudaStream_t stream = ctx.stream();
    const int    id     = ggml_cuda_get_device();
    const int    nsm    = ggml_cuda_info().devices[id].nsm;

    const char  * src0_d = (const char  *) src0->data;
    const float * src1_d = (const float *) src1->data;
    float       *  dst_d = (float       *)  dst->data;

    const int64_t dps2 = ne2 / ne02;
    const int64_t dps3 = ne3 / ne03;

    // dst columns per src0 matrix
    const int64_t ncols_total = ne1*dps2*dps3;

    const int64_t s10 = nb10 / sizeof(float);
    const int64_t s11 = nb11 / sizeof(float);
    const int64_t s12 = nb12 / sizeof(float);
    const int64_t s13 = nb13 / sizeof(float);
    const int64_t s1  = nb1  / sizeof(float);
    const int64_t s2  = nb2  / sizeof(float);
    const int64_t s3  = nb3  / sizeof(float);

    if (out_prod_q_use_vec(ncols_total, ne00, ne01)) {
        const int ncols  = ncols_total <= 1 ? 1 : ncols_total <= 2 ? 2 : ncols_total <= 4 ? 4 : 8;
        const int ntiles = (ncols_total + ncols - 1)/ncols;
        const int64_t nmat = ne02*ne03;

        // split the rows into chunks so that there are a few blocks per SM
        int64_t nchunks = std::max<int64_t>(1, (4*nsm + nmat*ntiles - 1)/(nmat*ntiles));
        nchunks = std::min<int64_t>(nchunks, (ne01 + OUT_PROD_Q_MIN_ROWS - 1)/OUT_PROD_Q_MIN_ROWS);
        nchunks = std::max<int64_t>(nchunks, 1);
        const int64_t chunk_rows = (ne01 + nchunks - 1)/nchunks;
        nchunks = std::max<int64_t>(1, (ne01 + chunk_rows - 1)/chunk_rows);

        GGML_ASSERT(nmat <= 65535 && ntiles <= 65535);
        const dim3 grid(nchunks, nmat, ntiles);

        ggml_cuda_pool_alloc<float> tmp(ctx.pool());
        float * out = dst_d;
        if (nchunks > 1) {
            out = tmp.alloc(nchunks*ggml_nelements(dst));
        }

#define OUT_PROD_Q_VEC_ARGS grid, src0_d, src1_d, out, ne00, ne01, ne02, ne1, ne2, ne3, dps2, dps3, nb01, nb02, nb03, \
        s10, s11, s12, s13, nchunks > 1 ? ne0 : s1, nchunks > 1 ? ne0*ne1 : s2, nchunks > 1 ? ne0*ne1*ne2 : s3, chunk_rows, stream
        switch (ncols) {
            case 1: out_prod_q_vec_launch<type, 1>(OUT_PROD_Q_VEC_ARGS); break;
            case 2: out_prod_q_vec_launch<type, 2>(OUT_PROD_Q_VEC_ARGS); break;
            case 4: out_prod_q_vec_launch<type, 4>(OUT_PROD_Q_VEC_ARGS); break;
            case 8: out_prod_q_vec_launch<type, 8>(OUT_PROD_Q_VEC_ARGS); break;
            default: GGML_ABORT("fatal error");
        }
#undef OUT_PROD_Q_VEC_ARGS
        CUDA_CHECK(cudaGetLastError());

        if (nchunks > 1) {
            GGML_ASSERT(ggml_is_contiguous(dst));
            const int64_t ne = ggml_nelements(dst);
            out_prod_q_combine_cuda(out, dst_d, ne, nchunks, stream);
        }
        return;
    }

    if (out_prod_q_use_mma(dst)) {
        out_prod_q_mma_cuda<type>(ctx, dst);
        return;
    }

    // large batch: src0 -> T (F16, or F32 for TF32 GEMMs) once, src1 -> T with k fastest, then per dst channel one
    // GEMM per src0 matrix over all of its dst columns: dst[ne0, ne1*dps2] = src0_T[ne00, ne01] * src1_T[ne01, ne1*dps2]
    // (the dps2 channels that share a src0 matrix are consecutive columns in src1_T and dst)
    GGML_ASSERT(ggml_is_contiguous(dst));
    const int cc = ggml_cuda_info().devices[id].cc;
    if (dequantize_x8_gemm_use_f32(cc)) {
        out_prod_q_gemm<float>(ctx, dst);
    } else {
        out_prod_q_gemm<half>(ctx, dst);
    }
}

void ggml_cuda_out_prod_q(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * src0 = dst->src[0];
    const ggml_tensor * src1 = dst->src[1];

    GGML_TENSOR_BINARY_OP_LOCALS

    GGML_ASSERT(src1->type == GGML_TYPE_F32);
    GGML_ASSERT(dst->type  == GGML_TYPE_F32);
    GGML_ASSERT(ggml_cuda_out_prod_q_supported(src0));

    GGML_ASSERT(ne01 == ne11);
    GGML_ASSERT(ne0  == ne00);
    GGML_ASSERT(ne1  == ne10);
    GGML_ASSERT(ne2  == ne12);
    GGML_ASSERT(ne3  == ne13);
    GGML_ASSERT(ne2 % ne02 == 0);
    GGML_ASSERT(ne3 % ne03 == 0);
    GGML_ASSERT(nb0 == sizeof(float));
    GGML_ASSERT(nb10 % sizeof(float) == 0 && nb11 % sizeof(float) == 0);

    if (ne01 == 0) {
        CUDA_CHECK(cudaMemsetAsync(dst->data, 0, ggml_nbytes(dst), ctx.stream()));
        return;
    }

    if (src0->type == GGML_TYPE_F16) {
        // a V dequantized once for all chunks of the split attention (llama-vq-attn.h): the F16 GEMM, f32 accumulation
        out_prod_q_gemm<half>(ctx, dst);
        return;
    }

    switch (src0->type) {
        case GGML_TYPE_Q4_0:   out_prod_q_cuda<GGML_TYPE_Q4_0>  (ctx, dst); break;
        case GGML_TYPE_Q4_1:   out_prod_q_cuda<GGML_TYPE_Q4_1>  (ctx, dst); break;
        case GGML_TYPE_Q5_0:   out_prod_q_cuda<GGML_TYPE_Q5_0>  (ctx, dst); break;
        case GGML_TYPE_Q5_1:   out_prod_q_cuda<GGML_TYPE_Q5_1>  (ctx, dst); break;
        case GGML_TYPE_Q8_0:   out_prod_q_cuda<GGML_TYPE_Q8_0>  (ctx, dst); break;
        case GGML_TYPE_IQ4_NL: out_prod_q_cuda<GGML_TYPE_IQ4_NL>(ctx, dst); break;
        default: GGML_ABORT("fatal error");
    }
}

// whether the softmax goes into the V*P: into the tensor-core V*P wherever that kernel takes the V*P (out_prod_q_use_mma),
// and into P's conversion to f16 where V*P takes the F16 GEMM path (k_out_prod_q_softmax_f16)
bool ggml_cuda_out_prod_q_softmax_supported(const ggml_tensor * softmax, const ggml_tensor * kqv) {
    if (softmax->op != GGML_OP_SOFT_MAX || kqv->op != GGML_OP_OUT_PROD) {
        return false;
    }
    const ggml_tensor * scores = softmax->src[0];
    const ggml_tensor * mask   = softmax->src[1];
    const ggml_tensor * sinks  = softmax->src[2];
    const ggml_tensor * v      = kqv->src[0];
    const ggml_tensor * pt     = kqv->src[1];
    if (!ggml_is_quantized(v->type) || !ggml_cuda_out_prod_q_supported(v) || pt->type != GGML_TYPE_F32 ||
            kqv->type != GGML_TYPE_F32 || !ggml_is_contiguous(kqv)) {
        return false;
    }
    if (softmax->type != GGML_TYPE_F32 || scores->type != GGML_TYPE_F32 || !ggml_is_contiguous(softmax) ||
            !ggml_is_contiguous(scores) || !ggml_are_same_shape(softmax, scores)) {
        return false;
    }
    float max_bias = 0.0f;
    memcpy(&max_bias, (const float *) softmax->op_params + 1, sizeof(float));
    if (max_bias != 0.0f) {
        return false;
    }
    if (mask && (mask->type != GGML_TYPE_F16 || mask->ne[0] != softmax->ne[0] || mask->nb[0] != sizeof(half) ||
            mask->nb[1] % 8 != 0 || mask->nb[2] % 8 != 0 || mask->nb[3] % 8 != 0 || (uintptr_t) mask->data % 8 != 0 ||
            ggml_nbytes(mask) > (size_t) INT_MAX*sizeof(half))) {
        return false;
    }
    if (sinks && (sinks->type != GGML_TYPE_F32 || !ggml_is_contiguous(sinks) || sinks->ne[0] != softmax->ne[2])) {
        return false;
    }
    // the OUT_PROD's P is the softmax's output viewed in place (its data, whole rows per column, k fastest)
    const size_t row = softmax->nb[1];
    if (pt->data != softmax->data || pt->nb[1] != sizeof(float) || pt->nb[0] % row != 0 || pt->nb[2] % row != 0 ||
            pt->nb[3] % row != 0 || softmax->ne[0] != v->ne[1] || row/sizeof(float) > INT_MAX) {
        return false;
    }
    if (out_prod_q_use_mma(kqv)) {
        return true;
    }
    // the F16 GEMM path, P whole and k-contiguous as that path reads it (src1_k_contiguous of out_prod_q_gemm)
    const int cc = ggml_cuda_info().devices[ggml_cuda_get_device()].cc;
    const bool k_contiguous = pt->nb[0] == (size_t) pt->ne[1]*pt->nb[1] && pt->nb[2] == (size_t) pt->ne[0]*pt->nb[0] &&
        pt->nb[3] == (size_t) pt->ne[2]*pt->nb[2];
    return ggml_cuda_out_prod_q_uses_gemm(kqv) && !dequantize_x8_gemm_use_f32(cc) && k_contiguous &&
        ggml_nelements(pt) == ggml_nelements(softmax) && ggml_nrows(softmax) <= INT_MAX;
}

void ggml_cuda_out_prod_q_softmax(ggml_backend_cuda_context & ctx, const ggml_tensor * softmax, ggml_tensor * kqv) {
    GGML_ASSERT(ggml_cuda_out_prod_q_softmax_supported(softmax, kqv));
    if (!out_prod_q_use_mma(kqv)) {
        out_prod_q_softmax_gemm_cuda(ctx, softmax, kqv);
        return;
    }
    switch (kqv->src[0]->type) {
        case GGML_TYPE_Q4_0:   out_prod_q_softmax_cuda<GGML_TYPE_Q4_0>  (ctx, softmax, kqv); break;
        case GGML_TYPE_Q4_1:   out_prod_q_softmax_cuda<GGML_TYPE_Q4_1>  (ctx, softmax, kqv); break;
        case GGML_TYPE_Q5_0:   out_prod_q_softmax_cuda<GGML_TYPE_Q5_0>  (ctx, softmax, kqv); break;
        case GGML_TYPE_Q5_1:   out_prod_q_softmax_cuda<GGML_TYPE_Q5_1>  (ctx, softmax, kqv); break;
        case GGML_TYPE_Q8_0:   out_prod_q_softmax_cuda<GGML_TYPE_Q8_0>  (ctx, softmax, kqv); break;
        case GGML_TYPE_IQ4_NL: out_prod_q_softmax_cuda<GGML_TYPE_IQ4_NL>(ctx, softmax, kqv); break;
        default: GGML_ABORT("fatal error");
    }
}
