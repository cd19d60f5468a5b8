// llama-vq server ABI: one request to one of the engine's routes (llama-server's route handlers), its answer or
// its stream; see llama_vq_server.h.

#include "llama_vq_server_impl.h"

using namespace llama_vq_detail;

#if !defined(_WIN32)
#    include <sys/socket.h>
#    include <unistd.h>
#endif

extern "C" {

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

} // extern "C"
