// llama-vq: the CPU backend's OUT_PROD with a quantized src0 (ggml_compute_forward_out_prod_q_f32, in place of
// upstream's) and the work size ggml_graph_plan reserves for it. Hooked in by patch 0004-cpu-out-prod-quantized:
// ops.h includes llama-vq-out-prod.h, ggml-cpu's CMakeLists.txt lists this file, ggml_graph_plan calls
// ggml_cpu_out_prod_q_wsize.
//
// ggml_out_prod(v, ggml_transpose(kq)) computes V*softmax(KQ) straight from a row-major quantized V cache:
// - src0 broadcasts over dims 2 and 3 like the F32 path (GQA);
// - decode (<= 4 columns per V matrix, AVX2+FMA, q4_0/iq4_nl/q8_0): each block dequantized into registers and added
//   into all the columns that share it, cells split over threads, partials summed in thread order (deterministic);
// - up to 32 columns: rows dequantized once per thread in tiles, added to each dst row;
// - from 32 columns (prefill): V^T dequantized once into wdata, then llamafile_sgemm as mul_mat does; the tile path
//   where sgemm refuses.

#define GGML_COMMON_IMPL_CPP
#define GGML_COMMON_DECL_CPP
#include "ggml-common.h"
#include "ops.h"

#include "ggml-cpu.h"
#include "ggml-impl.h"
#include "ggml.h"
#include "vec.h"
#include "llama-vq-op-log.h"

#if defined(GGML_USE_LLAMAFILE)
#include "llamafile/sgemm.h"
#endif

#include <cstring>

// 16 bytes of nibbles -> 32 values: the low nibbles, then the high ones (the order of the 32-value 4-bit blocks)
static inline void ggml_cpu_unpack_nibbles(const uint8_t * GGML_RESTRICT qs, int8_t * GGML_RESTRICT q) {
    const uint64_t m = 0x0F0F0F0F0F0F0F0FULL;
    uint64_t w[2];
    memcpy(w, qs, sizeof(w));
    const uint64_t u[4] = { w[0] & m, w[1] & m, (w[0] >> 4) & m, (w[1] >> 4) & m };
    memcpy(q, u, sizeof(u));
}

