#include "attn-decode-fused.cuh"
#include "cp-async.cuh"
#include "dequantize-x8.cuh"
#include "mma-f16.cuh"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>

// One block = (split of the cells, KV head x tile of <= 32 query columns, stream), 128 threads, no warp-size
// assumption beyond shuffles of width 4 and 32 (which divide 32- and 64-wide wavefronts), every thread reaching
// every shuffle. Query column col (0 .. n_tokens*gqa) = token col % n_tokens of head h*gqa + col / n_tokens.
// Per tile of AD_TC cells:
//   A. scores: AD_TPR threads per cell, each dequantizes 8 K values at a time (once per chunk of CG columns) and
//      multiplies them with the queries staged in shared memory, two cells per thread group so that a query read
//      serves both; s = dot*scale + mask
//   B. online softmax: per column, the tile max, the new running max m, p = exp(s - m) (in place), the tile sum,
//      and the factor exp(m_old - m) that rescales the running sum and the accumulators
//   C. V*P: each thread owns 8 values of d_v for a chunk of CG columns and a phase of the cells; V dequantized once
//      per (cell, chunk)
// f32 throughout. At the end the phases are summed in a fixed order in shared memory; one split: normalized
// (sinks join the max and the sum) and written; several: partial (m, l, o) per split, then k_attn_decode_combine.
// The tile's K and V rows are staged in shared memory by the whole block, in units of 16/8/4/2 bytes (the
// widest that the rows' size and strides allow): with cp.async where available (NVIDIA sm_80+) into two buffers, the
// next tile's K and V loading while this tile's three phases run; elsewhere by plain loads into one buffer, 4 units per
// thread in flight. The phases then read only shared memory (and the mask, loaded ahead of the scores' dot products).

#define AD_NT  128 // threads per block
#define AD_TC  64  // cells per tile
#define AD_CT  32  // query columns per block
#define AD_TPR 4   // threads per K row in the scores phase
#define AD_BLOCK_BYTES(type) ((type) == GGML_TYPE_Q4_0 ? 18 : (type) == GGML_TYPE_Q4_1 ? 20 : 34) // q4_0, q4_1, q8_0
// blocks per SM the register allocation keeps room for: on NVIDIA (sm_90) 5 for <= 4-column chunks (<= 102
// registers; 128 unbounded), 3 for 8 (168); on AMD none (a bound spills there: gfx90a keeps ~100 / ~170 / ~250 VGPRs)
// tile buffers the kernel's code has: 2 where cp.async exists (NVIDIA sm_80+; the CPU emulation of the tests runs that
// code on an emulation of cp.async, AD_EMULATE_CP_ASYNC), else 1 (the second buffer's code compiled out)
#ifdef CP_ASYNC_AVAILABLE
#define AD_NBUF_MAX 2
#else
#define AD_NBUF_MAX 1
#endif // CP_ASYNC_AVAILABLE

#ifdef GGML_USE_HIP
#define AD_MIN_BLOCKS(CG) 1
#else
#define AD_MIN_BLOCKS(CG) ((CG) <= 4 ? 5 : 3)
#endif // GGML_USE_HIP

// the tensor-core V*P: its layout constants, the two instructions and the phase's device functions
#include "attn-decode-vmma.cuh"

// the staging of the tiles: cp.async, the walks' plan and ad_stage
#include "attn-decode-stage.cuh"

struct attn_decode_params {
    const char  * q;
    const char  * k;
    const char  * v;
    const char  * mask;
    const float * sinks;
    float       * dst;
    float       * part_o;  // [n_stream][n_head_kv][nsplit][ncols][d_v]
    float2      * part_ml; // [n_stream][n_head_kv][nsplit][ncols] (running max, running sum)

    int dk, dv, n_kv, n_head_kv, gqa, ntok, ncols, ntiles, nsplit, cps, hadamard_n;
    int nbuf;     // K and V tile buffers: 2 (the next tile's copies in flight during this tile's phases) or 1
    int out_rot;  // > 0: every out_rot-segment of an output row is Hadamard-rotated before it is written
    unsigned * fold; // the combine folded into this kernel (ad_fold_combine): a count per (stream, KV head, tile), else null
    int rbk, rbv; // bytes of a K / V row (one cell of one KV head)
    int uk, uv;   // bytes per staging unit of K / V (16, 8, 4 or 2)
    int wk, wv;   // K / V staged as windows (attn_decode_rows): 16-byte units around each row, at its offset in 16 bytes
    int rsk, rsv; // bytes between two staged rows of K / V in shared memory (rbk / rbv unless staged as windows)
    ad_stage_geo gk[8], gv[8]; // the staging walks of K and V (attn_decode_rows): [0], or for windows [offset/2]
    int m_ne2, m_ne3;
    int mask_f16; // k_attn_decode_tc: the mask is f16 (else f32); k_attn_decode takes it as a template parameter
    float scale;

    int64_t q_nb1, q_nb2, q_nb3;      // bytes
    int64_t k_nb1, k_nb2, k_nb3;      // bytes
    int64_t v_nb1, v_nb2, v_nb3;      // bytes
    int64_t m_nb1, m_nb2, m_nb3;      // bytes
    int64_t d_s1, d_s2, d_s3;         // floats
};

template <typename mask_t>
static __device__ __forceinline__ float attn_decode_mask_value(const char * row, const int cell) {
    if constexpr (std::is_same_v<mask_t, half>) {
        return __half2float(((const half *) row)[cell]);
    } else {
        return ((const float *) row)[cell];
    }
}

// where a block's staged K and V rows begin in shared memory: the rows' offset within 16 bytes for windows, else 0
// (it also picks the staging walk: p.gk[koff/2])
struct ad_rows_blk {
    int koff, voff;
};

// windows (attn_decode_rows): every cell of the block's KV head and stream is a multiple of 16 bytes after its first
// (nb1 % 16 == 0), so the block's rows share one (even) offset in 16 bytes, and each is staged as the 16-byte units
// that cover it: the bytes read around a row lie in the 16-byte units of its own first and last bytes (never another
// page, nor past the allocation). Moves kbase / vbase back to the first window. The walks for each offset are the
// host's (p.gk, p.gv: kernel parameters, read where used, so that the block holds two offsets in registers).
static __device__ __forceinline__ ad_rows_blk ad_rows_block(const attn_decode_params & p, const char *& kbase,
        const char *& vbase) {
    ad_rows_blk r;
    r.koff = p.wk ? (int) ((uintptr_t) kbase & 15) : 0;
    r.voff = p.wv ? (int) ((uintptr_t) vbase & 15) : 0;
    kbase -= r.koff;
    vbase -= r.voff;
    return r;
}

// the K and V rows of cells [t0, t0 + tn) into a tile buffer (k_sh, v_sh), all threads of the block, as ad_stage
static __device__ __forceinline__ void ad_stage_tile(const attn_decode_params & p, const ad_rows_blk & rw, char * k_sh,
        char * v_sh, const char * kbase, const char * vbase, const int t0, const int tn) {
    ad_stage<AD_NT>(k_sh, kbase + (int64_t) t0*p.k_nb1, p.gk[rw.koff >> 1], tn, (int) threadIdx.x);
    ad_stage<AD_NT>(v_sh, vbase + (int64_t) t0*p.v_nb1, p.gv[rw.voff >> 1], tn, (int) threadIdx.x);
}

// the top of the tile at cell t0 (the it-th of a split ending at c_end; buffers kbuf / vbuf bytes apart): with two
// buffers the next tile's copies issued into the other one (its barrier was the previous tile's last) and this
// tile's awaited, an empty group on the last tile keeping the count; with one, this tile's awaited. A barrier must
// follow. Returns this tile's buffer.
static __device__ __forceinline__ int ad_tile_wait(const attn_decode_params & p, const ad_rows_blk & rw, char * k_sh0,
        char * v_sh0, const int kbuf, const int vbuf, const char * kbase, const char * vbase, const int t0, const int it,
        const int c_end, const bool two) {
    if (!two) {
        ad_wait_all();
        return 0;
    }
    const int b = it & 1;
    if (t0 + AD_TC < c_end) {
        ad_stage_tile(p, rw, k_sh0 + (b ^ 1)*kbuf, v_sh0 + (b ^ 1)*vbuf, kbase, vbase, t0 + AD_TC,
            min(AD_TC, c_end - t0 - AD_TC));
    }
    ad_commit();
    ad_wait_all_but_newest(); // this tile's K and V have landed
    return b;
}

// the bottom of the tile at t0, after the barrier that frees its buffers: with one buffer, the next tile staged into it
static __device__ __forceinline__ void ad_tile_next(const attn_decode_params & p, const ad_rows_blk & rw, char * k_sh0,
        char * v_sh0, const char * kbase, const char * vbase, const int t0, const int c_end, const bool two) {
    if (!two && t0 + AD_TC < c_end) {
        ad_stage_tile(p, rw, k_sh0, v_sh0, kbase, vbase, t0 + AD_TC, min(AD_TC, c_end - t0 - AD_TC));
        ad_commit();
    }
}

