#pragma once

#include "common.cuh"

// llama-vq: the Hadamard rotation of a quantized KV cache (a MUL_MAT run as a fast Walsh-Hadamard transform) fused
// with its neighbour: nodes[i .. i + n_nodes) become one kernel whose output is nodes[out_idx]
//   FWHT_SET_ROWS: fwht -> views -> SET_ROWS into a quantized cache     (fwht-fused.cuh)
//   CONT_FWHT:     CONT -> RESHAPE -> fwht  (the attention output)      (fwht-fused.cuh)
//   FWHT_KQ:       fwht -> views -> MUL_MAT(quantized K, queries)       (mmvq-short.cuh, the queries rotated in place)
//   ROPE_FWHT_SET_ROWS: ROPE -> RESHAPE -> FWHT_SET_ROWS (K's rope, rotation and store in one kernel; f16's K
//                  takes one kernel too, upstream's ROPE + VIEW + SET_ROWS; fwht-fused.cuh)
// The graph places the rotations next to these consumers (llama-graph.cpp, build_attn). On unless
// LLAMA_VQ_CUDA_FUSE_ROTATION=0.
struct ggml_cuda_fwht_fusion {
    enum kind_t { NONE, FWHT_SET_ROWS, CONT_FWHT, FWHT_KQ, ROPE_FWHT_SET_ROWS } kind = NONE;
    int n_nodes = 0;
    int out_idx = -1;
};

// RESHAPE, VIEW, PERMUTE, TRANSPOSE: nodes that run nothing, skipped between a rotation and its consumer
bool ggml_cuda_fwht_fusion_is_view(ggml_op op);

// on by default; LLAMA_VQ_CUDA_FUSE_ROTATION=0 runs the rotations as separate kernels (for comparison)
bool ggml_cuda_fwht_fusion_enabled();

// whether nodes[i] starts a rotation fusion; f: its kind, its nodes and the node it writes
bool ggml_cuda_match_fwht_fusion(const ggml_cgraph * cgraph, int i, ggml_cuda_fwht_fusion & f);

// runs the fusion f matched at nodes[i], and counts it (printed at exit with LLAMA_VQ_CUDA_FUSION_STATS=1)
void ggml_cuda_op_fwht_fusion(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const ggml_cuda_fwht_fusion & f);