#if defined(__AVX2__)
// 16 bytes of nibbles -> 32 floats lut[nibble]*d + m: the low nibbles, then the high ones
// 16 bytes of nibbles -> lut[nibble] as 32 floats in 4 registers: the low nibbles, then the high ones
static inline void ggml_cpu_nibbles_to_ps_avx2(const uint8_t * GGML_RESTRICT qs, const __m128i lut, __m256 q[4]) {
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i b    = _mm_loadu_si128((const __m128i *) qs);
    const __m128i lo   = _mm_shuffle_epi8(lut, _mm_and_si128(b, mask));
    const __m128i hi   = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(b, 4), mask));
    q[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
    q[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
    q[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
    q[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
}

static inline void ggml_cpu_dequantize_nibbles_avx2(const uint8_t * GGML_RESTRICT qs, const __m128i lut, const float d, const float m, float * GGML_RESTRICT y) {
    __m256 q[4];
    ggml_cpu_nibbles_to_ps_avx2(qs, lut, q);
    const __m256 vd = _mm256_set1_ps(d);
    const __m256 vm = _mm256_set1_ps(m);
    for (int k = 0; k < 4; ++k) {
        _mm256_storeu_ps(y + 8*k, _mm256_add_ps(_mm256_mul_ps(q[k], vd), vm));
    }
}
#endif

// dequantize a row with the CPU backend's SIMD: ggml-base's to_float is built for the baseline ISA, and dequantizing
// the rows is a large part of the quantized OUT_PROD. Each block is unpacked to 32 integers, then converted and
// scaled by two simple loops that the compiler vectorizes.
static void ggml_cpu_dequantize_row(const ggml_type type, const void * GGML_RESTRICT vx, float * GGML_RESTRICT y, const int64_t n) {
    int8_t q[32];
    switch (type) {
        case GGML_TYPE_Q4_0:
        case GGML_TYPE_IQ4_NL:
            {
                static_assert(sizeof(block_q4_0) == sizeof(block_iq4_nl) && QK4_0 == QK4_NL, "q4_0/iq4_nl layout");
                const block_q4_0 * x = (const block_q4_0 *) vx;
#if defined(__AVX2__)
                const __m128i lut = type == GGML_TYPE_Q4_0 ?
                    _mm_setr_epi8(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7) :
                    _mm_loadu_si128((const __m128i *) kvalues_iq4nl);
                for (int64_t ib = 0; ib < n/QK4_0; ++ib, y += QK4_0) {
                    ggml_cpu_dequantize_nibbles_avx2(x[ib].qs, lut, GGML_CPU_FP16_TO_FP32(x[ib].d), 0.0f, y);
                }
#else
                for (int64_t ib = 0; ib < n/QK4_0; ++ib, y += QK4_0) {
                    const float d = GGML_CPU_FP16_TO_FP32(x[ib].d);
                    ggml_cpu_unpack_nibbles(x[ib].qs, q);
                    if (type == GGML_TYPE_Q4_0) {
                        for (int j = 0; j < QK4_0; ++j) {
                            y[j] = d*(q[j] - 8);
                        }
                    } else {
                        for (int j = 0; j < QK4_0; ++j) {
                            y[j] = d*kvalues_iq4nl[q[j]];
                        }
                    }
                }
#endif
            } break;
        case GGML_TYPE_Q4_1:
            {
                const block_q4_1 * x = (const block_q4_1 *) vx;
                for (int64_t ib = 0; ib < n/QK4_1; ++ib, y += QK4_1) {
                    ggml_half dm[2];
                    memcpy(dm, &x[ib], sizeof(dm));
                    const float d = GGML_CPU_FP16_TO_FP32(dm[0]);
                    const float m = GGML_CPU_FP16_TO_FP32(dm[1]);
#if defined(__AVX2__)
                    ggml_cpu_dequantize_nibbles_avx2(x[ib].qs, _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), d, m, y);
#else
                    ggml_cpu_unpack_nibbles(x[ib].qs, q);
                    for (int j = 0; j < QK4_1; ++j) {
                        y[j] = d*q[j] + m;
                    }
#endif
                }
            } break;
        case GGML_TYPE_Q5_0:
        case GGML_TYPE_Q5_1:
            {
                static_assert(QK5_0 == QK5_1, "q5_0/q5_1 block size");
                const bool   q5_1 = type == GGML_TYPE_Q5_1;
                const size_t bs   = q5_1 ? sizeof(block_q5_1) : sizeof(block_q5_0);
                const size_t oqh  = q5_1 ? offsetof(block_q5_1, qh) : offsetof(block_q5_0, qh);
                const size_t oqs  = q5_1 ? offsetof(block_q5_1, qs) : offsetof(block_q5_0, qs);
                for (int64_t ib = 0; ib < n/QK5_0; ++ib, y += QK5_0) {
                    const uint8_t * b = (const uint8_t *) vx + ib*bs;
                    ggml_half dm[2];
                    memcpy(dm, b, sizeof(dm));
                    const float d = GGML_CPU_FP16_TO_FP32(dm[0]);
                    const float m = q5_1 ? GGML_CPU_FP16_TO_FP32(dm[1]) : -16.0f*d;
                    uint32_t qh;
                    memcpy(&qh, b + oqh, sizeof(qh));
                    const uint8_t * qs = b + oqs;
                    for (int j = 0; j < QK5_0/2; ++j) {
                        q[j]           = (qs[j] & 0x0F) | (((qh >> (j +  0)) << 4) & 0x10);
                        q[j + QK5_0/2] = (qs[j] >>   4) | (((qh >> (j + 16)) << 4) & 0x10);
                    }
                    for (int j = 0; j < QK5_0; ++j) {
                        y[j] = d*q[j] + m;
                    }
                }
            } break;
        case GGML_TYPE_Q8_0:
            {
                const block_q8_0 * x = (const block_q8_0 *) vx;
                for (int64_t ib = 0; ib < n/QK8_0; ++ib, y += QK8_0) {
                    const float d = GGML_CPU_FP16_TO_FP32(x[ib].d);
                    for (int j = 0; j < QK8_0; ++j) {
                        y[j] = d*x[ib].qs[j];
                    }
                }
            } break;
        default:
            ggml_get_type_traits(type)->to_float(vx, y, n);
    }
}

// y[0:n] += sum_{r < nr} x[r*n : (r + 1)*n]*v[r*vs] for a tile of nr dense rows x; the rows are the inner loop,
// so the GGML_F32_ARR accumulators of a step are independent chains and y is loaded and stored once per tile
static void ggml_out_prod_mad_tile(const int n, const int nr, float * GGML_RESTRICT y, const float * GGML_RESTRICT x,
        const char * GGML_RESTRICT v, const size_t vs) {
    int i = 0;
#if defined(GGML_SIMD) && !defined(__ARM_FEATURE_SVE) && !defined(__riscv_v_intrinsic)
    const int np = n & ~(GGML_F32_STEP - 1);
    for (; i < np; i += GGML_F32_STEP) {
        GGML_F32_VEC ay[GGML_F32_ARR];
        for (int j = 0; j < GGML_F32_ARR; ++j) {
            ay[j] = GGML_F32_VEC_LOAD(y + i + j*GGML_F32_EPR);
        }
        for (int r = 0; r < nr; ++r) {
            const GGML_F32_VEC vr = GGML_F32_VEC_SET1(*(const float *) (v + r*vs));
            for (int j = 0; j < GGML_F32_ARR; ++j) {
                ay[j] = GGML_F32_VEC_FMA(ay[j], GGML_F32_VEC_LOAD(x + r*n + i + j*GGML_F32_EPR), vr);
            }
        }
        for (int j = 0; j < GGML_F32_ARR; ++j) {
            GGML_F32_VEC_STORE(y + i + j*GGML_F32_EPR, ay[j]);
        }
    }
#endif
    for (int r = 0; r < nr; ++r) {
        const float vr = *(const float *) (v + r*vs);
        for (int k = i; k < n; ++k) {
            y[k] += x[r*n + k]*vr;
        }
    }
}

// Decode-sized quantized OUT_PROD (few dst rows per src0 matrix), q4_0 / iq4_nl / q8_0 with AVX2 + FMA: each 32-value
// block of src0 is dequantized into registers and added straight into the accumulators of all the nc dst rows that
// share the matrix, with the block's scale folded into each row's weight. No dequantized copy is stored and
// reloaded, the type switch is outside the loop, and the 4*nc accumulators are independent chains. Every thread
// takes a range of cells of every matrix, in chunks whose rows stay in L1 while each block column is walked in turn
// (a cell's blocks are read from memory once); the per-thread partial sums are added in a fixed order after a
// barrier (deterministic).
#define GGML_OUT_PROD_Q_DECODE_MAX_COLS 4
#define GGML_OUT_PROD_Q_DECODE_CHUNK    64

static bool ggml_out_prod_q_use_decode(const ggml_tensor * dst) {
#if defined(__AVX2__) && defined(__FMA__)
    const ggml_tensor * src0 = dst->src[0];
    const ggml_type     type = src0->type;
    if (type != GGML_TYPE_Q4_0 && type != GGML_TYPE_IQ4_NL && type != GGML_TYPE_Q8_0) {
        return false;
    }
    const int64_t nc = dst->ne[1]*(dst->ne[2]/src0->ne[2])*(dst->ne[3]/src0->ne[3]);
    return nc <= GGML_OUT_PROD_Q_DECODE_MAX_COLS && src0->ne[0] % 32 == 0;
#else
    GGML_UNUSED(dst);
    return false;
#endif
}

// per thread: the partial sums of every dst row, [src0 matrix][dst row of the matrix][ne0]
static size_t ggml_out_prod_q_decode_wsize(int n_tasks, const ggml_tensor * dst) {
    const int64_t nr = dst->ne[1]*dst->ne[2]*dst->ne[3];
    return sizeof(float)*(nr*dst->ne[0] + CACHE_LINE_SIZE_F32)*n_tasks;
}

#if defined(__AVX2__) && defined(__FMA__)
// acc[c][0:32] (+)= sum over nrows cells of block x (stride nbx) times weight w[c] (stride nbw)
template <int NC, ggml_type type>
static void ggml_out_prod_q_decode_block(const char * GGML_RESTRICT x, const size_t nbx, const int64_t nrows,
        const char * const * GGML_RESTRICT w, const size_t nbw, float * GGML_RESTRICT acc_mem, const int64_t acc_stride,
        const bool init) {
    __m256 acc[NC][4];
    for (int c = 0; c < NC; ++c) {
        for (int k = 0; k < 4; ++k) {
            acc[c][k] = init ? _mm256_setzero_ps() : _mm256_loadu_ps(acc_mem + c*acc_stride + 8*k);
        }
    }
    const __m128i lut = type == GGML_TYPE_IQ4_NL ? _mm_loadu_si128((const __m128i *) kvalues_iq4nl)
                                                 : _mm_setr_epi8(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);

    for (int64_t r = 0; r < nrows; ++r, x += nbx) {
        __m256 q[4];
        float  d;
        if constexpr (type == GGML_TYPE_Q8_0) {
            const block_q8_0 * b = (const block_q8_0 *) x;
            d = GGML_CPU_FP16_TO_FP32(b->d);
            for (int k = 0; k < 4; ++k) {
                q[k] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *) (b->qs + 8*k))));
            }
        } else {
            const block_q4_0 * b = (const block_q4_0 *) x; // block_iq4_nl has the same layout
            d = GGML_CPU_FP16_TO_FP32(b->d);
            ggml_cpu_nibbles_to_ps_avx2(b->qs, lut, q);
        }
        for (int c = 0; c < NC; ++c) {
            const __m256 wd = _mm256_set1_ps(*(const float *) (w[c] + r*nbw) * d);
            for (int k = 0; k < 4; ++k) {
                acc[c][k] = _mm256_fmadd_ps(q[k], wd, acc[c][k]);
            }
        }
    }

    for (int c = 0; c < NC; ++c) {
        for (int k = 0; k < 4; ++k) {
            _mm256_storeu_ps(acc_mem + c*acc_stride + 8*k, acc[c][k]);
        }
    }
}

