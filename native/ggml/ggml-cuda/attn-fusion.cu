// llama-vq: the fused decode attention's graph matching and dispatch (attn-fusion.cuh); the kernels are in
// attn-decode-fused.cu. Hooked in by patch 0013-cuda-fused-decode-attention (ggml_cuda_try_fuse, graph_optimize).

#include "attn-fusion.cuh"
#include "attn-decode-fused.cuh"
#include "out-prod-q.cuh"
#include "fwht.cuh"
#include "fwht-fused.cuh"
#include "rotation-fusion.cuh"

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>

// views of other tensors the attention match skips between the chain's nodes, at most
#define GGML_CUDA_ATTN_FUSION_MAX_OTHER_VIEWS 8

// LLAMA_VQ_CUDA_FUSED_ATTN: unset = auto (ggml_cuda_attn_decode_fused_auto), 0 = off, else on (read once)
enum ggml_cuda_attn_fusion_mode_t { GGML_CUDA_ATTN_FUSION_OFF, GGML_CUDA_ATTN_FUSION_ON, GGML_CUDA_ATTN_FUSION_AUTO };
static ggml_cuda_attn_fusion_mode_t ggml_cuda_attn_fusion_mode() {
    static const ggml_cuda_attn_fusion_mode_t mode = [] {
        const char * env = getenv("LLAMA_VQ_CUDA_FUSED_ATTN");
        if (env == nullptr || *env == '\0') {
            return GGML_CUDA_ATTN_FUSION_AUTO;
        }
        return atoi(env) != 0 ? GGML_CUDA_ATTN_FUSION_ON : GGML_CUDA_ATTN_FUSION_OFF;
    }();
    return mode;
}

