#pragma once

#include "common.cuh"

// llama-vq: the non-FA attention of a few query tokens on a quantized K/V cache as one pass
// (K*Q -> softmax(mask, scale, sinks) -> V*P, flash-decoding style: the cells of a KV head are split across blocks,
// each block keeps a running max/sum/accumulator per query column, a second kernel combines the splits).
// The graph form it replaces (llama-graph.cpp build_attn_mha, FA off, V row-major quantized, patch 0007-quantized-v-cache-without-flash-attn):
//   kq  = MUL_MAT(k, q)                      k: [d_k, n_kv, n_head_kv, n_stream] view of the cache, q: F32 view
//   kq  = SOFT_MAX(kq, mask, scale, sinks)   max_bias 0
//   kqv = OUT_PROD(v, TRANSPOSE(kq))         v: [d_v, n_kv, n_head_kv, n_stream] view of the cache
#define ATTN_DECODE_MAX_TOKENS 8   // query tokens per stream
#define ATTN_DECODE_MAX_COLS   128 // n_tokens * GQA columns per KV head (tiles of 32 per block)
#define ATTN_DECODE_MAX_D      256 // d_k and d_v

// kq, softmax, kqv: the three computing nodes of the chain (the transpose between the last two is a view);
// q: the queries K*Q reads (kq->src[1]; with hadamard_n > 0, the queries before their rotation, same layout)
bool ggml_cuda_attn_decode_fused_supported(const ggml_tensor * kq, const ggml_tensor * softmax, const ggml_tensor * kqv);

// the chain is one the fused kernels run by default: one query token per stream, and V*P on tensor cores
// (NVIDIA sm_80+, d_v 128), where the H200 measured the fused path faster than the separate ops at every depth
// and its KL from f16 below FA on's with the same cache types; the caller has checked ..._supported
bool ggml_cuda_attn_decode_fused_auto(const ggml_tensor * kq, const ggml_tensor * softmax, const ggml_tensor * kqv);

// hadamard_n > 0: q holds the queries before a Hadamard rotation of hadamard_n (rotation-fusion.cuh's FWHT_KQ form); every
// hadamard_n-segment of a query column is scaled by 1/sqrt(hadamard_n) and transformed in shared memory
bool ggml_cuda_attn_decode_fused_can_rotate(const ggml_tensor * kq, int hadamard_n);

// the chain's continuation in build_attn_mha: PERMUTE(kqv, 0, 2, 1, 3) -> CONT, and with out_rot > 0 the inverse
// rotation of a rotated V cache on the result (rotation-fusion.cuh's CONT_FWHT form: RESHAPE -> MUL_MAT of a Hadamard matrix of
// out_rot); out_rot 0: the CONT alone
bool ggml_cuda_attn_decode_fused_tail_supported(const ggml_tensor * kqv, const ggml_tensor * permute,
        const ggml_tensor * cont, int out_rot);

// out == nullptr: the result into kqv; else into out, the tail's last node (the CONT, or the rotation's
// MUL_MAT with out_rot > 0), permuted, contiguous and rotated as the tail would leave it. Returns whether V*P ran on
// tensor cores
bool ggml_cuda_attn_decode_fused(ggml_backend_cuda_context & ctx, const ggml_tensor * q, const ggml_tensor * kq,
        const ggml_tensor * softmax, ggml_tensor * kqv, int hadamard_n, ggml_tensor * out = nullptr, int out_rot = 0);

// how many times k_attn_decode_tc (both products on tensor cores) ran in this process; a fused kernel with the combine
// folded in (ad_fold_combine); a fused kernel with K or V rows staged as 16-byte windows (attn_decode_rows)
int64_t ggml_cuda_attn_decode_tc_runs();
int64_t ggml_cuda_attn_decode_fold_runs();
int64_t ggml_cuda_attn_decode_window_runs();