template <ggml_type type>
static void ggml_out_prod_q_decode_block_nc(const int nc, const char * x, const size_t nbx, const int64_t nrows,
        const char * const * w, const size_t nbw, float * acc_mem, const int64_t acc_stride, const bool init) {
    switch (nc) {
        case 1: ggml_out_prod_q_decode_block<1, type>(x, nbx, nrows, w, nbw, acc_mem, acc_stride, init); break;
        case 2: ggml_out_prod_q_decode_block<2, type>(x, nbx, nrows, w, nbw, acc_mem, acc_stride, init); break;
        case 3: ggml_out_prod_q_decode_block<3, type>(x, nbx, nrows, w, nbw, acc_mem, acc_stride, init); break;
        case 4: ggml_out_prod_q_decode_block<4, type>(x, nbx, nrows, w, nbw, acc_mem, acc_stride, init); break;
        default: GGML_ABORT("fatal error");
    }
}

static void ggml_compute_forward_out_prod_q_f32_decode(const ggml_compute_params * params, ggml_tensor * dst) {
    const ggml_tensor * src0 = dst->src[0];
    const ggml_tensor * src1 = dst->src[1];

    GGML_TENSOR_BINARY_OP_LOCALS;

    const int ith = params->ith;
    const int nth = params->nth;

    const ggml_type type = src0->type;
    const int64_t dps2 = ne2/ne02;
    const int64_t dps3 = ne3/ne03;
    const int64_t nc   = ne1*dps2*dps3; // dst rows per src0 matrix
    const int64_t nm   = ne02*ne03;     // src0 matrices
    const int64_t nbc  = ne00/32;       // block columns
    const size_t  bs   = ggml_type_size(type);

    GGML_ASSERT(params->wsize >= ggml_out_prod_q_decode_wsize(nth, dst));

    // this thread's partial sums, [im][c][ne0], over its cells [r0, r1) of every matrix
    const int64_t part_size = nm*nc*ne0 + CACHE_LINE_SIZE_F32;
    float * part = (float *) params->wdata + ith*part_size;

    const int64_t r0 = (ne01*ith)/nth;
    const int64_t r1 = (ne01*(ith + 1))/nth;
    if (r0 == r1) {
        memset(part, 0, sizeof(float)*nm*nc*ne0);
    }

    for (int64_t im = 0; im < nm && r0 < r1; ++im) {
        const int64_t i03 = im/ne02;
        const int64_t i02 = im - i03*ne02;

        const char * w0[GGML_OUT_PROD_Q_DECODE_MAX_COLS];
        for (int64_t c = 0; c < nc; ++c) {
            const int64_t i3 = i03*dps3 + c/(ne1*dps2);
            const int64_t i2 = i02*dps2 + (c/ne1)%dps2;
            const int64_t i1 = c%ne1;
            w0[c] = (const char *) src1->data + i1*nb10 + i2*nb12 + i3*nb13;
        }
        const char * x0 = (const char *) src0->data + i02*nb02 + i03*nb03;
        float * acc = part + im*nc*ne0;

        for (int64_t rc = r0; rc < r1; rc += GGML_OUT_PROD_Q_DECODE_CHUNK) {
            const int64_t n = MIN(GGML_OUT_PROD_Q_DECODE_CHUNK, r1 - rc);
            const char * w[GGML_OUT_PROD_Q_DECODE_MAX_COLS];
            for (int64_t c = 0; c < nc; ++c) {
                w[c] = w0[c] + rc*nb11;
            }
            for (int64_t ib = 0; ib < nbc; ++ib) {
                const char * x = x0 + rc*nb01 + ib*bs;
                switch (type) {
                    case GGML_TYPE_Q4_0:   ggml_out_prod_q_decode_block_nc<GGML_TYPE_Q4_0>  ((int) nc, x, nb01, n, w, nb11, acc + 32*ib, ne0, rc == r0); break;
                    case GGML_TYPE_IQ4_NL: ggml_out_prod_q_decode_block_nc<GGML_TYPE_IQ4_NL>((int) nc, x, nb01, n, w, nb11, acc + 32*ib, ne0, rc == r0); break;
                    case GGML_TYPE_Q8_0:   ggml_out_prod_q_decode_block_nc<GGML_TYPE_Q8_0>  ((int) nc, x, nb01, n, w, nb11, acc + 32*ib, ne0, rc == r0); break;
                    default: GGML_ABORT("fatal error");
                }
            }
        }
    }

    ggml_barrier(params->threadpool);

    // dst rows split over the threads, each the sum of the threads' partials in thread order
    const int64_t nr  = nm*nc;
    const int64_t q0  = (nr*ith)/nth;
    const int64_t q1  = (nr*(ith + 1))/nth;
    for (int64_t q = q0; q < q1; ++q) {
        const int64_t im  = q/nc;
        const int64_t c   = q%nc;
        const int64_t i03 = im/ne02;
        const int64_t i02 = im - i03*ne02;
        const int64_t i3  = i03*dps3 + c/(ne1*dps2);
        const int64_t i2  = i02*dps2 + (c/ne1)%dps2;
        const int64_t i1  = c%ne1;
        float * y = (float *) ((char *) dst->data + i1*nb1 + i2*nb2 + i3*nb3);
        const float * p = (const float *) params->wdata + q*ne0;
        memcpy(y, p, sizeof(float)*ne0);
        for (int t = 1; t < nth; ++t) {
            ggml_vec_acc_f32(ne0, y, p + t*part_size);
        }
    }
}
#endif // defined(__AVX2__) && defined(__FMA__)

