#pragma once

// llama-vq: the fused decode attention with both of its products on tensor cores (NVIDIA sm_80+), a part of
// attn-decode-fused.cu (included there after k_attn_decode_combine; the CPU emulation of the tests includes it the
// same way, with AD_EMULATE_MMA's ad_mma_s8, ad_mma_f16 and ad_ldsm_x4_trans).
//
// Why a second form: at GQA 16 (MiMo's full-attention layers) a cell of the cache carries 16 query columns' work,
// 3,072 multiply-adds of K*Q and 2,048 of V*P for its 284 bytes (q8_0 K 192 / q4_1 V 128). On dp4a and with the
// block's phases separated by barriers (k_attn_decode), that work, not the memory, bounds the kernel. Here:
// - K*Q is int8 mma m16n8k32 on the cache's own integers: the query columns as M (16 per block; the queries int8 per
//   32 values as k_attn_decode quantizes them, held in registers for the whole kernel), the cells as N, one K block
//   of 32 values as K, so that each (cell, block) scale multiplies one integer result: S^T += d_k d_q (K.Q)_int
//   (q4_0: d_k (d_q (K.Q)_int - 8 d_q sum(q)); q4_1: d_k d_q (K.Q)_int + m_k d_q sum(q)), as ad_kq_block;
// - every warp walks its own 16 cells of each tile with a softmax state of its own (running max and sum per column,
//   flash-decoding inside the block): the scores never leave the registers, and no barrier separates the phases;
// - S^T's accumulator fragments are, as f16, the A fragments of V*P (m16n8k16: P [columns x 16 cells] times V
//   [16 cells x 8 values of d_v]), V dequantized to f16 per warp (ad_v_chunk_f16) and read by ldmatrix .trans.
// The block's four warps merge their states at the end (a fixed order: deterministic), and the result leaves as
// k_attn_decode's does (ad_write_out: normalized, or a split's partial for k_attn_decode_combine). Each warp stages its
// own 16 cells of every 64-cell tile (ad_tc_stage: two buffers with cp.async, its next cells in flight) and waits
// only for its own copies: no block barrier between the tiles, so that the four warps drift apart and one's loads
// and barriers wait while another issues.

#define AD_TC_COLS 16 // query columns per block: one m-tile

// the d_k / d_v pairs the form is compiled for (others keep k_attn_decode)
static constexpr bool ad_tc_shape(const int dk, const int dv) {
    return (dk == 128 && dv == 128) || (dk == 192 && dv == 128) || (dk == 64 && dv == 64);
}

#ifdef AD_VMMA_CODE
// 4 bytes at a shared-memory address that is 2-byte aligned (q8_0 and q4_0 blocks are 34 and 18 bytes)
static __device__ __forceinline__ unsigned ad_tc_lds_u32(const char * ptr) {
    return (unsigned) *(const unsigned short *) ptr | (unsigned) *(const unsigned short *) (ptr + 2) << 16;
}

// B fragment of K^T for a K block (k 4t..4t+3 and 16+4t..16+4t+3 of the block's 32 values, as int8): q8_0 its bytes,
// q4 the nibbles of the same four bytes (low: values 4t.., high: 16+4t..), 0..15
template <ggml_type type_k>
static __device__ __forceinline__ void ad_tc_kfrag(const char * blk, const int t, unsigned & b0, unsigned & b1) {
    if constexpr (type_k == GGML_TYPE_Q8_0) {
        b0 = ad_tc_lds_u32(blk + 2 + 4*t);
        b1 = ad_tc_lds_u32(blk + 2 + 16 + 4*t);
    } else {
        const unsigned w = type_k == GGML_TYPE_Q4_1 ? *(const unsigned *) (blk + 4 + 4*t) : ad_tc_lds_u32(blk + 2 + 4*t);
        b0 = w & 0x0F0F0F0Fu;
        b1 = (w >> 4) & 0x0F0F0F0Fu;
    }
}

// a K block's scale d (and q4_1's minimum m)
template <ggml_type type_k>
static __device__ __forceinline__ float2 ad_tc_kdm(const char * blk) {
    if constexpr (type_k == GGML_TYPE_Q4_1) {
        return __half22float2(*(const half2 *) blk);
    } else {
        return make_float2(__half2float(*(const half *) blk), 0.0f);
    }
}

