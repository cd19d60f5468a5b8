// Internal declarations shared by the llama-vq chat sources (not part of the C ABI).
#pragma once

#include "chat.h"
#include "json.h"
#include "llama.h"

#include <mutex>
#include <set>
#include <stdexcept>
#include <string>

namespace llama_vq_chat {

using json = common_json;

// A request the caller can fix: becomes {"error": {"message", "param"}}.
struct request_error : std::runtime_error {
    std::string param;

    request_error(const std::string & message, std::string param) :
        std::runtime_error(message),
        param(std::move(param)) {}
};

struct templates {
    common_chat_templates_ptr tmpls;
    const llama_model *       model             = nullptr;
    bool                      use_jinja         = true;
    bool                      supports_thinking = false;
    std::string               builtin_name;  // set when a non-Jinja built-in template was asked for
    std::mutex                mutex;         // one render at a time per template set
};

// request.cpp: validate an OpenAI chat request, render it, describe grammar and parser.
json apply_request(templates & t, const json & request);

// grammar.cpp: triggers, prefill, load check, strict "required" (see each definition).
int  single_token(const llama_vocab * vocab, const std::string & text);  // -1 unless exactly one token
void describe_triggers(const common_chat_params & cp, const llama_vocab * vocab, const std::set<int> & preserved,
                       json & out);
json prefill_tokens(const llama_vocab * vocab, const std::string & generation_prompt);
void check_grammar(const llama_vocab * vocab, const std::string & gbnf, bool lazy, const json & patterns,
                   const json & tokens, const std::string & param);
bool   strict_required(std::string & gbnf, const std::string & thinking_start);
size_t cut_generation_prompt(std::string & gbnf, const std::string & generation_prompt,
                             const std::string & thinking_start);

// parse.cpp: parser state <-> common_chat_parser_params, message JSON, tool call ids.
common_chat_parser_params parser_params_from_json(const json & state);
json                      message_to_json(const common_chat_msg & msg);
std::string               random_tool_call_id();

}  // namespace llama_vq_chat