#if defined(GGML_USE_LLAMAFILE) && !defined(__ARM_FEATURE_SVE) && !defined(__ARM_FEATURE_MATMUL_INT8)
#define GGML_OUT_PROD_Q_SGEMM // as in ggml-cpu.c, where these undefine GGML_USE_LLAMAFILE
#endif

// dst columns per src0 matrix (ne1*dps2*dps3) from which the quantized OUT_PROD dequantizes each src0 matrix once
// to F32 and hands it to llamafile_sgemm; below it, the tiles of rows are reused by fewer columns but the path
// needs no barrier and no large workspace (decode)
#define GGML_OUT_PROD_Q_SGEMM_MIN_COLS 32

// rows of src0 dequantized together before they are written out transposed, a cache line per column
#define GGML_OUT_PROD_Q_SGEMM_TILE ((int64_t) CACHE_LINE_SIZE_F32)

// whether the quantized OUT_PROD takes the sgemm path: many columns per src0 matrix, and src1 [ne10, ne11] with its
// dim 1 (the sum) contiguous, as in ggml_out_prod(v, ggml_transpose(kq))
static bool ggml_out_prod_q_use_sgemm(const ggml_tensor * dst) {
#if defined(GGML_OUT_PROD_Q_SGEMM)
    const ggml_tensor * src0 = dst->src[0];
    const ggml_tensor * src1 = dst->src[1];
    const int64_t nc = dst->ne[1]*(dst->ne[2]/src0->ne[2])*(dst->ne[3]/src0->ne[3]);
    return nc >= GGML_OUT_PROD_Q_SGEMM_MIN_COLS &&
        src1->nb[1] == sizeof(float) && src1->nb[0] % sizeof(float) == 0 && src1->nb[0] >= src1->ne[1]*sizeof(float) &&
        dst->nb[1] % sizeof(float) == 0 && dst->nb[1] >= dst->ne[0]*sizeof(float);
#else
    GGML_UNUSED(dst);
    return false;
#endif
}

