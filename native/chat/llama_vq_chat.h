// llama-vq chat: a small C ABI over llama.cpp's common/chat (templates, tool calls, reasoning).
//
// JSON strings cross the boundary in both directions. Every function that returns `char *` returns a
// NUL-terminated UTF-8 JSON document allocated here; free it with llama_vq_chat_string_free. A failure
// is returned as {"error": {"message": "...", "param": "..." | null}}; no C++ exception escapes and
// nothing aborts on bad input.
//
// Life cycle:
//   templates = llama_vq_chat_templates_init(model, options, &err)   model may be NULL with a template
//   info      = llama_vq_chat_templates_info(templates)              source, caps, thinking support
//   plan      = llama_vq_chat_apply(templates, request)              prompt, grammar, triggers, parser
//   msg       = llama_vq_chat_parse(plan.parser, text, len, partial) one message (OpenAI shape)
//   stream    = llama_vq_chat_stream_new(plan.parser, &err)          then feed(piece) -> deltas ... finish
#pragma once

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#    define LLAMA_VQ_CHAT_API __declspec(dllexport)
#else
#    define LLAMA_VQ_CHAT_API __attribute__((visibility("default")))
#endif

struct llama_model;
struct llama_vq_chat_templates;
struct llama_vq_chat_stream;

// Version of this ABI; bumped on any incompatible change.
LLAMA_VQ_CHAT_API int llama_vq_chat_abi_version(void);

// options_json: {"template": "<builtin name or Jinja source>" (optional: the model's own otherwise),
//                "bos_token": "...", "eos_token": "..." (optional overrides, for model == NULL)}
// Returns NULL on failure and sets *error_json (free it with llama_vq_chat_string_free) when non-NULL.
LLAMA_VQ_CHAT_API struct llama_vq_chat_templates * llama_vq_chat_templates_init(
        const struct llama_model * model,
        const char               * options_json,
        char                    ** error_json);

LLAMA_VQ_CHAT_API void llama_vq_chat_templates_free(struct llama_vq_chat_templates * tmpls);

// {"source": str, "tool_use_source": str|null, "use_jinja": bool, "was_explicit": bool,
//  "caps": {"supports_tools": bool, ...}, "supports_thinking": bool, "builtin_name": str|null}
LLAMA_VQ_CHAT_API char * llama_vq_chat_templates_info(const struct llama_vq_chat_templates * tmpls);

// request_json: an OpenAI chat request subset (messages, tools, tool_choice, parallel_tool_calls,
// response_format, json_schema, grammar, chat_template_kwargs, reasoning_format, enable_thinking,
// reasoning_effort, add_generation_prompt, continue_final_message, stream). See llama_vq/chat.py.
// Two departures from llama-server, both in the grammar: a non-lazy chat grammar has the generation
// prompt (already in the prompt) cut from its root rule, so no prefill is needed unless the cut stops at
// the reasoning start tag (grammar_prefill_tokens / _text then hold the rest, to accept first); and
// tool_choice required/named allows no free text before the calls (tool_calls_strict).
LLAMA_VQ_CHAT_API char * llama_vq_chat_apply(const struct llama_vq_chat_templates * tmpls, const char * request_json);

// Parse model output (text of len bytes) with the "parser" object of an apply result.
// Returns the message {"role": "assistant", "content": ..., "reasoning_content"?, "tool_calls"?}.
LLAMA_VQ_CHAT_API char * llama_vq_chat_parse(const char * parser_json, const char * text, size_t len, int is_partial);

// Streaming: feed pieces of generated text; each call returns {"deltas": [OpenAI delta objects]} that
// concatenate to the message finish returns: {"message": {...}, "deltas": [...], "parse_error": str|null}.
LLAMA_VQ_CHAT_API struct llama_vq_chat_stream * llama_vq_chat_stream_new(const char * parser_json, char ** error_json);
LLAMA_VQ_CHAT_API char * llama_vq_chat_stream_feed(struct llama_vq_chat_stream * stream, const char * text, size_t len);
LLAMA_VQ_CHAT_API char * llama_vq_chat_stream_finish(struct llama_vq_chat_stream * stream);
LLAMA_VQ_CHAT_API void   llama_vq_chat_stream_free(struct llama_vq_chat_stream * stream);

// Names accepted as {"template": NAME} that are llama.cpp's built-in (non-Jinja) templates: JSON array.
LLAMA_VQ_CHAT_API char * llama_vq_chat_builtin_templates(void);

LLAMA_VQ_CHAT_API void llama_vq_chat_string_free(char * str);

// llama.cpp's common log threshold (process-wide): 1 errors only, 2 + warnings (a failed parse logs the
// whole output there), 3 + info (llama.cpp's default), 5 + debug.
LLAMA_VQ_CHAT_API void llama_vq_chat_set_log_verbosity(int verbosity);

#ifdef __cplusplus
}
#endif
