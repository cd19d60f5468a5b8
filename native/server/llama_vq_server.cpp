// llama-vq server ABI: llama-server's engine (server-context) behind a C interface; see llama_vq_server.h.

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

#if !defined(_WIN32)
#    include <sys/socket.h>
#    include <unistd.h>
#endif

namespace {

enum class vq_state { created, loading, ready, sleeping, failed, stopped };

const char * state_name(vq_state s) {
    switch (s) {
        case vq_state::created:  return "created";
        case vq_state::loading:  return "loading";
        case vq_state::ready:    return "ready";
        case vq_state::sleeping: return "sleeping";
        case vq_state::failed:   return "failed";
        case vq_state::stopped:  return "stopped";
    }
    return "failed";
}

const char * split_mode_name(llama_split_mode mode) {
    switch (mode) {
        case LLAMA_SPLIT_MODE_NONE:   return "none";
        case LLAMA_SPLIT_MODE_LAYER:  return "layer";
        case LLAMA_SPLIT_MODE_ROW:    return "row";
        case LLAMA_SPLIT_MODE_TENSOR: return "tensor";
    }
    return "layer";
}

char * dup_string(const std::string & s) {
    char * out = static_cast<char *>(std::malloc(s.size() + 1));
    if (out != nullptr) {
        std::memcpy(out, s.data(), s.size());
        out[s.size()] = '\0';
    }
    return out;
}

void set_error(char ** error_json, const std::string & message) {
    if (error_json != nullptr) {
        *error_json = dup_string(json{{"error", {{"message", message}}}}.dump());
    }
}

// an error response as llama-server's ex_wrapper makes it
server_http_res_ptr error_response(const std::string & message, error_type type) {
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

server_http_res_ptr feature_disabled(const server_http_req &) {
    auto res = std::make_unique<server_http_res>();
    res->status = 403;
    res->data = safe_json_to_str({{"error", {{"message", "this feature is disabled"}, {"type", "feature_disabled"}}}});
    return res;
}

} // namespace

struct llama_vq_server {
    common_params params;

    // as in llama_server(): the MCP manager outlives the tools, the context outlives the routes
    server_mcp mcp_mgr;
    server_context ctx_server;
    std::unique_ptr<server_routes> routes;
    server_tools tools;
    bool has_tools = false;
    std::vector<vq_route> table;

    int swa_type_k = -1;
    int swa_type_v = -1;

    mutable std::mutex mtx;
    vq_state state = vq_state::created;
    json progress = nullptr;
    std::atomic<bool> terminated{false};