// the sgemm path: one src0 matrix transposed to F32 (rows of ne01 padded to a cache line), then a tile per thread
static size_t ggml_out_prod_q_sgemm_wsize(int n_tasks, const ggml_tensor * dst) {
    const int64_t ne00 = dst->src[0]->ne[0];
    const int64_t ne01 = dst->src[0]->ne[1];
    const int64_t lda  = GGML_PAD(ne01, CACHE_LINE_SIZE_F32);
    return sizeof(float)*(ne00*lda + (GGML_OUT_PROD_Q_SGEMM_TILE*ne00 + CACHE_LINE_SIZE_F32)*n_tasks + CACHE_LINE_SIZE_F32);
}

size_t ggml_cpu_out_prod_q_wsize(int n_tasks, const struct ggml_tensor * dst) {
    // a tile of GGML_VEC_MAD_UNROLL dequantized rows per thread
    size_t cur = sizeof(float)*(GGML_VEC_MAD_UNROLL*dst->src[0]->ne[0] + CACHE_LINE_SIZE_F32)*n_tasks;
    if (ggml_out_prod_q_use_decode(dst)) {
        cur = MAX(cur, ggml_out_prod_q_decode_wsize(n_tasks, dst));
    }
    if (ggml_out_prod_q_use_sgemm(dst)) {
        cur = MAX(cur, ggml_out_prod_q_sgemm_wsize(n_tasks, dst));
    }
    return cur;
}

