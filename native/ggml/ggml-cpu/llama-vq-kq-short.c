// llama-vq: K*Q with a quantized K for decode-sized batches, each K row shared by its GQA heads
// (llama_vq_mul_mat_kq_short, llama-vq-kq-short.h). Hooked in by patch 0012-cpu-kq-quantized-k-gqa-shared-rows:
// ggml_compute_forward_mul_mat calls it after src1 is packed to q8_0, ggml-cpu's CMakeLists.txt lists this file.

#include "llama-vq-kq-short.h"
#include "llama-vq-op-log.h"

#include "ggml-cpu.h"
#include "ggml-cpu-impl.h"
#include "ggml-impl.h"
#include "quants.h"
#include "simd-mappings.h"

#include <stdbool.h>
#include <stdlib.h>

// llama-vq: K*Q with a quantized K cache for decode-sized batches. Upstream computes it as one
// vec_dot call per (K row, query column): with head-sized rows (2-8 blocks) the call, the unpacking of the
// K row and the final horizontal sum cost more than the dot itself, and each K row is unpacked again for
// every query head of its GQA group. Here every K row is unpacked once and dotted with all the query
// columns that share its head (GQA heads x tokens, up to 16) while it is in registers. The arithmetic is
// upstream's AVX2 vec_dot's, block for block (int8 dot, FMA by d_k*d_q, the same horizontal sum), so the
// results are bit-identical. AVX-512 VNNI / AVX-VNNI use dpbusd for the int8 dot, as upstream does.
// LLAMA_VQ_CPU_KQ_SHORT=0 turns it off.
#if defined(__AVX2__) && defined(__FMA__)
#define LLAMA_VQ_KQ_MAX_COLS   16
#define LLAMA_VQ_KQ_MAX_BLOCKS 8

static inline float llama_vq_hsum_f32_8(const __m256 x) {
    __m128 res = _mm256_extractf128_ps(x, 1);
    res = _mm_add_ps(res, _mm256_castps256_ps128(x));
    res = _mm_add_ps(res, _mm_movehl_ps(res, res));
    res = _mm_add_ss(res, _mm_movehdup_ps(res));
    return _mm_cvtss_f32(res);
}

// sum of x[i]*y[i] over pairs, as 8 int32 -> float; ax = |x|
static inline __m256 llama_vq_dot_i8(const __m256i ax, const __m256i x, const __m256i y) {
#if __AVXVNNIINT8__
    (void) ax;
    return _mm256_cvtepi32_ps(_mm256_dpbssd_epi32(_mm256_setzero_si256(), x, y));
#else
    const __m256i sy = _mm256_sign_epi8(y, x);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sy));
#elif defined(__AVXVNNI__)
    return _mm256_cvtepi32_ps(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), ax, sy));
#else
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1)));
#endif
#endif
}

// one K block as 32 int8 values and its scale
static inline __m256i llama_vq_kq_load(const char * row, int b, bool q4, float * d) {
    if (q4) {
        const block_q4_0 * x = (const block_q4_0 *) row + b;
        *d = GGML_CPU_FP16_TO_FP32(x->d);
        const __m128i t = _mm_loadu_si128((const __m128i *) x->qs);
        const __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0F));
        return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
    }
    const block_q8_0 * x = (const block_q8_0 *) row + b;
    *d = GGML_CPU_FP16_TO_FP32(x->d);
    return _mm256_loadu_si256((const __m256i *) x->qs);
}

// rows [ir0, ir1) of one K head against CN query columns (CN a constant: the accumulators stay in registers)
static inline __attribute__((always_inline)) void llama_vq_kq_rows(
        const int CN, const bool q4, const char * base, size_t nb01, int nb, int64_t ir0, int64_t ir1,
        const block_q8_0 * const * y, const float (*yd)[LLAMA_VQ_KQ_MAX_BLOCKS], float * const * out) {
    for (int64_t ir = ir0; ir < ir1; ++ir) {
        const char * row = base + ir*nb01;
        __m256 acc[4];
        for (int k = 0; k < CN; ++k) {
            acc[k] = _mm256_setzero_ps();
        }
        for (int b = 0; b < nb; ++b) {
            float xd;
            const __m256i x  = llama_vq_kq_load(row, b, q4, &xd);
            const __m256i ax = _mm256_sign_epi8(x, x);
            for (int k = 0; k < CN; ++k) {
                const __m256i yv = _mm256_loadu_si256((const __m256i *) y[k][b].qs);
                acc[k] = _mm256_fmadd_ps(_mm256_set1_ps(xd * yd[k][b]), llama_vq_dot_i8(ax, x, yv), acc[k]);
            }
        }
        for (int k = 0; k < CN; ++k) {
            out[k][ir] = llama_vq_hsum_f32_8(acc[k]);
        }
    }
}

