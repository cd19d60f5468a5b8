// llama-vq: the rotation fusions' graph matching and dispatch (rotation-fusion.cuh); the kernels are in
// fwht-fused.cu and mmvq-short.cu. Hooked in by patch 0009-cuda-fuse-attn-rotations (ggml_cuda_try_fuse,
// graph_optimize).

#include "rotation-fusion.cuh"
#include "fwht.cuh"
#include "fwht-fused.cuh"
#include "mmvq-short.cuh"

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>

bool ggml_cuda_fwht_fusion_is_view(const ggml_op op) {
    return op == GGML_OP_RESHAPE || op == GGML_OP_VIEW || op == GGML_OP_PERMUTE || op == GGML_OP_TRANSPOSE;
}

// K*Q on the queries before their rotation: the columns of the permuted view must start on segment boundaries
static bool ggml_cuda_fwht_kq_supported(const ggml_tensor * fwht, const ggml_tensor * kq) {
    const ggml_tensor * k = kq->src[0];
    const ggml_tensor * q = kq->src[1];
    if (kq->op != GGML_OP_MUL_MAT || q->view_src != fwht || q->type != GGML_TYPE_F32 || fwht->src[1]->type != GGML_TYPE_F32 ||
            !ggml_is_quantized(k->type)) {
        return false;
    }
    const int64_t n   = fwht->src[0]->ne[0];
    const size_t  seg = n*sizeof(float);
    if (q->view_offs % seg != 0) {
        return false;
    }
    for (int d = 1; d < GGML_MAX_DIMS; ++d) {
        if (q->ne[d] > 1 && q->nb[d] % seg != 0) {
            return false;
        }
    }
    return ggml_cuda_mmvq_short_can_rotate_src1(k, q, kq, (int) n);
}

bool ggml_cuda_fwht_fusion_enabled() {
    static const bool enabled = [] {
        const char * env = getenv("LLAMA_VQ_CUDA_FUSE_ROTATION");
        return env == nullptr || atoi(env) != 0;
    }();
    return enabled;
}

// ROPE -> RESHAPE -> (fwht -> views -> SET_ROWS): K's rope folded into its rotation + store
static bool ggml_cuda_match_rope_fwht_fusion(const ggml_cgraph * cgraph, const int i, ggml_cuda_fwht_fusion & f) {
    const ggml_tensor * node = cgraph->nodes[i];
    if (i + 3 >= cgraph->n_nodes) {
        return false;
    }
    const ggml_tensor * reshape = cgraph->nodes[i + 1];
    if (reshape->op != GGML_OP_RESHAPE || reshape->src[0] != node || cgraph->nodes[i + 2]->src[1] != reshape) {
        return false;
    }
    ggml_cuda_fwht_fusion inner;
    if (!ggml_cuda_match_fwht_fusion(cgraph, i + 2, inner) || inner.kind != ggml_cuda_fwht_fusion::FWHT_SET_ROWS ||
            !ggml_cuda_rope_fwht_set_rows_supported(node, cgraph->nodes[i + 2], cgraph->nodes[inner.out_idx])) {
        return false;
    }
    ggml_op ops[10];
    const int n = inner.n_nodes + 2;
    for (int j = 0; j < n; ++j) {
        ops[j] = cgraph->nodes[i + j]->op;
    }
    // the rope's output used by the reshape only
    if (!ggml_can_fuse_subgraph(cgraph, i, n, ops, &inner.out_idx, 1)) {
        return false;
    }
    f.kind    = ggml_cuda_fwht_fusion::ROPE_FWHT_SET_ROWS;
    f.n_nodes = n;
    f.out_idx = inner.out_idx;
    return true;
}