#if defined(GGML_OUT_PROD_Q_SGEMM)
// dst = src0 src1 with src0 quantized and many dst columns: every thread dequantizes part of a src0 matrix into the
// shared a = src0^T [ne00, lda] (a row per src0 column, ne01 values contiguous), then llamafile_sgemm computes all
// the dst columns of that matrix, split over the threads, as the mul_mat a*src1 (m = ne0, n = columns, k = ne01):
// src1 [ne10, ne11] has its dim 1 contiguous (transposed), so a dst column's k values are one contiguous run.
// The columns of a src0 matrix are the ne1 rows of each of its dps2 broadcast dst matrices; they form one sgemm of
// ne1*dps2 columns where src1 and dst step uniformly over them (contiguous kq and dst), else one sgemm per dst
// matrix. Returns false (on every thread) where llamafile_sgemm does not take the shapes; dst is then unwritten
// or partly written, and the caller computes it all.
static bool ggml_compute_forward_out_prod_q_f32_sgemm(
        const ggml_compute_params * params,
              ggml_tensor * dst) {

    const ggml_tensor * src0 = dst->src[0];
    const ggml_tensor * src1 = dst->src[1];

    GGML_TENSOR_BINARY_OP_LOCALS;

    const int ith = params->ith;
    const int nth = params->nth;

    const ggml_type type = src0->type;

    const int64_t dps2 = ne2 / ne02;
    const int64_t dps3 = ne3 / ne03;

    const int64_t lda  = GGML_PAD(ne01, CACHE_LINE_SIZE_F32);
    const int64_t tile = GGML_OUT_PROD_Q_SGEMM_TILE;

    GGML_ASSERT(params->wsize >= ggml_out_prod_q_sgemm_wsize(nth, dst));

    // wdata: a [ne00, lda], then a tile of dequantized rows [ne00, tile] per thread
    float * a = (float *) GGML_PAD((uintptr_t) params->wdata, CACHE_LINE_SIZE);
    float * w = a + ne00*lda + (tile*ne00 + CACHE_LINE_SIZE_F32)*ith;

    // the dps2 dst matrices of a src0 matrix as one run of columns: dst column j = i1 + ne1*(i2 - i02*dps2)
    const bool    merge = dps2 == 1 || (nb12 == ne1*nb10 && nb2 == ne1*nb1);
    const int64_t ncols = merge ? ne1*dps2 : ne1;
    const int64_t ngrp  = merge ? 1        : dps2;

    // tiles of src0 rows (a columns) of this thread
    const int64_t nt  = (ne01 + tile - 1)/tile;
    const int64_t it0 = (nt*ith)/nth;
    const int64_t it1 = (nt*(ith + 1))/nth;

    for (int64_t i03 = 0; i03 < ne03; ++i03) {
        for (int64_t i02 = 0; i02 < ne02; ++i02) {
            for (int64_t it = it0; it < it1; ++it) {
                const int64_t i01b  = it*tile;
                const int64_t nrows = MIN(tile, ne01 - i01b);

                for (int64_t ir = 0; ir < nrows; ++ir) {
                    const char * s0 = (const char *) src0->data + ((i01b + ir)*nb01 + i02*nb02 + i03*nb03);
                    ggml_cpu_dequantize_row(type, s0, w + ir*ne00, ne00);
                }
                for (int64_t i00 = 0; i00 < ne00; ++i00) {
                    float * ac = a + i00*lda + i01b;
                    for (int64_t ir = 0; ir < nrows; ++ir) {
                        ac[ir] = w[ir*ne00 + i00];
                    }
                }
            }

            ggml_barrier(params->threadpool);

            for (int64_t i3 = i03*dps3; i3 < (i03 + 1)*dps3; ++i3) {
                for (int64_t ig = 0; ig < ngrp; ++ig) {
                    const int64_t i2 = i02*dps2 + ig;
                    if (!llamafile_sgemm(params,
                                         ne0, ncols, ne01,
                                         a, lda,
                                         (const char *) src1->data + i2*nb12 + i3*nb13, nb10/sizeof(float),
                                         (char *) dst->data + i2*nb2 + i3*nb3, nb1/sizeof(float),
                                         GGML_TYPE_F32, GGML_TYPE_F32, GGML_TYPE_F32)) {
                        return false;
                    }
                }
            }
            // llamafile_sgemm ends with a barrier: a can be overwritten
        }
    }

    return true;
}
#endif

