#pragma once

// llama-vq: where each layer's attention runs, as the scheduler places it.
//
// A layer's attention is the ops that read its K/V cache (the cache store, flash attention, K*Q, V*P, the split
// chain's views and copies) and every op computed from them up to the output projection (the first matrix
// product that also reads a model weight). Each of them should run on the device that holds the layer's cache:
// when a backend lacks a kernel for the cache's types or shapes, the scheduler quietly moves the op to another
// backend (the CPU), copies the cache there on every batch, and the layer runs many times slower. The walk below
// finds those ops in a reserved graph (ggml_backend_sched_split_graph has assigned every node a backend), so a
// context can refuse such a mode, or "auto" can pass it over, before any batch runs.
//
// LLAMA_VQ_ATTN_UNSUPPORTED (tests): a comma-separated list of ggml op names (FLASH_ATTN_EXT, MUL_MAT, OUT_PROD
// ...) treated as unsupported on the layers' devices, as a backend without those kernels would be.
//
// Header-only: built into libllama (llama-context.cpp).

#include "ggml.h"
#include "ggml-backend.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

// a layer's cache as the graph reads it
struct llama_vq_attn_cache {
    ggml_type          type_k = GGML_TYPE_COUNT;
    ggml_type          type_v = GGML_TYPE_COUNT;
    ggml_backend_dev_t dev    = nullptr; // the device of the cache's buffer (nullptr: not allocated)
};

// one op of a layer's attention placed off the device that holds the layer's cache
struct llama_vq_attn_miss {
    int32_t     il;
    std::string op;     // ggml_op_name
    std::string placed; // where the scheduler put it
};

// the layer of a KV cache tensor ("cache_k_l12", "cache_v_l3", a tag after "cache_" allowed); -1 for any other
static int32_t llama_vq_cache_layer(const ggml_tensor * t, bool * is_v) {
    if (t == nullptr || strncmp(t->name, "cache_", 6) != 0) {
        return -1;
    }
    const char * p = strrchr(t->name, '_');
    if (p == nullptr || p - t->name < 7 || p[1] != 'l' || (p[-1] != 'k' && p[-1] != 'v')) {
        return -1;
    }
    char * end = nullptr;
    const long il = strtol(p + 2, &end, 10);
    if (end == p + 2 || *end != '\0' || il < 0) {
        return -1;
    }
    *is_v = p[-1] == 'v';
    return (int32_t) il;
}

static bool llama_vq_attn_injected(const ggml_tensor * node) {
    const char * env = getenv("LLAMA_VQ_ATTN_UNSUPPORTED");
    if (env == nullptr || env[0] == '\0') {
        return false;
    }
    const std::string list = std::string(",") + env + ",";
    const std::string op   = std::string(",") + ggml_op_name(node->op) + ",";
    return list.find(op) != std::string::npos;
}

static bool llama_vq_is_view_op(enum ggml_op op) {
    return op == GGML_OP_NONE || op == GGML_OP_VIEW || op == GGML_OP_RESHAPE || op == GGML_OP_PERMUTE ||
           op == GGML_OP_TRANSPOSE;
}

// walks a graph split by the scheduler: records each layer's cache (types, device) in caches and appends to misses
// the attention ops (one per layer and op name) placed off an accelerator that holds their layer's cache, or
// named by LLAMA_VQ_ATTN_UNSUPPORTED
static void llama_vq_attn_walk(ggml_cgraph * gf, ggml_backend_sched_t sched,
                               std::map<int32_t, llama_vq_attn_cache> & caches,
                               std::vector<llama_vq_attn_miss> & misses) {
    std::unordered_map<const ggml_tensor *, int32_t> layer_of;
    const int n_nodes = ggml_graph_n_nodes(gf);
    for (int i = 0; i < n_nodes; ++i) {
        ggml_tensor * node = ggml_graph_node(gf, i);
        int32_t il = -1;
        bool reads_weight = false;
        for (int j = 0; j < GGML_MAX_SRC; ++j) {
            const ggml_tensor * src = node->src[j];
            if (src == nullptr) {
                continue;
            }
            const ggml_tensor * root = src->view_src != nullptr ? src->view_src : src;
            bool is_v = false;
            const int32_t l = llama_vq_cache_layer(root, &is_v);
            if (l >= 0) {
                il = l;
                llama_vq_attn_cache & c = caches[l];
                (is_v ? c.type_v : c.type_k) = root->type;
                if (root->buffer != nullptr) {
                    ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(root->buffer);
                    c.dev = ggml_backend_buft_get_device(buft);
                    if (c.dev == nullptr && ggml_backend_buft_is_host(buft)) {
                        c.dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU); // the CPU's own type has none
                    }
                }
                continue;
            }
            const auto it = layer_of.find(src);
            if (it != layer_of.end()) {
                il = it->second;
            }
            if (root->buffer != nullptr && ggml_backend_buffer_get_usage(root->buffer) == GGML_BACKEND_BUFFER_USAGE_WEIGHTS) {
                reads_weight = true;
            }
        }
        if (il < 0) {
            continue;
        }
        if (reads_weight && (node->op == GGML_OP_MUL_MAT || node->op == GGML_OP_MUL_MAT_ID)) {
            continue; // the output projection: the attention ends before it
        }
        layer_of[node] = il;
        if (llama_vq_is_view_op(node->op)) {
            continue;
        }
        const llama_vq_attn_cache & c = caches[il];
        if (c.dev == nullptr) {
            continue;
        }
        ggml_backend_t     backend = ggml_backend_sched_get_tensor_backend(sched, node);
        ggml_backend_dev_t placed  = backend != nullptr ? ggml_backend_get_device(backend) : nullptr;
        std::string where;
        if (llama_vq_attn_injected(node)) {
            where = "no device (support removed by LLAMA_VQ_ATTN_UNSUPPORTED)";
        } else if (placed != nullptr && placed != c.dev && ggml_backend_dev_type(c.dev) != GGML_BACKEND_DEVICE_TYPE_CPU) {
            where = ggml_backend_dev_name(placed);
        } else {
            continue;
        }
        bool seen = false;
        for (const auto & m : misses) {
            seen = seen || (m.il == il && m.op == ggml_op_name(node->op));
        }
        if (!seen) {
            misses.push_back({ il, ggml_op_name(node->op), where });
        }
    }
}