// the queries K*Q reads are a view of the rotation's output whose columns start on segment boundaries
static bool ggml_cuda_attn_fusion_rotation_ok(const ggml_tensor * fwht, const ggml_tensor * kq) {
    const ggml_tensor * q = kq->src[1];
    if (q->view_src != fwht || q->type != GGML_TYPE_F32 || fwht->src[1]->type != GGML_TYPE_F32) {
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
    return ggml_cuda_attn_decode_fused_can_rotate(kq, (int) n);
}

// the tail: build_attn_mha's PERMUTE(kqv, 0, 2, 1, 3) -> CONT after the chain matched in nodes idxs [n] (ops [n]), and a
// rotated V cache's inverse rotation of the result (RESHAPE -> MUL_MAT of the Hadamard matrix, rotation-fusion.cuh's CONT_FWHT form):
// if they follow and nothing else reads their intermediates, f takes them (the fused kernels write the result)
static void ggml_cuda_match_attn_tail(const ggml_cgraph * cgraph, const int i, const int * idxs, const ggml_op * ops,
        const int n, ggml_cuda_attn_fusion & f) {
    const ggml_tensor * kqv = cgraph->nodes[f.kqv_idx];
    int t = f.kqv_idx + 1;
    int views = 0;
    // the permute of kqv; other tensors' views may come first
    while (t < cgraph->n_nodes && !(cgraph->nodes[t]->op == GGML_OP_PERMUTE && cgraph->nodes[t]->src[0] == kqv) &&
            ggml_cuda_fwht_fusion_is_view(cgraph->nodes[t]->op) && ++views <= GGML_CUDA_ATTN_FUSION_MAX_OTHER_VIEWS) {
        ++t;
    }
    const int pi = t;
    const int ci = t + 1;
    if (ci >= cgraph->n_nodes || cgraph->nodes[pi]->op != GGML_OP_PERMUTE || cgraph->nodes[pi]->src[0] != kqv ||
            cgraph->nodes[ci]->op != GGML_OP_CONT || cgraph->nodes[ci]->src[0] != cgraph->nodes[pi]) {
        return;
    }
    const ggml_tensor * cont = cgraph->nodes[ci];
    int last    = ci;
    int out_rot = 0;
    if (ci + 2 < cgraph->n_nodes && ggml_cuda_fwht_fusion_enabled() && cgraph->nodes[ci + 1]->op == GGML_OP_RESHAPE &&
            cgraph->nodes[ci + 1]->src[0] == cont && cgraph->nodes[ci + 2]->src[1] == cgraph->nodes[ci + 1] &&
            ggml_cuda_cont_fwht_supported(cont, cgraph->nodes[ci + 2])) {
        last    = ci + 2;
        out_rot = (int) cgraph->nodes[last]->src[0]->ne[0];
    }
    // the longest form that fits, else the copy alone
    for (int form = out_rot > 0 ? 0 : 1; form < 2; ++form) {
        const int l  = form == 0 ? last : ci;
        const int rn = form == 0 ? out_rot : 0;
        if (!ggml_cuda_attn_decode_fused_tail_supported(kqv, cgraph->nodes[pi], cont, rn)) {
            continue;
        }
        int     idxs2[16];
        ggml_op ops2[16];
        int     n2 = n;
        for (int k = 0; k < n; ++k) {
            idxs2[k] = idxs[k];
            ops2[k]  = ops[k];
        }
        for (int k = pi; k <= l; ++k) {
            idxs2[n2]  = k;
            ops2[n2++] = cgraph->nodes[k]->op;
        }
        int out2 = l;
        if (ggml_can_fuse_subgraph_ext(cgraph, idxs2, n2, ops2, &out2, 1)) {
            f.tail    = true;
            f.out_rot = rn;
            f.out_idx = l;
            f.n_nodes = l - i + 1;
            return;
        }
    }
}

// how many of the graph's nodes read t
static int32_t ggml_cuda_attn_fusion_uses(const ggml_cgraph * cgraph, const ggml_tensor * t) {
    const size_t pos = ggml_hash_find(&cgraph->visited_hash_set, t);
    return ggml_bitset_get(cgraph->visited_hash_set.used, pos) ? cgraph->use_counts[pos] : 0;
}

// whether t is read once and is not an output: the fused kernel may skip it
static bool ggml_cuda_attn_fusion_used_once(const ggml_cgraph * cgraph, const ggml_tensor * t) {
    return ggml_cuda_attn_fusion_uses(cgraph, t) == 1 && !(t->flags & GGML_TENSOR_FLAG_OUTPUT);
}

// the split attention's chunk (llama-vq-attn.h) from its SOFT_MAX at nodes[i]: [RESHAPE ->] TRANSPOSE -> OUT_PROD(V, .),
// each consuming the previous one, with only views of other tensors in between. The softmax runs in place on the
// scores (a view of K*Q's output, through a reshape): skipping it leaves them raw, which the fused kernel reads; so
// the softmax, the views after it and every tensor on its input's view chain must have no other reader.
// (ggml_can_fuse_subgraph_ext refuses a view whose source is outside the fused nodes, as the in-place softmax is.)
static bool ggml_cuda_match_softmax_vp(const ggml_cgraph * cgraph, const int i, ggml_cuda_attn_fusion & f) {
    const ggml_tensor * softmax = cgraph->nodes[i];
    if ((softmax->flags & GGML_TENSOR_FLAG_COMPUTE) == 0 || !ggml_cuda_attn_fusion_used_once(cgraph, softmax)) {
        return false;
    }
    // the scores, down through their views to the tensor that owns the memory (K*Q's output)
    for (const ggml_tensor * t = softmax->src[0]; ; t = t->src[0]) {
        if (t == nullptr || !ggml_cuda_attn_fusion_used_once(cgraph, t)) {
            return false;
        }
        if (t->view_src == nullptr) {
            break;
        }
    }
    int n = 1;
    const ggml_tensor * prev = softmax;
    int other = 0;
    for (int j = i + 1; j < cgraph->n_nodes; ++j) {
        const ggml_tensor * t = cgraph->nodes[j];
        const bool reshape   = t->op == GGML_OP_RESHAPE && n == 1 && t->src[0] == prev;
        const bool transpose = t->op == GGML_OP_TRANSPOSE && t->src[0] == prev && prev->op != GGML_OP_TRANSPOSE;
        const bool out_prod  = t->op == GGML_OP_OUT_PROD && t->src[1] == prev && prev->op == GGML_OP_TRANSPOSE;
        if (reshape || transpose || out_prod) {
            if (out_prod) {
                if ((t->flags & GGML_TENSOR_FLAG_COMPUTE) == 0 || !ggml_cuda_out_prod_q_softmax_supported(softmax, t)) {
                    return false;
                }
                f.sm_idx     = i;
                f.kqv_idx    = j;
                f.out_idx    = j;
                f.n_nodes    = j - i + 1;
                f.softmax_vp = true;
                return true;
            }
            if (!ggml_cuda_attn_fusion_used_once(cgraph, t)) {
                return false;
            }
            ++n;
            prev = t;
            continue;
        }
        if (!ggml_cuda_fwht_fusion_is_view(t->op) || ++other > GGML_CUDA_ATTN_FUSION_MAX_OTHER_VIEWS) {
            return false;
        }
    }
    return false;
}

bool ggml_cuda_match_attn_fusion(const ggml_cgraph * cgraph, const int i, ggml_cuda_attn_fusion & f) {
    const ggml_tensor * node = cgraph->nodes[i];
    if (node->op == GGML_OP_SOFT_MAX) {
        return ggml_cuda_match_softmax_vp(cgraph, i, f);
    }
    const ggml_cuda_attn_fusion_mode_t mode = ggml_cuda_attn_fusion_mode();
    if (mode == GGML_CUDA_ATTN_FUSION_OFF) {
        return false;
    }
    if (node->op != GGML_OP_MUL_MAT) {
        return false;
    }

    int     idxs[16];
    ggml_op ops[16];
    int     n = 0;
    int     j = i;

    const ggml_tensor * fwht = nullptr;
    if (ggml_cuda_op_mul_mat_use_fwht(node)) {
        if (!ggml_cuda_fwht_fusion_enabled()) {
            return false;
        }
        fwht = node;
        idxs[n] = i;
        ops[n++] = GGML_OP_MUL_MAT;
        // the views of the rotated queries, up to 6
        for (j = i + 1; j < cgraph->n_nodes && ggml_cuda_fwht_fusion_is_view(cgraph->nodes[j]->op); ++j) {
            if (cgraph->nodes[j]->view_src != fwht || n >= 7) {
                return false;
            }
            idxs[n] = j;
            ops[n++] = cgraph->nodes[j]->op;
        }
        if (j >= cgraph->n_nodes) {
            return false;
        }
    }

    const ggml_tensor * kq = cgraph->nodes[j];
    if (kq->op != GGML_OP_MUL_MAT || ggml_cuda_op_mul_mat_use_fwht(kq) || (fwht && !ggml_cuda_attn_fusion_rotation_ok(fwht, kq))) {
        return false;
    }
    idxs[n] = j;
    ops[n++] = GGML_OP_MUL_MAT;
    f.kq_idx = j;

    // SOFT_MAX, TRANSPOSE, OUT_PROD, each consuming the previous one, with only views of other tensors in between
    const ggml_op want[3] = { GGML_OP_SOFT_MAX, GGML_OP_TRANSPOSE, GGML_OP_OUT_PROD };
    const ggml_tensor * prev = kq;
    int other = 0;
    for (int w = 0; w < 3; ++w) {
        const int si = want[w] == GGML_OP_OUT_PROD ? 1 : 0;
        for (++j; ; ++j) {
            if (j >= cgraph->n_nodes) {
                return false;
            }
            const ggml_tensor * t = cgraph->nodes[j];
            if (t->op == want[w] && t->src[si] == prev) {
                break;
            }
            if (!ggml_cuda_fwht_fusion_is_view(t->op) || ++other > GGML_CUDA_ATTN_FUSION_MAX_OTHER_VIEWS) {
                return false;
            }
        }
        idxs[n] = j;
        ops[n++] = want[w];
        prev = cgraph->nodes[j];
    }
    f.sm_idx  = idxs[n - 3];
    f.kqv_idx = j;
    f.out_idx = j;

    if (!ggml_cuda_attn_decode_fused_supported(kq, cgraph->nodes[f.sm_idx], cgraph->nodes[f.kqv_idx])) {
        return false;
    }
    if (mode == GGML_CUDA_ATTN_FUSION_AUTO && !ggml_cuda_attn_decode_fused_auto(kq, cgraph->nodes[f.sm_idx], cgraph->nodes[f.kqv_idx])) {
        return false;
    }
    if (!ggml_can_fuse_subgraph_ext(cgraph, idxs, n, ops, &f.out_idx, 1)) {
        return false;
    }
    f.n_nodes    = f.out_idx - i + 1;
    f.hadamard_n = fwht ? (int) fwht->src[0]->ne[0] : 0;

    if (n + 4 <= 16) {
        ggml_cuda_match_attn_tail(cgraph, i, idxs, ops, n, f);
    }
    return true;
}

// how often the fused attention ran (plain, with the query rotation; of those, with the output's permute and copy, and
// with V's inverse rotation; of all, with V*P on tensor cores) and the split's softmax with its V*P, and of the fused
// attention's runs those with both products on tensor cores (k_attn_decode_tc), with the combine folded in and with
// rows staged as windows; printed at exit
// with LLAMA_VQ_CUDA_FUSION_STATS=1
static std::atomic<int64_t> ggml_cuda_attn_fusion_runs[6];

struct ggml_cuda_attn_fusion_stats {
    ~ggml_cuda_attn_fusion_stats() {
        const char * env = getenv("LLAMA_VQ_CUDA_FUSION_STATS");
        if (env == nullptr || atoi(env) == 0) {
            return;
        }
        fprintf(stderr, "llama-vq: attention fusions run: attn=%" PRId64 " rotated=%" PRId64 " tail=%" PRId64 " tail_rotated=%" PRId64
                " mma=%" PRId64 " softmax_vp=%" PRId64 " tc=%" PRId64 " fold=%" PRId64 " win=%" PRId64 "\n",
                ggml_cuda_attn_fusion_runs[0].load(), ggml_cuda_attn_fusion_runs[1].load(),
                ggml_cuda_attn_fusion_runs[2].load(), ggml_cuda_attn_fusion_runs[3].load(),
                ggml_cuda_attn_fusion_runs[4].load(), ggml_cuda_attn_fusion_runs[5].load(),
                ggml_cuda_attn_decode_tc_runs(), ggml_cuda_attn_decode_fold_runs(), ggml_cuda_attn_decode_window_runs());
    }
};
static ggml_cuda_attn_fusion_stats ggml_cuda_attn_fusion_stats_at_exit;

void ggml_cuda_op_attn_fusion(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, const int i, const ggml_cuda_attn_fusion & f) {
    if (f.softmax_vp) {
        ggml_cuda_out_prod_q_softmax(ctx, cgraph->nodes[f.sm_idx], cgraph->nodes[f.kqv_idx]);
        ggml_cuda_attn_fusion_runs[5]++;
        return;
    }
    const ggml_tensor * kq  = cgraph->nodes[f.kq_idx];
    const ggml_tensor * sm   = cgraph->nodes[f.sm_idx];
    ggml_tensor       * kqv  = cgraph->nodes[f.kqv_idx];
    ggml_tensor       * tail = f.tail ? cgraph->nodes[f.out_idx] : nullptr;
    bool vmma;
    if (f.hadamard_n > 0) {
        // the queries view, moved onto the rotation's input (same shape and layout as its output)
        ggml_tensor q = *kq->src[1];
        q.data = (char *) cgraph->nodes[i]->src[1]->data + kq->src[1]->view_offs;
        vmma = ggml_cuda_attn_decode_fused(ctx, &q, kq, sm, kqv, f.hadamard_n, tail, f.out_rot);
    } else {
        vmma = ggml_cuda_attn_decode_fused(ctx, kq->src[1], kq, sm, kqv, 0, tail, f.out_rot);
    }
    ggml_cuda_attn_fusion_runs[f.hadamard_n > 0 ? 1 : 0]++;
    if (f.tail) {
        ggml_cuda_attn_fusion_runs[f.out_rot > 0 ? 3 : 2]++;
    }
    if (vmma) {
        ggml_cuda_attn_fusion_runs[4]++;
    }
}
