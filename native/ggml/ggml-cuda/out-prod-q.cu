// llama-vq: OUT_PROD with a quantized src0 (q4_0, q4_1, q5_0, q5_1, q8_0, iq4_nl) for ggml-cuda and ggml-hip, and
// with a contiguous f16 src0 (the split attention's V, dequantized once for all of its chunks: F16 GEMM).
// Hooked in by patch 0005-cuda-out-prod-quantized: out-prod.cuh includes out-prod-q.cuh, ggml_cuda_out_prod hands a
// quantized or f16 src0 to ggml_cuda_out_prod_q, ggml-cuda.cu's supports_op and CUDA-graph check ask the two predicates.

#include "out-prod-q.cuh"
#include "dequantize-x8.cuh"
#include "cp-async.cuh"

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

// ---- V*P on tensor cores (NVIDIA sm_80+): the split attention's chunks ----
// A chunk of the split attention (llama-vq-attn.h) is 128 x 256 dst per V matrix over 64K+ cells: the GEMM path
// dequantizes all of V to f16/f32 for every chunk, converts P, and splits k over GEMMs of few tiles (a 16-token chunk's
// V*P ran at 49 TFLOPS on an H100 against 162 for the whole batch: benchmarks/RESULTS.md). This kernel reads the
// quantized V and the f32 P where they are, once: each block takes 128 d_v rows x 128 dst columns of one V matrix over
// a segment of k (the cells), per step of 32 cells dequantizes V to f16 (dequantize_x8, one rounding of the f32 value)
// and rounds P to f16 into shared memory, then 8 warps (4 over d_v x 2 over the columns, 32 x 64 each) run mma.sync
// m16n8k16 (f16 inputs, f32 accumulators, as flash attention's kernels and the fused decode's V*P). The segments'
// partial dst are summed by k_out_prod_q_combine in a fixed order. The tests' CPU emulation (AD_EMULATE_MMA) gives the
// two warp-wide instructions as the PTX ISA defines them.
#if defined(AD_EMULATE_MMA)
#define OUT_PROD_Q_MMA_CODE
#define opq_mma_f16       ad_mma_f16
#define opq_ldsm_x4_trans ad_ldsm_x4_trans
#elif defined(AMPERE_MMA_AVAILABLE)
#define OUT_PROD_Q_MMA_CODE
// D += A B, m16n8k16: A row-major 16x16 f16 (4 registers), B column-major 16x8 f16 (2), D 16x8 f32
static __device__ __forceinline__ void opq_mma_f16(float * d, const unsigned * a, const unsigned b0, const unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// four 8x8 f16 matrices, transposed: lane 8i + r gives the address of row r of matrix i (16 bytes, 16-byte aligned)
static __device__ __forceinline__ void opq_ldsm_x4_trans(unsigned * a, const half * row) {
    const unsigned s = ggml_cuda_cvta_generic_to_shared((void *) row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
        : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]) : "r"(s));
}
#endif // defined(AD_EMULATE_MMA)

#define OUT_PROD_Q_MMA_NT      256                      // threads: 8 warps
#define OUT_PROD_Q_MMA_M       128                      // d_v rows per block: 4 warps x 32
#define OUT_PROD_Q_MMA_N       128                      // dst columns per block: 2 warps x 64
#define OUT_PROD_Q_MMA_K       32                       // cells per step
#define OUT_PROD_Q_MMA_VS      (OUT_PROD_Q_MMA_M + 8)   // halves per row (cell) of the V tile: ldmatrix's 8 rows in distinct banks
#define OUT_PROD_Q_MMA_PS      (OUT_PROD_Q_MMA_K + 8)   // halves per row (column) of the P tile: lane (g, t)'s B words in bank 20g + t
#define OUT_PROD_Q_MMA_SMEM    ((OUT_PROD_Q_MMA_K*OUT_PROD_Q_MMA_VS + OUT_PROD_Q_MMA_N*OUT_PROD_Q_MMA_PS)*2)
#define OUT_PROD_Q_MMA_MIN_SEG 256                      // cells of the shortest k segment

