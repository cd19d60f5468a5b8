#pragma once

// llama-vq: the quantized OUT_PROD's V*P on tensor cores (NVIDIA sm_80+), a part of out-prod-q.cu (included there after
// the vector kernel and the combine; the CPU emulation of the tests includes it the same way).
//
// A chunk of the split attention (llama-vq-attn.h) is 128 x ~256 dst per V matrix over 64K+ cells: the GEMM path
// dequantizes all of V to f16/f32 for every chunk, converts P, and splits k over GEMMs of few tiles (a 16-token chunk's
// V*P ran at 49 TFLOPS on an H100 against 162 for the whole batch: benchmarks/RESULTS.md). This kernel reads the
// quantized V and the f32 P where they are, once: each block takes 128 d_v rows x 128 dst columns of one V matrix over
// a segment of k (the cells), per step of 32 cells dequantizes V to f16 (dequantize_x8, one rounding of the f32 value)
// and rounds P to f16 into shared memory, then 8 warps (4 over d_v x 2 over the columns, 32 x 64 each) run mma.sync
// m16n8k16 (f16 inputs, f32 accumulators, as flash attention's kernels and the fused decode's V*P; mma-f16.cuh). The
// next step's V and P are loaded into registers during a step's MMAs and stored into the other of two shared buffers.
// The segments' partial dst are summed by k_out_prod_q_combine in a fixed order.
#if defined(AMPERE_MMA_AVAILABLE) || defined(AD_EMULATE_MMA)
#define OUT_PROD_Q_MMA_CODE
#endif // defined(AMPERE_MMA_AVAILABLE) || defined(AD_EMULATE_MMA)

#define OUT_PROD_Q_MMA_NT      256                      // threads: 8 warps
#define OUT_PROD_Q_MMA_M       128                      // d_v rows per block: 4 warps x 32
#define OUT_PROD_Q_MMA_N       128                      // dst columns per block: 2 warps x 64
#define OUT_PROD_Q_MMA_K       32                       // cells per step
#define OUT_PROD_Q_MMA_VS      (OUT_PROD_Q_MMA_M + 8)   // halves per row (cell) of the V tile: ldmatrix's 8 rows in distinct banks
#define OUT_PROD_Q_MMA_PS      (OUT_PROD_Q_MMA_K + 8)   // halves per row (column) of the P tile: lane (g, t)'s B words in bank 20g + t
#define OUT_PROD_Q_MMA_SMEM    ((OUT_PROD_Q_MMA_K*OUT_PROD_Q_MMA_VS + OUT_PROD_Q_MMA_N*OUT_PROD_Q_MMA_PS)*2) // bytes of a V and a P tile
#define OUT_PROD_Q_MMA_MIN_SEG 256                      // cells of the shortest k segment

// dst column ic of src0 matrix (i02, i03): its (i1, i2, i3), ordered as k_out_prod_q_vec orders them (i1 fastest)
struct out_prod_q_col {
    int i1, i2, i3;
};
static __device__ __forceinline__ out_prod_q_col out_prod_q_mma_col(const int ic, const int i02, const int i03,
        const int ne1, const int dps2, const int dps3) {
    return {ic % ne1, i02*dps2 + (ic/ne1) % dps2, i03*dps3 + ic/(ne1*dps2)};
}

// The softmax taken over (k_out_prod_q_mma<type, true>, out_prod_q_softmax_cuda): src1 is then the raw scores S of
// a SOFT_MAX (mask, scale, sinks; no ALiBi) whose output the OUT_PROD would read, laid out as that output. Column c's
// P over a segment of k is exp(x - m) with x = S*scale + mask and m the segment's running max of x, the partial dst
// rescaled as m grows (flash attention's online softmax); each segment writes its column's m and l = sum of P, and
// k_out_prod_q_softmax_combine weighs the segments by exp(m - M) and divides by L (the sink's exp(sink - M) in it).
struct out_prod_q_softmax_args {
    const half * mask;   // f16, or nullptr: row r1 of softmax row (r1, r2, r3) at r1*mnb1 + (r2 % mne2)*mnb2 + (r3 % mne3)*mnb3
    int64_t mnb1, mnb2, mnb3; // in halves
    int     mne2, mne3;
    int     ns1, ns2;    // the softmax's rows per matrix and matrices per stream (its ne1, ne2)
    int     srow;        // floats from one softmax row to the next (contiguous: ne0): a column's row is its offset/srow
    float   scale;
    float * ml;          // [segment][column (i1 + ne1*(i2 + ne2*i3))][2]: the segment's m and l
};

