// llama-vq server ABI: llama-server's engine (server-context) behind a C interface; see llama_vq_server.h.
// The engine's life here; one request to one of its routes in llama_vq_server_call.cpp.

#include "llama_vq_server_impl.h"

#include <sstream>

using namespace llama_vq_detail;

namespace {

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

server_http_res_ptr feature_disabled(const server_http_req &) {
    auto res = std::make_unique<server_http_res>();
    res->status = 403;
    res->data = safe_json_to_str({{"error", {{"message", "this feature is disabled"}, {"type", "feature_disabled"}}}});
    return res;
}

} // namespace

// each distinct layer kind's attention (llama_vq_attn_layers), for /props and the start-up line
static json attention_layers(llama_context * ctx) {
    json out = json::array();
    std::istringstream rows(llama_vq_attn_layers(ctx));
    std::string row;
    while (std::getline(rows, row)) {
        std::vector<std::string> f;
        std::istringstream cols(row);
        std::string col;
        while (std::getline(cols, col, '\t')) {
            f.push_back(col);
        }
        if (f.size() == 7) {
            out.push_back({{"kind", f[0]}, {"prompt", f[1]}, {"decode", f[2]}, {"type_k", f[3]}, {"type_v", f[4]},
                           {"device", f[5]}, {"n_layers", std::stoi(f[6])}});
        }
    }
    return out;
}

static const char * attention_mode_name(enum llama_flash_attn_type t) {
    switch (t) {
        case LLAMA_FLASH_ATTN_TYPE_ENABLED:  return "on";
        case LLAMA_FLASH_ATTN_TYPE_DISABLED: return "off";
        case LLAMA_FLASH_ATTN_TYPE_PREFILL:  return "prefill";
        default:                             return "auto";
    }
}

// GET /props with llama-vq's "attention": the mode, why (the front end's choice for -fa auto), and each layer kind
static server_http_res_ptr with_attention(const llama_vq_server * srv, server_http_res_ptr res) {
    llama_context * ctx = srv->ctx_server.get_llama_context();
    if (res == nullptr || res->status != 200 || res->next != nullptr || ctx == nullptr) {
        return res;
    }
    try {
        json doc = json::parse(res->data);
        if (!doc.is_object()) {
            return res;
        }
        doc["attention"] = {
            {"mode",   attention_mode_name(llama_vq_flash_attn_type(ctx))},
            {"choice", srv->attn_choice.empty() ? json(nullptr) : json::parse(srv->attn_choice)},
            {"layers", attention_layers(ctx)},
        };
        res->data = safe_json_to_str(doc);
    } catch (...) {
        // a body that is not JSON (common_json_error) goes out as the engine made it
    }
    return res;
}

extern "C" {

int llama_vq_server_abi_version(void) {
    return 4;
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
        llama_vq_server * self = srv.get();
        srv->routes->for_each_route([&](const std::string & method, const std::string & path,
                                        const server_http_context::handler_t & handler) {
            if (method == "GET" && path == "/props") {
                srv->table.push_back({method, path, [self, handler](const server_http_req & req) {
                    return with_attention(self, handler(req));
                }});
                return;
            }
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
            {"flash_attn_type",  (int) p.flash_attn_type},
            {"cache_type_k",     (int) p.cache_type_k},
            {"cache_type_v",     (int) p.cache_type_v},
            {"n_ubatch",         p.n_ubatch},
            {"n_gpu_layers",     p.n_gpu_layers},
            {"n_threads",        p.cpuparams.n_threads},
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

void llama_vq_server_set_attn_choice(llama_vq_server * srv, const char * choice_json) {
    srv->attn_choice = choice_json != nullptr ? choice_json : "";
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
            {"attn_layers", attention_layers(ctx)},
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

void llama_vq_server_string_free(char * str) {
    std::free(str);
}

} // extern "C"