// grid: x = segment of k (chunk_rows cells, a multiple of 32), y = src0 matrix (i02 + ne02*i03), z = (128-column tile)
// x (128-row block of d_v), the row block fastest. dst columns of a src0 matrix are ordered as k_out_prod_q_vec's.
// src1 is read k-fastest (s11 == 1) in runs of 4 floats (s10, s12, s13 and its address multiples of 4 floats).
// With gridDim.x > 1 segment x writes its partial dst at dst + x*sk (s1, s2, s3 those of a contiguous dst).
template <ggml_type type>
static __global__ void __launch_bounds__(OUT_PROD_Q_MMA_NT, 2) k_out_prod_q_mma(
        const char * __restrict__ src0, const float * __restrict__ src1, float * __restrict__ dst,
        const int ne00, const int ne01, const int ne02, const int ne1, const int dps2, const int dps3,
        const int64_t nb01, const int64_t nb02, const int64_t nb03,
        const int64_t s10, const int64_t s12, const int64_t s13,
        const int64_t s1, const int64_t s2, const int64_t s3, const int64_t sk,
        const int chunk_rows) {
#ifdef OUT_PROD_Q_MMA_CODE
    constexpr int qr = ggml_cuda_type_traits<type>::qr;
    constexpr int VS = OUT_PROD_Q_MMA_VS;
    constexpr int PS = OUT_PROD_Q_MMA_PS;

    __shared__ float4 smem[OUT_PROD_Q_MMA_SMEM/16];
    half * vt = (half *) smem;                      // [K cells][VS]: V's 128 rows of the block per cell, f16
    half * pt = vt + OUT_PROD_Q_MMA_K*VS;           // [N columns][PS]: P's K cells per column, f16

    const int tid  = threadIdx.x;
    const int warp = tid / 32;
    const int lane = tid % 32;
    const int g    = lane / 4;
    const int t    = lane % 4;
    const int wm   = warp % 4;  // d_v rows 32wm .. 32wm + 31 of the block
    const int wn   = warp / 4;  // columns 64wn .. 64wn + 63 of the block

    const int i03 = blockIdx.y / ne02;
    const int i02 = blockIdx.y % ne02;
    const int nmb = ne00 / OUT_PROD_Q_MMA_M;
    const int mb  = blockIdx.z % nmb;
    const int c0  = (blockIdx.z / nmb)*OUT_PROD_Q_MMA_N;

    const int ncols_total = ne1*dps2*dps3;
    const int nc = min(ncols_total - c0, OUT_PROD_Q_MMA_N); // the block's columns

    const int k0 = blockIdx.x*chunk_rows;
    const int k1 = min(k0 + chunk_rows, ne01);

    src0 += i02*nb02 + i03*nb03;

    // the P runs this thread stages at every step: run r = tid + 256i is column r/8, cells 4(r%8) .. 4(r%8) + 3
    int64_t poff[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r  = tid + OUT_PROD_Q_MMA_NT*i;
        const int ic = c0 + min(r/8, nc - 1);
        const int i1 = ic % ne1;
        const int i2 = i02*dps2 + (ic/ne1) % dps2;
        const int i3 = i03*dps3 +  ic/(ne1*dps2);
        poff[i] = i1*s10 + i2*s12 + i3*s13 + 4*(r % 8);
    }

    float acc[2][8][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                acc[mt][nt][e] = 0.0f;
            }
        }
    }

    // ldmatrix rows: lanes 8i .. 8i + 7 address cells + 0 .. 7 (i = 0, 1) or + 8 .. 15 (i = 2, 3), d_v + 0 (i = 0, 2)
    // or + 8 (i = 1, 3); transposed, they are the four 8x8 quarters of A = V^T (d_v x cells)
    const int arow = (lane % 8 + 8*(lane / 16))*VS + 32*wm + 8*((lane / 8) % 2);

    for (int kb = k0; kb < k1; kb += OUT_PROD_Q_MMA_K) {
        // V: 32 cells x 16 slots of 8 values; a cell past k1 repeats the last one (its P is 0)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int q    = tid + OUT_PROD_Q_MMA_NT*i;
            const int cell = q / 16;
            const int j    = mb*16 + q % 16;
            float v[8];
            dequantize_x8<type>(src0 + min(kb + cell, k1 - 1)*nb01, j, v);
#pragma unroll
            for (int l = 0; l < 8; l += 2) {
                const half2 h = __floats2half2_rn(v[l], v[l + 1]); // values l, l + 1 are adjacent in the row
                const int   x = dequantize_x8_pos<qr>(j, l) - mb*OUT_PROD_Q_MMA_M;
                ggml_cuda_memcpy_1<4>(vt + cell*VS + x, &h);
            }
        }
        // P: 128 columns x 32 cells (past k1 or the block's columns: 0)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int r  = tid + OUT_PROD_Q_MMA_NT*i;
            const int kc = kb + 4*(r % 8);
            float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (r/8 < nc) {
                if (kc + 3 < k1) {
                    ggml_cuda_memcpy_1<16>(p, src1 + poff[i] + kb);
                } else {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        p[e] = kc + e < k1 ? src1[poff[i] + kb + e] : 0.0f;
                    }
                }
            }
            const half2 h[2] = {__floats2half2_rn(p[0], p[1]), __floats2half2_rn(p[2], p[3])};
            ggml_cuda_memcpy_1<8>(pt + (r/8)*PS + 4*(r % 8), h);
        }
        __syncthreads();