#ifdef OUT_PROD_Q_MMA_CODE
// V tile, loaded: cells kb .. kb + 31 x the block's 128 d_v rows (slots mb*16 .. of 8 values) dequantized to f16 in
// registers, two (cell, slot) pairs per thread; a cell past k1 repeats the last one (its P is 0)
template <ggml_type type>
static __device__ __forceinline__ void out_prod_q_mma_load_v(const char * src0, const int64_t nb01, const int kb,
        const int k1, const int mb, half2 (*vr)[4]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int q = threadIdx.x + OUT_PROD_Q_MMA_NT*i;
        float v[8];
        dequantize_x8<type>(src0 + min(kb + q/16, k1 - 1)*nb01, mb*16 + q % 16, v);
#pragma unroll
        for (int l = 0; l < 8; l += 2) {
            vr[i][l/2] = __floats2half2_rn(v[l], v[l + 1]); // values l, l + 1 are adjacent in the row
        }
    }
}

// V tile, stored: the loaded registers into vt [cell][VS]
template <ggml_type type>
static __device__ __forceinline__ void out_prod_q_mma_store_v(const half2 (*vr)[4], const int mb, half * vt) {
    constexpr int qr = ggml_cuda_type_traits<type>::qr;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int q = threadIdx.x + OUT_PROD_Q_MMA_NT*i;
        const int j = mb*16 + q % 16;
#pragma unroll
        for (int l = 0; l < 8; l += 2) {
            const int x = dequantize_x8_pos<qr>(j, l) - mb*OUT_PROD_Q_MMA_M;
            ggml_cuda_memcpy_1<4>(vt + (q/16)*OUT_PROD_Q_MMA_VS + x, &vr[i][l/2]);
        }
    }
}

// P tile, loaded: the block's nc columns x cells kb .. kb + 31 as f32 runs of 4 cells in registers (past k1 or nc: 0),
// four per thread: run r = threadIdx.x + 256i is column r/8, cells 4(r%8) .., read from src1 + poff[r/8] + 4(r%8) + kb
// (poff: per block column, in shared memory). Issued
// before the step's MMAs, whose work hides the loads' latency.
// the mask's 4 halves of each of this thread's P runs (past k1 or nc: -inf), loaded with them (softmax form)
static __device__ __forceinline__ void out_prod_q_mma_load_mask(const half * mask, const int * moff, const int kb,
        const int k1, const int nc, half2 (*mr)[2]) { // moff: per block column (shared memory)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r  = threadIdx.x + OUT_PROD_Q_MMA_NT*i;
        const int kc = kb + 4*(r % 8);
        half2 * h = mr[i];
        if (mask != nullptr && r/8 < nc && kc + 3 < k1) {
            ggml_cuda_memcpy_1<8>(h, mask + moff[r/8] + kc);
        } else {
            // a cell past k1 or nc has no x (-inf: P 0); without a mask, 0 is added
            float e[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                e[q] = r/8 >= nc || kc + q >= k1 ? -INFINITY : mask == nullptr ? 0.0f : __half2float(mask[moff[r/8] + kc + q]);
            }
            h[0] = __floats2half2_rn(e[0], e[1]);
            h[1] = __floats2half2_rn(e[2], e[3]);
        }
    }
}

static __device__ __forceinline__ void out_prod_q_mma_load_p(const float * src1, const int * poff, const int kb,
        const int k1, const int nc, float4 * pr) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r  = threadIdx.x + OUT_PROD_Q_MMA_NT*i;
        const int kc = kb + 4*(r % 8);
        pr[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r/8 < nc) {
            if (kc + 3 < k1) {
                ggml_cuda_memcpy_1<16>(&pr[i], src1 + poff[r/8] + kc);
            } else {
                float p[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    p[e] = kc + e < k1 ? src1[poff[r/8] + kc + e] : 0.0f;
                }
                pr[i] = make_float4(p[0], p[1], p[2], p[3]);
            }
        }
    }
}