// one block's integer dot products -> its contribution to the score (qds = (d_q, d_q sum(q)) of the column)
template <ggml_type type_k>
static __device__ __forceinline__ float ad_tc_kq_scale(const int si, const float2 kdm, const float2 qds) {
    if constexpr (type_k == GGML_TYPE_Q4_0) {
        return kdm.x*(qds.x*(float) si - 8.0f*qds.y);
    } else if constexpr (type_k == GGML_TYPE_Q4_1) {
        return kdm.x*qds.x*(float) si + kdm.y*qds.y;
    } else {
        return kdm.x*qds.x*(float) si;
    }
}

// the mask values of the lane's scores in the tile at cell t0 (rows g, g+8; the warp's cells wc0 + 8j + 2t (+1)),
// 0 past tn or without a mask: loaded a tile ahead, so that their latency hides under a tile's work. The two cells of
// a row are adjacent and t0 + wc0 + 8j + 2t is even (the splits are whole tiles), so where the rows are aligned
// (pair) each pair is one load.
static __device__ __forceinline__ void ad_tc_mask(float (*mv)[4], const char * mrow0, const char * mrow1, const bool mf16,
        const bool pair, const int t0, const int wc0, const int t, const int tn) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const char * mr = hr == 0 ? mrow0 : mrow1;
            const int    c  = wc0 + 8*j + 2*t;
            float2 v = make_float2(0.0f, 0.0f);
            if (mr && pair && c + 1 < tn) {
                v = mf16 ? __half22float2(*(const half2 *) ((const half *) mr + t0 + c)) :
                           *(const float2 *) ((const float *) mr + t0 + c);
            } else if (mr) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    if (c + e < tn) {
                        const float x = mf16 ? __half2float(((const half *) mr)[t0 + c + e]) : ((const float *) mr)[t0 + c + e];
                        if (e == 0) {
                            v.x = x;
                        } else {
                            v.y = x;
                        }
                    }
                }
            }
            mv[j][2*hr + 0] = v.x;
            mv[j][2*hr + 1] = v.y;
        }
    }
}

// warp w's cells of the tile at t0 (t0 + 16w .. t0 + 16w + 15, those before c_end) into its rows (16w ..) of a tile
// buffer (k_buf, v_buf), by the warp's lanes: the walks p.gk / p.gv are planned for 32 threads (attn_decode_walkers)
static __device__ __forceinline__ void ad_tc_stage(const attn_decode_params & p, const ad_rows_blk & rw, char * k_buf,
        char * v_buf, const char * kbase, const char * vbase, const int t0, const int c_end, const int warp,
        const int lane) {
    const int c0 = t0 + 16*warp;
    const int tn = min(16, c_end - c0);
    if (tn > 0) {
        ad_stage<32>(k_buf + 16*warp*p.rsk, kbase + (int64_t) c0*p.k_nb1, p.gk[rw.koff >> 1], tn, lane);
        ad_stage<32>(v_buf + 16*warp*p.rsv, vbase + (int64_t) c0*p.v_nb1, p.gv[rw.voff >> 1], tn, lane);
    }
}

static __device__ __forceinline__ unsigned ad_tc_pack_h2(const float lo, const float hi) {
    const half2 h = __floats2half2_rn(lo, hi);
    unsigned u;
    memcpy(&u, &h, sizeof(u));
    return u;
}
#endif // AD_VMMA_CODE

// the last part of k_attn_decode_tc's shared memory, bytes: the warps' f16 V rows, which hold the f32 queries while
// they are quantized and the block's sums at the end, and then the folded combine's arrays (ad_fold_combine)
static size_t attn_decode_tc_fold_room(const int dk, const int dv) {
    return std::max({(size_t) (AD_NT/32)*16*(dv + 8)*sizeof(half), (size_t) AD_TC_COLS*std::max(dk, dv)*sizeof(float),
                     (size_t) AD_TC_COLS*(2*dv + 4)*sizeof(float)});
}

