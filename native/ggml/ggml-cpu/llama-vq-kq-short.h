#pragma once

// llama-vq: K*Q with a quantized K for decode-sized batches (llama-vq-kq-short.c); ggml-cpu.c includes this header.

#include "ggml.h"

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ggml_compute_params;

// dst = mul_mat(src0, src1) for a q4_0/q8_0 src0 of at most 8 blocks per row and at most 16 src1 columns per src0
// matrix, each src0 row dotted with all of its columns while in registers (AVX2 + FMA builds; false elsewhere).
// Called by every thread once src1 is in wdata as q8_0 rows; false: not taken, the caller computes dst.
// LLAMA_VQ_CPU_KQ_SHORT=0 turns it off.
bool llama_vq_mul_mat_kq_short(const struct ggml_compute_params * params, struct ggml_tensor * dst);

#ifdef __cplusplus
}
#endif