// P tile, stored, softmax form: x = S*scale + mask of each run (past k1 or nc: -inf), the column's step max over its
// 8 threads (consecutive lanes), the running max m raised to it, P = exp(x - m) rounded to f16 into pt; l (this
// thread's part of the column's sum) and the partial dst rescaled by alpha = exp(m_old - m), which the column's first
// thread leaves in sa[column] for the warps that hold the column's accumulators (m: mcol[column], shared). A column
// with no finite x yet keeps m = -inf and P = 0.
static __device__ __forceinline__ void out_prod_q_mma_store_p_softmax(const float4 * pr, const half2 (*mr)[2],
        const float scale, float * mcol, float * l, half * pt, float * sa) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r = threadIdx.x + OUT_PROD_Q_MMA_NT*i;
        const float2 m01 = __half22float2(mr[i][0]);
        const float2 m23 = __half22float2(mr[i][1]);
        const float x[4] = {pr[i].x*scale + m01.x, pr[i].y*scale + m01.y, pr[i].z*scale + m23.x, pr[i].w*scale + m23.y};
        float mx = fmaxf(fmaxf(x[0], x[1]), fmaxf(x[2], x[3]));
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) {
            mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFF, mx, o, 8));
        }
        const float mo    = mcol[r/8];
        const float mn    = fmaxf(mo, mx);
        const float mu    = mn == -INFINITY ? 0.0f : mn;
        const float alpha = expf(mo - mu);
        float p[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            p[e] = expf(x[e] - mu);
        }
        l[i] = l[i]*alpha + ((p[0] + p[1]) + (p[2] + p[3]));
        __syncwarp(); // the column's 8 threads have read its m
        if (r % 8 == 0) {
            mcol[r/8] = mn;
            sa[r/8]   = alpha;
        }
        const half2 h[2] = {__floats2half2_rn(p[0], p[1]), __floats2half2_rn(p[2], p[3])};
        ggml_cuda_memcpy_1<8>(pt + (r/8)*OUT_PROD_Q_MMA_PS + 4*(r % 8), h);
    }
}

// the partial dst's columns rescaled by this step's alpha (sa, per block column) before its MMAs: acc[mt][nt][e] is
// column 64wn + 8nt + 2t + e%2
static __device__ __forceinline__ void out_prod_q_mma_rescale(const float * sa, const int nc, float (*acc)[8][4]) {
    const int wn = threadIdx.x / 128;
    const int t  = threadIdx.x % 4;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
        if (64*wn + 8*nt < nc) {
            const float a0 = sa[64*wn + 8*nt + 2*t];
            const float a1 = sa[64*wn + 8*nt + 2*t + 1];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
                acc[mt][nt][0] *= a0;
                acc[mt][nt][1] *= a1;
                acc[mt][nt][2] *= a0;
                acc[mt][nt][3] *= a1;
            }
        }
    }
}

// P tile, stored: the loaded runs rounded to f16 into pt [column][PS]
static __device__ __forceinline__ void out_prod_q_mma_store_p(const float4 * pr, half * pt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int   r    = threadIdx.x + OUT_PROD_Q_MMA_NT*i;
        const half2 h[2] = {__floats2half2_rn(pr[i].x, pr[i].y), __floats2half2_rn(pr[i].z, pr[i].w)};
        ggml_cuda_memcpy_1<8>(pt + (r/8)*OUT_PROD_Q_MMA_PS + 4*(r % 8), h);
    }
}

