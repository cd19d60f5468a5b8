// llama-vq server: a small C ABI over llama-server's own engine (tools/server's server-context library).
//
// The HTTP front end (llama-vq-server, FastAPI) owns sockets, authentication, CORS, limits and lifecycle;
// this library owns everything llama-server does behind its routes: slots, continuous batching, the prompt
// cache, SWA checkpoints, speculative decoding, the chat layer and every endpoint's semantics. Route
// handlers are upstream's (server_routes::for_each_route, patch 0015-server-route-table-and-param-defaults),
// called with a request built here.
//
// Strings returned as `char *` are NUL-terminated UTF-8 JSON allocated here: free them with
// llama_vq_server_string_free. Pointers returned as `const char *` belong to their object. No C++ exception
// crosses this boundary: a failing handler becomes a JSON error response ({"error": {"code", "message",
// "type"}}, llama-server's shape and status codes: 400 for the client's mistakes, 500 for the rest), a failing
// call of this ABI returns NULL / -1 and an error document where it takes `char ** error_json`.
//
// Threads: create, load, run and the calls may each be on a thread of their own. load() and run() block;
// call_run() blocks until the engine answers; cancel() from any thread makes them return at once,
// and freeing the call then cancels its tasks, whose slots the task loop frees at its next iteration.
#pragma once

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#    define LLAMA_VQ_SERVER_API __declspec(dllexport)
#else
#    define LLAMA_VQ_SERVER_API __attribute__((visibility("default")))
#endif

struct llama_vq_server;
struct llama_vq_server_call;

// Version of this ABI; bumped on any incompatible change.
LLAMA_VQ_SERVER_API int llama_vq_server_abi_version(void);

// Parse llama-server's command line (argv[0] is the program name) with llama.cpp's own parser for the
// server (common_params_parse, LLAMA_EXAMPLE_SERVER: every llama-server flag and LLAMA_ARG_* variable).
// On failure returns NULL and sets *error_json (the parser has printed its own message to stderr).
// Note: --help, --usage and --version print and exit the process, as llama-server does.
LLAMA_VQ_SERVER_API struct llama_vq_server * llama_vq_server_create(int argc, const char * const * argv,
                                                                    char ** error_json);

// What the front end needs of the parsed parameters: {"host", "port", "api_prefix", "api_keys": [...],
// "cors_origins", "cors_methods", "cors_headers", "cors_credentials", "timeout_read", "timeout_write",
// "n_parallel", "n_ctx", "split_mode": "none"|"layer"|"row"|"tensor", "model_path", "model_alias": [...],
// "slot_save_path", "sleep_idle_seconds", "endpoint_metrics", "endpoint_slots", "endpoint_props", "ssl",
// "tools": bool, "ui_mcp_proxy": bool (--ui-mcp-proxy: the front end serves /cors-proxy), "flash_attn_type"
// (-1 auto, 0 off, 1 on, 2 prefill), "cache_type_k", "cache_type_v" (ggml type ids), "n_ubatch", "n_gpu_layers",
// "n_threads"}.
LLAMA_VQ_SERVER_API char * llama_vq_server_params(const struct llama_vq_server * srv);

// The routes, in llama-server's registration order: [{"method": "GET"|"POST"|"DELETE", "path": "/slots/:id_slot"}].
LLAMA_VQ_SERVER_API char * llama_vq_server_routes(const struct llama_vq_server * srv);

// The sliding-window layers' own cache types (ggml type ids; -1 = the full layers' type), for every context
// this server creates (llama-server's -fit probe, the context, each wake from --sleep-idle-seconds), through
// libllama's LLAMA_VQ_CACHE_TYPE_K_SWA / _V_SWA of this process. Before load().
LLAMA_VQ_SERVER_API void llama_vq_server_set_swa_cache_types(struct llama_vq_server * srv, int type_k, int type_v);

// What -fa auto was resolved from, as JSON (the front end's measured or cached choice: mode, how, why, timings);
// GET /props carries it under "attention" with the mode and each layer kind's paths, types and device. Before load().
LLAMA_VQ_SERVER_API void llama_vq_server_set_attn_choice(struct llama_vq_server * srv, const char * choice_json);

// Load the model(s) and create the contexts. Blocks; returns 0 on success, -1 on failure.
LLAMA_VQ_SERVER_API int llama_vq_server_load(struct llama_vq_server * srv);