bool llama_vq_mul_mat_kq_short(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const struct ggml_tensor * src0 = dst->src[0];
    const struct ggml_tensor * src1 = dst->src[1];

    GGML_TENSOR_BINARY_OP_LOCALS

    static int enabled = -1;  // a benign race: every thread computes the same value
    if (enabled < 0) {
        const char * e = getenv("LLAMA_VQ_CPU_KQ_SHORT");
        enabled = e == NULL || atoi(e) != 0;
    }
    if (!enabled || (src0->type != GGML_TYPE_Q4_0 && src0->type != GGML_TYPE_Q8_0) || src1->type != GGML_TYPE_F32 ||
        ggml_get_type_traits_cpu(src0->type)->vec_dot_type != GGML_TYPE_Q8_0) {
        return false;
    }
    const int64_t r2 = ne12 / ne02;
    const int64_t r3 = ne13 / ne03;
    const int nb = (int) (ne00 / QK8_0);
    if (ne00 % QK8_0 != 0 || nb > LLAMA_VQ_KQ_MAX_BLOCKS || ne11 * r2 > LLAMA_VQ_KQ_MAX_COLS || ne01 < 32) {
        return false;
    }

    const int ith = params->ith;
    const int nth = params->nth;
    const bool q4 = src0->type == GGML_TYPE_Q4_0;
    if (ith == 0) {
        static int logged = 0;
        llama_vq_cpu_op_log_first(&logged, "kq_short", src0->type);
    }
    const size_t row_size = ggml_row_size(GGML_TYPE_Q8_0, ne10);
    const char * wdata = params->wdata;  // src1 as q8_0 rows, packed by the caller before its barrier

    const int64_t dr  = (ne01 + nth - 1) / nth;
    const int64_t ir0 = dr * ith;
    const int64_t ir1 = MIN(ir0 + dr, ne01);
    if (ir0 >= ir1) {
        return true;
    }

    for (int64_t i13 = 0; i13 < ne13; ++i13) {
        const int64_t i03 = i13 / r3;
        for (int64_t i02 = 0; i02 < ne02; ++i02) {
            const block_q8_0 * y[LLAMA_VQ_KQ_MAX_COLS];
            float * out[LLAMA_VQ_KQ_MAX_COLS];
            float yd[LLAMA_VQ_KQ_MAX_COLS][LLAMA_VQ_KQ_MAX_BLOCKS];
            int nc = 0;
            for (int64_t i12 = i02*r2; i12 < (i02 + 1)*r2; ++i12) {
                for (int64_t i11 = 0; i11 < ne11; ++i11, ++nc) {
                    y[nc]   = (const block_q8_0 *) (wdata + (i11 + i12*ne11 + i13*ne12*ne11)*row_size);
                    out[nc] = (float *) ((char *) dst->data + i11*nb1 + i12*nb2 + i13*nb3);
                    for (int b = 0; b < nb; ++b) {
                        yd[nc][b] = GGML_CPU_FP16_TO_FP32(y[nc][b].d);
                    }
                }
            }
            const char * base = (const char *) src0->data + i02*nb02 + i03*nb03;
            for (int c0 = 0; c0 < nc; c0 += 4) {
                switch (MIN(4, nc - c0)) {
                    case 4: llama_vq_kq_rows(4, q4, base, nb01, nb, ir0, ir1, y + c0, yd + c0, out + c0); break;
                    case 3: llama_vq_kq_rows(3, q4, base, nb01, nb, ir0, ir1, y + c0, yd + c0, out + c0); break;
                    case 2: llama_vq_kq_rows(2, q4, base, nb01, nb, ir0, ir1, y + c0, yd + c0, out + c0); break;
                    default: llama_vq_kq_rows(1, q4, base, nb01, nb, ir0, ir1, y + c0, yd + c0, out + c0); break;
                }
            }
        }
    }
    return true;
}
#else
bool llama_vq_mul_mat_kq_short(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    GGML_UNUSED(params);
    GGML_UNUSED(dst);
    return false;
}
#endif // __AVX2__ && __FMA__
