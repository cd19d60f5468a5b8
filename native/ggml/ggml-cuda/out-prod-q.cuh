#pragma once

// llama-vq: OUT_PROD with a quantized or contiguous f16 src0 (out-prod-q.cu); out-prod.cuh includes this header.

#include "common.cuh"

// whether ggml_cuda_out_prod_q takes src0 (its type, and dim 0 not permuted; an f16 src0 contiguous)
bool ggml_cuda_out_prod_q_supported(const ggml_tensor * src0);

// a quantized OUT_PROD that runs through the GEMM path (CUDA graphs are not used for graphs holding one)
bool ggml_cuda_out_prod_q_uses_gemm(const ggml_tensor * dst);

// dst = out_prod(src0, src1) with a quantized or f16 src0 that may broadcast over dims 2 and 3
void ggml_cuda_out_prod_q(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

// whether SOFT_MAX -> [RESHAPE ->] TRANSPOSE -> OUT_PROD(V, .) (the split attention's chunk) runs as one pass over the
// raw scores: the tensor-core V*P takes this V*P, the softmax is in place, f16 mask, no ALiBi
bool ggml_cuda_out_prod_q_softmax_supported(const ggml_tensor * softmax, const ggml_tensor * kqv);

// kqv = out_prod(V, transpose(softmax(scores, mask, scale, sinks))) without writing the softmax
void ggml_cuda_out_prod_q_softmax(ggml_backend_cuda_context & ctx, const ggml_tensor * softmax, ggml_tensor * kqv);