// one step's MMAs: warp (wm, wn) multiplies its d_v rows 32wm .. 32wm + 31 (A = V^T from vt by ldmatrix, transposed)
// with its n-tiles of 8 columns 64wn + 8nt .. (B from pt) over the step's 32 cells. ldmatrix rows: lanes 8i .. 8i + 7
// address cells + 0 .. 7 (i = 0, 1) or + 8 .. 15 (i = 2, 3), d_v + 0 (i = 0, 2) or + 8 (i = 1, 3): transposed, the four
// 8x8 quarters of A. acc[mt][nt] is the m16n8 D fragment: (row g, columns 2t, 2t + 1), (row g + 8, the same).
static __device__ __forceinline__ void out_prod_q_mma_step(const half * vt, const half * pt, const int nc,
        float (*acc)[8][4]) {
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int wm   = warp % 4;
    const int wn   = warp / 4;
    const int arow = (lane % 8 + 8*(lane / 16))*OUT_PROD_Q_MMA_VS + 32*wm + 8*((lane / 8) % 2);
#pragma unroll
    for (int kk = 0; kk < OUT_PROD_Q_MMA_K; kk += 16) {
        unsigned a[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
            ad_ldsm_x4_trans(a[mt], vt + arow + kk*OUT_PROD_Q_MMA_VS + 16*mt);
        }
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
            if (64*wn + 8*nt < nc) { // the same for the whole warp
                const half * pb = pt + (64*wn + 8*nt + lane/4)*OUT_PROD_Q_MMA_PS + kk + 2*(lane % 4);
                unsigned b0;
                unsigned b1;
                ggml_cuda_memcpy_1<4>(&b0, pb);
                ggml_cuda_memcpy_1<4>(&b1, pb + 8);
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
                    ad_mma_f16(acc[mt][nt], a[mt], b0, b1);
                }
            }
        }
    }
}
#endif // OUT_PROD_Q_MMA_CODE

