// llama-vq server ABI, internal: the engine and call objects behind llama_vq_server.h, shared by
// llama_vq_server.cpp (the engine: create, load, run, stop) and llama_vq_server_call.cpp (one request to a route).
#pragma once

#include "llama_vq_server.h"

#include "server-common.h"
#include "server-context.h"
#include "server-http.h"
#include "server-mcp.h"
#include "server-stream.h"
#include "server-tools.h"

#include "arg.h"
#include "common.h"
#include "llama.h"
#include "log.h"

#include <atomic>
#include <cerrno>
#include <clocale>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace llama_vq_detail {

enum class vq_state { created, loading, ready, sleeping, failed, stopped };

inline char * dup_string(const std::string & s) {
    char * out = static_cast<char *>(std::malloc(s.size() + 1));
    if (out != nullptr) {
        std::memcpy(out, s.data(), s.size());
        out[s.size()] = '\0';
    }
    return out;
}

inline void set_error(char ** error_json, const std::string & message) {
    if (error_json != nullptr) {
        *error_json = dup_string(json{{"error", {{"message", message}}}}.dump());
    }
}

// an error response as llama-server's ex_wrapper makes it
inline server_http_res_ptr error_response(const std::string & message, error_type type) {
    auto res = std::make_unique<server_http_res>();
    json err = format_error_response(message, type);
    res->status = json_value(err, "code", 500);
    res->data = safe_json_to_str({{"error", err}});
    return res;
}

// what llama_vq_server_routes lists (method + path) and what serves it
struct vq_route {
    std::string method;
    std::string path;
    server_http_context::handler_t handler;
};

} // namespace llama_vq_detail

struct llama_vq_server {
    common_params params;

    // as in llama_server(): the MCP manager outlives the tools, the context outlives the routes
    server_mcp mcp_mgr;
    server_context ctx_server;
    std::unique_ptr<server_routes> routes;
    server_tools tools;
    bool has_tools = false;
    std::vector<llama_vq_detail::vq_route> table;

    int swa_type_k = -1;
    int swa_type_v = -1;

    // what -fa auto was resolved from (llama_vq.attn_choice, as JSON: mode, how, why, timings); /props carries it
    std::string attn_choice;

    mutable std::mutex mtx;
    llama_vq_detail::vq_state state = llama_vq_detail::vq_state::created;
    json progress = nullptr;
    std::atomic<bool> terminated{false};

    void set_state(llama_vq_detail::vq_state s, json p = nullptr) {
        std::lock_guard<std::mutex> lock(mtx);
        if (state == llama_vq_detail::vq_state::stopped || state == llama_vq_detail::vq_state::failed) {
            return;
        }
        state = s;
        progress = std::move(p);
    }

    // the SWA cache types reach every context this server creates (llama-server's -fit probe, the context itself,
    // each wake from sleep, a draft model's) through libllama's LLAMA_VQ_CACHE_TYPE_K_SWA / _V_SWA (patch
    // 0010-llama-swa-layer-cache-types): its per-thread setter is consumed by the first context created, which with
    // -fit on is the fit's probe
    void set_swa_env() const {
        if (swa_type_k >= 0) {
            setenv("LLAMA_VQ_CACHE_TYPE_K_SWA", ggml_type_name((ggml_type) swa_type_k), 1);
        }
        if (swa_type_v >= 0) {
            setenv("LLAMA_VQ_CACHE_TYPE_V_SWA", ggml_type_name((ggml_type) swa_type_v), 1);
        }
    }
};

struct llama_vq_server_call {
    llama_vq_server * srv = nullptr;
    server_http_context::handler_t handler;

    std::atomic<bool> cancelled{false};
    std::function<bool()> should_stop;   // referenced by req: declared before it
    std::string path;
    std::string query_string;
    std::map<std::string, std::string> params;
    std::map<std::string, std::string> headers;
    std::string body;
    std::map<std::string, uploaded_file> files;

    std::unique_ptr<server_http_req> req;
    server_http_res_ptr res;
    std::string head;
    std::thread pump;   // a stream's reader (call_stream_fd), joined by call_free
};