#pragma unroll
        for (int kk = 0; kk < OUT_PROD_Q_MMA_K; kk += 16) {
            unsigned a[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
                opq_ldsm_x4_trans(a[mt], vt + arow + kk*VS + 16*mt);
            }
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
                if (64*wn + 8*nt < nc) { // the same for the whole warp
                    const half * pb = pt + (64*wn + 8*nt + g)*PS + kk + 2*t;
                    unsigned b0;
                    unsigned b1;
                    ggml_cuda_memcpy_1<4>(&b0, pb);
                    ggml_cuda_memcpy_1<4>(&b1, pb + 8);
#pragma unroll
                    for (int mt = 0; mt < 2; ++mt) {
                        opq_mma_f16(acc[mt][nt], a[mt], b0, b1);
                    }
                }
            }
        }
        __syncthreads();
    }

    // D fragments: (row g, columns 2t, 2t + 1), (row g + 8, the same) of each m16n8 tile
    dst += blockIdx.x*sk;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int e1 = 0; e1 < 2; ++e1) {
            const int cb = 64*wn + 8*nt + 2*t + e1;
            if (cb < nc) {
                const int ic = c0 + cb;
                const int i1 = ic % ne1;
                const int i2 = i02*dps2 + (ic/ne1) % dps2;
                const int i3 = i03*dps3 +  ic/(ne1*dps2);
                float * d = dst + i1*s1 + i2*s2 + i3*s3 + mb*OUT_PROD_Q_MMA_M + 32*wm + g;
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
                    d[16*mt + 0] = acc[mt][nt][e1 + 0];
                    d[16*mt + 8] = acc[mt][nt][e1 + 2];
                }
            }
        }
    }
#else
    GGML_UNUSED(src0); GGML_UNUSED(src1); GGML_UNUSED(dst); GGML_UNUSED(ne00); GGML_UNUSED(ne01); GGML_UNUSED(ne02);
    GGML_UNUSED(ne1); GGML_UNUSED(dps2); GGML_UNUSED(dps3); GGML_UNUSED(nb01); GGML_UNUSED(nb02); GGML_UNUSED(nb03);
    GGML_UNUSED(s10); GGML_UNUSED(s12); GGML_UNUSED(s13); GGML_UNUSED(s1); GGML_UNUSED(s2); GGML_UNUSED(s3);
    GGML_UNUSED(sk); GGML_UNUSED(chunk_rows);
    NO_DEVICE_CODE;
#endif // OUT_PROD_Q_MMA_CODE
}