// the block's query columns staged for K*Q: the queries (padded columns 0, scaled by 1/sqrt(n) and rotated in place
// for a rotated K cache, as mmvq-short), then as int8 per 32 values, as ggml's q8_0/q8_1 (d = amax/127,
// q = round(x/d), and d*sum(q)), so that K*Q runs on dp4a with the K blocks' own integers as the CPU's vec_dot and
// upstream's mmvq do for these types; the columns' mask rows and the running state (max, sum, rescale factor).
// Ends with a barrier.
static __device__ __forceinline__ void ad_load_queries(const attn_decode_params & p, float * q_sh, int * qi_sh,
        float2 * qd_sh, int64_t * moff, float * m_sh, float * l_sh, float * a_sh, const int col0, const int nc,
        const int ncp, const int h, const int s) {
    const int tid = threadIdx.x;
    const float yscale = p.hadamard_n > 0 ? rsqrtf((float) p.hadamard_n) : 1.0f;
    // QU loads of each thread in flight before their stores (a store to shared memory between two loads of the
    // queries would order them: one memory latency each)
    constexpr int QU = 8;
    for (int j0 = tid; j0 < ncp*p.dk; j0 += QU*AD_NT) {
        float val[QU];
#pragma unroll
        for (int u = 0; u < QU; ++u) {
            const int i  = j0 + u*AD_NT;
            const int c  = i / p.dk;
            const int i0 = i - c*p.dk;
            val[u] = 0.0f;
            if (i < ncp*p.dk && c < nc) {
                const int col  = col0 + c;
                const int tok  = col % p.ntok;
                const int head = h*p.gqa + col / p.ntok;
                val[u] = *(const float *) (p.q + i0*sizeof(float) + tok*p.q_nb1 + head*p.q_nb2 + s*p.q_nb3) * yscale;
            }
        }
#pragma unroll
        for (int u = 0; u < QU; ++u) {
            const int i = j0 + u*AD_NT;
            if (i < ncp*p.dk) {
                q_sh[i] = val[u];
            }
        }
    }
    if (tid < AD_CT) {
        const int col  = min(col0 + tid, p.ncols - 1);
        const int tok  = col % p.ntok;
        const int head = h*p.gqa + col / p.ntok;
        moff[tid] = tok*p.m_nb1 + (head % p.m_ne2)*p.m_nb2 + (s % p.m_ne3)*p.m_nb3;
        m_sh[tid] = -INFINITY;
        l_sh[tid] = 0.0f;
        a_sh[tid] = 1.0f;
    }
    __syncthreads();

    if (p.hadamard_n > 0) {
        // Walsh-Hadamard transform of every hadamard_n-segment (d_k is a multiple of it)
        const int npairs = ncp*p.dk/2;
        for (int hh = 1; hh < p.hadamard_n; hh *= 2) {
            for (int pr = tid; pr < npairs; pr += AD_NT) {
                const int i = (pr/hh)*(2*hh) + pr%hh;
                const float a = q_sh[i];
                const float b = q_sh[i + hh];
                q_sh[i]      = a + b;
                q_sh[i + hh] = a - b;
            }
            __syncthreads();
        }
    }

    // each thread one 32-value block, its reads rotated by the lane (blocks are 32 words apart: unrotated, the lanes of a
    // warp would read one bank)
    const int nbk = p.dk/32;
    const int rot = tid % 32;
    for (int i = tid; i < ncp*nbk; i += AD_NT) {
        const float * x = q_sh + i*32; // column i / nbk, block i % nbk
        float amax = 0.0f;
#pragma unroll
        for (int l = 0; l < 32; ++l) {
            amax = fmaxf(amax, fabsf(x[(l + rot) % 32]));
        }
        const float d  = amax/127.0f;
        const float id = d != 0.0f ? 1.0f/d : 0.0f;
        int sumq = 0;
#pragma unroll
        for (int w0 = 0; w0 < 8; ++w0) {
            const int w = (w0 + rot) % 8;
            int packed = 0;
#pragma unroll
            for (int l = 0; l < 4; ++l) {
                const int qv = (int) roundf(x[4*w + l]*id);
                sumq   += qv;
                packed |= (qv & 0xFF) << (8*l);
            }
            qi_sh[i*8 + w] = packed;
        }
        qd_sh[i] = make_float2(d, d*sumq);
    }
    __syncthreads();
}

// a 32-value K block's integers, 4 per int (q4: the low nibbles = values 0..15 in kw[0..3], the high = 16..31 in
// kw[4..7]), its scale d and (q4_1) its minimum m
template <ggml_type type_k>
static __device__ __forceinline__ void ad_k_block(const char * blk, int * kw, float & d, float & m) {
    if constexpr (type_k == GGML_TYPE_Q8_0) {
        d = __half2float(((const block_q8_0 *) blk)->d);
        m = 0.0f;
        ggml_cuda_memcpy_1<16, 2>(kw + 0, ((const block_q8_0 *) blk)->qs + 0);
        ggml_cuda_memcpy_1<16, 2>(kw + 4, ((const block_q8_0 *) blk)->qs + 16);
    } else {
        int qs[4];
        if constexpr (type_k == GGML_TYPE_Q4_1) {
            const float2 dm = __half22float2(((const block_q4_1 *) blk)->dm);
            d = dm.x;
            m = dm.y;
            ggml_cuda_memcpy_1<16, 4>(qs, ((const block_q4_1 *) blk)->qs);
        } else {
            d = __half2float(((const block_q4_0 *) blk)->d);
            m = 0.0f;
            ggml_cuda_memcpy_1<16, 2>(qs, ((const block_q4_0 *) blk)->qs);
        }
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            kw[w + 0] = qs[w] & 0x0F0F0F0F;
            kw[w + 4] = (qs[w] >> 4) & 0x0F0F0F0F;
        }
    }
}

// one K block (ad_k_block) times one query column's int8 block (y0, y1; ds = (d_q, d_q*sum(q))): 8 dp4a, one scale
template <ggml_type type_k>
static __device__ __forceinline__ float ad_kq_block(const int * kw, const float kd, const float km, const int4 y0,
        const int4 y1, const float2 ds) {
    int si = 0;
    si = ggml_cuda_dp4a(kw[0], y0.x, si);
    si = ggml_cuda_dp4a(kw[1], y0.y, si);
    si = ggml_cuda_dp4a(kw[2], y0.z, si);
    si = ggml_cuda_dp4a(kw[3], y0.w, si);
    si = ggml_cuda_dp4a(kw[4], y1.x, si);
    si = ggml_cuda_dp4a(kw[5], y1.y, si);
    si = ggml_cuda_dp4a(kw[6], y1.z, si);
    si = ggml_cuda_dp4a(kw[7], y1.w, si);
    if constexpr (type_k == GGML_TYPE_Q4_0) {
        return kd*(ds.x*si - 8.0f*ds.y); // d_k * sum((n - 8) * q) * d_q
    } else if constexpr (type_k == GGML_TYPE_Q4_1) {
        return kd*ds.x*si + km*ds.y;     // sum((d_k n + m_k) * q * d_q)
    } else {
        return kd*ds.x*si;
    }
}

// online softmax of a tile, per column (G threads each; threads past the last column, !bowner, take part in every
// shuffle with -INF scores and read and write nothing: column nc-1's owners rewrite those cells meanwhile): the
// tile max, the new running max, p = exp(s - m) in place, the tile sum, and the factor exp(m_old - m) that rescales
// the running sum and the accumulators; with PT p also as f16 into pt [column][AD_PTS] (cells past tn: 0)
template <int G, bool PT>
static __device__ __forceinline__ void ad_softmax_tile(float * s_sh, const int sst, float * m_sh, float * l_sh,
        float * a_sh, half * pt, const int cb, const int lb, const bool bowner, const int tn) {
    float mx = -INFINITY;
    if (bowner) {
        for (int c = lb; c < tn; c += G) {
            mx = fmaxf(mx, s_sh[c*sst + cb]);
        }
    }
    mx = warp_reduce_max<G>(mx);
    const float m_old = bowner ? m_sh[cb] : -INFINITY;
    const float m_new = fmaxf(m_old, mx);
    float sum = 0.0f;
    for (int c = lb; c < AD_TC; c += G) {
        const float sc = bowner ? s_sh[c*sst + cb] : -INFINITY;
        const float pr = c < tn && sc != -INFINITY ? expf(sc - m_new) : 0.0f;
        sum += pr;
        if (bowner) {
            s_sh[c*sst + cb] = pr;
            if constexpr (PT) {
                pt[cb*AD_PTS + c] = __float2half(pr);
            }
        }
    }
    sum = warp_reduce_sum<G>(sum);
    if (bowner && lb == 0) {
        // exactly 1 where the max stayed (ad_vp_mma then skips the rescale); 0 from -INF (nothing accumulated yet)
        const float alpha = m_new > m_old ? expf(m_old - m_new) : 1.0f;
        a_sh[cb] = alpha;
        l_sh[cb] = l_sh[cb]*alpha + sum;
        m_sh[cb] = m_new;
    }
}