// grid: x = segment of k (chunk_rows cells, a multiple of 32), y = src0 matrix (i02 + ne02*i03), z = (128-column tile)
// x (128-row block of d_v), the row block fastest. src1 is read k-fastest (s11 == 1) in runs of 4 floats (s10, s12,
// s13 and its address multiples of 4 floats). With gridDim.x > 1 segment x writes its partial dst at dst + x*sk (s1, s2,
// s3 those of a contiguous dst).
// softmax: src1 holds the raw scores (out_prod_q_softmax_args); every segment writes its partial dst and its columns'
// m and l (sm.ml), sk > 0 even for one segment.
template <ggml_type type, bool softmax = false>
static __global__ void __launch_bounds__(OUT_PROD_Q_MMA_NT, 2) k_out_prod_q_mma(
        const char * __restrict__ src0, const float * __restrict__ src1, float * __restrict__ dst,
        const int ne00, const int ne01, const int ne02, const int ne1, const int dps2, const int dps3,
        const int64_t nb01, const int64_t nb02, const int64_t nb03,
        const int64_t s10, const int64_t s12, const int64_t s13,
        const int64_t s1, const int64_t s2, const int64_t s3, const int64_t sk,
        const int chunk_rows, const out_prod_q_softmax_args sm = {}) {
#ifdef OUT_PROD_Q_MMA_CODE
    __shared__ float4 smem[2*OUT_PROD_Q_MMA_SMEM/16];
    __shared__ float salpha[softmax ? 2 : 1][softmax ? OUT_PROD_Q_MMA_N : 1]; // per buffer: each column's alpha

    const int i03 = blockIdx.y / ne02;
    const int i02 = blockIdx.y % ne02;
    const int nmb = ne00 / OUT_PROD_Q_MMA_M;
    const int mb  = blockIdx.z % nmb;
    const int c0  = (blockIdx.z / nmb)*OUT_PROD_Q_MMA_N;
    const int nc  = min(ne1*dps2*dps3 - c0, OUT_PROD_Q_MMA_N); // the block's columns
    const int k0  = blockIdx.x*chunk_rows;
    const int k1  = min(k0 + chunk_rows, ne01);

    // where this thread's P runs start (out_prod_q_mma_stage_p): column r/8 of the block (past nc: its last)
    // per block column (past nc: its last): where its P starts in src1 (src1's extent is under 2^31 floats:
    // out_prod_q_use_mma) and, softmax, its mask row; each column's running max of x
    __shared__ int poff[OUT_PROD_Q_MMA_N];
    __shared__ int moff[softmax ? OUT_PROD_Q_MMA_N : 1];
    __shared__ float mcol[softmax ? OUT_PROD_Q_MMA_N : 1];
    if (threadIdx.x < OUT_PROD_Q_MMA_N) {
        const out_prod_q_col c = out_prod_q_mma_col(c0 + min((int) threadIdx.x, nc - 1), i02, i03, ne1, dps2, dps3);
        const int64_t o = c.i1*s10 + c.i2*s12 + c.i3*s13;
        poff[threadIdx.x] = (int) o;
        if constexpr (softmax) {
            const int row = (int) (o/sm.srow);
            const int r1 = row % sm.ns1, r2 = (row/sm.ns1) % sm.ns2, r3 = row/(sm.ns1*sm.ns2);
            moff[threadIdx.x] = (int) (r1*sm.mnb1 + (r2 % sm.mne2)*sm.mnb2 + (r3 % sm.mne3)*sm.mnb3);
            mcol[threadIdx.x] = -INFINITY;
        }
    }
    __syncthreads();
    float l[softmax ? 4 : 1]; // softmax: this thread's part of its runs' columns' sums of P
#pragma unroll
    for (int i = 0; i < (softmax ? 4 : 1); ++i) {
        l[i] = 0.0f;
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

    // two buffers of the V and P tiles, loaded one step ahead: step s's tiles go to buffer s%2 while the warps may
    // still read buffer (s-1)%2, so one barrier per step; the next step's loads are in flight during this step's MMAs
    src0 += i02*nb02 + i03*nb03;
    float4 pr[4];
    half2  mr[softmax ? 4 : 1][2];
    half2  vr[2][4];
    out_prod_q_mma_load_p(src1, poff, k0, k1, nc, pr);
    if constexpr (softmax) {
        out_prod_q_mma_load_mask(sm.mask, moff, k0, k1, nc, mr);
    }
    out_prod_q_mma_load_v<type>(src0, nb01, k0, k1, mb, vr);
    for (int kb = k0, buf = 0; kb < k1; kb += OUT_PROD_Q_MMA_K, buf ^= 1) {
        half * vt = (half *) smem + buf*(OUT_PROD_Q_MMA_SMEM/2); // [K cells][VS]
        half * pt = vt + OUT_PROD_Q_MMA_K*OUT_PROD_Q_MMA_VS;     // [N columns][PS]
        out_prod_q_mma_store_v<type>(vr, mb, vt);
        if constexpr (softmax) {
            out_prod_q_mma_store_p_softmax(pr, mr, sm.scale, mcol, l, pt, salpha[buf]);
        } else {
            out_prod_q_mma_store_p(pr, pt);
        }
        __syncthreads();
        if (kb + OUT_PROD_Q_MMA_K < k1) {
            out_prod_q_mma_load_p(src1, poff, kb + OUT_PROD_Q_MMA_K, k1, nc, pr);
            if constexpr (softmax) {
                out_prod_q_mma_load_mask(sm.mask, moff, kb + OUT_PROD_Q_MMA_K, k1, nc, mr);
            }
            out_prod_q_mma_load_v<type>(src0, nb01, kb + OUT_PROD_Q_MMA_K, k1, mb, vr);
        }
        if constexpr (softmax) {
            out_prod_q_mma_rescale(salpha[buf], nc, acc);
        }
        out_prod_q_mma_step(vt, pt, nc, acc);
    }

    // the D fragments: (row g, columns 2t, 2t + 1), (row g + 8, the same) of each of the warp's m16n8 tiles
    const int warp = threadIdx.x / 32;
    const int g    = (threadIdx.x % 32) / 4;
    const int t    = threadIdx.x % 4;
    dst += blockIdx.x*sk;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int e1 = 0; e1 < 2; ++e1) {
            const int cb = 64*(warp / 4) + 8*nt + 2*t + e1;
            if (cb < nc) {
                const out_prod_q_col c = out_prod_q_mma_col(c0 + cb, i02, i03, ne1, dps2, dps3);
                float * d = dst + c.i1*s1 + c.i2*s2 + c.i3*s3 + mb*OUT_PROD_Q_MMA_M + 32*(warp % 4) + g;
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
                    d[16*mt + 0] = acc[mt][nt][e1 + 0];
                    d[16*mt + 8] = acc[mt][nt][e1 + 2];
                }
            }
        }
    }
    if constexpr (softmax) {
        // the segment's m and l of each column (l summed over the column's 8 threads), once per column: row block 0
        const int64_t ne2 = (int64_t) ne02*dps2;
        const int64_t ncols_all = ne1*ne2*(gridDim.y/ne02)*dps3;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int r = threadIdx.x + OUT_PROD_Q_MMA_NT*i;
            float li = l[i];
#pragma unroll
            for (int o = 1; o < 8; o <<= 1) {
                li += __shfl_xor_sync(0xFFFFFFFF, li, o, 8);
            }
            if (mb == 0 && r % 8 == 0 && r/8 < nc) {
                const out_prod_q_col c = out_prod_q_mma_col(c0 + r/8, i02, i03, ne1, dps2, dps3);
                float * ml = sm.ml + 2*(blockIdx.x*ncols_all + c.i1 + ne1*(c.i2 + ne2*c.i3));
                ml[0] = mcol[r/8];
                ml[1] = li;
            }
        }
    }
