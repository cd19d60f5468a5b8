#pragma once

// llama-vq's test-backend-ops cases: the test_case classes of our kernels and graph forms, and the two functions that
// add our cases to test-backend-ops' lists. tests/test-backend-ops.cpp includes this file after its own test_case
// classes and calls llama_vq_test_cases_eval() from make_test_cases_eval() and llama_vq_test_cases_perf() from
// make_test_cases_perf() (patch 0014-tests-llama-vq-cases). The op names and parameters of the cases are what
// `test-backend-ops -o OP -p PARAMS` selects (OUT_PROD, MUL_MAT, HADAMARD_SET_ROWS, ATTN_DECODE_FUSED, ...).

#include "../src/llama-vq-attn.h" // the split attention (ATTN_SPLIT)

// GGML_OP_OUT_PROD as the non-FA attention uses it with a quantized V cache:
// kqv = ggml_out_prod(v, ggml_transpose(kq))
//   v  [d_v, n_kv, n_head_kv, n_stream]: a permuted view of a row-major cache [d_v*n_head_kv, kv_size, n_stream]
//   kq [n_kv, n_tokens, n_head, n_stream] (softmax output, transposed as src1)
struct test_out_prod_kqv : public test_case {
    const ggml_type type_v;
    const int64_t d_v;
    const int64_t n_kv;
    const int64_t n_head_kv;
    const int64_t gqa;
    const int64_t n_tokens;
    const int64_t n_stream;

    std::string vars() override {
        return VARS_TO_STR7(type_v, d_v, n_kv, n_head_kv, gqa, n_tokens, n_stream);
    }

    double max_nmse_err() override {
        return 5e-4;
    }

    uint64_t op_flops(ggml_tensor * t) override {
        GGML_UNUSED(t);
        return 2 * d_v * n_kv * n_tokens * n_head_kv * gqa * n_stream;
    }

    test_out_prod_kqv(ggml_type type_v = GGML_TYPE_Q4_0, int64_t d_v = 128, int64_t n_kv = 256,
            int64_t n_head_kv = 2, int64_t gqa = 4, int64_t n_tokens = 1, int64_t n_stream = 1)
        : type_v(type_v), d_v(d_v), n_kv(n_kv), n_head_kv(n_head_kv), gqa(gqa), n_tokens(n_tokens), n_stream(n_stream) {}

    ggml_tensor * build_graph(ggml_context * ctx) override {
        // one cache cell more than used, like a KV cache view of n_kv out of kv_size cells
        ggml_tensor * cache = ggml_new_tensor_3d(ctx, type_v, d_v*n_head_kv, n_kv + 1, n_stream);
        ggml_set_name(cache, "cache");

        ggml_tensor * v = ggml_view_4d(ctx, cache, d_v, n_head_kv, n_kv, n_stream,
                ggml_row_size(type_v, d_v), cache->nb[1], cache->nb[2], 0);
        v = ggml_permute(ctx, v, 0, 2, 1, 3);
        ggml_set_name(v, "v");

        ggml_tensor * kq = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, n_kv, n_tokens, n_head_kv*gqa, n_stream);
        ggml_set_name(kq, "kq");

        ggml_tensor * out = ggml_out_prod(ctx, v, ggml_transpose(ctx, kq));
        ggml_set_name(out, "out");

        return out;
    }

    void initialize_tensors(ggml_context * ctx) override {
        for (ggml_tensor * t = ggml_get_first_tensor(ctx); t != nullptr; t = ggml_get_next_tensor(ctx, t)) {
            if (t->view_src == nullptr) {
                // kq: non-negative like a softmax output
                init_tensor_uniform(t, t->type == GGML_TYPE_F32 ? 0.0f : -1.0f, 1.0f);
            }
        }
    }
};

// GGML_OP_MUL_MAT as the non-FA attention uses it with a quantized K cache: kq = ggml_mul_mat(k, q)
//   k [d_k, n_kv, n_head_kv, n_stream]: a permuted view of a row-major cache [d_k*n_head_kv, kv_size, n_stream]
//   q [d_k, n_tokens, n_head, n_stream]: a permuted view of [d_k, n_head, n_tokens, n_stream]
struct test_mul_mat_kq : public test_case {
    const ggml_type type_k;
    const int64_t d_k;
    const int64_t n_kv;
    const int64_t n_head_kv;
    const int64_t gqa;
    const int64_t n_tokens;
    const int64_t n_stream;

    std::string vars() override {
        return VARS_TO_STR7(type_k, d_k, n_kv, n_head_kv, gqa, n_tokens, n_stream);
    }

    double max_nmse_err() override {
        return 5e-4;
    }

    uint64_t op_flops(ggml_tensor * t) override {
        GGML_UNUSED(t);
        return 2 * d_k * n_kv * n_tokens * n_head_kv * gqa * n_stream;
    }

    test_mul_mat_kq(ggml_type type_k = GGML_TYPE_Q4_0, int64_t d_k = 128, int64_t n_kv = 256,
            int64_t n_head_kv = 2, int64_t gqa = 4, int64_t n_tokens = 1, int64_t n_stream = 1)
        : type_k(type_k), d_k(d_k), n_kv(n_kv), n_head_kv(n_head_kv), gqa(gqa), n_tokens(n_tokens), n_stream(n_stream) {}

    ggml_tensor * build_graph(ggml_context * ctx) override {
        ggml_tensor * cache = ggml_new_tensor_3d(ctx, type_k, d_k*n_head_kv, n_kv + 1, n_stream);
        ggml_set_name(cache, "cache");

        ggml_tensor * k = ggml_view_4d(ctx, cache, d_k, n_head_kv, n_kv, n_stream,
                ggml_row_size(type_k, d_k), cache->nb[1], cache->nb[2], 0);
        k = ggml_permute(ctx, k, 0, 2, 1, 3);
        ggml_set_name(k, "k");

        ggml_tensor * q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, d_k, n_head_kv*gqa, n_tokens, n_stream);
        ggml_set_name(q, "q");
        q = ggml_permute(ctx, q, 0, 2, 1, 3);

        ggml_tensor * out = ggml_mul_mat(ctx, k, q);
        ggml_set_name(out, "out");

        return out;
    }

    void initialize_tensors(ggml_context * ctx) override {
        for (ggml_tensor * t = ggml_get_first_tensor(ctx); t != nullptr; t = ggml_get_next_tensor(ctx, t)) {
            if (t->view_src == nullptr) {
                init_tensor_uniform(t);
            }
        }
    }
};

// llama-vq: the Hadamard rotation of a quantized KV cache next to its consumer, as llama-graph.cpp builds it
// (MUL_MAT with GGML_HINT_SRC0_IS_HADAMARD, see llama_mul_mat_hadamard); a backend may fuse each pair
// (ggml-cuda: fwht-fused.cuh and the rotated queries of mmvq-short.cuh)
static void init_hadamard_rotation(ggml_tensor * t) {
    const int64_t n = t->ne[0];
    GGML_ASSERT(t->type == GGML_TYPE_F32 && t->ne[1] == n);
    std::vector<float> data(n*n);
    const float scale = 1.0f/sqrtf((float) n);
    for (int64_t r = 0; r < n; ++r) {
        for (int64_t c = 0; c < n; ++c) {
            data[r*n + c] = __builtin_popcountll((unsigned long long) (r & c)) % 2 == 0 ? scale : -scale;
        }
    }
    ggml_backend_tensor_set(t, data.data(), 0, data.size()*sizeof(float));
}

static ggml_tensor * build_hadamard_rotation(ggml_context * ctx, ggml_tensor * x, ggml_tensor * rot) {
    ggml_tensor * r = ggml_reshape_2d(ctx, x, rot->ne[0], ggml_nelements(x)/rot->ne[0]);
    r = ggml_mul_mat(ctx, rot, r);
    ggml_mul_mat_set_hint(r, GGML_HINT_SRC0_IS_HADAMARD);
    return ggml_reshape_4d(ctx, r, x->ne[0], x->ne[1], x->ne[2], x->ne[3]);
}

// rotation -> view -> SET_ROWS into a (quantized) cache, as the K and V stores
struct test_hadamard_set_rows : public test_case {
    const ggml_type type;
    const ggml_type type_idx;
    const int64_t n_rot;
    const int64_t d;
    const int64_t n_head;
    const int64_t n_tokens;
    const int64_t n_stream;

    std::string vars() override {
        return VARS_TO_STR7(type, type_idx, n_rot, d, n_head, n_tokens, n_stream);
    }

    std::string op_desc(ggml_tensor * t) override {
        GGML_UNUSED(t);
        return "HADAMARD_SET_ROWS";
    }