// every n-segment of x [len] (len a multiple of n) scaled by 1/sqrt(n) and Walsh-Hadamard transformed in place, by
// all threads of the block, as the queries' rotation in ad_load_queries (and the inverse rotation of a rotated V
// cache, applied to the attention's output rows). Starts and ends with a barrier.
static __device__ __forceinline__ void ad_fwht_rows(float * x, const int len, const int n) {
    __syncthreads();
    const float sc = rsqrtf((float) n);
    for (int i = threadIdx.x; i < len; i += AD_NT) {
        x[i] *= sc;
    }
    __syncthreads();
    for (int hh = 1; hh < n; hh *= 2) {
        for (int pr = threadIdx.x; pr < len/2; pr += AD_NT) {
            const int i = (pr/hh)*(2*hh) + pr%hh;
            const float a = x[i];
            const float b = x[i + hh];
            x[i]      = a + b;
            x[i + hh] = a - b;
        }
        __syncthreads();
    }
}

// the block's result, o = q_sh [nc][dv] (the phases' sums): one split: normalized (a sink joins the max and the sum
// only) into dst; several: the partial (o, max, sum) of this split for k_attn_decode_combine
static __device__ __forceinline__ void ad_write_out(const attn_decode_params & p, float * q_sh,
        const float * m_sh, const float * l_sh, const int col0, const int nc, const int h, const int s, const int z) {
    const int64_t blk = ((int64_t) s*p.n_head_kv + h)*p.nsplit + z;
    if (p.nsplit == 1 && p.out_rot > 0) {
        // rotation and normalization commute (both linear per row): rotate the sums, normalize below
        ad_fwht_rows(q_sh, nc*p.dv, p.out_rot);
    }
    for (int i = threadIdx.x; i < nc*p.dv; i += AD_NT) {
        const int c   = i / p.dv;
        const int i0  = i - c*p.dv;
        const int col = col0 + c;
        const float o = q_sh[c*p.dv + i0];
        if (p.nsplit == 1) {
            const int tok  = col % p.ntok;
            const int head = h*p.gqa + col / p.ntok;
            float f = 1.0f;
            float l = l_sh[c];
            if (p.sinks) {
                const float sk = p.sinks[head];
                const float m  = m_sh[c];
                const float mn = fmaxf(m, sk);
                f = m == -INFINITY ? 0.0f : expf(m - mn);
                l = l*f + expf(sk - mn);
            }
            p.dst[tok*p.d_s1 + head*p.d_s2 + s*p.d_s3 + i0] = o*f/l;
        } else {
            p.part_o[(blk*p.ncols + col)*p.dv + i0] = o;
            if (i0 == 0) {
                p.part_ml[blk*p.ncols + col] = make_float2(m_sh[c], l_sh[c]);
            }
        }
    }
}

// the combine of the splits: k_attn_decode_combine and the combine folded into the kernels (ad_fold_combine)
#include "attn-decode-combine.cuh"