// {"state": "created"|"loading"|"ready"|"sleeping"|"failed"|"stopped", "progress": {...} | null}
LLAMA_VQ_SERVER_API char * llama_vq_server_state(const struct llama_vq_server * srv);

// The KV cache of the loaded context, for the start-up line: {"type_k", "type_v": ggml type names, "n_cells",
// "k_bytes", "v_bytes", "flash_attn": 0 off | 1 on | 2 prefill mode (llama_vq_flash_attn_type), "attn_layers": [{"kind":
// "full"|"swa"|"mtp", "prompt", "decode": "flash"|"llama-vq", "type_k", "type_v", "device", "n_layers"}], and for an iSWA
// model "type_k_swa", "type_v_swa", "swa_k_bytes", "swa_v_bytes" (their share of k_bytes, v_bytes)}; NULL before
// a successful load() or when the memory is not a KV cache. Free with llama_vq_server_string_free.
LLAMA_VQ_SERVER_API char * llama_vq_server_kv_cache(const struct llama_vq_server * srv);

// The task loop (slots, batching). Blocks until terminate(); call after a successful load().
LLAMA_VQ_SERVER_API void llama_vq_server_run(struct llama_vq_server * srv);

// Unblock run(); pending and later calls end as cancelled. Any thread.
LLAMA_VQ_SERVER_API void llama_vq_server_terminate(struct llama_vq_server * srv);

// Stop the MCP servers (--mcp-servers-*) now, as llama-server does first on SIGTERM: a tool call waiting for one
// returns at once with an error, so that the drain does not wait for it. Any thread; terminate() does it too.
LLAMA_VQ_SERVER_API void llama_vq_server_stop_tools(struct llama_vq_server * srv);

// Free everything (after run() returned, or when it never started). Calls must be freed first.
LLAMA_VQ_SERVER_API void llama_vq_server_free(struct llama_vq_server * srv);

// One request to the handler of route (method, route_path) as llama_vq_server_routes lists it.
// request_json: {"path": the request's path, "query_string": "a=1&b=2", "params": {query and path parameters},
// "headers": {name: value}}; body: body_len bytes (a multipart form's fields as a JSON object, as llama-server
// turns them). Returns NULL (and *error_json) for an unknown route.
LLAMA_VQ_SERVER_API struct llama_vq_server_call * llama_vq_server_call_new(
        struct llama_vq_server * srv, const char * method, const char * route_path, const char * request_json,
        const char * body, size_t body_len, char ** error_json);

// An uploaded file (multipart form), before call_run.
LLAMA_VQ_SERVER_API void llama_vq_server_call_add_file(struct llama_vq_server_call * call, const char * field,
                                                       const char * filename, const char * content_type,
                                                       const void * data, size_t len);

// Run the handler. Blocks (a non-streaming completion: until it is done). Returns the HTTP status.
LLAMA_VQ_SERVER_API int llama_vq_server_call_run(struct llama_vq_server_call * call);

// After call_run: {"status": int, "content_type": str, "headers": {...}, "stream": bool}.
LLAMA_VQ_SERVER_API const char * llama_vq_server_call_head(struct llama_vq_server_call * call);

// After call_run, a response that is not a stream: its body.
LLAMA_VQ_SERVER_API void llama_vq_server_call_body(struct llama_vq_server_call * call, const char ** data, size_t * len);

// After call_run, a response that is a stream: a socket (the caller's to close) from which the stream's bytes are
// read as the engine makes them, the end of the stream being its end of file. A thread of the call writes them, as
// llama-server's HTTP thread writes to its client; closing the socket before the end stops it at its next chunk.
// -1 when the response is not a stream, or the socket cannot be made (errno says why), or on Windows.
LLAMA_VQ_SERVER_API int llama_vq_server_call_stream_fd(struct llama_vq_server_call * call);

// The client is gone: should_stop() is true from now on, and a call_run() or a stream waiting for results
// returns now. Any thread.
LLAMA_VQ_SERVER_API void llama_vq_server_call_cancel(struct llama_vq_server_call * call);

// Completes the response (upstream's on_complete) and frees the call; a stream's thread is cancelled and joined
// first, so close its socket before (a full socket that nobody reads would hold the thread in send()).
LLAMA_VQ_SERVER_API void llama_vq_server_call_free(struct llama_vq_server_call * call);

LLAMA_VQ_SERVER_API void llama_vq_server_string_free(char * str);

#ifdef __cplusplus
}
#endif
