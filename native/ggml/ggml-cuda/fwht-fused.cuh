#pragma once

#include "common.cuh"

// The Hadamard rotation of a quantized KV cache (MUL_MAT with GGML_HINT_SRC0_IS_HADAMARD, run as a fast
// Walsh-Hadamard transform) fused with the node next to it, saving one launch and one round trip through memory:
//
// - fwht -> [reshape/view] -> SET_ROWS into a quantized cache: the rows are transformed in registers and quantized
//   straight into the cache (ggml_cuda_op_fwht_set_rows)
// - CONT -> reshape -> fwht (the attention output, permuted back to [n_embd, n_tokens] by a CONT): the transform
//   reads the permuted source directly (ggml_cuda_op_cont_fwht)
//
// The third fusion, fwht -> [views] -> K*Q, applies the transform to the queries inside the K*Q kernel
// (mmvq-short.cuh).

// fwht is a MUL_MAT that ggml_cuda_op_mul_mat_use_fwht accepts; set_rows stores its result
bool ggml_cuda_fwht_set_rows_supported(const ggml_tensor * fwht, const ggml_tensor * set_rows);
void ggml_cuda_op_fwht_set_rows(ggml_backend_cuda_context & ctx, const ggml_tensor * fwht, ggml_tensor * set_rows);

// rope -> reshape -> fwht -> [reshape/view] -> SET_ROWS (a quantized K's store): the kernel above, reading the
// rope's source and rotating each pair itself (GGML_ROPE_TYPE_NORMAL or NEOX; each pair inside one segment of the
// transform), so that a quantized K is stored by one kernel, as an f16 K is (upstream's rope + set_rows fusion)
struct fwht_rope_params {
    const char    * src;           // the rope's F32 source, rows strided (nb1, nb2, nb3 bytes)
    const int32_t * pos;           // [ne2] positions
    const float   * freq_factors;  // [n_dims/2] or nullptr
    int64_t ne0, ne1, ne2;         // the rope's shape (its output contiguous)
    int64_t nb1, nb2, nb3;
    int   n_dims, n_offs;
    bool  neox;
    float theta_scale, freq_scale, ext_factor, attn_factor, corr_low, corr_high;
};
bool ggml_cuda_rope_fwht_set_rows_supported(const ggml_tensor * rope, const ggml_tensor * fwht, const ggml_tensor * set_rows);
void ggml_cuda_op_rope_fwht_set_rows(ggml_backend_cuda_context & ctx, const ggml_tensor * rope, const ggml_tensor * fwht,
        ggml_tensor * set_rows);

// cont feeds (through a reshape) the src1 of fwht
bool ggml_cuda_cont_fwht_supported(const ggml_tensor * cont, const ggml_tensor * fwht);
void ggml_cuda_op_cont_fwht(ggml_backend_cuda_context & ctx, const ggml_tensor * cont, ggml_tensor * fwht);