// A. the scores of a tile: a group of AD_TPR threads computes the tile's rows rg + u*RPI (u < NR) together, so that
// each int8 query block read from shared memory serves NR rows (uniform trip counts: the reduction shuffles within
// groups of AD_TPR lanes); s = dot*scale + mask into s_sh [AD_TC][sst] (padded columns and rows past tn: 0)
template <ggml_type type_k, int CG, int NR, typename mask_t>
static __device__ __forceinline__ void ad_scores_tile(const attn_decode_params & p, const char * k_sh,
        const int * qi_sh, const float2 * qd_sh, const int64_t * moff, float * s_sh, const int sst, const int nchunk,
        const int nc, const int t0, const int tn) {
    constexpr int RPI = AD_NT/AD_TPR;
    const int rg  = threadIdx.x / AD_TPR;
    const int ln  = threadIdx.x % AD_TPR;
    const int nbk = p.dk/32; // K blocks per row
    const char * krow[NR];
    bool         rok[NR];
#pragma unroll
    for (int u = 0; u < NR; ++u) {
        const int r = u*RPI + rg;
        rok[u]  = r < tn;
        krow[u] = k_sh + min(r, tn - 1)*p.rsk;
    }

    constexpr int NM = (CG + AD_TPR - 1)/AD_TPR; // columns whose score this thread writes, per row and chunk
    for (int ch = 0; ch < nchunk; ++ch) {
        // the mask values this thread adds (column c = ln + i*AD_TPR of the chunk), loaded before the dot products
        // so that their latency overlaps them
        float mv[NR][NM];
#pragma unroll
        for (int u = 0; u < NR; ++u) {
#pragma unroll
            for (int i = 0; i < NM; ++i) {
                const int c   = ln + i*AD_TPR;
                const int col = ch*CG + c;
                mv[u][i] = 0.0f;
                if (p.mask && c < CG && col < nc && rok[u]) {
                    mv[u][i] = attn_decode_mask_value<mask_t>(p.mask + moff[col], t0 + u*RPI + rg);
                }
            }
        }
        float sum[NR][CG];
#pragma unroll
        for (int u = 0; u < NR; ++u) {
#pragma unroll
            for (int c = 0; c < CG; ++c) {
                sum[u][c] = 0.0f;
            }
        }
        // one 32-value block of the NR rows per step: its integers unpacked once (q4: low nibbles = values
        // 0..15, high = 16..31, 4 per int), then 8 dp4a per row and column
        for (int b = ln; b < nbk; b += AD_TPR) {
            int   kw[NR][8];
            float kd[NR];
            float km[NR];
#pragma unroll
            for (int u = 0; u < NR; ++u) {
                ad_k_block<type_k>(krow[u] + b*AD_BLOCK_BYTES(type_k), kw[u], kd[u], km[u]);
            }
#pragma unroll
            for (int c = 0; c < CG; ++c) {
                const int   qc = (ch*CG + c)*nbk + b;
                const int4  y0 = ((const int4 *) qi_sh)[2*qc + 0];
                const int4  y1 = ((const int4 *) qi_sh)[2*qc + 1];
                const float2 ds = qd_sh[qc];
#pragma unroll
                for (int u = 0; u < NR; ++u) {
                    sum[u][c] += ad_kq_block<type_k>(kw[u], kd[u], km[u], y0, y1, ds);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < NR; ++u) {
            const int r = u*RPI + rg;
#pragma unroll
            for (int c = 0; c < CG; ++c) {
                const float d   = warp_reduce_sum<AD_TPR>(sum[u][c]);
                const int   col = ch*CG + c;
                if (c % AD_TPR == ln) {
                    // padded columns: 0 (never normalized, never written; keeps their accumulators finite)
                    float sc = 0.0f;
                    if (col < nc && rok[u]) {
                        sc = d*p.scale + mv[u][c/AD_TPR];
                    }
                    s_sh[r*sst + col] = sc;
                }
            }
        }
    }
}

// VMMA: V*P on tensor cores (ad_vp_mma, ad_v_chunk_f16); d_v 128 only, launched only where
// ampere_mma_available (attn_decode_vmma)
template <ggml_type type_k, ggml_type type_v, int CG, typename mask_t, bool VMMA>
static __global__ void __launch_bounds__(AD_NT, AD_MIN_BLOCKS(CG)) k_attn_decode(const attn_decode_params p) {
#if !defined(AD_VMMA_CODE)
    if constexpr (VMMA) {
        NO_DEVICE_CODE;
        return;
    }
#endif // !defined(AD_VMMA_CODE)
    constexpr int qrv = ggml_cuda_type_traits<type_v>::qr;
    constexpr int NTM = CG <= 4 ? 1 : AD_CT/8;  // n-tiles of 8 columns (VMMA)
    constexpr int RPI = AD_NT/AD_TPR;          // cells per pass of the thread groups in the scores phase
    constexpr int NR  = AD_TC/RPI;             // rows per thread group and tile (2)
    constexpr int G   = CG <= 4 ? 32 : 4;      // threads per column in the softmax phase (CG <= 4: <= 4 columns)
    static_assert(AD_TC == NR*RPI, "tile");
    static_assert(AD_NT/G >= (CG <= 4 ? 4 : AD_CT), "softmax phase: a group of G threads for every column");

    extern __shared__ int64_t ad_smem[];

    const int tid  = threadIdx.x;
    const int z    = blockIdx.x;
    const int h    = blockIdx.y / p.ntiles;
    const int tile = blockIdx.y % p.ntiles;
    const int s    = blockIdx.z;

    const int col0   = tile*AD_CT;
    const int nc     = min(AD_CT, p.ncols - col0);
    const int nchunk = (nc + CG - 1)/CG;
    const int ncp    = nchunk*CG;               // padded columns
    const int dmax   = max(p.dk, p.dv);
    const int sst    = ncp + 1;                 // score row stride (odd: the phases of C read distinct banks)

    int64_t * moff = ad_smem;                   // [AD_CT] byte offset of each column's mask row
    float   * q_sh = (float *) (moff + AD_CT);  // [ncp][dk] queries; at the end [ncp][dv] sums
    float   * s_sh = q_sh + ncp*dmax;           // [AD_TC][sst] scores, then probabilities
    float   * m_sh = s_sh + AD_TC*sst;          // [AD_CT] running max
    float   * l_sh = m_sh + AD_CT;              // [AD_CT] running sum
    float   * a_sh = l_sh + AD_CT;              // [AD_CT] rescale factor of the current tile
    // [nbuf][AD_TC][rsk] the tiles' K rows, each buffer 16-byte aligned (as attn_decode_smem counts), then
    // [nbuf][AD_TC][rsv] their V rows
    const int kbuf = (AD_TC*p.rsk + 15)/16*16;
    const int vbuf = (AD_TC*p.rsv + 15)/16*16;
    char    * k_sh0 = (char *) ad_smem + ((const char *) (a_sh + AD_CT) - (const char *) ad_smem + 15)/16*16;
    char    * v_sh0 = k_sh0 + p.nbuf*kbuf;
    int     * qi_sh = (int *) (v_sh0 + p.nbuf*vbuf); // [ncp][dk/4] the queries as int8, 4 per int
    float2  * qd_sh = (float2 *) (qi_sh + ncp*p.dk/4);            // [ncp][dk/32] per 32 values: scale d, d*sum(q)
    // VMMA: [4 warps][16][AD_VWS] the warps' V chunks as f16, 16-byte aligned, then [ncp][AD_PTS] P as f16
    half    * vw_sh = (half *) ((char *) ad_smem + ((const char *) (qd_sh + ncp*p.dk/32) - (const char *) ad_smem + 15)/16*16);
    half    * pt_sh = vw_sh + (AD_NT/32)*16*AD_VWS;

    const int c_begin = z*p.cps;
    const int c_end   = min(c_begin + p.cps, p.n_kv);

    const char * kbase = p.k + h*p.k_nb2 + s*p.k_nb3;
    const char * vbase = p.v + h*p.v_nb2 + s*p.v_nb3;
    const ad_rows_blk rw = ad_rows_block(p, kbase, vbase); // a staged row's bytes begin at +koff / +voff

    // launched early behind the kernel before it (programmatic dependent launch): everything above is index
    // arithmetic; the caches, queries and mask are read only after that kernel has finished and its writes are seen
    ggml_cuda_pdl_sync();

    // the first tile's K and V: their loads overlap the queries' staging
    ad_stage_tile(p, rw, k_sh0, v_sh0, kbase, vbase, c_begin, min(AD_TC, c_end - c_begin));
    ad_commit();

    ad_load_queries(p, q_sh, qi_sh, qd_sh, moff, m_sh, l_sh, a_sh, col0, nc, ncp, h, s);

    const int nslots_v = p.dv/8;

    // softmax phase: G threads per column; threads past the last column repeat its work and write nothing
    const int  cb     = min(tid / G, nc - 1);
    const int  lb     = tid % G;
    const bool bowner = tid / G < nc;

    // V*P phase: thread -> (slot jv of 8 values of d_v, chunk gv of CG columns, phase ph of the cells)
    const int  ncombo  = nslots_v*nchunk;       // <= 128 (d_v <= 256, ncp <= 32)
    const int  nph     = max(1, AD_NT / ncombo);
    const int  jv      = tid % nslots_v;
    const int  gv      = (tid / nslots_v) % nchunk;
    const int  ph      = tid / ncombo;
    const bool vactive = ph < nph;

    float acc[CG][8];
#pragma unroll
    for (int c = 0; c < CG; ++c) {
#pragma unroll
        for (int l = 0; l < 8; ++l) {
            acc[c][l] = 0.0f;
        }
    }
    float macc[2][NTM][4] = {}; // VMMA: warp w's D fragments (ad_vp_mma)

    // tile it sits in buffer it % nbuf. Two buffers: the next tile's K and V are copied while this tile's phases run
    // (cp.async), and each tile waits once. One buffer (no cp.async: HIP): the next tile is staged after this one.
    const bool two = AD_NBUF_MAX == 2 && p.nbuf == 2;
    for (int t0 = c_begin, it = 0; t0 < c_end; t0 += AD_TC, ++it) {
        const int tn = min(AD_TC, c_end - t0);
        const int b  = ad_tile_wait(p, rw, k_sh0, v_sh0, kbuf, vbuf, kbase, vbase, t0, it, c_end, two);
        const char * k_sh = k_sh0 + b*kbuf + rw.koff;
        const char * v_sh = v_sh0 + b*vbuf + rw.voff;
        __syncthreads();

        // A. scores
        ad_scores_tile<type_k, CG, NR, mask_t>(p, k_sh, qi_sh, qd_sh, moff, s_sh, sst, nchunk, nc, t0, tn);
        __syncthreads();

        // B. online softmax per column
        ad_softmax_tile<G, VMMA>(s_sh, sst, m_sh, l_sh, a_sh, pt_sh, cb, lb, bowner, tn);
        __syncthreads();

        // C. V*P: VMMA on tensor cores, else two cells per step (their loads and dequantizations independent; the sums
        // in the cells' order)
        if constexpr (VMMA) {
#ifdef AD_VMMA_CODE
            ad_vp_mma<type_v, NTM>(v_sh, p.rsv, vw_sh + (tid/32)*16*AD_VWS, pt_sh, a_sh, macc, ncp, tn);
#endif // AD_VMMA_CODE
        } else if (vactive) {
#pragma unroll
            for (int c = 0; c < CG; ++c) {
                const float alpha = a_sh[gv*CG + c];
#pragma unroll
                for (int l = 0; l < 8; ++l) {
                    acc[c][l] *= alpha;
                }
            }
            int c = ph;
#ifndef GGML_USE_HIP
            for (; c + nph < tn; c += 2*nph) {
                float va[8];
                float vb[8];
                dequantize_x8<type_v>(v_sh + c*p.rsv, jv, va);
                dequantize_x8<type_v>(v_sh + (c + nph)*p.rsv, jv, vb);
#pragma unroll
                for (int cc = 0; cc < CG; ++cc) {
                    const float pa = s_sh[c*sst + gv*CG + cc];
                    const float pb = s_sh[(c + nph)*sst + gv*CG + cc];
#pragma unroll
                    for (int l = 0; l < 8; ++l) {
                        acc[cc][l] += pa*va[l];
                        acc[cc][l] += pb*vb[l];
                    }
                }
            }
#endif // GGML_USE_HIP
            for (; c < tn; c += nph) {
                float vv[8];
                dequantize_x8<type_v>(v_sh + c*p.rsv, jv, vv);
#pragma unroll
                for (int cc = 0; cc < CG; ++cc) {
                    const float pr = s_sh[c*sst + gv*CG + cc];
#pragma unroll
                    for (int l = 0; l < 8; ++l) {
                        acc[cc][l] += pr*vv[l];
                    }
                }
            }
        }
        __syncthreads(); // this tile's buffers and s_sh are free
        ad_tile_next(p, rw, k_sh0, v_sh0, kbase, vbase, t0, c_end, two);
    }

    // the cells are done: the next kernel (the combine, or the output's consumer) may start launching; it waits for
    // this grid's completion before it reads anything
    ggml_cuda_pdl_lc();

    if constexpr (VMMA) {
#ifdef AD_VMMA_CODE
        ad_vp_mma_store<NTM>(q_sh, macc, p.dv, nc, ncp);
#endif // AD_VMMA_CODE
        __syncthreads();
    } else
    // sum the phases in q_sh [ncp][dv], in a fixed order (phase 0 covers every element)
    for (int pp = 0; pp < nph; ++pp) {
        if (vactive && ph == pp) {
#pragma unroll
            for (int c = 0; c < CG; ++c) {
#pragma unroll
                for (int l = 0; l < 8; ++l) {
                    const int idx = (gv*CG + c)*p.dv + dequantize_x8_pos<qrv>(jv, l);
                    q_sh[idx] = pp == 0 ? acc[c][l] : q_sh[idx] + acc[c][l];
                }
            }
        }
        __syncthreads();
    }

    ad_write_out(p, q_sh, m_sh, l_sh, col0, nc, h, s, z);
    if (p.fold) {
        ad_fold_combine(p, q_sh, col0, nc, h, s, tile); // q_sh and s_sh: attn_decode_fold_floats
    }
}

// the form with K*Q and V*P both on tensor cores (k_attn_decode_tc; NVIDIA sm_80+)
#include "attn-decode-tc.cuh"

// columns per chunk: 1 (one column), 4 (up to 4: the 8B shape's GQA 4 at one token), 8
static int attn_decode_cg(const int ncols) {
    return ncols == 1 ? 1 : (ncols <= 4 ? 4 : 8);
}

// dynamic shared memory of k_attn_decode: mask offsets, queries (then sums), scores, running state, nbuf K and nbuf
// V tiles, the int8 queries and their scales; with vmma the f16 V tile and P
static size_t attn_decode_smem(const int ncols, const int dk, const int dv, const int rbk, const int rbv, const int nbuf,
        const bool vmma) {
    const int cg  = attn_decode_cg(ncols);
    const int ncp = (std::min(AD_CT, ncols) + cg - 1)/cg*cg;
    const size_t front = AD_CT*sizeof(int64_t) + ((size_t) ncp*std::max(dk, dv) + (size_t) AD_TC*(ncp + 1) + 3*AD_CT)*sizeof(float);
    const size_t base  = (front + 15)/16*16 + nbuf*((size_t) (AD_TC*rbk + 15)/16*16 + (size_t) (AD_TC*rbv + 15)/16*16) +
        (size_t) ncp*dk + (size_t) ncp*(dk/32)*2*sizeof(float);
    if (!vmma) {
        return base;
    }
    // (q8_0 K and V at 4 columns: 45120 bytes, within the H200's 5 blocks per SM)
    return (base + 15)/16*16 + ((size_t) (AD_NT/32)*16*AD_VWS + (size_t) ncp*AD_PTS)*sizeof(half);
}

// splits of the cells: about bpsm blocks per SM over all (KV head, column tile, stream), at least min_tiles tiles per
// split (but one split always)
static void attn_decode_plan(attn_decode_params & p, const int nstream, const int nsm, const int bpsm,
        const int min_tiles = 1) {
    const int64_t nblk0      = (int64_t) p.n_head_kv*p.ntiles*nstream;
    const int64_t nsplit_max = std::max<int64_t>(1, (p.n_kv + AD_TC - 1)/AD_TC/std::max(1, min_tiles));
    int64_t nsplit = std::min<int64_t>(std::max<int64_t>(1, ((int64_t) bpsm*nsm + nblk0 - 1)/nblk0), nsplit_max);
    int64_t cps    = (p.n_kv + nsplit - 1)/nsplit;
    cps            = (cps + AD_TC - 1)/AD_TC*AD_TC;
    nsplit         = (p.n_kv + cps - 1)/cps;
    p.cps    = (int) cps;
    p.nsplit = (int) nsplit;
}

// the folded combine (ad_fold_combine): where a tile's splits are at most AD_FOLD_MAX_SPLITS and their partials at
// most AD_FOLD_MAX_PARTS columns x splits (the last block reads them all: the SWA layers' 8 x 12 at 768 cells, not the
// full layers' 16 x 20 at 1,280, which k_attn_decode_combine spreads over 16 blocks), and where the block's free
// shared memory holds attn_decode_fold_floats floats (room: k_attn_decode's queries and scores, k_attn_decode_tc's V rows)
#define AD_FOLD_MAX_SPLITS 32
#define AD_FOLD_MAX_PARTS  128
static bool attn_decode_fold_fits(const int nc, const int dv, const int nsplit, const size_t room) {
    const size_t floats = (size_t) nc*dv + 2*(size_t) nc*nsplit + nc;
    return nsplit > 1 && nsplit <= AD_FOLD_MAX_SPLITS && nc*nsplit <= AD_FOLD_MAX_PARTS && floats*sizeof(float) <= room;
}

// k_attn_decode's free shared memory at the end (its queries' and scores' arrays), bytes
static size_t attn_decode_fold_room(const int ncols, const int dk, const int dv) {
    const int cg  = attn_decode_cg(ncols);
    const int ncp = (std::min(AD_CT, ncols) + cg - 1)/cg*cg;
    return ((size_t) ncp*std::max(dk, dv) + (size_t) AD_TC*(ncp + 1))*sizeof(float);
}

static size_t attn_decode_combine_smem(const int nsplit, const int dv) {
    return (2*(size_t) nsplit + AD_NT/32 + (size_t) (AD_NT/(dv/4))*dv)*sizeof(float);
}

static bool attn_decode_type_supported(const ggml_type type) {
    return type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q8_0;
}

// bytes of a row of d values (d a multiple of the block size)
static int attn_decode_row_bytes(const ggml_type type, const int64_t d) {
    return (int) (d/ggml_blck_size(type)*ggml_type_size(type));
}

// the row bytes and the staging of the K and V caches into p, the walks for nt threads (attn_decode_walkers)
static void attn_decode_layout(attn_decode_params & p, const ggml_tensor * k, const ggml_tensor * v, const int nt) {
    p.rbk = attn_decode_row_bytes(k->type, k->ne[0]);
    p.rbv = attn_decode_row_bytes(v->type, v->ne[0]);
    attn_decode_rows(p.rbk, (uintptr_t) k->data, k->nb[1], k->nb[2], k->nb[3], nt, p.uk, p.wk, p.rsk, p.gk);
    attn_decode_rows(p.rbv, (uintptr_t) v->data, v->nb[1], v->nb[2], v->nb[3], nt, p.uv, p.wv, p.rsv, p.gv);
}

// the splits aim at AD_SPLIT_BPSM blocks per SM, each split at least AD_SPLIT_MIN_TILES tiles of AD_TC cells (as
// measured on an H200: benchmarks/KERNEL_NOTES.md, the split knobs)
#define AD_SPLIT_BPSM      4
#define AD_SPLIT_MIN_TILES 1

// launches one of the fused attention's kernels the way ggml launches its own (ggml_cuda_kernel_launch): where CUDA
// supports it (12.3+, PTX for sm_90+), as a programmatic dependent launch, so that its blocks are scheduled while the
// kernel before it drains, and each waits (ggml_cuda_pdl_sync) before it reads that kernel's output.
// GGML_CUDA_PDL=0 turns that off for every kernel.
template <typename Kernel, typename... Args>
static void attn_decode_kernel_launch(Kernel kernel, const dim3 grid, const size_t smem, cudaStream_t stream,
        Args &&... args) {
    ggml_cuda_kernel_launch(kernel, ggml_cuda_kernel_launch_params(grid, dim3(AD_NT, 1, 1), smem, stream),
        std::forward<Args>(args)...);
}

// K and V tile buffers of k_attn_decode: 2 where cp.async copies the next tile during this one (NVIDIA sm_80+) and
// the shared memory allows, else 1
static int attn_decode_nbuf(const int ncols, const int dk, const int dv, const int rbk, const int rbv, const bool vmma) {
    const int    id = ggml_cuda_get_device();
    const auto & di = ggml_cuda_info().devices[id];
    if (!cp_async_available(di.cc) || attn_decode_smem(ncols, dk, dv, rbk, rbv, 2, vmma) > di.smpbo) {
        return 1;
    }
    return 2;
}

// V*P on tensor cores: NVIDIA with mma.sync m16n8k16 compiled for the device (sm_80+), d_v 128, and the f16 V
// tile fits the shared memory (one tile buffer); LLAMA_VQ_CUDA_FUSED_ATTN_MMA=0 turns it off (read once)
static bool attn_decode_vmma(const int ncols, const int dk, const int dv, const int rbk, const int rbv) {
#ifdef GGML_USE_HIP
    GGML_UNUSED_VARS(ncols, dk, dv, rbk, rbv);
    return false;
#else
    static const bool off = [] {
        const char * env = getenv("LLAMA_VQ_CUDA_FUSED_ATTN_MMA");
        return env && atoi(env) == 0;
    }();
    const auto & di = ggml_cuda_info().devices[ggml_cuda_get_device()];
    return !off && dv == AD_VMMA_DV && ampere_mma_available(di.cc) &&
        attn_decode_smem(ncols, dk, dv, rbk, rbv, 1, true) <= di.smpbo;
#endif // GGML_USE_HIP
}

// both products on tensor cores (k_attn_decode_tc): NVIDIA with mma.sync for the device (sm_80+), a d_k / d_v pair
// it is compiled for, cp.async, and its shared memory (two tile buffers) within the device's. By
// default only where it measured faster (H100, benchmarks/RESULTS.md "Decode attention's two forms"): more than 8
// query columns in one tile of 16 (GQA 16 at one token: MiMo's full-attention layers) and at least 8192 cells; fewer
// columns leave the m-tile mostly empty and short caches pay its higher fixed cost. LLAMA_VQ_CUDA_FUSED_ATTN_TC=0:
// never, =1: wherever it is compiled (read once). Returns the tile buffers (0: not this form).
static int attn_decode_tc_nbuf(const int dk, const int dv, const int rbk, const int rbv, const int ncols, const int n_kv) {
#ifdef GGML_USE_HIP
    GGML_UNUSED_VARS(dk, dv, rbk, rbv, ncols, n_kv);
    return 0;
#else
    static const int mode = [] {
        const char * env = getenv("LLAMA_VQ_CUDA_FUSED_ATTN_TC");
        return env ? atoi(env) : -1;
    }();
    const auto & di = ggml_cuda_info().devices[ggml_cuda_get_device()];
    if (mode == 0 || !ad_tc_shape(dk, dv) || !ampere_mma_available(di.cc)) {
        return 0;
    }
    if (mode < 0 && (ncols <= 8 || ncols > AD_TC_COLS || n_kv < 8192)) {
        return 0;
    }
    // two tile buffers always (k_attn_decode_tc has no code for one): cp.async comes with mma.sync (sm_80+), and the
    // MiMo shape's 62 KB fit every such device's shared memory
    return cp_async_available(di.cc) && attn_decode_tc_smem(dk, dv, rbk, rbv, 2) <= di.smpbo ? 2 : 0;
#endif // GGML_USE_HIP
}

bool ggml_cuda_attn_decode_fused_supported(const ggml_tensor * kq, const ggml_tensor * softmax, const ggml_tensor * kqv) {
    if (kq->op != GGML_OP_MUL_MAT || softmax->op != GGML_OP_SOFT_MAX || kqv->op != GGML_OP_OUT_PROD) {
        return false;
    }
    const ggml_tensor * k     = kq->src[0];
    const ggml_tensor * q     = kq->src[1];
    const ggml_tensor * mask  = softmax->src[1];
    const ggml_tensor * sinks = softmax->src[2];
    const ggml_tensor * v     = kqv->src[0];
    const ggml_tensor * pt    = kqv->src[1];

    if (softmax->src[0] != kq || pt->op != GGML_OP_TRANSPOSE || pt->src[0] != softmax) {
        return false;
    }
    if (!attn_decode_type_supported(k->type) || !attn_decode_type_supported(v->type) || q->type != GGML_TYPE_F32 ||
            kq->type != GGML_TYPE_F32 || softmax->type != GGML_TYPE_F32 || kqv->type != GGML_TYPE_F32) {
        return false;
    }
    float max_bias = 0.0f;
    memcpy(&max_bias, (const float *) softmax->op_params + 1, sizeof(float));
    if (max_bias != 0.0f) {
        return false;
    }

    const int64_t dk = k->ne[0], n_kv = k->ne[1], nkvh = k->ne[2], nstream = k->ne[3];
    const int64_t dv = v->ne[0];
    if (dk % 32 != 0 || dk > ATTN_DECODE_MAX_D || dv % 32 != 0 || dv > ATTN_DECODE_MAX_D || n_kv < 1 || n_kv > INT32_MAX/2) {
        return false;
    }
    if (k->nb[0] != ggml_type_size(k->type) || v->nb[0] != ggml_type_size(v->type) || q->nb[0] != sizeof(float)) {
        return false;
    }
    // a tile's rows within 2^31 bytes (ad_walk's 32-bit offsets)
    if (k->nb[1] > INT32_MAX/AD_TC || v->nb[1] > INT32_MAX/AD_TC) {
        return false;
    }
    if (q->ne[0] != dk || v->ne[1] != n_kv || v->ne[2] != nkvh || v->ne[3] != nstream || q->ne[3] != nstream ||
            q->ne[2] % nkvh != 0) {
        return false;
    }
    const int64_t ntok = q->ne[1];
    const int64_t gqa  = q->ne[2]/nkvh;
    if (ntok > ATTN_DECODE_MAX_TOKENS || ntok*gqa > ATTN_DECODE_MAX_COLS || nkvh*((ntok*gqa + 31)/32) > 65535 ||
            nstream > 65535) {
        return false;
    }
    // the shapes the chain itself gives (ggml_mul_mat, ggml_soft_max, ggml_out_prod): checked, not assumed
    if (kq->ne[0] != n_kv || kq->ne[1] != ntok || kq->ne[2] != q->ne[2] || kq->ne[3] != nstream || !ggml_is_contiguous(kq) ||
            kqv->ne[0] != dv || kqv->ne[1] != ntok || kqv->ne[2] != q->ne[2] || kqv->ne[3] != nstream ||
            kqv->nb[0] != sizeof(float)) {
        return false;
    }
    if (mask) {
        if ((mask->type != GGML_TYPE_F16 && mask->type != GGML_TYPE_F32) || mask->ne[0] != n_kv || mask->ne[1] < ntok ||
                mask->nb[0] != ggml_type_size(mask->type) || q->ne[2] % mask->ne[2] != 0 || nstream % mask->ne[3] != 0) {
            return false;
        }
    }
    if (sinks && (sinks->type != GGML_TYPE_F32 || sinks->ne[0] != q->ne[2] || !ggml_is_contiguous(sinks))) {
        return false;
    }
    // the staged K and V tiles must fit the device's shared memory (d 256 x 32 columns of q8_0 needs ~76 KB: above a
    // 64 KB limit, e.g. AMD's, such shapes keep the separate ops)
    attn_decode_params lp = {};
    attn_decode_layout(lp, k, v, attn_decode_walkers(false));
    const size_t smem = attn_decode_smem((int) (ntok*gqa), (int) dk, (int) dv, lp.rsk, lp.rsv, 1, false);
    if (smem > ggml_cuda_info().devices[ggml_cuda_get_device()].smpbo) {
        return false;
    }
    return true;
}

bool ggml_cuda_attn_decode_fused_auto(const ggml_tensor * kq, const ggml_tensor * softmax, const ggml_tensor * kqv) {
    GGML_UNUSED(softmax);
    const ggml_tensor * k = kq->src[0];
    const ggml_tensor * q = kq->src[1];
    const ggml_tensor * v = kqv->src[0];
    if (q->ne[1] != 1) {
        return false;
    }
#if defined(GGML_USE_HIP)
    // HIP (gfx90a): the f32 V*P form for single-token decode. Its source runs correctly at wavefront 64 in the CPU
    // emulation (tests/kernels/test_kernel_emulation_wavefronts.py), and on an NVIDIA GPU configured as HIP runs it, it
    // decoded faster than the separate ops from 8K on (benchmarks/RESULTS.md, the HIP path by proxy). Never run on an AMD GPU.
    GGML_UNUSED(k);
    GGML_UNUSED(v);
    return true;
#else
    const int ncols = (int) (q->ne[2]/k->ne[2]);
    attn_decode_params lp = {};
    attn_decode_layout(lp, k, v, attn_decode_walkers(false));
    return attn_decode_tc_nbuf((int) k->ne[0], (int) v->ne[0], lp.rsk, lp.rsv, ncols, (int) k->ne[1]) > 0 ||
        attn_decode_vmma(ncols, (int) k->ne[0], (int) v->ne[0], lp.rsk, lp.rsv);
#endif
}

bool ggml_cuda_attn_decode_fused_can_rotate(const ggml_tensor * kq, const int hadamard_n) {
    const int64_t dk = kq->src[0]->ne[0];
    return hadamard_n >= 2 && hadamard_n <= ATTN_DECODE_MAX_D && (hadamard_n & (hadamard_n - 1)) == 0 && dk % hadamard_n == 0;
}

bool ggml_cuda_attn_decode_fused_tail_supported(const ggml_tensor * kqv, const ggml_tensor * permute,
        const ggml_tensor * cont, const int out_rot) {
    if (permute->op != GGML_OP_PERMUTE || permute->src[0] != kqv || cont->op != GGML_OP_CONT || cont->src[0] != permute ||
            cont->type != GGML_TYPE_F32 || !ggml_is_contiguous(cont) || ggml_nelements(cont) != ggml_nelements(kqv)) {
        return false;
    }
    // permute(kqv, 0, 2, 1, 3): [d_v, n_head, n_tokens, n_stream]
    if (permute->ne[0] != kqv->ne[0] || permute->ne[1] != kqv->ne[2] || permute->ne[2] != kqv->ne[1] ||
            permute->ne[3] != kqv->ne[3] || permute->nb[1] != kqv->nb[2] || permute->nb[2] != kqv->nb[1] ||
            permute->nb[3] != kqv->nb[3]) {
        return false;
    }
    if (out_rot != 0 && (out_rot < 2 || out_rot > ATTN_DECODE_MAX_D || (out_rot & (out_rot - 1)) != 0 ||
            kqv->ne[0] % out_rot != 0)) {
        return false;
    }
    return true;
}

template <ggml_type type_k, ggml_type type_v, int CG, bool VMMA>
static void attn_decode_launch_v(const attn_decode_params & p, const bool mask_f16, const dim3 grid, const size_t smem,
        cudaStream_t stream) {
    const size_t smpbo = ggml_cuda_info().devices[ggml_cuda_get_device()].smpbo;
    if (mask_f16) {
        CUDA_SET_SHARED_MEMORY_LIMIT((k_attn_decode<type_k, type_v, CG, half, VMMA>), smpbo);
        attn_decode_kernel_launch(k_attn_decode<type_k, type_v, CG, half, VMMA>, grid, smem, stream, p);
    } else {
        CUDA_SET_SHARED_MEMORY_LIMIT((k_attn_decode<type_k, type_v, CG, float, VMMA>), smpbo);
        attn_decode_kernel_launch(k_attn_decode<type_k, type_v, CG, float, VMMA>, grid, smem, stream, p);
    }
}

// the tensor-core V*P variants exist only where they can run (not on HIP)
template <ggml_type type_k, ggml_type type_v, int CG>
static void attn_decode_launch(const attn_decode_params & p, const bool mask_f16, const bool vmma, const dim3 grid,
        const size_t smem, cudaStream_t stream) {
#ifndef GGML_USE_HIP
    if (vmma) {
        attn_decode_launch_v<type_k, type_v, CG, true>(p, mask_f16, grid, smem, stream);
        return;
    }
#endif // GGML_USE_HIP
    GGML_ASSERT(!vmma);
    attn_decode_launch_v<type_k, type_v, CG, false>(p, mask_f16, grid, smem, stream);
}

template <ggml_type type_k, ggml_type type_v>
static void attn_decode_switch_cg(const attn_decode_params & p, const int cg, const bool mask_f16, const bool vmma,
        const dim3 grid, const size_t smem, cudaStream_t stream) {
    switch (cg) {
        case 1:  attn_decode_launch<type_k, type_v, 1>(p, mask_f16, vmma, grid, smem, stream); break;
        case 4:  attn_decode_launch<type_k, type_v, 4>(p, mask_f16, vmma, grid, smem, stream); break;
        default: attn_decode_launch<type_k, type_v, 8>(p, mask_f16, vmma, grid, smem, stream); break;
    }
}

template <ggml_type type_k>
static void attn_decode_switch_v(const ggml_type type_v, const attn_decode_params & p, const int cg, const bool mask_f16,
        const bool vmma, const dim3 grid, const size_t smem, cudaStream_t stream) {
    switch (type_v) {
        case GGML_TYPE_Q4_0: attn_decode_switch_cg<type_k, GGML_TYPE_Q4_0>(p, cg, mask_f16, vmma, grid, smem, stream); break;
        case GGML_TYPE_Q4_1: attn_decode_switch_cg<type_k, GGML_TYPE_Q4_1>(p, cg, mask_f16, vmma, grid, smem, stream); break;
        case GGML_TYPE_Q8_0: attn_decode_switch_cg<type_k, GGML_TYPE_Q8_0>(p, cg, mask_f16, vmma, grid, smem, stream); break;
        default: GGML_ABORT("fatal error");
    }
}

// launches of the fused kernels: with both products on tensor cores, with the combine folded in, with K or V staged
// as windows
static std::atomic<int64_t> attn_decode_tc_count{0};
static std::atomic<int64_t> attn_decode_fold_count{0};
static std::atomic<int64_t> attn_decode_win_count{0};

int64_t ggml_cuda_attn_decode_tc_runs() {
    return attn_decode_tc_count.load();
}

int64_t ggml_cuda_attn_decode_fold_runs() {
    return attn_decode_fold_count.load();
}

int64_t ggml_cuda_attn_decode_window_runs() {
    return attn_decode_win_count.load();
}

#ifndef GGML_USE_HIP
// k_attn_decode_tc's instance for the types and the d_k / d_v pair, with the blocks per SM its registers and shared
// memory allow (read once per instance and size)
template <ggml_type type_k, ggml_type type_v, int DK, int DV>
static void attn_decode_tc_launch_dv(const attn_decode_params & p, const dim3 grid, const size_t smem, cudaStream_t stream) {
    const size_t smpbo = ggml_cuda_info().devices[ggml_cuda_get_device()].smpbo;
    CUDA_SET_SHARED_MEMORY_LIMIT((k_attn_decode_tc<type_k, type_v, DK, DV>), smpbo);
    attn_decode_kernel_launch(k_attn_decode_tc<type_k, type_v, DK, DV>, grid, smem, stream, p);
}

template <ggml_type type_k, ggml_type type_v, int DK, int DV>
static int attn_decode_tc_occupancy(const size_t smem) {
    const size_t smpbo = ggml_cuda_info().devices[ggml_cuda_get_device()].smpbo;
    CUDA_SET_SHARED_MEMORY_LIMIT((k_attn_decode_tc<type_k, type_v, DK, DV>), smpbo);
    int nb = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, k_attn_decode_tc<type_k, type_v, DK, DV>, AD_NT, smem));
    return std::max(1, nb);
}