// cells per k segment of k_out_prod_q_mma for nblocks blocks per segment: segments enough for ~two blocks per SM, each
// at least OUT_PROD_Q_MMA_MIN_SEG cells, a multiple of 32
static int out_prod_q_mma_chunk_rows(const int64_t ne01, const int64_t nblocks, const int nsm) {
    const int64_t want = (2*(int64_t) nsm + nblocks - 1)/nblocks;
    const int64_t nseg = std::max<int64_t>(1, std::min<int64_t>(want, ne01/OUT_PROD_Q_MMA_MIN_SEG));
    const int64_t rows = (ne01 + nseg - 1)/nseg;
    return (int) ((rows + 31)/32*32);
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

// whether the tensor-core kernel (k_out_prod_q_mma) takes a quantized src0's dst that the vector kernel does not.
// LLAMA_VQ_CUDA_OUT_PROD_MMA: unset or 0 never (the GEMM path, the default); 1 the split attention's chunks: more than
// OUT_PROD_Q_MMA_MIN_COLS dst columns per V matrix (decode batches, up to 8 sequences at GQA 16, keep their paths) in at
// most OUT_PROD_Q_MMA_MAX_TILES 128 x 128 dst tiles, where the GEMM path cuts k; 2 every shape the kernel takes (tests).
// Measured on an H100 (benchmarks/RESULTS.md): a 16-token chunk's V*P at 64K cells 248 us against the GEMM path's 346,
// the whole 512-token batch's 6,923 against 3,362; a first rule that also sent 256-tile shapes (the SWA layers' and the
// unbounded graph's V*P) to the kernel slowed pp512 at 64K by 7-9 %. This rule, which keeps those on the GEMM path, was
// not timed end to end, so the kernel is not the default.
#define OUT_PROD_Q_MMA_MIN_COLS  128
#define OUT_PROD_Q_MMA_MAX_TILES 64
static bool out_prod_q_use_mma(const ggml_tensor * dst) {
    static const int mode = [] {
        const char * env = getenv("LLAMA_VQ_CUDA_OUT_PROD_MMA");
        return env == nullptr ? 0 : atoi(env);
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
    // src1 read k-fastest in runs of 4 floats
    if (src1->nb[1] != sizeof(float) || src1->nb[0] % 16 != 0 || src1->nb[2] % 16 != 0 || src1->nb[3] % 16 != 0 ||
            (uintptr_t) src1->data % 16 != 0) {
        return false;
    }
    const int64_t dps2  = dst->ne[2]/src0->ne[2];
    const int64_t ncols = dst->ne[1]*dps2*(dst->ne[3]/src0->ne[3]);
    if (mode >= 2) {
        return true;
    }
    const int64_t tiles = ((dst->ne[0] + 127)/128)*((dst->ne[1]*dps2 + 127)/128)*src0->ne[2]*dst->ne[3];
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

// k_out_prod_q_mma over segments of k (out_prod_q_mma_chunk_rows), their partial dst summed by k_out_prod_q_combine
template <ggml_type type>
static void out_prod_q_mma_cuda(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * src0 = dst->src[0];
    const ggml_tensor * src1 = dst->src[1];

    GGML_TENSOR_BINARY_OP_LOCALS

    cudaStream_t stream = ctx.stream();
    const int    nsm    = ggml_cuda_info().devices[ggml_cuda_get_device()].nsm;

    const int64_t dps2  = ne2/ne02;
    const int64_t dps3  = ne3/ne03;
    const int64_t ncols = ne1*dps2*dps3;
    const int64_t nmat  = ne02*ne03;
    const int64_t nz    = (ne00/OUT_PROD_Q_MMA_M)*((ncols + OUT_PROD_Q_MMA_N - 1)/OUT_PROD_Q_MMA_N);
    GGML_ASSERT(nmat <= 65535 && nz <= 65535 && ne01 <= INT_MAX);

    const int     chunk_rows = out_prod_q_mma_chunk_rows(ne01, nmat*nz, nsm);
    const int64_t nseg       = (ne01 + chunk_rows - 1)/chunk_rows;
    const int64_t ne         = ggml_nelements(dst);

    ggml_cuda_pool_alloc<float> tmp(ctx.pool());
    float * out = (float *) dst->data;
    if (nseg > 1) {
        GGML_ASSERT(ggml_is_contiguous(dst));
        out = tmp.alloc(nseg*ne);
    }
    const int64_t s1 = nseg > 1 ? ne0           : nb1/sizeof(float);
    const int64_t s2 = nseg > 1 ? ne0*ne1       : nb2/sizeof(float);
    const int64_t s3 = nseg > 1 ? ne0*ne1*ne2   : nb3/sizeof(float);

    k_out_prod_q_mma<type><<<dim3(nseg, nmat, nz), OUT_PROD_Q_MMA_NT, 0, stream>>>(
        (const char *) src0->data, (const float *) src1->data, out, ne00, ne01, ne02, ne1, dps2, dps3,
        nb01, nb02, nb03, nb10/sizeof(float), nb12/sizeof(float), nb13/sizeof(float), s1, s2, s3,
        nseg > 1 ? ne : 0, chunk_rows);
    CUDA_CHECK(cudaGetLastError());

    if (nseg > 1) {
        out_prod_q_combine_cuda(out, (float *) dst->data, ne, (int) nseg, stream);
    }
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
// LLAMA_VQ_CUDA_OUT_PROD_SPLIT_K, for side-by-side measurements: 0 never; N >= 2 only when the output has at most N
// tiles (H200, a 64K-cell chunk of the split attention: split-K won at 8 tiles and lost at 12 and 16; benchmarks/RESULTS.md)
static int64_t out_prod_q_gemm_splits(const int64_t m, const int64_t n, const int64_t k, const int64_t nmat, const int nsm) {
    static const int64_t max_tiles = [] {
        const char * env = getenv("LLAMA_VQ_CUDA_OUT_PROD_SPLIT_K");
        const int64_t v = env == nullptr ? 1 : atoll(env);
        return v == 1 ? INT64_MAX : v;  // 1 (or unset): the rule below alone
    }();
    const int64_t tiles = ((m + 127)/128)*((n + 127)/128)*nmat;
    if (max_tiles <= 0 || tiles > max_tiles || tiles >= 2*nsm || k < 2*OUT_PROD_Q_SPLIT_K_MIN) {
        return 1;
    }
    const int64_t want = (2*nsm + tiles - 1)/tiles;
    return std::max<int64_t>(1, std::min({want, k/OUT_PROD_Q_SPLIT_K_MIN, (int64_t) OUT_PROD_Q_SPLIT_K_MAX}));
}

template <typename T>
static void out_prod_q_gemm(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
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
    if (std::is_same_v<T, float> && src1_k_contiguous) {
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