    bool run_whole_graph() override { return true; }

    // the CPU and the backend transform in a different float order; a quantized store can round one value of many
    // thousands to the neighbouring level (q4_0: 1/8 of its block's range), far below any real error (~1e-2)
    double max_nmse_err() override {
        return 1e-5;
    }

    test_hadamard_set_rows(ggml_type type = GGML_TYPE_Q4_0, ggml_type type_idx = GGML_TYPE_I64, int64_t n_rot = 128,
            int64_t d = 128, int64_t n_head = 8, int64_t n_tokens = 1, int64_t n_stream = 1)
        : type(type), type_idx(type_idx), n_rot(n_rot), d(d), n_head(n_head), n_tokens(n_tokens), n_stream(n_stream) {}

    ggml_tensor * build_graph(ggml_context * ctx) override {
        const int64_t n_cells = 64;

        ggml_tensor * x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, d, n_head, n_tokens);
        ggml_set_name(x, "x");
        ggml_tensor * rot = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_rot, n_rot);
        ggml_set_name(rot, "rot");

        ggml_tensor * xr = build_hadamard_rotation(ctx, x, rot);
        xr = ggml_view_2d(ctx, xr, d*n_head, n_tokens, xr->nb[2], 0);

        ggml_tensor * cache = ggml_new_tensor_3d(ctx, type, d*n_head, n_cells, n_stream);
        ggml_set_name(cache, "cache");
        if (n_stream > 1) {
            cache = ggml_reshape_2d(ctx, cache, d*n_head, n_cells*n_stream);
        }

        ggml_tensor * idx = ggml_new_tensor_1d(ctx, type_idx, n_tokens);
        ggml_set_name(idx, "row_idxs");

        ggml_tensor * out = ggml_set_rows(ctx, cache, xr, idx);
        ggml_set_name(out, "out");
        return out;
    }

    void initialize_tensors(ggml_context * ctx) override {
        for (ggml_tensor * t = ggml_get_first_tensor(ctx); t != nullptr; t = ggml_get_next_tensor(ctx, t)) {
            if (t->view_src != nullptr) {
                continue;
            }
            if (strcmp(t->name, "rot") == 0) {
                init_hadamard_rotation(t);
            } else if (strcmp(t->name, "row_idxs") == 0) {
                init_set_rows_row_ids(t, 64*n_stream);
            } else {
                init_tensor_uniform(t);
            }
        }
    }
};

// ROPE -> rotation -> view -> SET_ROWS, as a quantized K's store (ggml-cuda runs it as one kernel). The
// rope's source is a view into a wider row (a fused QKV projection's output) when strided; n_offs: ggml_rope_set_offset
struct test_rope_hadamard_set_rows : public test_case {
    const ggml_type type;
    const int64_t n_rot;
    const int64_t d;
    const int64_t n_head;
    const int64_t n_tokens;
    const int mode;
    const int n_dims;
    const int n_offs;
    const bool ff;
    const float ext_factor;
    const bool strided;

    std::string vars() override {
        return VARS_TO_STR11(type, n_rot, d, n_head, n_tokens, mode, n_dims, n_offs, ff, ext_factor, strided);
    }

    std::string op_desc(ggml_tensor * t) override {
        GGML_UNUSED(t);
        return "ROPE_HADAMARD_SET_ROWS";
    }

    bool run_whole_graph() override { return true; }

    // as test_hadamard_set_rows: a quantized store can round a value of many thousands to its neighbouring level
    double max_nmse_err() override {
        return 1e-5;
    }

    test_rope_hadamard_set_rows(ggml_type type = GGML_TYPE_Q4_0, int64_t n_rot = 128, int64_t d = 128, int64_t n_head = 8,
            int64_t n_tokens = 1, int mode = GGML_ROPE_TYPE_NEOX, int n_dims = 128, int n_offs = 0, bool ff = false,
            float ext_factor = 0.0f, bool strided = false)
        : type(type), n_rot(n_rot), d(d), n_head(n_head), n_tokens(n_tokens), mode(mode), n_dims(n_dims),
          n_offs(n_offs), ff(ff), ext_factor(ext_factor), strided(strided) {}

    ggml_tensor * build_graph(ggml_context * ctx) override {
        const int64_t n_cells = 64;

        ggml_tensor * x;
        if (strided) {
            // K's part of a fused projection's rows: [q | k | v] per token, k at an offset
            ggml_tensor * qkv = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 3*d*n_head, n_tokens);
            ggml_set_name(qkv, "qkv");
            x = ggml_view_3d(ctx, qkv, d, n_head, n_tokens, d*sizeof(float), qkv->nb[1], d*n_head*sizeof(float));
        } else {
            x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, d, n_head, n_tokens);
            ggml_set_name(x, "x");
        }
        ggml_tensor * pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_tokens);
        ggml_set_name(pos, "pos");
        ggml_tensor * freq = nullptr;
        if (ff) {
            freq = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n_dims/2);
            ggml_set_name(freq, "freq");
        }
        ggml_tensor * rot = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_rot, n_rot);
        ggml_set_name(rot, "rot");

        ggml_tensor * k = ggml_rope_ext(ctx, x, pos, freq, n_dims, mode, 4096, 500000.0f,
            ext_factor != 0.0f ? 0.25f : 1.0f, ext_factor, 1.0f, 32.0f, 1.0f);
        if (n_offs != 0) {
            ggml_rope_set_offset(k, n_offs);
        }
        ggml_tensor * kr = build_hadamard_rotation(ctx, k, rot);
        kr = ggml_view_2d(ctx, kr, d*n_head, n_tokens, kr->nb[2], 0);

        ggml_tensor * cache = ggml_new_tensor_2d(ctx, type, d*n_head, n_cells);
        ggml_set_name(cache, "cache");
        ggml_tensor * idx = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, n_tokens);
        ggml_set_name(idx, "row_idxs");

        ggml_tensor * out = ggml_set_rows(ctx, cache, kr, idx);
        ggml_set_name(out, "out");
        return out;
    }

    void initialize_tensors(ggml_context * ctx) override {
        std::random_device rd;
        std::default_random_engine rng(rd());
        for (ggml_tensor * t = ggml_get_first_tensor(ctx); t != nullptr; t = ggml_get_next_tensor(ctx, t)) {
            if (t->view_src != nullptr) {
                continue;
            }
            if (strcmp(t->name, "rot") == 0) {
                init_hadamard_rotation(t);
            } else if (strcmp(t->name, "row_idxs") == 0) {
                init_set_rows_row_ids(t, 64);
            } else if (strcmp(t->name, "pos") == 0) {
                // positions below 512, as test_rope's: at positions of tens of thousands the CPU's rope and CUDA's own
                // rope kernel (fast math: __sinf/__cosf, whose error grows with the angle) differ by more than this
                // test's bound whether the rope is fused or not (H200, positions to 70000: 6 of 48 cases above 1e-5
                // with CUDA's rope kernel, 9 of 48 fused; 1.0e-5 to 2.9e-5 either way)
                std::uniform_int_distribution<int> dist(0, 511);
                std::vector<int32_t> data(t->ne[0]);
                for (auto & v : data) {
                    v = dist(rng);
                }
                ggml_backend_tensor_set(t, data.data(), 0, data.size()*sizeof(int32_t));
            } else if (strcmp(t->name, "freq") == 0) {
                init_tensor_uniform(t, 0.9f, 1.1f);
            } else {
                init_tensor_uniform(t);
            }
        }
    }
};

// CONT (the attention output permuted back to [n_embd, n_tokens]) -> rotation, as the rotated V's inverse
struct test_cont_hadamard : public test_case {
    const int64_t n_rot;
    const int64_t d;
    const int64_t n_head;
    const int64_t n_tokens;
    const int64_t n_stream;

    std::string vars() override {
        return VARS_TO_STR5(n_rot, d, n_head, n_tokens, n_stream);
    }

    std::string op_desc(ggml_tensor * t) override {
        GGML_UNUSED(t);
        return "CONT_HADAMARD";
    }

    bool run_whole_graph() override { return true; }

    test_cont_hadamard(int64_t n_rot = 64, int64_t d = 128, int64_t n_head = 32, int64_t n_tokens = 1, int64_t n_stream = 1)
        : n_rot(n_rot), d(d), n_head(n_head), n_tokens(n_tokens), n_stream(n_stream) {}