// dynamic shared memory of k_attn_decode_tc: mask offsets and the running state arrays ad_load_queries fills, the
// warps' (max, sum) per column, the int8 queries and their scales, nbuf K and V tiles, then the warps' f16 V rows,
// which also hold the f32 queries while they are quantized and the block's sums at the end
static size_t attn_decode_tc_smem(const int dk, const int dv, const int rbk, const int rbv, const int nbuf) {
    const size_t front = AD_CT*sizeof(int64_t) + (3*AD_CT + 2*(AD_NT/32)*AD_TC_COLS)*sizeof(float) +
        (size_t) AD_TC_COLS*dk + (size_t) AD_TC_COLS*(dk/32)*2*sizeof(float);
    const size_t tiles = nbuf*((size_t) (AD_TC*rbk + 15)/16*16 + (size_t) (AD_TC*rbv + 15)/16*16);
    return (front + 15)/16*16 + tiles + attn_decode_tc_fold_room(dk, dv);
}

// one block = (split of the cells, KV head x tile of <= 16 query columns, stream), 128 threads = 4 warps of 32 lanes
// (NVIDIA only: the fragments are warp-32 layouts). g = lane/4, t = lane%4: the lane's query columns are g and g+8
// of the block's 16 (rows of the fragments), its cells 2t, 2t+1 (+8) of the warp's 16 in a tile.
template <ggml_type type_k, ggml_type type_v, int DK, int DV>
static __global__ void __launch_bounds__(AD_NT, 3) k_attn_decode_tc(const attn_decode_params p) {
#if !defined(AD_VMMA_CODE) || AD_NBUF_MAX != 2 // mma.sync and cp.async (two tile buffers, attn_decode_tc_nbuf)
    GGML_UNUSED(p);
    NO_DEVICE_CODE;
#else
    constexpr int NKB = DK/32;  // K blocks per row
    constexpr int NVT = DV/8;   // n-tiles of d_v in V*P
    constexpr int VWS = DV + 8; // halves per row of a warp's f16 V (rows 16 bytes apart in banks: ldmatrix conflict-free)
    constexpr int NW  = AD_NT/32;
    static_assert(AD_TC == 16*NW, "a tile is 16 cells per warp");

    extern __shared__ int64_t ad_smem[];

    const int tid  = threadIdx.x;
    const int warp = tid / 32;
    const int lane = tid % 32;
    const int g    = lane / 4;
    const int t    = lane % 4;
    const int z    = blockIdx.x;
    const int h    = blockIdx.y / p.ntiles;
    const int tile = blockIdx.y % p.ntiles;
    const int s    = blockIdx.z;

    const int col0 = tile*AD_TC_COLS;
    const int nc   = min(AD_TC_COLS, p.ncols - col0);

    int64_t * moff  = ad_smem;                      // [AD_CT] byte offset of each column's mask row
    float   * m_sh  = (float *) (moff + AD_CT);     // [AD_CT] ad_load_queries' running state (here: the block's max)
    float   * l_sh  = m_sh + AD_CT;                 // [AD_CT] (the block's sum)
    float   * a_sh  = l_sh + AD_CT;                 // [AD_CT] (unused after ad_load_queries)
    float   * wm_sh = a_sh + AD_CT;                 // [NW][16] the warps' running max per column
    float   * wl_sh = wm_sh + NW*AD_TC_COLS;        // [NW][16] the warps' running sum per column
    int     * qi_sh = (int *) (wl_sh + NW*AD_TC_COLS);          // [16][DK/4] the queries as int8, 4 per int
    float2  * qd_sh = (float2 *) (qi_sh + AD_TC_COLS*DK/4);     // [16][DK/32] per 32 values: d, d*sum(q)
    const int kbuf = (AD_TC*p.rsk + 15)/16*16;
    const int vbuf = (AD_TC*p.rsv + 15)/16*16;
    char    * k_sh0 = (char *) ad_smem + ((const char *) (qd_sh + AD_TC_COLS*NKB) - (const char *) ad_smem + 15)/16*16;
    char    * v_sh0 = k_sh0 + p.nbuf*kbuf;
    half    * vw_sh = (half *) (v_sh0 + p.nbuf*vbuf);           // [NW][16][VWS] the warps' f16 V rows
    float   * q_sh  = (float *) vw_sh;                          // [16][max(DK, DV)] f32 queries, then the sums
    float   * o_sh  = q_sh + AD_TC_COLS*DV;                     // [16][DV + 4] the warps' sums added (at the end)
    half    * vw    = vw_sh + warp*16*VWS;

    const int c_begin = z*p.cps;
    const int c_end   = min(c_begin + p.cps, p.n_kv);

    const char * kbase = p.k + h*p.k_nb2 + s*p.k_nb3;
    const char * vbase = p.v + h*p.v_nb2 + s*p.v_nb3;
    const ad_rows_blk rw = ad_rows_block(p, kbase, vbase); // a staged row's bytes begin at +koff / +voff

    // everything above is index arithmetic: the kernel before may still be running (programmatic dependent launch)
    ggml_cuda_pdl_sync();

    ad_tc_stage(p, rw, k_sh0, v_sh0, kbase, vbase, c_begin, c_end, warp, lane);
    ad_commit();

    // the queries: int8 per 32 values into qi_sh / qd_sh (padded columns 0), the mask rows' offsets (ends with a barrier)
    ad_load_queries(p, q_sh, qi_sh, qd_sh, moff, m_sh, l_sh, a_sh, col0, nc, AD_TC_COLS, h, s);

    // the lane's A fragments of Q (rows g, g+8; k 4t.. and 16+4t.. of each block) and its columns' block scales
    unsigned qa[NKB][4];
    float2   qds[NKB][2];
#pragma unroll
    for (int b = 0; b < NKB; ++b) {
        qa[b][0] = (unsigned) qi_sh[g*(DK/4)       + 8*b + t];
        qa[b][1] = (unsigned) qi_sh[(g + 8)*(DK/4) + 8*b + t];
        qa[b][2] = (unsigned) qi_sh[g*(DK/4)       + 8*b + 4 + t];
        qa[b][3] = (unsigned) qi_sh[(g + 8)*(DK/4) + 8*b + 4 + t];
        qds[b][0] = qd_sh[g*NKB + b];
        qds[b][1] = qd_sh[(g + 8)*NKB + b];
    }
    // the mask rows of the lane's columns (padded columns read column nc-1's row: their scores are never used)
    const char * mrow0 = p.mask ? p.mask + moff[min(g, nc - 1)]     : nullptr;
    const char * mrow1 = p.mask ? p.mask + moff[min(g + 8, nc - 1)] : nullptr;
    const bool   mf16  = p.mask_f16;
    // both rows aligned for pairs of values (ad_tc_mask)
    const bool   mpair = ((uintptr_t) mrow0 | (uintptr_t) mrow1) % (mf16 ? 4 : 8) == 0;
    float mv[2][4]; // the mask values of the lane's scores in the current tile (ad_tc_mask), the next tile's loaded early
    ad_tc_mask(mv, mrow0, mrow1, mf16, mpair, c_begin, 16*warp, t, min(AD_TC, c_end - c_begin));
    __syncthreads(); // q_sh (the f32 queries) is vw's memory from here on

    float m_run[2] = {-INFINITY, -INFINITY}; // rows g, g+8
    float l_run[2] = {0.0f, 0.0f};           // this lane's cells only (the 4 lanes of a row are summed at the end)
    float acc[NVT][4];
#pragma unroll
    for (int nt = 0; nt < NVT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            acc[nt][e] = 0.0f;
        }
    }

    // ldmatrix .trans rows of the warp's f16 V: lanes 8i .. 8i+7 give the cells 0..7 (i even) or 8..15 (i odd) at d_v
    // columns +0 (i < 2) or +8 (i >= 2) of a pair of n-tiles
    const half * vrow = vw + ((lane % 8) + 8*((lane / 8) % 2))*VWS + 8*(lane / 16);

    const int wc0 = 16*warp; // the warp's first cell in a tile
    for (int t0 = c_begin, it = 0; t0 < c_end; t0 += AD_TC, ++it) {
        const int  tn   = min(AD_TC, c_end - t0);
        const bool next = t0 + AD_TC < c_end;
        // the warp's rows of this tile: its next cells' copies issued into the other buffer (its lanes' last reads of
        // it came before the __syncwarp that closed the previous tile) and this tile's awaited, an empty group on the
        // last tile keeping the count
        const int buf = it & 1;
        if (next) {
            ad_tc_stage(p, rw, k_sh0 + (buf ^ 1)*kbuf, v_sh0 + (buf ^ 1)*vbuf, kbase, vbase, t0 + AD_TC, c_end, warp,
                lane);
        }
        ad_commit();
        ad_wait_all_but_newest();
        const char * k_sh = k_sh0 + buf*kbuf + rw.koff;
        const char * v_sh = v_sh0 + buf*vbuf + rw.voff;
        __syncwarp(); // every lane's copies of the warp's rows have landed

        if (wc0 < tn) { // uniform per warp
            // the warp's 16 cells of V as f16 (cells past tn: 0), one 32-value block of d_v at a time, first: they
            // depend on nothing below, so that the compiler may interleave them with K*Q's loads and mma (the previous
            // tile's ldmatrix reads of vw are ordered before this by the __syncwarp that closed it)
#pragma unroll
            for (int vb = 0; vb < DV/32; ++vb) {
                ad_v_chunk_f16<type_v>(v_sh, p.rsv, wc0, tn, vw + 32*vb, vb, VWS);
            }
            // S^T = Q K^T for the warp's 16 cells (n-tiles j: cells 8j .. 8j+7): one int8 mma per (block, n-tile)
            float sc[2][4];
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const char * krow = k_sh + min(wc0 + 8*j + g, tn - 1)*p.rsk;  // B's column g: cell 8j + g
                const char * kr0  = k_sh + min(wc0 + 8*j + 2*t, tn - 1)*p.rsk; // the scales of cells 2t, 2t+1
                const char * kr1  = k_sh + min(wc0 + 8*j + 2*t + 1, tn - 1)*p.rsk;
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    sc[j][e] = 0.0f;
                }
#pragma unroll
                for (int b = 0; b < NKB; ++b) {
                    unsigned b0, b1;
                    ad_tc_kfrag<type_k>(krow + b*AD_BLOCK_BYTES(type_k), t, b0, b1);
                    int si[4] = {0, 0, 0, 0};
                    ad_mma_s8(si, qa[b], b0, b1);
                    const float2 k0 = ad_tc_kdm<type_k>(kr0 + b*AD_BLOCK_BYTES(type_k));
                    const float2 k1 = ad_tc_kdm<type_k>(kr1 + b*AD_BLOCK_BYTES(type_k));
                    sc[j][0] += ad_tc_kq_scale<type_k>(si[0], k0, qds[b][0]);
                    sc[j][1] += ad_tc_kq_scale<type_k>(si[1], k1, qds[b][0]);
                    sc[j][2] += ad_tc_kq_scale<type_k>(si[2], k0, qds[b][1]);
                    sc[j][3] += ad_tc_kq_scale<type_k>(si[3], k1, qds[b][1]);
                }
            }
            // online softmax per row (the 4 lanes t of a row hold its 16 cells)
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int j = 0; j < 2; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int c = wc0 + 8*j + 2*t + (e & 1);
                    sc[j][e] = c < tn ? sc[j][e]*p.scale + mv[j][e] : -INFINITY;
                    mx[e >> 1] = fmaxf(mx[e >> 1], sc[j][e]);
                }
            }
            if (next) {
                // the next tile's mask values: in flight during this tile's V*P and the next tile's wait
                ad_tc_mask(mv, mrow0, mrow1, mf16, mpair, t0 + AD_TC, wc0, t, min(AD_TC, c_end - t0 - AD_TC));
            }
            float alpha[2];
            bool  grew = false; // a running max of the lane's rows rose (else both factors are 1)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                mx[r] = warp_reduce_max<4>(mx[r]);
                const float m_new = fmaxf(m_run[r], mx[r]);
                const bool  up    = m_new > m_run[r];
                grew     = grew || up;
                alpha[r] = up ? expf(m_run[r] - m_new) : 1.0f;
                m_run[r] = m_new;
            }
            float ps[2] = {0.0f, 0.0f};