#else
    GGML_UNUSED(src0); GGML_UNUSED(src1); GGML_UNUSED(dst); GGML_UNUSED(ne00); GGML_UNUSED(ne01); GGML_UNUSED(ne02);
    GGML_UNUSED(ne1); GGML_UNUSED(dps2); GGML_UNUSED(dps3); GGML_UNUSED(nb01); GGML_UNUSED(nb02); GGML_UNUSED(nb03);
    GGML_UNUSED(s10); GGML_UNUSED(s12); GGML_UNUSED(s13); GGML_UNUSED(s1); GGML_UNUSED(s2); GGML_UNUSED(s3);
    GGML_UNUSED(sk); GGML_UNUSED(chunk_rows); GGML_UNUSED(sm);
    NO_DEVICE_CODE;
#endif // OUT_PROD_Q_MMA_CODE
}

// the softmax form's segments combined: element i of dst column col = i/ne0 (contiguous dst, tmp its nseg partials)
// is sum_s tmp[s][i]*exp(m_s - M) / (sum_s l_s*exp(m_s - M) + exp(sink - M)), M the largest of the m_s and the sink;
// the sink is that of the column's softmax row's matrix. The segments in a fixed order; a column with no finite x
// and no sink is 0.
static __global__ void k_out_prod_q_softmax_combine(const float * __restrict__ tmp, const float * __restrict__ ml,
        const float * __restrict__ sinks, float * __restrict__ dst, const int64_t ne, const int ne0, const int64_t ncols,
        const int nseg, const int ne1, const int ne2, const int64_t s10, const int64_t s12, const int64_t s13,
        const int srow, const int ns1, const int ns2) {
    const int64_t i = (int64_t) blockIdx.x*blockDim.x + threadIdx.x;
    if (i >= ne) {
        return;
    }
    const int64_t col = i/ne0;
    float M = -INFINITY;
    for (int s = 0; s < nseg; ++s) {
        M = fmaxf(M, ml[2*(s*ncols + col)]);
    }
    float sink = -INFINITY;
    if (sinks != nullptr) {
        const int64_t i1 = col % ne1;
        const int64_t i2 = (col/ne1) % ne2;
        const int64_t i3 = col/((int64_t) ne1*ne2);
        sink = sinks[((i1*s10 + i2*s12 + i3*s13)/srow/ns1) % ns2];
        M = fmaxf(M, sink);
    }
    if (M == -INFINITY) {
        dst[i] = 0.0f;
        return;
    }
    float L = sinks != nullptr ? expf(sink - M) : 0.0f;
    float a = 0.0f;
    for (int s = 0; s < nseg; ++s) {
        const float w = expf(ml[2*(s*ncols + col)] - M);
        L += ml[2*(s*ncols + col) + 1]*w;
        a += tmp[s*ne + i]*w;
    }
    dst[i] = a/L;
}

// cells per k segment of k_out_prod_q_mma for nblocks blocks per segment: segments enough for ~two blocks per SM, each
// at least OUT_PROD_Q_MMA_MIN_SEG cells, a multiple of 32
static int out_prod_q_mma_chunk_rows(const int64_t ne01, const int64_t nblocks, const int nsm) {
    const int64_t want = (2*(int64_t) nsm + nblocks - 1)/nblocks;
    const int64_t nseg = std::max<int64_t>(1, std::min<int64_t>(want, ne01/OUT_PROD_Q_MMA_MIN_SEG));
    const int64_t rows = (ne01 + nseg - 1)/nseg;
    return (int) ((rows + 31)/32*32);
}
