#pragma once

// llama-vq: the attention without flash attention, split along the query tokens so that its scores never take
// more than a scratch budget, however long the context.
//
// The unsplit graph materialises the scores of every query token against every cell at once,
// n_kv x n_tokens x n_head x 4 bytes: 16 GiB at 128K cells, 512 tokens and 64 heads. Split here into chunks of
// query tokens (and streams), each chunk's K*Q -> softmax -> V*P is finished before the next one starts, so the
// graph allocator reuses one chunk's worth of scores for all of them. Every row of scores is computed exactly as in
// the unsplit graph (same cells, same mask row, same sinks); only the columns of the matrix products are grouped
// differently.
//
// Within a chunk the queries of the heads that share a KV head are the columns of one matrix product
// (K*Q: [d_k, n_kv] x [d_k, c*r] per KV head, r = n_head/n_head_kv), so K and V are read once per chunk and KV
// head, as flash attention's kernels read them, instead of once per query head.
//
// Header-only: built into libllama (llama-graph.cpp) and into test-backend-ops (llama-vq-test-cases.h), which
// checks the split graph on every backend against the CPU.

#include "ggml.h"

#include <algorithm>
#include <cinttypes>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

struct llama_vq_attn_split_params {
    float  kq_scale;
    float  max_bias;       // ALiBi's maximum bias (0: none)
    float  softcap;        // attention logit soft-capping (0: none): kq = softcap*tanh(kq*pre_softcap)
    float  pre_softcap;    // 1/softcap, or Grok's output multiplier over its softcap
    size_t scratch;        // bytes the scores of one chunk may take
    int    il;             // layer, for the tensors' names (-1: none)
    int    v_f16;          // a quantized row-major V: LLAMA_VQ_ATTN_V_AUTO (0), _QUANT or _F16 (below)
};

// How the chunks of a quantized row-major V read it (V*P):
//   QUANT: each chunk's OUT_PROD reads the quantized V (a GPU's GEMM dequantizes all of it again for every chunk)
//   F16:   V dequantized once per stream into an f16 copy [d_v, n_kv, n_head_kv] that every chunk's OUT_PROD reads
//          (CUDA/HIP: the F16 GEMM in place, f32 accumulation); n_kv x d_v x n_head_kv x 2 bytes more scratch
//          (128 MiB at 128K cells on the MiMo shape), V rounded to f16 as the HIP GEMM rounds it anyway
//   AUTO:  LLAMA_VQ_ATTN_V_F16=1 gives F16, else QUANT. Measured on an H100 (MiMo shape, 64K cells, pp512;
//          benchmarks/RESULTS.md): F16 prefills 1.05x faster but takes the compute buffer at 128K, ub 2048 to 1.55x
//          flash attention's (the target is 1.5x), so it is not the default; MI210 may weigh it otherwise
enum {
    LLAMA_VQ_ATTN_V_AUTO  = 0,
    LLAMA_VQ_ATTN_V_QUANT = 1,
    LLAMA_VQ_ATTN_V_F16   = 2,
};

static inline bool llama_vq_attn_split_v_f16(const ggml_tensor * v, int mode) {
    if (!ggml_is_quantized(v->type) || mode == LLAMA_VQ_ATTN_V_QUANT) {
        return false;
    }
    if (mode == LLAMA_VQ_ATTN_V_F16) {
        return true;
    }
    const char * env = getenv("LLAMA_VQ_ATTN_V_F16");
    return env != nullptr && atoi(env) != 0;
}

// default scratch budget of the split attention (MiB), when neither the API nor LLAMA_VQ_ATTN_SCRATCH_MIB sets one
#define LLAMA_VQ_ATTN_SCRATCH_MIB_DEFAULT 256

// chunks of query tokens per stream: 1 (no split) when the scores of the whole batch fit the budget, else as few as
// keep each chunk's scores within it (a chunk is at least one token)
static inline int64_t llama_vq_attn_split_chunks(int64_t n_kv, int64_t n_tokens, int64_t n_head, int64_t n_stream,
                                                 size_t scratch) {
    const size_t row = (size_t) n_kv * (size_t) n_head * sizeof(float); // one query token's scores
    if (row * (size_t) n_tokens * (size_t) n_stream <= scratch) {
        return 1;
    }
    const int64_t c = std::max<int64_t>(1, (int64_t) (scratch / row));
    return (n_tokens + c - 1) / c;
}

// graph nodes that one layer's split attention adds at most (a bound for llama_context::graph_max_nodes)
static inline int64_t llama_vq_attn_split_nodes(int64_t n_kv, int64_t n_tokens, int64_t n_head, int64_t n_stream,
                                                size_t scratch) {
    const int64_t n_chunks = llama_vq_attn_split_chunks(n_kv, n_tokens, n_head, n_stream, scratch);
    if (n_chunks == 1) {
        return 0;
    }
    const int64_t per_chunk  = 24; // views, the matrix products, softmax, the output's copy and set (+ MLA, softcap)
    const int64_t per_stream = 8;  // K, V, mask views and V's copies (f32 and f16, or transposed)
    return n_stream * (n_chunks * per_chunk + per_stream) + 4;
}