    void set_state(vq_state s, json p = nullptr) {
        std::lock_guard<std::mutex> lock(mtx);
        if (state == vq_state::stopped || state == vq_state::failed) {
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

extern "C" {

int llama_vq_server_abi_version(void) {
    return 3;
}

llama_vq_server * llama_vq_server_create(int argc, const char * const * argv, char ** error_json) {
    try {
        std::setlocale(LC_NUMERIC, "C");
        auto srv = std::make_unique<llama_vq_server>();

        common_init();
        std::vector<char *> args;
        for (int i = 0; i < argc; i++) {
            args.push_back(const_cast<char *>(argv[i]));
        }
        args.push_back(nullptr);
        if (!common_params_parse(argc, args.data(), srv->params, LLAMA_EXAMPLE_SERVER)) {
            set_error(error_json, "invalid llama-server arguments (the message above says which)");
            return nullptr;
        }
        if (srv->params.model.path.empty()) {
            set_error(error_json, "no model: pass -m/--model PATH (llama-vq-server serves one model; "
                                  "router mode and -hf downloads are llama-server's alone)");
            return nullptr;
        }

        llama_backend_init();
        llama_numa_init(srv->params.numa);
        server_params_finalize(srv->params, /* is_router_server */ false);
        common_params_print_info(srv->params, true);

        // the stream session manager runs for as long as the routes can reach it (as in llama_server())
        server_stream_session_manager_start();

        srv->routes = std::make_unique<server_routes>(srv->params, srv->ctx_server);
        srv->routes->for_each_route([&](const std::string & method, const std::string & path,
                                        const server_http_context::handler_t & handler) {
            srv->table.push_back({method, path, handler});
        });

        srv->mcp_mgr.start(srv->params);
        if (!srv->params.server_tools.empty() || !srv->mcp_mgr.empty()) {
            srv->tools.setup(srv->params.server_tools, srv->mcp_mgr, srv->params.server_tools_runtime);
            srv->table.push_back({"GET", "/tools", srv->tools.handle_get});
            srv->table.push_back({"POST", "/tools", srv->tools.handle_post});
            srv->has_tools = true;
        } else {
            srv->table.push_back({"GET", "/tools", feature_disabled});
            srv->table.push_back({"POST", "/tools", feature_disabled});
        }

        llama_vq_server * raw = srv.get();
        srv->ctx_server.set_state_callback([raw](server_state state, json payload) {
            switch (state) {
                case SERVER_STATE_LOADING:  raw->set_state(vq_state::loading, std::move(payload)); break;
                case SERVER_STATE_READY:    raw->set_state(vq_state::ready); break;
                case SERVER_STATE_SLEEPING: raw->set_state(vq_state::sleeping); break;
                default: break;
            }
        });
        return srv.release();
    } catch (const std::exception & e) {
        set_error(error_json, e.what());
    } catch (...) {
        set_error(error_json, "unknown error");
    }
    return nullptr;
}

char * llama_vq_server_params(const llama_vq_server * srv) {
    try {
        const common_params & p = srv->params;
        json out = {
            {"host",             p.hostnames.empty() ? std::string("127.0.0.1") : p.hostnames.front()},
            {"hosts",            p.hostnames},
            {"port",             p.port},
            {"api_prefix",       p.api_prefix},
            {"api_keys",         p.api_keys},
            {"cors_origins",     p.cors_origins},
            {"cors_methods",     p.cors_methods},
            {"cors_headers",     p.cors_headers},
            {"cors_credentials", p.cors_credentials},
            {"timeout_read",     p.timeout_read},
            {"timeout_write",    p.timeout_write},
            {"n_parallel",       p.n_parallel},
            {"n_ctx",            p.n_ctx},
            {"split_mode",       split_mode_name(p.split_mode)},
            {"model_path",       p.model.path},
            {"model_alias",      p.model_alias},
            {"slot_save_path",   p.slot_save_path},
            {"sleep_idle_seconds", p.sleep_idle_seconds},
            {"endpoint_metrics", p.endpoint_metrics},
            {"endpoint_slots",   p.endpoint_slots},
            {"endpoint_props",   p.endpoint_props},
            {"ssl",              !p.ssl_file_key.empty() || !p.ssl_file_cert.empty()},
            {"tools",            srv->has_tools},
            {"ui_mcp_proxy",     p.ui_mcp_proxy},
        };
        return dup_string(out.dump());
    } catch (const std::exception & e) {
        return dup_string(json{{"error", {{"message", e.what()}}}}.dump());
    }
}

char * llama_vq_server_routes(const llama_vq_server * srv) {
    json out = json::array();
    for (const auto & r : srv->table) {
        out.push_back({{"method", r.method}, {"path", r.path}});
    }
    return dup_string(out.dump());
}

void llama_vq_server_set_swa_cache_types(llama_vq_server * srv, int type_k, int type_v) {
    srv->swa_type_k = type_k;
    srv->swa_type_v = type_v;
}

int llama_vq_server_load(llama_vq_server * srv) {
    try {
        srv->set_state(vq_state::loading);
        srv->set_swa_env();
        if (!srv->ctx_server.load_model(srv->params)) {
            std::lock_guard<std::mutex> lock(srv->mtx);
            srv->state = vq_state::failed;
            return -1;
        }
        srv->routes->update_meta(srv->ctx_server);
        srv->set_state(vq_state::ready);
        return 0;
    } catch (const std::exception & e) {
        LOG_ERR("llama-vq-server: loading failed: %s\n", e.what());
    } catch (...) {
        LOG_ERR("%s", "llama-vq-server: loading failed\n");
    }
    std::lock_guard<std::mutex> lock(srv->mtx);
    srv->state = vq_state::failed;
    return -1;
}

char * llama_vq_server_kv_cache(const llama_vq_server * srv) {
    try {
        llama_context * ctx = srv->ctx_server.get_llama_context();
        size_t k_bytes = 0;
        size_t v_bytes = 0;
        uint32_t n_cells = 0;
        if (ctx == nullptr || !llama_kv_cache_size(ctx, &k_bytes, &v_bytes, &n_cells)) {
            return nullptr;
        }
        json doc = {
            {"type_k",     ggml_type_name(srv->params.cache_type_k)},
            {"type_v",     ggml_type_name(srv->params.cache_type_v)},
            {"n_cells",    n_cells},
            {"k_bytes",    k_bytes},
            {"v_bytes",    v_bytes},
            {"flash_attn", (int) llama_vq_flash_attn_type(ctx)},
        };
        ggml_type type_k_swa = GGML_TYPE_F16;
        ggml_type type_v_swa = GGML_TYPE_F16;
        size_t swa_k_bytes = 0;
        size_t swa_v_bytes = 0;
        if (llama_vq_kv_cache_swa(ctx, &type_k_swa, &type_v_swa, &swa_k_bytes, &swa_v_bytes)) {
            doc["type_k_swa"]  = ggml_type_name(type_k_swa);
            doc["type_v_swa"]  = ggml_type_name(type_v_swa);
            doc["swa_k_bytes"] = swa_k_bytes;
            doc["swa_v_bytes"] = swa_v_bytes;
        }
        return dup_string(doc.dump());
    } catch (...) {
        return nullptr;
    }
}

char * llama_vq_server_state(const llama_vq_server * srv) {
    std::lock_guard<std::mutex> lock(srv->mtx);
    return dup_string(json{{"state", state_name(srv->state)}, {"progress", srv->progress}}.dump());
}

void llama_vq_server_run(llama_vq_server * srv) {
    try {
        if (!srv->terminated.load()) {
            srv->ctx_server.start_loop();
        }
    } catch (const std::exception & e) {
        LOG_ERR("llama-vq-server: the task loop failed: %s\n", e.what());
    } catch (...) {
        LOG_ERR("%s", "llama-vq-server: the task loop failed\n");
    }
    std::lock_guard<std::mutex> lock(srv->mtx);
    srv->state = vq_state::stopped;
}

void llama_vq_server_terminate(llama_vq_server * srv) {
    srv->terminated.store(true);
    try {
        srv->mcp_mgr.shutdown();
        srv->ctx_server.terminate();
        srv->ctx_server.wake_waiters();
    } catch (...) {
    }
}

void llama_vq_server_stop_tools(llama_vq_server * srv) {
    try {
        srv->mcp_mgr.shutdown();
    } catch (...) {
    }
}

void llama_vq_server_free(llama_vq_server * srv) {
    if (srv == nullptr) {
        return;
    }
    try {
        server_stream_session_manager_stop();
        srv->routes.reset();
        delete srv;
        llama_backend_free();
    } catch (...) {
    }
}

llama_vq_server_call * llama_vq_server_call_new(llama_vq_server * srv, const char * method, const char * route_path,
                                                const char * request_json, const char * body, size_t body_len,
                                                char ** error_json) {
    try {
        const vq_route * route = nullptr;
        for (const auto & r : srv->table) {
            if (r.method == method && r.path == route_path) {
                route = &r;
                break;
            }
        }
        if (route == nullptr) {
            set_error(error_json, std::string("no route ") + method + " " + route_path);
            return nullptr;
        }
        auto call = std::make_unique<llama_vq_server_call>();
        call->srv = srv;
        call->handler = route->handler;
        const json rq = json::parse(request_json != nullptr ? request_json : "{}");
        call->path = json_value(rq, "path", std::string(route_path));
        call->query_string = json_value(rq, "query_string", std::string());
        for (const char * key : {"params", "headers"}) {
            if (!rq.contains(key)) {
                continue;
            }
            auto & dst = std::string(key) == "params" ? call->params : call->headers;
            for (const auto & [name, value] : rq.at(key).items()) {
                dst[name] = value.get<std::string>();
            }
        }
        if (body != nullptr) {
            call->body.assign(body, body_len);
        }
        llama_vq_server_call * raw = call.get();
        call->should_stop = [raw]() {
            return raw->cancelled.load(std::memory_order_relaxed) || raw->srv->terminated.load(std::memory_order_relaxed);
        };
        return call.release();
    } catch (const std::exception & e) {
        set_error(error_json, e.what());
    } catch (...) {
        set_error(error_json, "unknown error");
    }
    return nullptr;
}

void llama_vq_server_call_add_file(llama_vq_server_call * call, const char * field, const char * filename,
                                   const char * content_type, const void * data, size_t len) {
    try {
        const auto * bytes = static_cast<const uint8_t *>(data);
        call->files[field] = uploaded_file{raw_buffer(bytes, bytes + len), filename, content_type};
    } catch (...) {
    }
}

int llama_vq_server_call_run(llama_vq_server_call * call) {
    call->req.reset(new server_http_req{
        call->params, call->headers, call->path, call->query_string, call->body, call->files, call->should_stop});
    try {
        call->res = call->handler(*call->req);
        if (call->res == nullptr) {
            call->res = error_response("empty response from handler", ERROR_TYPE_SERVER);
        }
    } catch (const std::exception & e) {
        // as llama-server's ex_wrapper: the client's mistakes are 400, anything else 500
        // (patch 0020-server-client-errors-are-4xx)
        call->res = error_response(e.what(), exception_error_type(e));
    } catch (...) {
        call->res = error_response("unknown error", ERROR_TYPE_SERVER);
    }
    if (call->res->is_stream()) {
        call->res->headers["X-Accel-Buffering"] = "no";   // as llama-server: proxies must not buffer a stream
    }
    try {
        call->head = safe_json_to_str({
            {"status",       call->res->status},
            {"content_type", call->res->content_type},
            {"headers",      call->res->headers},
            {"stream",       call->res->is_stream()},
        });
    } catch (...) {
        call->head = "{\"status\": 500, \"content_type\": \"application/json\", \"headers\": {}, \"stream\": false}";
    }
    return call->res->status;
}

const char * llama_vq_server_call_head(llama_vq_server_call * call) {
    return call->head.c_str();
}

void llama_vq_server_call_body(llama_vq_server_call * call, const char ** data, size_t * len) {
    *data = call->res ? call->res->data.data() : "";
    *len = call->res ? call->res->data.size() : 0;
}

int llama_vq_server_call_stream_fd(llama_vq_server_call * call) {
#if defined(_WIN32)
    (void) call;
    return -1;
#else
    if (!call->res || !call->res->is_stream() || call->pump.joinable()) {
        return -1;
    }
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
        return -1;
    }
    // as llama-server's HTTP thread: res->next() until the stream ends, each chunk written as it comes (a full
    // socket blocks the writer, as a slow client does there); the reader closing its end ends the loop too
    call->pump = std::thread([call, fd = fds[1]] {
        std::string chunk;
        for (bool more = true; more;) {
            chunk.clear();
            try {
                more = call->res->next(chunk);
            } catch (const std::exception & e) {
                chunk = format_oai_sse(json{{"error", format_error_response(e.what(), ERROR_TYPE_SERVER)}});
                more = false;
            } catch (...) {
                more = false;
            }
            for (size_t off = 0; off < chunk.size();) {
                const ssize_t n = send(fd, chunk.data() + off, chunk.size() - off, MSG_NOSIGNAL);
                if (n < 0 && errno == EINTR) {
                    continue;
                }
                if (n <= 0) {
                    more = false;
                    break;
                }
                off += (size_t) n;
            }
        }
        close(fd);
    });
    return fds[0];
#endif
}

void llama_vq_server_call_cancel(llama_vq_server_call * call) {
    call->cancelled.store(true);
    // the handler waiting for this call's results checks should_stop() now, not at its next 1 s poll
    // (patch 0021-server-wake-waiting-handlers)
    call->srv->ctx_server.wake_waiters();
}

void llama_vq_server_call_free(llama_vq_server_call * call) {
    if (call == nullptr) {
        return;
    }
    if (call->pump.joinable()) {   // its res->next() returns at once now, and its send() fails once the reader has closed
        llama_vq_server_call_cancel(call);
        call->pump.join();
    }
    try {
        if (call->res) {
            call->res->on_complete();
        }
        call->res.reset();
        call->req.reset();
    } catch (...) {
    }
    delete call;
}

void llama_vq_server_string_free(char * str) {
    std::free(str);
}

} // extern "C"