    ggml_tensor * build_graph(ggml_context * ctx) override {
        ggml_tensor * kqv = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, d, n_tokens, n_head, n_stream);
        ggml_set_name(kqv, "kqv");
        ggml_tensor * rot = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_rot, n_rot);
        ggml_set_name(rot, "rot");

        ggml_tensor * cur = ggml_permute(ctx, kqv, 0, 2, 1, 3);
        cur = ggml_cont_2d(ctx, cur, d*n_head, n_tokens*n_stream);
        cur = ggml_reshape_2d(ctx, cur, n_rot, ggml_nelements(cur)/n_rot);

        ggml_tensor * out = ggml_mul_mat(ctx, rot, cur);
        ggml_mul_mat_set_hint(out, GGML_HINT_SRC0_IS_HADAMARD);
        ggml_set_name(out, "out");
        return out;
    }

    void initialize_tensors(ggml_context * ctx) override {
        for (ggml_tensor * t = ggml_get_first_tensor(ctx); t != nullptr; t = ggml_get_next_tensor(ctx, t)) {
            if (t->view_src != nullptr) {
                continue;
            }
            if (strcmp(t->name, "rot") == 0) {
                init_hadamard_rotation(t);
            } else {
                init_tensor_uniform(t);
            }
        }
    }
};

// rotation of the queries -> K*Q on a (quantized) K cache, as test_mul_mat_kq
struct test_hadamard_kq : public test_case {
    const ggml_type type_k;
    const int64_t n_rot;
    const int64_t d_k;
    const int64_t n_kv;
    const int64_t n_head_kv;
    const int64_t gqa;
    const int64_t n_tokens;

    std::string vars() override {
        return VARS_TO_STR7(type_k, n_rot, d_k, n_kv, n_head_kv, gqa, n_tokens);
    }

    std::string op_desc(ggml_tensor * t) override {
        GGML_UNUSED(t);
        return "HADAMARD_KQ";
    }

    bool run_whole_graph() override { return true; }

    double max_nmse_err() override {
        return 5e-4; // as test_mul_mat_kq: the CPU quantizes the queries to q8
    }

    test_hadamard_kq(ggml_type type_k = GGML_TYPE_Q4_0, int64_t n_rot = 128, int64_t d_k = 128, int64_t n_kv = 777,
            int64_t n_head_kv = 2, int64_t gqa = 4, int64_t n_tokens = 1)
        : type_k(type_k), n_rot(n_rot), d_k(d_k), n_kv(n_kv), n_head_kv(n_head_kv), gqa(gqa), n_tokens(n_tokens) {}

    ggml_tensor * build_graph(ggml_context * ctx) override {
        ggml_tensor * cache = ggml_new_tensor_2d(ctx, type_k, d_k*n_head_kv, n_kv + 1);
        ggml_set_name(cache, "cache");
        ggml_tensor * k = ggml_view_4d(ctx, cache, d_k, n_head_kv, n_kv, 1, ggml_row_size(type_k, d_k), cache->nb[1],
                cache->nb[1]*(n_kv + 1), 0);
        k = ggml_permute(ctx, k, 0, 2, 1, 3);

        ggml_tensor * q = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, d_k, n_head_kv*gqa, n_tokens);
        ggml_set_name(q, "q");
        ggml_tensor * rot = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_rot, n_rot);
        ggml_set_name(rot, "rot");

        ggml_tensor * qr = build_hadamard_rotation(ctx, q, rot);
        qr = ggml_permute(ctx, qr, 0, 2, 1, 3);

        ggml_tensor * out = ggml_mul_mat(ctx, k, qr);
        ggml_set_name(out, "out");
        return out;
    }

    void initialize_tensors(ggml_context * ctx) override {
        for (ggml_tensor * t = ggml_get_first_tensor(ctx); t != nullptr; t = ggml_get_next_tensor(ctx, t)) {
            if (t->view_src != nullptr) {
                continue;
            }
            if (strcmp(t->name, "rot") == 0) {
                init_hadamard_rotation(t);
            } else {
                init_tensor_uniform(t);
            }
        }
    }
};

// GGML_OP_OUT_PROD
// the non-FA attention of a quantized, row-major V cache (llm_graph_context::build_attn_mha): kq*v as
// ggml_out_prod(v, ggml_transpose(kq)) straight from the quantized rows of a view of the cache
struct test_attn_v_quant : public test_case {
    const ggml_type type_V;
    const int64_t hsv;      // V head size
    const int64_t nh_kv;    // num KV heads
    const int64_t nr2;      // Q heads per KV head (grouped-query attention)
    const int64_t kv;       // number of KV cells attended
    const int64_t kv_size;  // number of KV cells in the cache
    const int64_t nb;       // batch size
    const int64_t n_stream; // KV streams

    std::string op_desc(ggml_tensor * t) override {
        GGML_UNUSED(t);
        return "ATTN_V_QUANT";
    }

    std::string vars() override {
        return VARS_TO_STR8(type_V, hsv, nh_kv, nr2, kv, kv_size, nb, n_stream);
    }

    double max_nmse_err() override {
        return 5e-4;
    }

    test_attn_v_quant(ggml_type type_V = GGML_TYPE_Q4_0, int64_t hsv = 128, int64_t nh_kv = 2, int64_t nr2 = 4,
            int64_t kv = 113, int64_t kv_size = 256, int64_t nb = 1, int64_t n_stream = 1)
        : type_V(type_V), hsv(hsv), nh_kv(nh_kv), nr2(nr2), kv(kv), kv_size(kv_size), nb(nb), n_stream(n_stream) {}

    ggml_tensor * build_graph(ggml_context * ctx) override {
        const int64_t n_embd_v_gqa = hsv*nh_kv;

        // one row of n_embd_v_gqa per cell, as llama_kv_cache stores a V cache that is not transposed
        ggml_tensor * v_cache = ggml_new_tensor_3d(ctx, type_V, n_embd_v_gqa, kv_size, n_stream);
        ggml_set_name(v_cache, "v_cache");

        // llama_kv_cache::get_v(), then the permute of build_attn_mha(): [hsv, kv, nh_kv, n_stream]
        ggml_tensor * v = ggml_view_4d(ctx, v_cache, hsv, nh_kv, kv, n_stream,
                ggml_row_size(type_V, hsv),
                ggml_row_size(type_V, n_embd_v_gqa),
                ggml_row_size(type_V, n_embd_v_gqa*kv_size), 0);
        v = ggml_permute(ctx, v, 0, 2, 1, 3);

        ggml_tensor * kq = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, kv, nb, nh_kv*nr2, n_stream);
        ggml_set_name(kq, "kq");

        // [hsv, nb, nh_kv*nr2, n_stream]
        ggml_tensor * out = ggml_out_prod(ctx, v, ggml_transpose(ctx, kq));
        ggml_set_name(out, "out");

        return out;
    }
};

// llama-vq: the non-FA attention of a few query tokens on a quantized K/V cache, as build_attn_mha builds it:
// MUL_MAT(k, q) -> SOFT_MAX(mask, scale[, sinks]) -> OUT_PROD(v, TRANSPOSE(kq)), k and v permuted views of the caches;
// n_rot > 0: the queries are rotated first (a rotated K cache). A backend may run the chain as one pass
// (ggml-cuda: attn-decode-fused.cuh); the CPU runs the separate ops.
struct test_attn_decode_fused : public test_case {
    const ggml_type type_k;
    const ggml_type type_v;
    const int64_t d_k;
    const int64_t d_v;
    const int64_t n_head;
    const int64_t n_head_kv;
    const int64_t n_kv;
    const int64_t n_tokens;   // per stream
    const bool    sinks;
    const int64_t n_rot;
    const int64_t n_stream;
    const ggml_type type_mask;
    const int64_t out_tail;   // -1: ends at the OUT_PROD; 0: + build_attn_mha's permute and copy; n > 0: + V's inverse
                              // rotation of n (the fused kernels write that tail's result)

    std::string vars() override {
        if (out_tail >= 0) {
            return VARS_TO_STR13(type_k, type_v, d_k, d_v, n_head, n_head_kv, n_kv, n_tokens, sinks, n_rot, n_stream, type_mask, out_tail);
        }
        return VARS_TO_STR12(type_k, type_v, d_k, d_v, n_head, n_head_kv, n_kv, n_tokens, sinks, n_rot, n_stream, type_mask);
    }

    std::string op_desc(ggml_tensor * t) override {
        GGML_UNUSED(t);
        return "ATTN_DECODE_FUSED";
    }

    bool run_whole_graph() override { return true; }

    double max_nmse_err() override {
        return 5e-4; // as test_mul_mat_kq: the CPU quantizes the queries to q8 for K*Q
    }