// whether a batch's mask should be f16 (as flash attention's input is): the split attention will view it, and half
// the bytes are held on each device; the mask's values (0 and -inf) are exact in f16, ALiBi's distances are not
static inline bool llama_vq_attn_split_f16_mask(int64_t n_kv, int64_t n_tokens, int64_t n_head, int64_t n_stream,
                                                size_t scratch, bool alibi) {
    return !alibi && n_head > 0 && llama_vq_attn_split_chunks(n_kv, n_tokens, n_head, n_stream, scratch) > 1;
}

// The mask the split attention of a layer views: a copy of the graph's input mask made on the layer's device (a
// view of the input itself would be copied once per chunk, and every copy held through the graph split); none on
// a host device, whose ops read the input where it is. One per graph and device: the caller keeps it for the
// graph's other layers.
static inline ggml_tensor * llama_vq_attn_split_mask(ggml_context * ctx, ggml_tensor * mask, bool host) {
    if (host) {
        return mask;
    }
    ggml_tensor * res = ggml_cont(ctx, mask);
    ggml_format_name(res, "kq_mask_split-%s", mask->name);
    return res;
}

static inline void llama_vq_attn_name(ggml_tensor * t, const char * name, int il, int64_t s, int64_t t0) {
    if (il >= 0) {
        ggml_format_name(t, "%s-%d-s%" PRId64 "-t%" PRId64, name, il, s, t0);
    } else {
        ggml_format_name(t, "%s-s%" PRId64 "-t%" PRId64, name, s, t0);
    }
}

