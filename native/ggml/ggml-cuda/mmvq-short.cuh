#include "common.cuh"

// MUL_MAT with a quantized src0 of short rows (ne00 <= 1024, e.g. a quantized K cache [n_embd_head_k, n_kv, n_head_kv])
// batched over src1 channels (attention): a vector kernel for a few src1 columns per src0 matrix (decode: n_tokens x
// GQA ratio <= 8), src0 dequantized once + cuBLAS otherwise
bool ggml_cuda_should_use_mmvq_short(const ggml_tensor * src0, const ggml_tensor * src1, const ggml_tensor * dst);

void ggml_cuda_mul_mat_vec_q_short(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ggml_tensor * src1, ggml_tensor * dst);

// The same product with src1 = the queries before a Hadamard rotation of hadamard_n (the K cache is stored rotated):
// every hadamard_n-segment of a src1 column is transformed (scaled by 1/sqrt(hadamard_n)) in shared memory before
// use. Only the vector kernel does it (few columns); src1 columns must start on segment boundaries.
bool ggml_cuda_mmvq_short_can_rotate_src1(const ggml_tensor * src0, const ggml_tensor * src1, const ggml_tensor * dst, int hadamard_n);

void ggml_cuda_mul_mat_vec_q_short_rotated(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ggml_tensor * src1, ggml_tensor * dst,
        int hadamard_n);