// blocks per SM (launch == false) or the launch (launch == true) of the instance for p's types and d_k / d_v
template <ggml_type type_k, ggml_type type_v>
static int attn_decode_tc_dispatch_dv(const attn_decode_params & p, const bool launch, const dim3 grid, const size_t smem,
        cudaStream_t stream) {
#define AD_TC_CASE(DK, DV) \
    if (p.dk == (DK) && p.dv == (DV)) { \
        if (!launch) { return attn_decode_tc_occupancy<type_k, type_v, DK, DV>(smem); } \
        attn_decode_tc_launch_dv<type_k, type_v, DK, DV>(p, grid, smem, stream); return 0; \
    }
    AD_TC_CASE(128, 128)
    AD_TC_CASE(192, 128)
    AD_TC_CASE(64, 64)
#undef AD_TC_CASE
    GGML_ABORT("fatal error");
}

template <ggml_type type_k>
static int attn_decode_tc_dispatch_v(const ggml_type type_v, const attn_decode_params & p, const bool launch,
        const dim3 grid, const size_t smem, cudaStream_t stream) {
    switch (type_v) {
        case GGML_TYPE_Q4_0: return attn_decode_tc_dispatch_dv<type_k, GGML_TYPE_Q4_0>(p, launch, grid, smem, stream);
        case GGML_TYPE_Q4_1: return attn_decode_tc_dispatch_dv<type_k, GGML_TYPE_Q4_1>(p, launch, grid, smem, stream);
        case GGML_TYPE_Q8_0: return attn_decode_tc_dispatch_dv<type_k, GGML_TYPE_Q8_0>(p, launch, grid, smem, stream);
        default: GGML_ABORT("fatal error");
    }
}

