// Parser state (what apply returns under "parser") <-> common_chat_parser_params; message JSON.

#include "chat_internal.h"

#include <random>
#include <string>

namespace llama_vq_chat {

common_chat_parser_params parser_params_from_json(const json & state) {
    if (!state.is_object()) {
        throw request_error("the parser state must be the object apply returned under \"parser\"", "parser");
    }
    common_chat_parser_params p;
    const int format = state.value("format", 0);
    if (format < 0 || format >= COMMON_CHAT_FORMAT_COUNT) {
        throw request_error("unknown chat format " + std::to_string(format), "parser.format");
    }
    p.format               = (common_chat_format) format;
    p.generation_prompt    = state.value("generation_prompt", std::string());
    p.reasoning_format     = common_reasoning_format_from_name(state.value("reasoning_format", std::string("deepseek")));
    p.reasoning_in_content = state.value("reasoning_in_content", false);
    p.parse_tool_calls     = state.value("parse_tool_calls", true);
    p.is_continuation      = state.value("is_continuation", false);
    const std::string parser = state.value("parser", std::string());
    if (!parser.empty()) {
        try {
            p.parser.load(parser);
        } catch (const std::exception & e) {
            throw request_error(std::string("the serialized parser does not load: ") + e.what(), "parser.parser");
        }
    }
    return p;
}

json message_to_json(const common_chat_msg & msg) {
    json out       = json::object();
    out["role"]    = "assistant";
    out["content"] = msg.content;
    if (!msg.reasoning_content.empty()) {
        out["reasoning_content"] = msg.reasoning_content;
    }
    if (!msg.tool_calls.empty()) {
        json calls = json::array();
        for (const auto & tc : msg.tool_calls) {
            json fn         = json::object();
            fn["name"]      = tc.name;
            fn["arguments"] = tc.arguments;
            json call       = json::object();
            call["id"]       = tc.id;
            call["type"]     = "function";
            call["function"] = fn;
            calls.push_back(call);
        }
        out["tool_calls"] = calls;
    }
    return out;
}

// OpenAI-style ids are opaque; llama-server uses 32 random alphanumerics, so do we.
std::string random_tool_call_id() {
    static const char           chars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    thread_local std::mt19937_64 rng{ std::random_device{}() };
    std::uniform_int_distribution<int> dist(0, (int) sizeof(chars) - 2);
    std::string id;
    for (int i = 0; i < 32; i++) {
        id += chars[dist(rng)];
    }
    return id;
}

}  // namespace llama_vq_chat