bool ggml_cuda_match_fwht_fusion(const ggml_cgraph * cgraph, const int i, ggml_cuda_fwht_fusion & f) {
    if (!ggml_cuda_fwht_fusion_enabled()) {
        return false;
    }
    const ggml_tensor * node = cgraph->nodes[i];

    if (node->op == GGML_OP_ROPE) {
        return ggml_cuda_match_rope_fwht_fusion(cgraph, i, f);
    }

    if (node->op == GGML_OP_CONT) {
        if (i + 2 >= cgraph->n_nodes) {
            return false;
        }
        const ggml_tensor * reshape = cgraph->nodes[i + 1];
        const ggml_tensor * fwht    = cgraph->nodes[i + 2];
        if (reshape->op != GGML_OP_RESHAPE || reshape->src[0] != node || fwht->op != GGML_OP_MUL_MAT ||
                fwht->src[1] != reshape || !ggml_cuda_cont_fwht_supported(node, fwht)) {
            return false;
        }
        const ggml_op ops[3] = { GGML_OP_CONT, GGML_OP_RESHAPE, GGML_OP_MUL_MAT };
        const int     out    = i + 2;
        if (!ggml_can_fuse_subgraph(cgraph, i, 3, ops, &out, 1)) {
            return false;
        }
        f.kind    = ggml_cuda_fwht_fusion::CONT_FWHT;
        f.n_nodes = 3;
        f.out_idx = out;
        return true;
    }

    if (node->op != GGML_OP_MUL_MAT || !ggml_cuda_op_mul_mat_use_fwht(node)) {
        return false;
    }

    // up to 6 view nodes between the transform and its consumer
    ggml_op ops[8];
    ops[0] = GGML_OP_MUL_MAT;
    int j = i + 1;
    while (j < cgraph->n_nodes && j - i < 7 && ggml_cuda_fwht_fusion_is_view(cgraph->nodes[j]->op)) {
        ops[j - i] = cgraph->nodes[j]->op;
        ++j;
    }
    if (j >= cgraph->n_nodes || j - i >= 7) {
        return false;
    }
    const ggml_tensor * consumer = cgraph->nodes[j];
    ops[j - i] = consumer->op;

    ggml_cuda_fwht_fusion::kind_t kind = ggml_cuda_fwht_fusion::NONE;
    if (consumer->op == GGML_OP_SET_ROWS && ggml_cuda_fwht_set_rows_supported(node, consumer)) {
        kind = ggml_cuda_fwht_fusion::FWHT_SET_ROWS;
    } else if (consumer->op == GGML_OP_MUL_MAT && ggml_cuda_fwht_kq_supported(node, consumer)) {
        kind = ggml_cuda_fwht_fusion::FWHT_KQ;
    } else {
        return false;
    }
    if (!ggml_can_fuse_subgraph(cgraph, i, j - i + 1, ops, &j, 1)) {
        return false;
    }
    f.kind    = kind;
    f.n_nodes = j - i + 1;
    f.out_idx = j;
    return true;
}

// llama-vq: how often each rotation fusion ran in this process, by kind; printed to stderr at exit when
// LLAMA_VQ_CUDA_FUSION_STATS=1, so that a test can tell a fused run from an unfused one with the same result
static std::atomic<int64_t> ggml_cuda_fwht_fusion_runs[5];

struct ggml_cuda_fwht_fusion_stats {
    ~ggml_cuda_fwht_fusion_stats() {
        const char * env = getenv("LLAMA_VQ_CUDA_FUSION_STATS");
        if (env == nullptr || atoi(env) == 0) {
            return;
        }
        fprintf(stderr, "llama-vq: rotation fusions run: set_rows=%" PRId64 " cont=%" PRId64 " kq=%" PRId64
                " rope=%" PRId64 "\n",
                ggml_cuda_fwht_fusion_runs[ggml_cuda_fwht_fusion::FWHT_SET_ROWS].load(),
                ggml_cuda_fwht_fusion_runs[ggml_cuda_fwht_fusion::CONT_FWHT].load(),
                ggml_cuda_fwht_fusion_runs[ggml_cuda_fwht_fusion::FWHT_KQ].load(),
                ggml_cuda_fwht_fusion_runs[ggml_cuda_fwht_fusion::ROPE_FWHT_SET_ROWS].load());
    }
};
static ggml_cuda_fwht_fusion_stats ggml_cuda_fwht_fusion_stats_at_exit;

void ggml_cuda_op_fwht_fusion(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, const int i, const ggml_cuda_fwht_fusion & f) {
    ggml_tensor * node = cgraph->nodes[i];
    ggml_tensor * out  = cgraph->nodes[f.out_idx];

    switch (f.kind) {
        case ggml_cuda_fwht_fusion::FWHT_SET_ROWS:
            ggml_cuda_op_fwht_set_rows(ctx, node, out);
            break;
        case ggml_cuda_fwht_fusion::ROPE_FWHT_SET_ROWS:
            ggml_cuda_op_rope_fwht_set_rows(ctx, node, cgraph->nodes[i + 2], out);
            break;
        case ggml_cuda_fwht_fusion::CONT_FWHT:
            ggml_cuda_op_cont_fwht(ctx, node, out);
            break;
        case ggml_cuda_fwht_fusion::FWHT_KQ: {
            // the queries view, moved onto the transform's input (same shape and layout as its output)
            ggml_tensor q = *out->src[1];
            q.data = (char *) node->src[1]->data + out->src[1]->view_offs;
            ggml_cuda_mul_mat_vec_q_short_rotated(ctx, out->src[0], &q, out, (int) node->src[0]->ne[0]);
        } break;
        default:
            GGML_ABORT("fatal error");
    }
    ggml_cuda_fwht_fusion_runs[f.kind]++;
}