static int attn_decode_tc_dispatch(const ggml_type type_k, const ggml_type type_v, const attn_decode_params & p,
        const bool launch, const dim3 grid, const size_t smem, cudaStream_t stream) {
    switch (type_k) {
        case GGML_TYPE_Q4_0: return attn_decode_tc_dispatch_v<GGML_TYPE_Q4_0>(type_v, p, launch, grid, smem, stream);
        case GGML_TYPE_Q4_1: return attn_decode_tc_dispatch_v<GGML_TYPE_Q4_1>(type_v, p, launch, grid, smem, stream);
        case GGML_TYPE_Q8_0: return attn_decode_tc_dispatch_v<GGML_TYPE_Q8_0>(type_v, p, launch, grid, smem, stream);
        default: GGML_ABORT("fatal error");
    }
}
#endif // GGML_USE_HIP

// the folded combine's counts for a stream (ad_fold_combine): AD_FOLD_COUNTS per stream, allocated and zeroed in
// the stream's order on its first use (inside a CUDA graph's capture too: ggml captures in relaxed mode, which allows
// cudaMalloc, and the zeroing then is a node of that graph, harmless on every replay), never freed or moved, so that
// captured graphs keep their address; the kernels leave them at 0. A stream of its own per context: two contexts'
// kernels running at once never share a count. Null where n counts do not fit.
#define AD_FOLD_COUNTS 4096
static unsigned * attn_decode_fold_counts(cudaStream_t stream, const int64_t n) {
    if (n > AD_FOLD_COUNTS) {
        return nullptr;
    }
    static std::mutex                                   mutex;
    static std::unordered_map<cudaStream_t, unsigned *> counts;
    std::lock_guard<std::mutex> lock(mutex);
    auto it = counts.find(stream);
    if (it == counts.end()) {
        unsigned * d = nullptr;
        CUDA_CHECK(cudaMalloc((void **) &d, AD_FOLD_COUNTS*sizeof(unsigned)));
        CUDA_CHECK(cudaMemsetAsync(d, 0, AD_FOLD_COUNTS*sizeof(unsigned), stream));
        it = counts.emplace(stream, d).first;
    }
    return it->second;
}