    test_attn_decode_fused(ggml_type type_k = GGML_TYPE_Q4_0, ggml_type type_v = GGML_TYPE_Q4_0, int64_t d_k = 128,
            int64_t d_v = 128, int64_t n_head = 32, int64_t n_head_kv = 8, int64_t n_kv = 256, int64_t n_tokens = 1,
            bool sinks = false, int64_t n_rot = 0, int64_t n_stream = 1, ggml_type type_mask = GGML_TYPE_F32,
            int64_t out_tail = -1)
        : type_k(type_k), type_v(type_v), d_k(d_k), d_v(d_v), n_head(n_head), n_head_kv(n_head_kv), n_kv(n_kv),
          n_tokens(n_tokens), sinks(sinks), n_rot(n_rot), n_stream(n_stream), type_mask(type_mask), out_tail(out_tail) {}

    // the attention's inputs as build_attn_mha() has them: the caches' views, the queries, the mask and the sinks
    struct attn_inputs {
        ggml_tensor * k;
        ggml_tensor * v;
        ggml_tensor * q;
        ggml_tensor * mask;
        ggml_tensor * sinks;
    };

    attn_inputs build_inputs(ggml_context * ctx) {
        const int64_t kv_size = n_kv + 5; // cells past n_kv are not attended

        // one row of n_head_kv heads per cell and stream, as llama_kv_cache stores K and a non-transposed V;
        // get_k()/get_v() views, then the permutes of build_attn_mha(): [d, n_kv, n_head_kv, n_stream]
        ggml_tensor * k_cache = ggml_new_tensor_3d(ctx, type_k, d_k*n_head_kv, kv_size, n_stream);
        ggml_set_name(k_cache, "k_cache");
        ggml_tensor * k = ggml_view_4d(ctx, k_cache, d_k, n_head_kv, n_kv, n_stream, ggml_row_size(type_k, d_k),
                k_cache->nb[1], k_cache->nb[2], 0);
        k = ggml_permute(ctx, k, 0, 2, 1, 3);

        ggml_tensor * v_cache = ggml_new_tensor_3d(ctx, type_v, d_v*n_head_kv, kv_size, n_stream);
        ggml_set_name(v_cache, "v_cache");
        ggml_tensor * v = ggml_view_4d(ctx, v_cache, d_v, n_head_kv, n_kv, n_stream, ggml_row_size(type_v, d_v),
                v_cache->nb[1], v_cache->nb[2], 0);
        v = ggml_permute(ctx, v, 0, 2, 1, 3);

        // the queries [d_k, n_head, n_tokens*n_stream], split into streams and permuted as in build_attn_mha()
        ggml_tensor * q = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, d_k, n_head, n_tokens*n_stream);
        ggml_set_name(q, "q");
        if (n_rot > 0) {
            ggml_tensor * rot = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_rot, n_rot);
            ggml_set_name(rot, "rot");
            q = build_hadamard_rotation(ctx, q, rot);
        }
        q = ggml_view_4d(ctx, q, d_k, n_head, n_tokens, n_stream, q->nb[1], q->nb[2], q->nb[2]*n_tokens, 0);
        q = ggml_permute(ctx, q, 0, 2, 1, 3);

        ggml_tensor * mask = ggml_new_tensor_4d(ctx, type_mask, n_kv, n_tokens, 1, n_stream);
        ggml_set_name(mask, "mask");

        ggml_tensor * s = nullptr;
        if (sinks) {
            s = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n_head);
            ggml_set_name(s, "sinks");
        }
        return { k, v, q, mask, s };
    }

    ggml_tensor * build_graph(ggml_context * ctx) override {
        const attn_inputs in = build_inputs(ctx);
        ggml_tensor * v = in.v;

        ggml_tensor * kq = ggml_mul_mat(ctx, in.k, in.q);
        ggml_prec_set_acc(kq, GGML_PREC_F32);

        kq = ggml_soft_max_ext(ctx, kq, in.mask, 1.0f/sqrtf((float) d_k), 0.0f);
        ggml_soft_max_add_sinks(kq, in.sinks);

        // [d_v, n_tokens, n_head, n_stream]
        ggml_tensor * out = ggml_out_prod(ctx, v, ggml_transpose(ctx, kq));
        ggml_set_name(out, "out");
        if (out_tail >= 0) {
            // as build_attn_mha continues: [d_v, n_head, n_tokens, n_stream] made contiguous, streams recombined; then
            // a rotated V cache's inverse rotation (llama_mul_mat_hadamard)
            out = ggml_permute(ctx, out, 0, 2, 1, 3);
            out = ggml_cont_2d(ctx, out, out->ne[0]*out->ne[1], out->ne[2]*out->ne[3]);
            if (out_tail > 0) {
                ggml_tensor * rot_v = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, out_tail, out_tail);
                ggml_set_name(rot_v, "rot_v");
                out = build_hadamard_rotation(ctx, out, rot_v);
            }
            ggml_set_name(out, "out_tail");
        }
        return out;
    }

    // a mask as a decode step sees it: causal over the last n_tokens cells, scattered holes, and for long caches a
    // masked range of cells (a window) that whole splits of a flash-decoding kernel fall into; cell 0 always visible
    void init_mask(ggml_tensor * t) {
        std::mt19937 gen(1234);
        std::uniform_real_distribution<float> dis(-1.0f, 1.0f);
        std::vector<float> data(ggml_nelements(t));
        for (int64_t s = 0; s < t->ne[3]; ++s) {
            for (int64_t r = 0; r < t->ne[1]; ++r) {
                for (int64_t c = 0; c < t->ne[0]; ++c) {
                    const bool causal = c >= n_kv - n_tokens + r + 1;
                    const bool hole   = (c*7 + r*13 + s*5) % 11 == 0;
                    const bool window = n_kv >= 1024 && c >= n_kv/4 && c < n_kv/2;
                    data[(s*t->ne[1] + r)*t->ne[0] + c] = c > 0 && (causal || hole || window) ? -INFINITY : dis(gen);
                }
            }
        }
        if (t->type == GGML_TYPE_F16) {
            std::vector<ggml_fp16_t> h(data.size());
            ggml_fp32_to_fp16_row(data.data(), h.data(), data.size());
            ggml_backend_tensor_set(t, h.data(), 0, h.size()*sizeof(ggml_fp16_t));
        } else {
            ggml_backend_tensor_set(t, data.data(), 0, data.size()*sizeof(float));
        }
    }

    void initialize_tensors(ggml_context * ctx) override {
        for (ggml_tensor * t = ggml_get_first_tensor(ctx); t != nullptr; t = ggml_get_next_tensor(ctx, t)) {
            if (t->view_src != nullptr) {
                continue;
            }
            if (strcmp(t->name, "rot") == 0 || strcmp(t->name, "rot_v") == 0) {
                init_hadamard_rotation(t);
            } else if (strcmp(t->name, "mask") == 0) {
                init_mask(t);
            } else if (strcmp(t->name, "q") == 0) {
                init_tensor_uniform(t, -3.0f, 3.0f); // peaked enough that the softmax is not near-uniform
            } else if (strcmp(t->name, "sinks") == 0) {
                init_tensor_uniform(t, -2.0f, 4.0f);
            } else {
                init_tensor_uniform(t);
            }
        }
    }
};

// llama-vq: the attention without flash attention of a prompt batch whose scores exceed the scratch budget
// (llama-vq-attn.h, patch 0017-llama-attn-split-scratch-budget): per stream and chunk of `chunk` query tokens,
// K*Q (the heads of a KV head side by side) -> softmax -> V*P, the chunks' outputs set into one [d_v, n_head, n_tokens, n_stream] tensor. A quantized V is
// read row-major by OUT_PROD; an f16 V (flash attention's layout, prefill mode) is transposed once per stream.
struct test_attn_split : public test_attn_decode_fused {
    const int64_t chunk;
    const int     v_mode; // a quantized V: read by each chunk (LLAMA_VQ_ATTN_V_QUANT) or dequantized once (_F16)

    std::string vars() override {
        std::string v = VARS_TO_STR12(type_k, type_v, d_k, d_v, n_head, n_head_kv, n_kv, n_tokens, sinks, n_stream, chunk, type_mask);
        if (v_mode == LLAMA_VQ_ATTN_V_F16) {
            v += ",v_once=f16";
        }
        return v;
    }

    std::string op_desc(ggml_tensor * t) override {
        GGML_UNUSED(t);
        return "ATTN_SPLIT";
    }

    test_attn_split(ggml_type type_k, ggml_type type_v, int64_t d_k, int64_t d_v, int64_t n_head, int64_t n_head_kv,
            int64_t n_kv, int64_t n_tokens, bool sinks, int64_t n_stream, int64_t chunk,
            ggml_type type_mask = GGML_TYPE_F32, // f16: llama.cpp's input mask when the attention is split
            int v_mode = LLAMA_VQ_ATTN_V_QUANT)
        : test_attn_decode_fused(type_k, type_v, d_k, d_v, n_head, n_head_kv, n_kv, n_tokens, sinks, 0, n_stream, type_mask),
          chunk(chunk), v_mode(v_mode) {}

