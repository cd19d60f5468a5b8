#pragma once

#include "common.cuh"

// llama-vq: the non-FA attention of a few query tokens on a quantized K/V cache as one pass (attn-decode-fused.cuh):
//   [rotation of the queries -> views ->] MUL_MAT(K, Q) -> SOFT_MAX(mask, scale, sinks) -> TRANSPOSE -> OUT_PROD(V, .)
// The query rotation (rotation-fusion.cuh's FWHT_KQ form) is taken over: the kernel rotates the queries in shared memory. View nodes
// of other tensors between the chain's nodes (V's permute) run nothing and are skipped. Matched before the rotation
// fusions, which would otherwise take the K*Q. By default only where it was measured faster than the separate
// ops and within FA's fidelity (H200): one query token per stream and V*P on tensor cores;
// LLAMA_VQ_CUDA_FUSED_ATTN=1 fuses every supported chain (up to 8 tokens, the f32 V*P), =0 none.
struct ggml_cuda_attn_fusion {
    int n_nodes    = 0;  // nodes[i .. i + n_nodes) are done by the fused kernels
    int kq_idx     = -1;
    int sm_idx     = -1;
    int kqv_idx    = -1; // the OUT_PROD
    int out_idx    = -1; // the node the kernels write: the OUT_PROD, or the tail's last node
    int hadamard_n = 0;  // > 0: nodes[i] is the rotation of the queries
    bool tail      = false; // PERMUTE -> CONT [-> RESHAPE -> MUL_MAT(Hadamard)] done too
    int out_rot    = 0;     // the tail's rotation (0: none)
    bool softmax_vp = false; // SOFT_MAX -> [RESHAPE ->] TRANSPOSE -> OUT_PROD: the split attention's chunk, its softmax
                             // taken into the tensor-core V*P (out-prod-q.cuh); kq_idx -1, sm_idx == i
};

// whether nodes[i] starts a fused attention chain (a MUL_MAT: the decode attention; a SOFT_MAX: the split's softmax and
// V*P); f: its nodes and the node the kernels write
bool ggml_cuda_match_attn_fusion(const ggml_cgraph * cgraph, int i, ggml_cuda_attn_fusion & f);

// runs the chain f matched at nodes[i], and counts it (printed at exit with LLAMA_VQ_CUDA_FUSION_STATS=1)
void ggml_cuda_op_attn_fusion(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const ggml_cuda_attn_fusion & f);