bool ggml_cuda_attn_decode_fused(ggml_backend_cuda_context & ctx, const ggml_tensor * q, const ggml_tensor * kq,
        const ggml_tensor * softmax, ggml_tensor * kqv, const int hadamard_n, ggml_tensor * out, const int out_rot) {
    GGML_ASSERT(ggml_cuda_attn_decode_fused_supported(kq, softmax, kqv));
    GGML_ASSERT(hadamard_n == 0 || ggml_cuda_attn_decode_fused_can_rotate(kq, hadamard_n));
    GGML_ASSERT(out != nullptr || out_rot == 0);

    const ggml_tensor * k     = kq->src[0];
    const ggml_tensor * mask  = softmax->src[1];
    const ggml_tensor * sinks = softmax->src[2];
    const ggml_tensor * v     = kqv->src[0];

    cudaStream_t stream = ctx.stream();
    const int    id     = ggml_cuda_get_device();
    const int    nsm    = ggml_cuda_info().devices[id].nsm;

    attn_decode_params p = {};
    p.dk         = (int) k->ne[0];
    p.dv         = (int) v->ne[0];
    p.n_kv       = (int) k->ne[1];
    p.n_head_kv  = (int) k->ne[2];
    p.gqa        = (int) (q->ne[2]/k->ne[2]);
    p.ntok       = (int) q->ne[1];
    p.ncols      = p.ntok*p.gqa;
    p.ntiles     = (p.ncols + AD_CT - 1)/AD_CT;
    p.hadamard_n = hadamard_n;
    memcpy(&p.scale, (const float *) softmax->op_params + 0, sizeof(float));

    const int nstream = (int) k->ne[3];

    attn_decode_layout(p, k, v, attn_decode_walkers(false));
    p.mask_f16 = mask && mask->type == GGML_TYPE_F16;
    // k_attn_decode_tc where it exists: tiles of 16 columns, and splits for whole waves of the blocks per SM its
    // resources allow
    const int tc_nbuf = attn_decode_tc_nbuf(p.dk, p.dv, p.rsk, p.rsv, p.ncols, p.n_kv);
    size_t tc_smem = 0;
    if (tc_nbuf > 0) {
#ifndef GGML_USE_HIP
        p.ntiles = (p.ncols + AD_TC_COLS - 1)/AD_TC_COLS;
        attn_decode_layout(p, k, v, attn_decode_walkers(true)); // each warp walks its own cells
        tc_smem  = attn_decode_tc_smem(p.dk, p.dv, p.rsk, p.rsv, tc_nbuf);
        static std::mutex                        tc_mutex;
        static std::unordered_map<uint64_t, int> tc_bpsm;
        const uint64_t key = ((uint64_t) k->type << 48) ^ ((uint64_t) v->type << 40) ^ ((uint64_t) p.dk << 28) ^
            ((uint64_t) p.dv << 16) ^ ((uint64_t) id << 8) ^ (uint64_t) tc_nbuf;
        int bpsm = 0;
        {
            std::lock_guard<std::mutex> lock(tc_mutex);
            auto it = tc_bpsm.find(key);
            if (it == tc_bpsm.end()) {
                it = tc_bpsm.emplace(key, attn_decode_tc_dispatch(k->type, v->type, p, false, dim3(), tc_smem, nullptr)).first;
            }
            bpsm = it->second;
        }
        attn_decode_plan(p, nstream, nsm, bpsm, AD_SPLIT_MIN_TILES);
#endif // GGML_USE_HIP
    } else {
        attn_decode_plan(p, nstream, nsm, AD_SPLIT_BPSM, AD_SPLIT_MIN_TILES);
    }
    const int64_t nsplit = p.nsplit;

    p.q = (const char *) q->data;
    p.q_nb1 = q->nb[1]; p.q_nb2 = q->nb[2]; p.q_nb3 = q->nb[3];
    p.k = (const char *) k->data;
    p.k_nb1 = k->nb[1]; p.k_nb2 = k->nb[2]; p.k_nb3 = k->nb[3];
    p.v = (const char *) v->data;
    p.v_nb1 = v->nb[1]; p.v_nb2 = v->nb[2]; p.v_nb3 = v->nb[3];
    p.mask = mask ? (const char *) mask->data : nullptr;
    p.m_ne2 = mask ? (int) mask->ne[2] : 1;
    p.m_ne3 = mask ? (int) mask->ne[3] : 1;
    p.m_nb1 = mask ? mask->nb[1] : 0; p.m_nb2 = mask ? mask->nb[2] : 0; p.m_nb3 = mask ? mask->nb[3] : 0;
    p.sinks = sinks ? (const float *) sinks->data : nullptr;
    if (out) {
        // the permuted, contiguous output [d_v, n_head, n_tokens, n_stream], rotated if out_rot > 0
        const int64_t n_head = q->ne[2];
        p.dst  = (float *) out->data;
        p.d_s1 = (int64_t) p.dv*n_head; p.d_s2 = p.dv; p.d_s3 = (int64_t) p.dv*n_head*p.ntok;
    } else {
        p.dst  = (float *) kqv->data;
        p.d_s1 = kqv->nb[1]/sizeof(float); p.d_s2 = kqv->nb[2]/sizeof(float); p.d_s3 = kqv->nb[3]/sizeof(float);
    }
    p.out_rot = out_rot;

    const int    cg   = attn_decode_cg(p.ncols);
    const bool   vmma = tc_nbuf > 0 || attn_decode_vmma(p.ncols, p.dk, p.dv, p.rsk, p.rsv);
    p.nbuf            = tc_nbuf > 0 ? tc_nbuf : attn_decode_nbuf(p.ncols, p.dk, p.dv, p.rsk, p.rsv, vmma);
    const size_t smem = tc_nbuf > 0 ? tc_smem : attn_decode_smem(p.ncols, p.dk, p.dv, p.rsk, p.rsv, p.nbuf, vmma);

    // the combine folded into the kernel where the splits are few (attn_decode_fold_fits)
    {
        const int    ncmax = tc_nbuf > 0 ? AD_TC_COLS : AD_CT;
        const size_t room  = tc_nbuf > 0 ? attn_decode_tc_fold_room(p.dk, p.dv) : attn_decode_fold_room(p.ncols, p.dk, p.dv);
        if (attn_decode_fold_fits(std::min(ncmax, p.ncols), p.dv, p.nsplit, room)) {
            p.fold = attn_decode_fold_counts(stream, (int64_t) nstream*p.n_head_kv*p.ntiles);
        }
    }

    ggml_cuda_pool_alloc<float>  part_o(ctx.pool());
    ggml_cuda_pool_alloc<float2> part_ml(ctx.pool());
    if (nsplit > 1) {
        const size_t nml = (size_t) nstream*p.n_head_kv*nsplit*p.ncols;
        part_o.alloc(nml*p.dv);
        part_ml.alloc(nml);
        p.part_o  = part_o.get();
        p.part_ml = part_ml.get();
    }

    const dim3 grid((unsigned) nsplit, (unsigned) (p.n_head_kv*p.ntiles), (unsigned) nstream);
    const bool mask_f16 = p.mask_f16;
#ifndef GGML_USE_HIP
    if (tc_nbuf > 0) {
        attn_decode_tc_dispatch(k->type, v->type, p, true, grid, smem, stream);
        attn_decode_tc_count++;
    } else
#endif // GGML_USE_HIP
    switch (k->type) {
        case GGML_TYPE_Q4_0: attn_decode_switch_v<GGML_TYPE_Q4_0>(v->type, p, cg, mask_f16, vmma, grid, smem, stream); break;
        case GGML_TYPE_Q4_1: attn_decode_switch_v<GGML_TYPE_Q4_1>(v->type, p, cg, mask_f16, vmma, grid, smem, stream); break;
        case GGML_TYPE_Q8_0: attn_decode_switch_v<GGML_TYPE_Q8_0>(v->type, p, cg, mask_f16, vmma, grid, smem, stream); break;
        default: GGML_ABORT("fatal error");
    }
    CUDA_CHECK(cudaGetLastError());
    attn_decode_fold_count += p.fold != nullptr;
    attn_decode_win_count  += p.wk || p.wv;

    if (nsplit > 1 && !p.fold) {
        const dim3 grid_c((unsigned) p.ncols, (unsigned) p.n_head_kv, (unsigned) nstream);
        attn_decode_kernel_launch(k_attn_decode_combine, grid_c, attn_decode_combine_smem(p.nsplit, p.dv), stream,
            (const float *) p.part_o, (const float2 *) p.part_ml, p.sinks, p.dst, p.dv, p.ncols, p.ntok, p.gqa,
            p.n_head_kv, p.nsplit, p.d_s1, p.d_s2, p.d_s3, p.out_rot);
    }
    return vmma;
}