    ggml_tensor * build_graph(ggml_context * ctx) override {
        const attn_inputs in = build_inputs(ctx);

        llama_vq_attn_split_params p = {};
        p.kq_scale = 1.0f/sqrtf((float) d_k);
        p.scratch  = (size_t) chunk*n_kv*n_head*sizeof(float); // exactly `chunk` tokens' scores
        p.il       = -1;
        p.v_f16    = v_mode;
        ggml_tensor * out = llama_vq_attn_split(ctx, in.q, in.k, in.v, false, in.mask, nullptr, in.sinks, nullptr, p);
        GGML_ASSERT(out != nullptr && "the case's scores must exceed its budget");
        ggml_set_name(out, "out");
        return out;
    }
};

// llama-vq's evaluation cases, in test-backend-ops' make_test_cases_eval()
static void llama_vq_test_cases_eval(std::vector<std::unique_ptr<test_case>> & test_cases) {
    // quantized V cache on the non-FA attention path: V-shaped permuted src0, transposed src1, GQA broadcast,
    // 1 and 2 streams, from 1 to 2048 dst columns (n_tokens*gqa) per src0 matrix
    for (ggml_type type_v : {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0, GGML_TYPE_IQ4_NL}) {
        for (int64_t gqa : {1, 4, 16}) {
            for (int64_t n_tokens : {1, 3, 32}) {
                for (int64_t n_stream : {1, 2}) {
                    test_cases.emplace_back(new test_out_prod_kqv(type_v, 128, 777, 2, gqa, n_tokens, n_stream));
                }
            }
        }
        for (int64_t d_v : {64, 192, 256, 512}) {
            test_cases.emplace_back(new test_out_prod_kqv(type_v, d_v, 300, 2, 2, 1, 1));
        }
    }
    for (ggml_type type_v : {GGML_TYPE_Q4_0, GGML_TYPE_Q8_0}) {
        for (int64_t gqa : {1, 2, 3, 4, 5, 6, 7, 8, 12, 16}) {
            test_cases.emplace_back(new test_out_prod_kqv(type_v, 128, 1000, 2, gqa, 1, 1));
            test_cases.emplace_back(new test_out_prod_kqv(type_v, 128, 1000, 2, gqa, 2, 2));
        }
        for (int64_t n_kv : {1, 31, 32, 33, 4096 + 7}) {
            test_cases.emplace_back(new test_out_prod_kqv(type_v, 128, n_kv, 8, 4, 1, 1));
        }
        for (int64_t n_tokens : {7, 8, 9, 64, 512}) {
            test_cases.emplace_back(new test_out_prod_kqv(type_v, 128, 512, 2, 4, n_tokens, 1));
        }
    }
    // the tensor-core V*P (k_out_prod_q_mma, NVIDIA sm_80+: out-prod-q-mma.cuh; by default for long contexts' chunks
    // only, reached here with LLAMA_VQ_CUDA_OUT_PROD_MMA=2): more than 128 columns per V matrix over a number of cells
    // that is a multiple of 4 (kq's rows are read in runs of 4 floats): the split attention's chunk at GQA 16 for every
    // type, two streams, d_v 256 with a partial column tile, one V matrix over many k segments
    for (ggml_type type_v : {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0, GGML_TYPE_IQ4_NL}) {
        test_cases.emplace_back(new test_out_prod_kqv(type_v, 128, 1000, 4, 16, 16, 1));
    }
    test_cases.emplace_back(new test_out_prod_kqv(GGML_TYPE_Q4_1, 128, 4096, 4, 16, 16, 2));
    test_cases.emplace_back(new test_out_prod_kqv(GGML_TYPE_Q8_0, 256,  520, 2,  8, 20, 1));
    test_cases.emplace_back(new test_out_prod_kqv(GGML_TYPE_Q4_0, 128, 9000, 1,  1, 300, 1));
    // decode shapes: MiMo-V2 (4 KV heads x GQA 16, 8 x GQA 8), SmolLM2 (d 64, 3 x GQA 3), Llama-3 8B at 32K cells
    // (many chunks to combine), short rows (d 32, 96), 2-3 tokens per step
    for (ggml_type type_v : {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q8_0, GGML_TYPE_IQ4_NL}) {
        test_cases.emplace_back(new test_out_prod_kqv(type_v, 128, 4096 + 5, 4, 16, 1, 1));
        test_cases.emplace_back(new test_out_prod_kqv(type_v, 128, 640, 8, 8, 1, 1));
        test_cases.emplace_back(new test_out_prod_kqv(type_v, 64, 4096 + 3, 3, 3, 1, 1));
        test_cases.emplace_back(new test_out_prod_kqv(type_v, 128, 32768 + 29, 8, 4, 1, 1));
        test_cases.emplace_back(new test_out_prod_kqv(type_v, 128, 256, 8, 4, 1, 2));
        test_cases.emplace_back(new test_out_prod_kqv(type_v, 32, 1000, 4, 2, 1, 1));
        test_cases.emplace_back(new test_out_prod_kqv(type_v, 96, 1000, 3, 2, 1, 1));
        test_cases.emplace_back(new test_out_prod_kqv(type_v, 128, 2000, 8, 4, 2, 1));
        test_cases.emplace_back(new test_out_prod_kqv(type_v, 128, 2000, 8, 4, 3, 2));
    }
    for (ggml_type type_a : {GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, GGML_TYPE_IQ4_NL}) {
        for (bool trans_b : {false, true}) {
            test_cases.emplace_back(new test_out_prod(type_a, GGML_TYPE_F32, 256, 4,   64, {2, 2}, {2, 2}, trans_b));
            test_cases.emplace_back(new test_out_prod(type_a, GGML_TYPE_F32, 256, 100, 64, {2, 2}, {2, 2}, trans_b));
        }
    }
    // 48 dst columns per V matrix: dequantized then llamafile_sgemm on the CPU, where n_kv suits it (a multiple of 8)
    for (ggml_type type_v : {GGML_TYPE_Q4_0, GGML_TYPE_Q8_0}) {
        for (int64_t n_kv : {8, 264, 1000, 1001, 4096}) {
            test_cases.emplace_back(new test_out_prod_kqv(type_v, 64, n_kv, 3, 3, 16, 2));
        }
    }

    // quantized K cache on the non-FA attention path: short permuted src0 rows shared by n_tokens*gqa columns
    for (ggml_type type_k : {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0, GGML_TYPE_IQ4_NL}) {
        for (int64_t gqa : {1, 2, 4, 8, 16}) {
            for (int64_t n_tokens : {1, 2}) {
                for (int64_t n_stream : {1, 2}) {
                    test_cases.emplace_back(new test_mul_mat_kq(type_k, 128, 777, 2, gqa, n_tokens, n_stream));
                }
            }
        }
        for (int64_t d_k : {32, 64, 192, 256, 576}) {
            test_cases.emplace_back(new test_mul_mat_kq(type_k, d_k, 300, 2, 4, 1, 1));
        }
    }
    for (ggml_type type_k : {GGML_TYPE_Q4_0, GGML_TYPE_Q8_0}) {
        for (int64_t gqa : {3, 5, 6, 7}) {
            test_cases.emplace_back(new test_mul_mat_kq(type_k, 128, 1000, 2, gqa, 1, 1));
        }
        for (int64_t n_kv : {1, 31, 33, 4096 + 7}) {
            test_cases.emplace_back(new test_mul_mat_kq(type_k, 128, n_kv, 8, 4, 1, 1));
        }
        for (int64_t n_tokens : {3, 4, 8, 32, 512}) {
            test_cases.emplace_back(new test_mul_mat_kq(type_k, 128, 512, 2, 4, n_tokens, 1));
        }
        test_cases.emplace_back(new test_mul_mat_kq(type_k, 192, 300, 2, 8, 16, 2));
    }
    // MiMo-V2-Flash's K (192): full-attention layers GQA 16 (4 KV heads), sliding-window layers GQA 8 (8 KV heads),
    // decode and small batches (tiles of 16 columns in the vector kernel, the F16 GEMM above its limit), 1-2 streams;
    // MLA-like (576, one KV head, GQA 128)
    for (ggml_type type_k : {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q8_0, GGML_TYPE_IQ4_NL}) {
        for (int64_t gqa : {8, 16}) {
            for (int64_t n_tokens : {1, 2, 3, 4}) {
                test_cases.emplace_back(new test_mul_mat_kq(type_k, 192, 1000, 64/gqa, gqa, n_tokens, 1));
            }
            test_cases.emplace_back(new test_mul_mat_kq(type_k, 192, 333, 64/gqa, gqa, 1, 2));
        }
        for (int64_t n_tokens : {1, 2}) {
            test_cases.emplace_back(new test_mul_mat_kq(type_k, 576, 300, 1, 128, n_tokens, 1));
        }
    }

    // Hadamard rotation of a quantized KV cache + its consumer (llama_mul_mat_hadamard, fused by backends)
    for (ggml_type type : {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0, GGML_TYPE_IQ4_NL}) {
        for (int64_t n_rot : {64, 128}) {
            for (int64_t n_tokens : {1, 7}) {
                test_cases.emplace_back(new test_hadamard_set_rows(type, GGML_TYPE_I64, n_rot, 128, 8, n_tokens, 1));
            }
            test_cases.emplace_back(new test_hadamard_kq(type, n_rot, 128, 777, 2, 4, 1));
        }
    }
    test_cases.emplace_back(new test_hadamard_set_rows(GGML_TYPE_Q4_0, GGML_TYPE_I32, 128, 128, 8, 3, 1));
    test_cases.emplace_back(new test_hadamard_set_rows(GGML_TYPE_Q8_0, GGML_TYPE_I64,  64, 192, 4, 5, 1)); // MiMo K
    test_cases.emplace_back(new test_hadamard_set_rows(GGML_TYPE_Q4_0, GGML_TYPE_I64, 256, 256, 2, 2, 1));
    test_cases.emplace_back(new test_hadamard_set_rows(GGML_TYPE_Q4_0, GGML_TYPE_I64, 512, 512, 1, 2, 1));
    test_cases.emplace_back(new test_hadamard_set_rows(GGML_TYPE_Q4_0, GGML_TYPE_I64, 128, 128, 8, 3, 2)); // 2 streams
    // K's rope + rotation + store: 8B / SmolLM2-like NEOX and NORMAL heads, MiMo's K (192, rotation 64, rope
    // on its first 64), a rope window at an offset, frequency factors, YaRN, a fused projection's strided rows
    for (ggml_type type : {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q8_0}) {
        for (int mode : {GGML_ROPE_TYPE_NORMAL, GGML_ROPE_TYPE_NEOX}) {
            for (int64_t n_tokens : {1, 5}) {
                test_cases.emplace_back(new test_rope_hadamard_set_rows(type, 128, 128, 8, n_tokens, mode, 128));
                test_cases.emplace_back(new test_rope_hadamard_set_rows(type,  64,  64, 3, n_tokens, mode, 64));
                test_cases.emplace_back(new test_rope_hadamard_set_rows(type,  64, 192, 4, n_tokens, mode, 64)); // MiMo K
            }
        }
    }
    for (int mode : {GGML_ROPE_TYPE_NORMAL, GGML_ROPE_TYPE_NEOX}) {
        test_cases.emplace_back(new test_rope_hadamard_set_rows(GGML_TYPE_Q4_0, 128, 128, 8, 3, mode, 64));           // partial
        test_cases.emplace_back(new test_rope_hadamard_set_rows(GGML_TYPE_Q4_0, 128, 128, 8, 3, mode, 32, 64));       // offset
        test_cases.emplace_back(new test_rope_hadamard_set_rows(GGML_TYPE_Q8_0, 128, 128, 8, 2, mode, 128, 0, true)); // ff
        test_cases.emplace_back(new test_rope_hadamard_set_rows(GGML_TYPE_Q8_0, 128, 128, 8, 2, mode, 128, 0, false, 1.0f)); // YaRN
        test_cases.emplace_back(new test_rope_hadamard_set_rows(GGML_TYPE_Q4_0, 128, 128, 8, 4, mode, 128, 0, true, 1.0f, true));
        test_cases.emplace_back(new test_rope_hadamard_set_rows(GGML_TYPE_Q4_0,  64, 256, 2, 2, mode, 256)); // pairs across segments: not fused
    }
    for (int64_t n_rot : {64, 128}) {
        for (int64_t n_tokens : {1, 5}) {
            for (int64_t n_stream : {1, 2}) {
                test_cases.emplace_back(new test_cont_hadamard(n_rot, 128, 32, n_tokens, n_stream));
            }
        }
    }
    test_cases.emplace_back(new test_cont_hadamard( 64, 192, 16, 3, 1));
    test_cases.emplace_back(new test_cont_hadamard(256, 256,  4, 2, 1));
    test_cases.emplace_back(new test_cont_hadamard(512, 512,  2, 2, 1));
    for (ggml_type type_k : {GGML_TYPE_Q4_0, GGML_TYPE_Q8_0}) {
        for (int64_t gqa : {1, 3, 8}) {
            test_cases.emplace_back(new test_hadamard_kq(type_k, 128, 128, 777, 2, gqa, 1));
        }
        test_cases.emplace_back(new test_hadamard_kq(type_k, 128, 128, 300, 2, 4, 2));
        test_cases.emplace_back(new test_hadamard_kq(type_k,  64, 192, 300, 2, 16, 1)); // MiMo: K 192, GQA 16
        for (int64_t n_tokens : {1, 2, 4}) {
            test_cases.emplace_back(new test_hadamard_kq(type_k, 64, 192, 1000, 4, 16, n_tokens)); // MiMo full layers
        }
        test_cases.emplace_back(new test_hadamard_kq(type_k, 64, 192, 1000, 8, 8, 2));   // MiMo SWA layers, 2 tokens
        test_cases.emplace_back(new test_hadamard_kq(type_k, 64, 576, 300, 1, 128, 1));  // MLA-like
        test_cases.emplace_back(new test_hadamard_kq(type_k, 256, 256, 300, 2, 2, 1));
        test_cases.emplace_back(new test_hadamard_kq(type_k, 128, 128, 512, 2, 4, 32)); // prefill: not fused
    }

    // llama-vq: the non-FA attention of a few tokens on a quantized K/V cache, K*Q -> softmax -> V*P (fused by
    // ggml-cuda, attn-decode-fused.cuh): the 8B shape (d 128, 32 heads / 8 KV heads), MiMo's full-attention layers
    // (K 192 / V 128, 64 / 4: GQA 16) and sliding-window layers (64 / 8), 1..32768 cells, 1-8 tokens, with and
    // without sinks
    {
        struct attn_shape { int64_t d_k, d_v, n_head, n_head_kv; };
        const attn_shape shapes[] = { {128, 128, 32, 8}, {192, 128, 64, 4}, {192, 128, 64, 8} };
        const std::pair<ggml_type, ggml_type> kv_types[] = {
            {GGML_TYPE_Q4_0, GGML_TYPE_Q4_0}, {GGML_TYPE_Q8_0, GGML_TYPE_Q4_1}, {GGML_TYPE_Q8_0, GGML_TYPE_Q8_0} };
        for (const attn_shape & sh : shapes) {
            for (int64_t n_kv : {1, 127, 256, 4096, 32768}) {
                for (int64_t n_tokens : {1, 2, 4, 8}) {
                    for (const auto & tkv : kv_types) {
                        for (bool sinks : {false, true}) {
                            test_cases.emplace_back(new test_attn_decode_fused(tkv.first, tkv.second, sh.d_k, sh.d_v,
                                sh.n_head, sh.n_head_kv, n_kv, n_tokens, sinks));
                        }
                    }
                }
            }
        }
        // other head sizes (64/64, 256/256), GQA 1, 2 streams, an F16 mask, q4_1 K
        for (int64_t n_kv : {127, 4096}) {
            for (int64_t n_tokens : {1, 3}) {
                test_cases.emplace_back(new test_attn_decode_fused(GGML_TYPE_Q4_0, GGML_TYPE_Q8_0,  64,  64, 16, 4, n_kv, n_tokens, true));
                test_cases.emplace_back(new test_attn_decode_fused(GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, 256, 256, 16, 2, n_kv, n_tokens, true));
                test_cases.emplace_back(new test_attn_decode_fused(GGML_TYPE_Q4_1, GGML_TYPE_Q4_1, 128, 128,  8, 8, n_kv, n_tokens, false));
                test_cases.emplace_back(new test_attn_decode_fused(GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 128, 128, 32, 8, n_kv, n_tokens, true, 0, 2));
                test_cases.emplace_back(new test_attn_decode_fused(GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, 128, 128, 32, 8, n_kv, n_tokens, false, 0, 1, GGML_TYPE_F16));
            }
        }
        // the queries rotated first (a rotated K cache, the FWHT_KQ form, taken over by the fused kernel)
        for (int64_t n_kv : {256, 4096}) {
            for (int64_t n_tokens : {1, 4}) {
                for (bool sinks : {false, true}) {
                    test_cases.emplace_back(new test_attn_decode_fused(GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 128, 128, 32, 8, n_kv, n_tokens, sinks, 128));
                    test_cases.emplace_back(new test_attn_decode_fused(GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, 192, 128, 64, 4, n_kv, n_tokens, sinks, 64));
                }
            }
        }
        test_cases.emplace_back(new test_attn_decode_fused(GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 128, 128, 32, 8, 300, 2, true, 64, 2));
        // with build_attn_mha's permute and copy, and V's inverse rotation: one split and several, 2 streams
        for (int64_t n_kv : {127, 4096}) {
            for (int64_t out_tail : {0, 64, 128}) {
                test_cases.emplace_back(new test_attn_decode_fused(GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 128, 128, 32, 8, n_kv, 1, false, 128, 1, GGML_TYPE_F32, out_tail));
                test_cases.emplace_back(new test_attn_decode_fused(GGML_TYPE_Q8_0, GGML_TYPE_Q4_1, 192, 128, 64, 4, n_kv, 2, true, 64, 1, GGML_TYPE_F32, out_tail));
                test_cases.emplace_back(new test_attn_decode_fused(GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, 128, 128, 32, 8, n_kv, 3, true, 0, 2, GGML_TYPE_F16, out_tail));
            }
        }
        test_cases.emplace_back(new test_attn_decode_fused(GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, 256, 256, 16, 2, 700, 4, false, 256, 1, GGML_TYPE_F32, 256));
        // not fused (more than 8 tokens, f16 K): the separate ops
        test_cases.emplace_back(new test_attn_decode_fused(GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 128, 128, 32, 8, 512, 16, false));
        test_cases.emplace_back(new test_attn_decode_fused(GGML_TYPE_F16,  GGML_TYPE_Q4_0, 128, 128, 32, 8, 512, 1, false));
    }

    // non-FA attention with a quantized, row-major V cache: GQA ratios 1..16, 1 and 2 streams
    for (ggml_type type_V : {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0, GGML_TYPE_IQ4_NL}) {
        for (int hsv : { 64, 128, }) {
            for (int nr2 : { 1, 2, 4, 8, 16, }) {
                for (int n_stream : { 1, 2, }) {
                    test_cases.emplace_back(new test_attn_v_quant(type_V, hsv, 2, nr2, 113, 256, 1,  n_stream));
                    test_cases.emplace_back(new test_attn_v_quant(type_V, hsv, 2, nr2, 512, 512, 32, n_stream));
                }
            }
        }
    }

    // prompt batches split under a scratch budget: 8B (GQA 4), MiMo's full layers (K 192 / V 128, GQA 16) and SWA
    // layers (GQA 8, sinks), SmolLM2 (d 64, GQA 3), chunks that do and do not divide the batch, 2 streams, one token
    // per chunk, and an f16 V in flash attention's layout (prefill mode's decode). At most ~6 chunks a case: a
    // test case's context holds 128 tensors
    test_cases.emplace_back(new test_attn_split(GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 128, 128, 32, 8,  512,  37, false, 1,   8));
    test_cases.emplace_back(new test_attn_split(GGML_TYPE_Q8_0, GGML_TYPE_Q4_1, 192, 128, 64, 4, 1024,  64, false, 1,  16));
    test_cases.emplace_back(new test_attn_split(GGML_TYPE_Q8_0, GGML_TYPE_Q4_1, 192, 128, 64, 8,  640,  64, true,  1,  11));
    test_cases.emplace_back(new test_attn_split(GGML_TYPE_Q8_0, GGML_TYPE_Q8_0,  64,  64,  9, 3,  768,  50, false, 1,  10));
    test_cases.emplace_back(new test_attn_split(GGML_TYPE_F16,  GGML_TYPE_F16,  128, 128, 32, 8,  512,  37, false, 1,   8));
    test_cases.emplace_back(new test_attn_split(GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 128, 128, 32, 8, 4096, 512, false, 1, 128));
    test_cases.emplace_back(new test_attn_split(GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, 128, 128, 32, 8,  256,   5, false, 1,   1));
    test_cases.emplace_back(new test_attn_split(GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 128, 128, 32, 8,  512,  20, false, 2,   8));
    test_cases.emplace_back(new test_attn_split(GGML_TYPE_Q8_0, GGML_TYPE_Q4_1, 192, 128, 64, 8,  640,  20, true,  2,   8));
    // the f16 mask llama.cpp gives the split attention; on CUDA V*P's k cut into segments (8-token chunks: 128
    // columns per V, the GEMM path): 2 of 2048 cells, and 3 of 2167 (the last segment shorter)
    test_cases.emplace_back(new test_attn_split(GGML_TYPE_Q8_0, GGML_TYPE_Q4_1, 192, 128, 64, 4, 4096,  40, false, 1,   8, GGML_TYPE_F16));
    test_cases.emplace_back(new test_attn_split(GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, 192, 128, 64, 4, 6500,  24, false, 1,   8, GGML_TYPE_F16));
    test_cases.emplace_back(new test_attn_split(GGML_TYPE_Q8_0, GGML_TYPE_Q4_1, 192, 128, 64, 8,  640,  20, true,  2,   8, GGML_TYPE_F16));
    test_cases.emplace_back(new test_attn_split(GGML_TYPE_F16,  GGML_TYPE_F16,   64,  64,  9, 3,  512,  20, false, 2,   8));
    // on NVIDIA sm_80+ by default the tensor-core V*P with the softmax taken in (16-token chunks at GQA 16: 256
    // columns in 8 output tiles; f16 mask, sinks; 3,000 cells: k segments, the last one short)
    test_cases.emplace_back(new test_attn_split(GGML_TYPE_Q8_0, GGML_TYPE_Q4_1, 192, 128, 64, 4, 3000,  48, true,  1,  16, GGML_TYPE_F16));
    test_cases.emplace_back(new test_attn_split(GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 192, 128, 64, 4, 2048,  32, false, 1,  16, GGML_TYPE_F16));
    // a quantized V dequantized to f16 once per stream, each chunk's OUT_PROD reading the f16 copy (LLAMA_VQ_ATTN_V_F16=1):
    // MiMo's full and SWA shapes with the f16 mask (split-K segments, sinks, 2 streams), 8B, one token per chunk
    test_cases.emplace_back(new test_attn_split(GGML_TYPE_Q8_0, GGML_TYPE_Q4_1, 192, 128, 64, 4, 4096,  40, false, 1,   8, GGML_TYPE_F16, LLAMA_VQ_ATTN_V_F16));
    test_cases.emplace_back(new test_attn_split(GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, 192, 128, 64, 4, 6500,  24, false, 1,   8, GGML_TYPE_F16, LLAMA_VQ_ATTN_V_F16));
    test_cases.emplace_back(new test_attn_split(GGML_TYPE_Q8_0, GGML_TYPE_Q4_1, 192, 128, 64, 8,  640,  20, true,  2,   8, GGML_TYPE_F16, LLAMA_VQ_ATTN_V_F16));
    test_cases.emplace_back(new test_attn_split(GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 128, 128, 32, 8,  512,  37, false, 1,   8, GGML_TYPE_F32, LLAMA_VQ_ATTN_V_F16));
    test_cases.emplace_back(new test_attn_split(GGML_TYPE_Q8_0, GGML_TYPE_Q8_0,  64,  64,  9, 3,  768,  50, false, 1,  10, GGML_TYPE_F32, LLAMA_VQ_ATTN_V_F16));
    test_cases.emplace_back(new test_attn_split(GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, 128, 128, 32, 8,  256,   5, false, 1,   1, GGML_TYPE_F32, LLAMA_VQ_ATTN_V_F16));
    // OUT_PROD with a contiguous f16 src0 (that copy): several matrices in dims 2 and 3 (without broadcast, which
    // the CPU's f16 OUT_PROD does not take: such cases would only be skipped), few and many columns, and a long k
    // whose few output tiles take the split-K GEMM on CUDA
    for (bool trans_b : {false, true}) {
        test_cases.emplace_back(new test_out_prod(GGML_TYPE_F16, GGML_TYPE_F32, 128, 4,   300, {2, 2}, {1, 1}, trans_b));
        test_cases.emplace_back(new test_out_prod(GGML_TYPE_F16, GGML_TYPE_F32, 128, 100, 300, {4, 1}, {1, 1}, trans_b));
    }
    test_cases.emplace_back(new test_out_prod(GGML_TYPE_F16, GGML_TYPE_F32, 128, 256, 9000, {4, 1}, {1, 1}, true));
}