#pragma unroll
            for (int j = 0; j < 2; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float mr = m_run[e >> 1];
                    sc[j][e] = sc[j][e] == -INFINITY ? 0.0f : expf(sc[j][e] - mr);
                    ps[e >> 1] += sc[j][e];
                }
            }
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                l_run[r] = l_run[r]*alpha[r] + ps[r];
            }
            // the accumulators rescaled only where a row's max rose in the warp: deep in a cache most tiles leave every
            // max as it was, and a factor of 1 changes nothing (the warp's 64 multiplications skipped)
            if (__any_sync(0xffffffff, grew)) {
#pragma unroll
                for (int nt = 0; nt < NVT; ++nt) {
                    acc[nt][0] *= alpha[0];
                    acc[nt][1] *= alpha[0];
                    acc[nt][2] *= alpha[1];
                    acc[nt][3] *= alpha[1];
                }
            }
            // P as the A fragment of m16n8k16: (row g, cells 2t, 2t+1), (row g+8, the same), (row g, 8+2t, ..), (g+8, ..)
            unsigned pa[4];
            pa[0] = ad_tc_pack_h2(sc[0][0], sc[0][1]);
            pa[1] = ad_tc_pack_h2(sc[0][2], sc[0][3]);
            pa[2] = ad_tc_pack_h2(sc[1][0], sc[1][1]);
            pa[3] = ad_tc_pack_h2(sc[1][2], sc[1][3]);

            __syncwarp(); // every lane's f16 V rows are written