// The attention output, split, or nullptr when the whole batch fits the budget (then the unsplit graph is built).
//   q:     [d_k, n_tokens, n_head, n_stream]       (any strides: build_attn_mha's permuted view)
//   k:     [d_k, n_kv, n_head_kv, n_stream]
//   v:     [d_v, n_kv, n_head_kv, n_stream], row-major (a quantized V), or
//          [n_kv, d_v, n_head_kv, n_stream] when v_trans (a transposed f16/f32 V cache)
//   mask:  [n_kv, >= n_tokens, 1, n_stream], f32 or f16, on the device of the layer's ops: the chunks view it, and a
//          backend gets its own copy of every tensor from another device that its ops read, held for the whole graph
//          split, so views of a host input would each be copied (llama_vq_attn_split_mask makes the one copy)
//   kq_b:  nullptr or [n_kv, n_tokens, n_head, 1]  (added to the scores before the softmax; one stream only)
//   sinks: nullptr or [n_head]
//   v_mla: nullptr or MLA's per-head decompression [d_v, d_v_mla, n_head]
// -> [d_v (d_v_mla), n_head, n_tokens, n_stream], contiguous: the unsplit graph's ggml_cont(ggml_permute(kqv, 0, 2, 1, 3))
static inline ggml_tensor * llama_vq_attn_split(
        ggml_context * ctx,
        ggml_tensor  * q,
        ggml_tensor  * k,
        ggml_tensor  * v,
        bool           v_trans,
        ggml_tensor  * mask,
        ggml_tensor  * kq_b,
        ggml_tensor  * sinks,
        ggml_tensor  * v_mla,
        const llama_vq_attn_split_params & p) {
    const int64_t d_k       = q->ne[0];
    const int64_t n_tokens  = q->ne[1];
    const int64_t n_head    = q->ne[2];
    const int64_t n_stream  = q->ne[3];
    const int64_t n_kv      = k->ne[1];
    const int64_t n_head_kv = k->ne[2];

    if (n_head % n_head_kv != 0 || k->ne[3] != n_stream || (kq_b && (n_stream != 1 || kq_b->ne[1] != n_tokens))) {
        return nullptr;
    }
    const int64_t n_chunks = llama_vq_attn_split_chunks(n_kv, n_tokens, n_head, n_stream, p.scratch);
    if (n_chunks == 1) {
        return nullptr;
    }
    const int64_t r   = n_head / n_head_kv; // query heads per KV head: head h reads KV head h / r
    const int64_t d_v = v_trans ? v->ne[1] : v->ne[0];
    const bool    v_f16 = !v_trans && llama_vq_attn_split_v_f16(v, p.v_f16);

    ggml_tensor * out = nullptr; // [d_v, n_head, n_tokens, n_stream]

    for (int64_t s = 0; s < n_stream; ++s) {
        ggml_tensor * ks = ggml_view_3d(ctx, k, d_k, n_kv, n_head_kv, k->nb[1], k->nb[2], s*k->nb[3]);
        ggml_tensor * vs = ggml_view_3d(ctx, v, v->ne[0], v->ne[1], n_head_kv, v->nb[1], v->nb[2], s*v->nb[3]);
        bool vs_trans = v_trans;
        if (v_f16) {
            // a quantized V dequantized once per stream (llama_vq_attn_split_v_f16): to f32 (the quantized types'
            // copy on every backend), then to f16, both contiguous; the f32 copy is free again before the chunks'
            // scores are allocated. Each chunk's OUT_PROD reads the f16 rows (CUDA/HIP: the F16 GEMM in place).
            // ggml_cpy into new tensors, not ggml_cast: a cast is its own src[1], which ggml_backend_graph_copy
            // (test-backend-ops) copies as a null source
            vs = ggml_cpy(ctx, vs, ggml_new_tensor_3d(ctx, GGML_TYPE_F32, vs->ne[0], vs->ne[1], vs->ne[2]));
            vs = ggml_cpy(ctx, vs, ggml_new_tensor_3d(ctx, GGML_TYPE_F16, vs->ne[0], vs->ne[1], vs->ne[2]));
            llama_vq_attn_name(vs, "v_f16", p.il, s, 0);
        } else if (!vs_trans && !ggml_is_quantized(vs->type)) {
            // a row-major f16/f32 V (flash attention's layout): transposed once per stream, not once per chunk
            vs = ggml_cont(ctx, ggml_transpose(ctx, vs));
            llama_vq_attn_name(vs, "v_cont", p.il, s, 0);
            vs_trans = true;
        }

        // chunks of n_tokens/n_chunks tokens, the first n_tokens % n_chunks of them one more: no short tail
        for (int64_t ic = 0, t0 = 0; ic < n_chunks; ++ic) {
            const int64_t nc = n_tokens/n_chunks + (ic < n_tokens % n_chunks ? 1 : 0);

            // the chunk's queries, the heads of each KV head side by side: [d_k, nc, r, n_head_kv] -> [d_k, nc*r, n_head_kv]
            ggml_tensor * qc = ggml_view_3d(ctx, q, d_k, nc, n_head, q->nb[1], q->nb[2], s*q->nb[3] + t0*q->nb[1]);
            qc = ggml_cont(ctx, qc);
            qc = ggml_reshape_3d(ctx, qc, d_k, nc*r, n_head_kv);

            // K*Q: [n_kv, nc*r, n_head_kv] = [n_kv, nc, n_head]
            ggml_tensor * kq = ggml_mul_mat(ctx, ks, qc);
            ggml_prec_set_acc(kq, GGML_PREC_F32);
            llama_vq_attn_name(kq, "kq", p.il, s, t0);
            kq = ggml_reshape_3d(ctx, kq, n_kv, nc, n_head);

            if (p.softcap != 0.0f) {
                kq = ggml_scale(ctx, kq, p.pre_softcap);
                kq = ggml_tanh(ctx, kq);
                kq = ggml_scale(ctx, kq, p.softcap);
            }
            if (kq_b) {
                kq = ggml_add(ctx, kq, ggml_view_3d(ctx, kq_b, n_kv, nc, n_head, kq_b->nb[1], kq_b->nb[2], t0*kq_b->nb[1]));
            }

            ggml_tensor * mc = ggml_view_3d(ctx, mask, n_kv, nc, 1, mask->nb[1], mask->nb[2], s*mask->nb[3] + t0*mask->nb[1]);
            // in place: one chunk's scores take the budget once, not twice
            kq = ggml_soft_max_ext_inplace(ctx, kq, mc, p.kq_scale, p.max_bias);
            ggml_soft_max_add_sinks(kq, sinks);
            llama_vq_attn_name(kq, "kq_soft_max", p.il, s, t0);

            // V*P: [d_v, nc*r, n_head_kv] = [d_v, nc, n_head]
            ggml_tensor * pc = ggml_reshape_3d(ctx, kq, n_kv, nc*r, n_head_kv);
            ggml_tensor * kqv = vs_trans
                ? ggml_mul_mat(ctx, vs, pc)                          // vs: [n_kv, d_v, n_head_kv]
                : ggml_out_prod(ctx, vs, ggml_transpose(ctx, pc));   // vs: [d_v, n_kv, n_head_kv], quantized or f16 rows
            llama_vq_attn_name(kqv, "kqv", p.il, s, t0);
            kqv = ggml_reshape_3d(ctx, kqv, d_v, nc, n_head);

            if (v_mla) {
                kqv = ggml_mul_mat(ctx, v_mla, kqv);
                llama_vq_attn_name(kqv, "kqv_mla", p.il, s, t0);
            }

            // [d_v', n_head, nc] into the output's tokens t0.., stream s
            kqv = ggml_permute(ctx, kqv, 0, 2, 1, 3);
            if (out == nullptr) {
                out = ggml_pad_ext(ctx, kqv, 0, 0, 0, 0, 0, n_tokens - nc, 0, n_stream - 1);
            } else {
                kqv = ggml_cont(ctx, kqv);
                out = ggml_set_inplace(ctx, out, kqv, out->nb[1], out->nb[2], out->nb[3], s*out->nb[3] + t0*out->nb[2]);
            }
            llama_vq_attn_name(out, "kqv_split", p.il, s, t0);
            t0 += nc;
        }
    }

    return out;
}