// llama-vq's performance cases, in test-backend-ops' make_test_cases_perf()
static void llama_vq_test_cases_perf(std::vector<std::unique_ptr<test_case>> & test_cases) {
    // non-FA attention V*softmax(KQ) at Llama-3-8B shapes (d_v 128, 8 KV heads, GQA 4):
    // quantized row-major V through OUT_PROD against the f16 transposed V through MUL_MAT
    for (int64_t n_kv : {256, 8192, 32768}) {
        for (int64_t n_tokens : {1, 512}) {
            if (n_kv == 256 && n_tokens > 1) {
                continue;
            }
            for (ggml_type type_v : {GGML_TYPE_Q4_0, GGML_TYPE_Q8_0}) {
                test_cases.emplace_back(new test_out_prod_kqv(type_v, 128, n_kv, 8, 4, n_tokens, 1));
            }
            test_cases.emplace_back(new test_mul_mat(GGML_TYPE_F16, GGML_TYPE_F32, 128, n_tokens, n_kv, {8, 1}, {4, 1}));
        }
    }

    // V*P at MiMo-V2-Flash's full-attention layers (V 128, 4 KV heads, GQA 16) for 2-8 decoding sequences: 32-128
    // columns per V, where OUT_PROD's vector kernel and its GEMM path meet
    for (int64_t n_kv : {1024, 4096, 16384, 65536}) {
        for (int64_t n_tokens : {2, 3, 4, 8}) {
            for (ggml_type type_v : {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1}) {
                test_cases.emplace_back(new test_out_prod_kqv(type_v, 128, n_kv, 4, 16, n_tokens, 1));
            }
        }
    }

    // the split attention at MiMo's full-attention layers, depth 64K, a 512-token batch: V*P of one 16-token chunk
    // (256 columns per V over 64K cells: the GEMM's k split) against the whole batch's; the split graph against the
    // unsplit one
    for (int64_t n_tokens : {16, 512}) {
        test_cases.emplace_back(new test_out_prod_kqv(GGML_TYPE_Q4_1, 128, 65536, 4, 16, n_tokens, 1));
    }
    // the largest chunks pp512 gives at the default 256 MiB budget (llama_vq_attn_split_chunks): MiMo's full-attention
    // layers at depth 8K, 32K and 64K (n_kv + 512 cells; 5, 17 and 35 chunks of up to 103, 31 and 15 tokens: 1,648, 496
    // and 240 columns per V), the 8B shape's at 8K and 32K (3 and 9 chunks of up to 171 and 57 tokens, GQA 4: 684 and
    // 228 columns)
    for (auto [n_kv, n_tokens] : std::initializer_list<std::pair<int64_t, int64_t>>{{8192, 103}, {32768, 31}, {65536, 15}}) {
        test_cases.emplace_back(new test_out_prod_kqv(GGML_TYPE_Q4_1, 128, n_kv + 512, 4, 16, n_tokens, 1));
    }
    for (auto [n_kv, n_tokens] : std::initializer_list<std::pair<int64_t, int64_t>>{{8192, 171}, {32768, 57}}) {
        test_cases.emplace_back(new test_out_prod_kqv(GGML_TYPE_Q4_0, 128, n_kv + 512, 8, 4, n_tokens, 1));
    }
    test_cases.emplace_back(new test_attn_split(GGML_TYPE_Q8_0, GGML_TYPE_Q4_1, 192, 128, 64, 4, 65536, 512, false, 1, 16, GGML_TYPE_F16));
    test_cases.emplace_back(new test_attn_split(GGML_TYPE_Q8_0, GGML_TYPE_Q4_1, 192, 128, 64, 4, 65536, 512, false, 1, 16, GGML_TYPE_F16, LLAMA_VQ_ATTN_V_F16));
    test_cases.emplace_back(new test_attn_decode_fused(GGML_TYPE_Q8_0, GGML_TYPE_Q4_1, 192, 128, 64, 4, 65536, 512, false, 0, 1, GGML_TYPE_F16));

    // non-FA attention K*Q at the same shapes: quantized K against f16 K
    for (int64_t n_kv : {8192, 32768}) {
        for (int64_t n_tokens : {1, 512}) {
            for (ggml_type type_k : {GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, GGML_TYPE_F16}) {
                test_cases.emplace_back(new test_mul_mat_kq(type_k, 128, n_kv, 8, 4, n_tokens, 1));
            }
        }
    }
    // MiMo-V2-Flash's full-attention layers (K 192, 4 KV heads, GQA 16): decode and a few tokens; MLA-like GQA 128
    for (int64_t n_kv : {8192, 32768, 65536}) {
        for (int64_t n_tokens : {1, 2, 4}) {
            for (ggml_type type_k : {GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, GGML_TYPE_F16}) {
                test_cases.emplace_back(new test_mul_mat_kq(type_k, 192, n_kv, 4, 16, n_tokens, 1));
            }
        }
    }
    for (ggml_type type_k : {GGML_TYPE_Q4_0, GGML_TYPE_F16}) {
        test_cases.emplace_back(new test_mul_mat_kq(type_k, 576, 32768, 1, 128, 1, 1));
    }
    // llama-vq: K*Q -> softmax -> V*P at decode (fused by ggml-cuda; with LLAMA_VQ_CUDA_FUSED_ATTN=1, else the separate ops):
    // the 8B shape and MiMo's full-attention layers (K 192 / V 128, GQA 16), 1 and 4 tokens; 256 cells: a decode at depth
    // 0 (llama.cpp pads the cells it attends to 256)
    for (int64_t n_kv : {256, 4096, 8192, 32768}) {
        for (int64_t n_tokens : {1, 4}) {
            for (ggml_type type_kv : {GGML_TYPE_Q4_0, GGML_TYPE_Q8_0}) {
                test_cases.emplace_back(new test_attn_decode_fused(type_kv, type_kv, 128, 128, 32, 8, n_kv, n_tokens, false));
                test_cases.emplace_back(new test_attn_decode_fused(type_kv, type_kv, 192, 128, 64, 4, n_kv, n_tokens, true));
            }
        }
    }
    // the deep contexts: 32K, 64K and 128K cells, both shapes, the product's q8_0 K / q4_1 V and the equal pairs, 1 and
    // 4 tokens; MiMo's sliding-window layers (8 KV heads, 768 cells: the window and a batch, padded). perf mode times a
    // case's last node alone (the chain is not fused there): the fused kernels' bandwidth is benchmarks/gpu.sh
    // decode-bandwidth's (llama-bench at depth, ncu)
    for (int64_t n_kv : {32768, 65536, 131072}) {
        for (int64_t n_tokens : {1, 4}) {
            for (auto tkv : {std::make_pair(GGML_TYPE_Q8_0, GGML_TYPE_Q4_1), std::make_pair(GGML_TYPE_Q4_0, GGML_TYPE_Q4_0),
                             std::make_pair(GGML_TYPE_Q8_0, GGML_TYPE_Q8_0)}) {
                test_cases.emplace_back(new test_attn_decode_fused(tkv.first, tkv.second, 128, 128, 32, 8, n_kv, n_tokens, false, 0, 1, GGML_TYPE_F32));
                test_cases.emplace_back(new test_attn_decode_fused(tkv.first, tkv.second, 192, 128, 64, 4, n_kv, n_tokens, true, 0, 1, GGML_TYPE_F32));
            }
        }
    }
    test_cases.emplace_back(new test_attn_decode_fused(GGML_TYPE_Q8_0, GGML_TYPE_Q4_1, 192, 128, 64, 8, 768, 1, true, 0, 1, GGML_TYPE_F32));

    // non-FA attention V*softmax(KQ) at SmolLM2-135M shapes (d_v 64, 3 KV heads, GQA 3) for the CPU backend:
    // quantized row-major V through OUT_PROD against the f16 transposed V through MUL_MAT
    // n_tokens 8: 24 dst columns per V matrix, the tiles of rows; 16 and 512: the dequantize-then-sgemm path
    for (int64_t n_tokens : {1, 8, 16, 512}) {
        for (ggml_type type_v : {GGML_TYPE_Q4_0, GGML_TYPE_Q8_0}) {
            test_cases.emplace_back(new test_out_prod_kqv(type_v, 64, 4096, 3, 3, n_tokens, 1));
        }
        test_cases.emplace_back(new test_mul_mat(GGML_TYPE_F16, GGML_TYPE_F32, 64, n_tokens, 4096, {3, 1}, {3, 1}));
    }
    // and K*Q at the same decode shape, per K cache type
    for (ggml_type type_k : {GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, GGML_TYPE_F16}) {
        test_cases.emplace_back(new test_mul_mat_kq(type_k, 64, 4096, 3, 3, 1, 1));
    }
}
