#pragma once

// llama-vq: the fused decode attention's V*P on tensor cores, a part of attn-decode-fused.cu (included there
// after AD_NT, AD_TC and AD_BLOCK_BYTES; the CPU emulation of the tests includes it the same way).

// V*P on tensor cores (NVIDIA sm_80+, d_v 128): the softmax phase writes P as f16 (pt, [columns][AD_PTS]
// halves); each warp, 16 cells at a time, dequantizes its 32-value block of d_v to f16 in a buffer of its own (vw,
// [16][AD_VWS] halves: rows of 80 bytes, so that ldmatrix's eight rows of a matrix fall in distinct banks) and runs
// mma.sync m16n8k16 (f16 inputs, f32 accumulators; as FA's mma kernels) on V^T P with d_v as M, the cells as K and the
// query columns as N. 16 cells per warp keep the shared memory at 5 KB (a whole f16 tile, 17 KB, cost q8_0 two of
// its five blocks per SM on the H200). The CPU emulation of the tests defines AD_EMULATE_MMA and its own ad_mma_f16 and
// ad_ldsm_x4_trans.
#if defined(AMPERE_MMA_AVAILABLE) || defined(AD_EMULATE_MMA)
#define AD_VMMA_CODE
#endif // defined(AMPERE_MMA_AVAILABLE) || defined(AD_EMULATE_MMA)
#define AD_VMMA_DV 128           // the d_v the tensor-core V*P handles: 4 blocks of 32 values, one per warp
#define AD_VWS     40               // halves per row of a warp's f16 V buffer (32 values + 8)
#define AD_PTS     (AD_TC + 8)      // halves per pt row (36 words: lane (g, t)'s B words fall in bank 4g + t)

// ad_mma_f16 and ad_ldsm_x4_trans: mma-f16.cuh (attn-decode-fused.cu includes it)

#ifdef AD_VMMA_CODE
static __device__ __forceinline__ half2 ad_h2(const unsigned u) {
    half2 h;
    memcpy(&h, &u, sizeof(h));
    return h;
}

// 4 bytes at a 2-byte aligned shared-memory address (q4_0 and q8_0 blocks are 18 and 34 bytes)
static __device__ __forceinline__ unsigned ad_lds_u32_a2(const char * ptr) {
    return (unsigned) *(const unsigned short *) ptr | (unsigned) *(const unsigned short *) (ptr + 2) << 16;
}

// the four bytes of x (each < 256) as f16 1024 + byte, exactly (an f16 of exponent 10 has a unit mantissa step):
// (b0, b1) and (b2, b3)
static __device__ __forceinline__ void ad_bytes_h2(const unsigned x, half2 & h01, half2 & h23) {
    h01 = ad_h2(__byte_perm(x, 0x64646464u, 0x4140));
    h23 = ad_h2(__byte_perm(x, 0x64646464u, 0x4342));
}

// C'. a 32-value block of d_v (block vb; by default block w of d_v 128 for warp w) for cells kb .. kb + 15 as f16 into
// vw [16][vws] (cells past tn: 0): lane l takes cell kb + l%16 and half l/16 of the block's bytes. The integers
// become exact f16 (ad_bytes_h2, minus 1024 + the type's offset), then one rounding: * d (q4_0, q8_0) or * d + m
// (q4_1), as FA's kernels dequantize to f16.
template <ggml_type type_v>
static __device__ __forceinline__ void ad_v_chunk_f16(const char * v_sh, const int rbv, const int kb, const int tn,
        half * vw, const int vb = threadIdx.x / 32, const int vws = AD_VWS) {
    const int lane = threadIdx.x % 32;
    const int hb   = lane / 16;
    // the two 8-value runs this lane writes: q8_0 bytes 16hb .. 16hb + 15 are values 16hb .., q4 bytes 8hb .. 8hb + 7
    // are values 8hb .. (low nibbles) and 16 + 8hb .. (high)
    const int x0 = type_v == GGML_TYPE_Q8_0 ? 16*hb     : 8*hb;
    const int x1 = type_v == GGML_TYPE_Q8_0 ? 16*hb + 8 : 16 + 8*hb;
    const int c  = kb + lane % 16;
    half2 h[8];
    if (c < tn) {
        const char * blk = v_sh + c*rbv + vb*AD_BLOCK_BYTES(type_v);
        if constexpr (type_v == GGML_TYPE_Q8_0) {
            const half2 d2  = __half2half2(*(const half *) blk);
            const half2 off = __float2half2_rn(1152.0f); // 1024 + 128: the bytes' sign bits flipped
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                ad_bytes_h2(ad_lds_u32_a2(blk + 2 + 16*hb + 4*k) ^ 0x80808080u, h[2*k], h[2*k + 1]);
                h[2*k + 0] = __hmul2(__hsub2(h[2*k + 0], off), d2);
                h[2*k + 1] = __hmul2(__hsub2(h[2*k + 1], off), d2);
            }
        } else {
            unsigned w[2];
            half2 d2;
            half2 m2;
            if constexpr (type_v == GGML_TYPE_Q4_1) {
                const half2 dm = *(const half2 *) blk;
                d2   = __low2half2(dm);
                m2   = __high2half2(dm);
                w[0] = *(const unsigned *) (blk + 4 + 8*hb);
                w[1] = *(const unsigned *) (blk + 8 + 8*hb);
            } else {
                d2   = __half2half2(*(const half *) blk);
                m2   = d2;
                w[0] = ad_lds_u32_a2(blk + 2 + 8*hb);
                w[1] = ad_lds_u32_a2(blk + 6 + 8*hb);
            }
            const half2 off = __float2half2_rn(type_v == GGML_TYPE_Q4_1 ? 1024.0f : 1032.0f);
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                ad_bytes_h2(w[k] & 0x0F0F0F0Fu,        h[2*k + 0], h[2*k + 1]); // low nibbles: run 0
                ad_bytes_h2((w[k] >> 4) & 0x0F0F0F0Fu, h[2*k + 4], h[2*k + 5]); // high nibbles: run 1
            }
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                if constexpr (type_v == GGML_TYPE_Q4_1) {
                    h[k] = __hfma2(__hsub2(h[k], off), d2, m2);
                } else {
                    h[k] = __hmul2(__hsub2(h[k], off), d2);
                }
            }
        }
    } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            h[k] = __float2half2_rn(0.0f);
        }
    }
    ggml_cuda_memcpy_1<16>(vw + (lane % 16)*vws + x0, h + 0);
    ggml_cuda_memcpy_1<16>(vw + (lane % 16)*vws + x1, h + 4);
}