#pragma unroll
            for (int np = 0; np < NVT/2; ++np) {
                unsigned vbf[4];
                ad_ldsm_x4_trans(vbf, vrow + 16*np);
                ad_mma_f16(acc[2*np + 0], pa, vbf[0], vbf[1]);
                ad_mma_f16(acc[2*np + 1], pa, vbf[2], vbf[3]);
            }
        }
        __syncwarp(); // the warp's rows of this tile's buffers and its f16 V rows are free
    }

    ggml_cuda_pdl_lc();

    // the warps' states merged: per column the block's max M, each warp's factor exp(m_w - M), the block's sum, and
    // the sums of o added warp by warp into q_sh [16][DV] (fixed order)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l_run[r] = warp_reduce_sum<4>(l_run[r]);
    }
    if (t == 0) {
        wm_sh[warp*AD_TC_COLS + g]     = m_run[0];
        wm_sh[warp*AD_TC_COLS + g + 8] = m_run[1];
        wl_sh[warp*AD_TC_COLS + g]     = l_run[0];
        wl_sh[warp*AD_TC_COLS + g + 8] = l_run[1];
    }
    __syncthreads();
    float f[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int col = g + 8*r;
        float mb = -INFINITY;
#pragma unroll
        for (int w = 0; w < NW; ++w) {
            mb = fmaxf(mb, wm_sh[w*AD_TC_COLS + col]);
        }
        f[r] = m_run[r] == -INFINITY ? 0.0f : expf(m_run[r] - mb);
        if (warp == 0 && t == 0) {
            float lb = 0.0f;
#pragma unroll
            for (int w = 0; w < NW; ++w) {
                const float mw = wm_sh[w*AD_TC_COLS + col];
                lb += mw == -INFINITY ? 0.0f : expf(mw - mb)*wl_sh[w*AD_TC_COLS + col];
            }
            m_sh[col] = mb;
            l_sh[col] = lb;
        }
    }
    // into o_sh, rows DV + 4 apart (DV apart, the 8 rows g of a fragment would share a bank), then copied into q_sh
#pragma unroll
    for (int w = 0; w < NW; ++w) {
        if (warp == w) {
#pragma unroll
            for (int nt = 0; nt < NVT; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int col = g + 8*(e >> 1);
                    const int i0  = 8*nt + 2*t + (e & 1);
                    const float o = acc[nt][e]*f[e >> 1];
                    o_sh[col*(DV + 4) + i0] = w == 0 ? o : o_sh[col*(DV + 4) + i0] + o;
                }
            }
        }
        __syncthreads();
    }
    for (int i = tid; i < AD_TC_COLS*DV; i += AD_NT) {
        q_sh[i] = o_sh[(i/DV)*(DV + 4) + i % DV];
    }
    __syncthreads();

    ad_write_out(p, q_sh, m_sh, l_sh, col0, nc, h, s, z);
    if (p.fold) {
        ad_fold_combine(p, q_sh, col0, nc, h, s, tile); // q_sh and o_sh: attn_decode_fold_floats
    }
#endif // !defined(AD_VMMA_CODE) || AD_NBUF_MAX != 2
}