void ggml_compute_forward_out_prod_q_f32(
        const ggml_compute_params * params,
              ggml_tensor * dst) {

    const ggml_tensor * src0 = dst->src[0];
    const ggml_tensor * src1 = dst->src[1];

    GGML_TENSOR_BINARY_OP_LOCALS;

    const int ith = params->ith;
    const int nth = params->nth;

    const ggml_type type = src0->type;
    if (ith == 0) {
        static int logged = 0;
        llama_vq_cpu_op_log_first(&logged, "out_prod", type);
    }

    GGML_ASSERT(ne2  == ne12);
    GGML_ASSERT(ne3  == ne13);
    GGML_ASSERT(ne2 % ne02 == 0);
    GGML_ASSERT(ne3 % ne03 == 0);

    // we don't support permuted src0 dim0
    GGML_ASSERT(nb00 == ggml_type_size(type));

    // dst dim0 cannot be transposed or permuted
    GGML_ASSERT(nb0 == sizeof(float));

    GGML_ASSERT(ne0 == ne00);
    GGML_ASSERT(ne1 == ne10);
    GGML_ASSERT(ne01 == ne11);

#if defined(GGML_OUT_PROD_Q_SGEMM)
    if (ggml_out_prod_q_use_sgemm(dst) && ggml_compute_forward_out_prod_q_f32_sgemm(params, dst)) {
        return;
    }
#endif

#if defined(__AVX2__) && defined(__FMA__)
    if (ggml_out_prod_q_use_decode(dst)) {
        ggml_compute_forward_out_prod_q_f32_decode(params, dst);
        return;
    }
#endif

    // dst[:,:,:,:] = 0
    // for i2,i3:
    //   for i1:
    //     for i01:
    //       for i0:
    //         dst[i0,i1,i2,i3] += src0[i0,i01,i2/dps2,i3/dps3] * src1[i1,i01,i2,i3]
    //
    // src0 is typically a quantized V cache [n_embd_v, n_kv, n_head_kv] and src1 the transposed
    // KQ [n_tokens, n_kv, n_head]: every src0 row is shared by all dst rows (i1, dps2*dps3 heads)
    // of its src0 matrix, so the rows are dequantized in tiles of GGML_VEC_MAD_UNROLL and reused
    // for all the dst rows a thread owns, instead of once per dst row.

    // dps == dst per src0, used for group query attention
    const int64_t dps2 = ne2 / ne02;
    const int64_t dps3 = ne3 / ne03;

    // dst rows per src0 matrix and number of src0 matrices
    const int64_t nc = ne1*dps2*dps3;
    const int64_t nm = ne02*ne03;

    // split the (src0 matrix, dst row) pairs evenly: a src0 matrix shared by two threads is dequantized by both
    const int64_t nr  = nm*nc;
    const int64_t ir0 = (nr*ith)/nth;
    const int64_t ir1 = (nr*(ith + 1))/nth;

    const int64_t blck = GGML_VEC_MAD_UNROLL;

    float * wdata = (float *) params->wdata + (blck*ne0 + CACHE_LINE_SIZE_F32) * ith;

    for (int64_t im = ir0/nc; im < nm && im*nc < ir1; ++im) {
        const int64_t i03 = im/ne02;
        const int64_t i02 = im - i03*ne02;

        const int64_t ic0 = MAX(ir0, im*nc)       - im*nc;
        const int64_t ic1 = MIN(ir1, (im + 1)*nc) - im*nc;

        for (int64_t ic = ic0; ic < ic1; ++ic) {
            const int64_t i3 = i03*dps3 + ic/(ne1*dps2);
            const int64_t i2 = i02*dps2 + (ic/ne1)%dps2;
            const int64_t i1 = ic%ne1;

            ggml_vec_set_f32(ne0, (float *) ((char *) dst->data + (i1*nb1 + i2*nb2 + i3*nb3)), 0.0f);
        }

        for (int64_t i01b = 0; i01b < ne01; i01b += blck) {
            const int64_t nrows = MIN(blck, ne01 - i01b);

            for (int64_t ir = 0; ir < nrows; ++ir) {
                const char * s0 = (const char *) src0->data + ((i01b + ir)*nb01 + i02*nb02 + i03*nb03);
                ggml_cpu_dequantize_row(type, s0, wdata + ir*ne0, ne0);
            }

            for (int64_t ic = ic0; ic < ic1; ++ic) {
                const int64_t i3 = i03*dps3 + ic/(ne1*dps2);
                const int64_t i2 = i02*dps2 + (ic/ne1)%dps2;
                const int64_t i1 = ic%ne1;

                const char * s1 = (const char *) src1->data + (i1*nb10 + i01b*nb11 + i2*nb12 + i3*nb13);
                float      * d  = (float *) ((char *) dst->data + (i1*nb1 + i2*nb2 + i3*nb3));

                ggml_out_prod_mad_tile(ne0, nrows, d, wdata, s1, nb11);
            }
        }
    }
}