// C'. the tile's V^T P on tensor cores, after the accumulators are rescaled by the tile's factors: per step of
// 16 cells (cells past tn: V and P 0) the warp's V chunk as f16 (ad_v_chunk_f16, into its own vw), then warp w's two
// m-tiles, d_v rows 32w .. 32w + 15 and 32w + 16 .. 32w + 31 (A from vw by ldmatrix, transposed), times the n-tiles,
// columns 8nt .. 8nt + 7 (B from pt). acc[mt][nt] is the m16n8 D fragment: (row g, columns 2t, 2t + 1), (row g + 8,
// the same), g = lane/4, t = lane%4.
template <ggml_type type_v, int NTM>
static __device__ __forceinline__ void ad_vp_mma(const char * v_sh, const int rbv, half * vw, const half * pt,
        const float * a_sh, float (*acc)[NTM][4], const int ncp, const int tn) {
    const int nnt  = (ncp + 7)/8;
    const int lane = threadIdx.x % 32;
    const int g    = lane / 4;
    const int t    = lane % 4;
    // the factors are exactly 1 where a column's max stayed (ad_softmax_tile): deep in a cache, mostly all of them
    float f[NTM][2];
    bool  any = false;
#pragma unroll
    for (int nt = 0; nt < NTM; ++nt) {
        f[nt][0] = nt < nnt ? a_sh[8*nt + 2*t + 0] : 1.0f;
        f[nt][1] = nt < nnt ? a_sh[8*nt + 2*t + 1] : 1.0f;
        any = any || f[nt][0] != 1.0f || f[nt][1] != 1.0f;
    }
    if (__any_sync(0xffffffff, any)) {
#pragma unroll
        for (int nt = 0; nt < NTM; ++nt) {
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
                acc[mt][nt][0] *= f[nt][0];
                acc[mt][nt][1] *= f[nt][1];
                acc[mt][nt][2] *= f[nt][0];
                acc[mt][nt][3] *= f[nt][1];
            }
        }
    }
    // ldmatrix: lanes 8i .. 8i + 7 address the rows (cells) of matrix i: cells + 0 .. 7 (i = 0, 1) or + 8 .. 15
    // (i = 2, 3), d_v columns + 0 (i = 0, 2) or + 8 (i = 1, 3); transposed, they are A's four 8x8 quarters
    const half * arow = vw + (lane % 8 + 8*(lane / 16))*AD_VWS + 8*((lane / 8) % 2);
    for (int kb = 0; kb < tn; kb += 16) {
        ad_v_chunk_f16<type_v>(v_sh, rbv, kb, tn, vw);
        __syncwarp();
        unsigned a[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
            ad_ldsm_x4_trans(a[mt], arow + 16*mt);
        }
        __syncwarp(); // every lane's rows are read: the next chunk may overwrite vw
#pragma unroll
        for (int nt = 0; nt < NTM; ++nt) {
            if (nt < nnt) {
                // pt has ncp rows: the n-tile's columns past them are 0 (their results are never written)
                const half * pb = pt + (8*nt + g)*AD_PTS + kb + 2*t;
                const bool   in = 8*nt + g < ncp;
                const unsigned b0 = in ? *(const unsigned *) pb       : 0u;
                const unsigned b1 = in ? *(const unsigned *) (pb + 8) : 0u;
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
                    ad_mma_f16(acc[mt][nt], a[mt], b0, b1);
                }
            }
        }
    }
}

// the D fragments of ad_vp_mma into q_sh [ncp][dv]: each element is one lane's; the padded columns are not written
template <int NTM>
static __device__ __forceinline__ void ad_vp_mma_store(float * q_sh, const float (*acc)[NTM][4], const int dv,
        const int nc, const int ncp) {
    const int nnt  = (ncp + 7)/8;
    const int warp = threadIdx.x / 32;
    const int g    = (threadIdx.x % 32) / 4;
    const int t    = threadIdx.x % 4;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int nt = 0; nt < NTM; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int col = 8*nt + 2*t + (e & 1);
                if (nt < nnt && col < nc) {
                    q_sh[col*dv + 32*warp + 16*mt + g + 8*(e >> 1)] = acc[mt][nt][e];
                }
            }
        }
    }
}
#endif // AD_VMMA_CODE
