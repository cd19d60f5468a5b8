// OpenAI chat request -> common_chat_templates_inputs -> rendered prompt, grammar, triggers, parser.
//
// The checks here name the field at fault (param "messages[3].tool_calls[0].function.arguments") so a
// server can answer 400 with it; common/chat's own messages say what is wrong but not where.

#include "chat_internal.h"

#include "common.h"
#include "json-schema-to-grammar.h"

#include <map>
#include <set>
#include <string>
#include <vector>

namespace llama_vq_chat {

namespace {

std::string idx(const std::string & base, size_t i) {
    return base + "[" + std::to_string(i) + "]";
}

bool has(const json & obj, const char * key) {
    return obj.is_object() && obj.contains(key) && !obj.at(key).is_null();
}

const std::string & require_string(const json & obj, const char * key, const std::string & param, std::string & tmp) {
    if (!has(obj, key)) {
        throw request_error(param + " is missing", param);
    }
    const json & v = obj.at(key);
    if (!v.is_string()) {
        throw request_error(param + " must be a string, got " + v.dump(), param);
    }
    tmp = v.get<std::string>();
    return tmp;
}

// content: a string, or an array of {"type": "text", "text": str} parts
json check_content(const json & content, const std::string & param) {
    if (content.is_string()) {
        return content;
    }
    if (!content.is_array()) {
        throw request_error(param + " must be a string or an array of text parts, got " + content.dump(), param);
    }
    json parts = json::array();
    for (size_t k = 0; k < content.size(); k++) {
        const json & part = content.at(k);
        const auto   p    = idx(param, k);
        std::string  tmp;
        if (!part.is_object()) {
            throw request_error(p + " must be an object {\"type\": \"text\", \"text\": ...}", p);
        }
        const auto type = require_string(part, "type", p + ".type", tmp);
        if (type != "text") {
            throw request_error(p + ".type '" + type + "' is not supported: this server takes text content only",
                                p + ".type");
        }
        json out       = json::object();
        out["type"]    = "text";
        out["text"]    = require_string(part, "text", p + ".text", tmp);
        parts.push_back(out);
    }
    return parts;
}

json check_tool_calls(const json & calls, const std::string & param) {
    if (!calls.is_array()) {
        throw request_error(param + " must be an array, got " + calls.dump(), param);
    }
    json out = json::array();
    for (size_t j = 0; j < calls.size(); j++) {
        const json & tc  = calls.at(j);
        const auto   p   = idx(param, j);
        std::string  tmp;
        if (!tc.is_object()) {
            throw request_error(p + " must be an object", p);
        }
        if (has(tc, "type") && require_string(tc, "type", p + ".type", tmp) != "function") {
            throw request_error(p + ".type must be \"function\", got '" + tmp + "'", p + ".type");
        }
        if (!has(tc, "function") || !tc.at("function").is_object()) {
            throw request_error(p + ".function is missing (an object with name and arguments)", p + ".function");
        }
        const json & fn   = tc.at("function");
        const auto   name = require_string(fn, "name", p + ".function.name", tmp);
        if (name.empty()) {
            throw request_error(p + ".function.name is empty", p + ".function.name");
        }
        std::string args = "{}";
        if (has(fn, "arguments")) {
            const json & a = fn.at("arguments");
            if (a.is_string()) {
                args = a.get<std::string>();
                if (json::parse_no_throw(args).is_discarded() || !json::parse(args).is_object()) {
                    throw request_error(p + ".function.arguments must be a JSON object encoded as a string, got " +
                                            a.dump(), p + ".function.arguments");
                }
            } else if (a.is_object()) {
                args = a.dump();
            } else {
                throw request_error(p + ".function.arguments must be a string (JSON object), got " + a.dump(),
                                    p + ".function.arguments");
            }
        }
        json f         = json::object();
        f["name"]      = name;
        f["arguments"] = args;
        json call      = json::object();
        call["type"]   = "function";
        call["function"] = f;
        if (has(tc, "id")) {
            call["id"] = require_string(tc, "id", p + ".id", tmp);
        }
        out.push_back(call);
    }
    return out;
}

json check_message(const json & m, size_t i) {
    const auto  p = idx("messages", i);
    std::string tmp;
    if (!m.is_object()) {
        throw request_error(p + " must be an object with a role", p);
    }
    const std::string role = require_string(m, "role", p + ".role", tmp);
    static const std::set<std::string> roles = { "system", "developer", "user", "assistant", "tool" };
    if (!roles.count(role)) {
        throw request_error(p + ".role '" + role + "' is not one of system, developer, user, assistant, tool",
                            p + ".role");
    }
    json out    = json::object();
    out["role"] = role;
    if (has(m, "content")) {
        out["content"] = check_content(m.at("content"), p + ".content");
    }
    if (has(m, "tool_calls")) {
        if (role != "assistant") {
            throw request_error(p + ".tool_calls is only allowed in assistant messages", p + ".tool_calls");
        }
        json calls = check_tool_calls(m.at("tool_calls"), p + ".tool_calls");
        if (!calls.empty()) {
            out["tool_calls"] = calls;
        }
    }
    if (role == "assistant") {
        if (!out.contains("content") && !out.contains("tool_calls")) {
            out["content"] = "";
        }
    } else if (!out.contains("content")) {
        throw request_error(p + ".content is missing (required for role '" + role + "')", p + ".content");
    }
    if (role == "tool") {
        out["tool_call_id"] = require_string(m, "tool_call_id", p + ".tool_call_id", tmp);
    } else if (has(m, "tool_call_id")) {
        throw request_error(p + ".tool_call_id is only allowed in tool messages", p + ".tool_call_id");
    }
    if (has(m, "reasoning_content")) {
        out["reasoning_content"] = require_string(m, "reasoning_content", p + ".reasoning_content", tmp);
    }
    if (has(m, "name")) {
        out["name"] = require_string(m, "name", p + ".name", tmp);
    }
    return out;
}

std::vector<common_chat_msg> parse_messages(const json & request) {
    if (!has(request, "messages") || !request.at("messages").is_array()) {
        throw request_error("messages must be an array of messages", "messages");
    }
    const json & messages = request.at("messages");
    if (messages.empty()) {
        throw request_error("messages must not be empty", "messages");
    }
    json checked = json::array();
    for (size_t i = 0; i < messages.size(); i++) {
        checked.push_back(check_message(messages.at(i), i));
    }
    return common_chat_msgs_parse_oaicompat(checked);
}

// tools: [{"type": "function", "function": {"name", "description"?, "parameters"?}}]; each schema must
// become a grammar, so a bad one is reported by its index rather than as a failed render
json check_tools(const json & tools) {
    if (!tools.is_array()) {
        throw request_error("tools must be an array, got " + tools.dump(), "tools");
    }
    std::set<std::string> names;
    for (size_t i = 0; i < tools.size(); i++) {
        const json & t = tools.at(i);
        const auto   p = idx("tools", i);
        std::string  tmp;
        if (!t.is_object() || require_string(t, "type", p + ".type", tmp) != "function") {
            throw request_error(p + " must be {\"type\": \"function\", \"function\": {...}}", p + ".type");
        }
        if (!has(t, "function") || !t.at("function").is_object()) {
            throw request_error(p + ".function is missing", p + ".function");
        }
        const json & fn   = t.at("function");
        const auto   name = require_string(fn, "name", p + ".function.name", tmp);
        if (name.empty() || !names.insert(name).second) {
            throw request_error(p + ".function.name '" + name + "' is empty or not unique", p + ".function.name");
        }
        if (has(fn, "description") && !fn.at("description").is_string()) {
            throw request_error(p + ".function.description must be a string", p + ".function.description");
        }
        if (has(fn, "parameters")) {
            const json & params = fn.at("parameters");
            if (!params.is_object()) {
                throw request_error(p + ".function.parameters must be a JSON schema object", p + ".function.parameters");
            }
            try {
                json_schema_to_grammar(params);
            } catch (const std::exception & e) {
                throw request_error(p + ".function.parameters cannot become a grammar: " + e.what(),
                                    p + ".function.parameters");
            }
        }
    }
    return tools;
}

// tool_choice: "auto" | "none" | "required" | {"type": "function", "function": {"name": N}} (only N, required)
common_chat_tool_choice apply_tool_choice(const json & request, json & tools) {
    if (!has(request, "tool_choice")) {
        return COMMON_CHAT_TOOL_CHOICE_AUTO;
    }
    const json & tc = request.at("tool_choice");
    if (tc.is_string()) {
        const auto s = tc.get<std::string>();
        if (s == "auto") {
            return COMMON_CHAT_TOOL_CHOICE_AUTO;
        }
        if (s == "none") {
            return COMMON_CHAT_TOOL_CHOICE_NONE;
        }
        if (s == "required") {
            if (tools.empty()) {
                throw request_error("tool_choice 'required' needs tools", "tool_choice");
            }
            return COMMON_CHAT_TOOL_CHOICE_REQUIRED;
        }
        throw request_error("tool_choice must be 'auto', 'none', 'required' or a named function, got '" + s + "'",
                            "tool_choice");
    }
    std::string tmp;
    if (!tc.is_object() || !has(tc, "function") || !tc.at("function").is_object()) {
        throw request_error("tool_choice must be a string or {\"type\": \"function\", \"function\": {\"name\": ...}}",
                            "tool_choice");
    }
    const auto name = require_string(tc.at("function"), "name", "tool_choice.function.name", tmp);
    json kept = json::array();
    for (size_t i = 0; i < tools.size(); i++) {
        if (tools.at(i).at("function").at("name").get<std::string>() == name) {
            kept.push_back(tools.at(i));
        }
    }
    if (kept.empty()) {
        throw request_error("tool_choice names function '" + name + "', which is not in tools",
                            "tool_choice.function.name");
    }
    tools = kept;
    return COMMON_CHAT_TOOL_CHOICE_REQUIRED;
}

// response_format (OpenAI) or json_schema (llama-server extension) -> one schema, or null
json response_schema(const json & request) {
    json schema;
    if (has(request, "json_schema")) {
        schema = request.at("json_schema");
    }
    if (has(request, "response_format")) {
        const json & rf = request.at("response_format");
        std::string  type;
        if (!rf.is_object() || !has(rf, "type") || !rf.at("type").is_string()) {
            throw request_error("response_format must be an object with a type", "response_format.type");
        }
        type = rf.at("type").get<std::string>();
        if (type == "json_object") {
            schema = has(rf, "schema") ? rf.at("schema") : (schema.is_null() ? json::object() : schema);
        } else if (type == "json_schema") {
            if (!has(rf, "json_schema") || !has(rf.at("json_schema"), "schema")) {
                throw request_error("response_format.json_schema.schema is missing", "response_format.json_schema");
            }
            schema = rf.at("json_schema").at("schema");
        } else if (type != "text") {
            throw request_error("response_format.type must be text, json_object or json_schema, got '" + type + "'",
                                "response_format.type");
        }
    }
    if (schema.is_null()) {
        return schema;
    }
    if (!schema.is_object()) {
        throw request_error("the response schema must be a JSON object", "response_format");
    }
    if (schema.empty()) {
        schema["type"] = "object";  // an empty schema means any object, as llama-server
    }
    try {
        json_schema_to_grammar(schema);
    } catch (const std::exception & e) {
        throw request_error(std::string("the response schema cannot become a grammar: ") + e.what(), "response_format");
    }
    return schema;
}

bool get_bool(const json & request, const char * key, bool def) {
    if (!has(request, key)) {
        return def;
    }
    if (!request.at(key).is_boolean()) {
        throw request_error(std::string(key) + " must be a boolean", key);
    }
    return request.at(key).get<bool>();
}

common_chat_templates_inputs build_inputs(templates & t, const json & request, json & tools_out) {
    common_chat_templates_inputs in;
    in.use_jinja = t.use_jinja;
    in.messages  = parse_messages(request);

    json tools = json::array();
    if (has(request, "tools")) {
        tools = check_tools(request.at("tools"));
    }
    in.tool_choice = apply_tool_choice(request, tools);
    if (!tools.empty() && !t.use_jinja) {
        throw request_error("tools need a Jinja chat template; the built-in template '" + t.builtin_name +
                            "' has none: use the model's template or --chat-template-file", "tools");
    }
    if (!tools.empty()) {
        in.tools = common_chat_tools_parse_oaicompat(tools);
    }
    tools_out = tools;

    const json schema = response_schema(request);
    std::string grammar;
    if (has(request, "grammar")) {
        if (!request.at("grammar").is_string()) {
            throw request_error("grammar must be a string (GBNF)", "grammar");
        }
        grammar = request.at("grammar").get<std::string>();
    }
    if (!schema.is_null() && !grammar.empty()) {
        throw request_error("use either a response schema or a grammar, not both", "grammar");
    }
    if (!grammar.empty() && !in.tools.empty() && in.tool_choice != COMMON_CHAT_TOOL_CHOICE_NONE) {
        throw request_error("a custom grammar cannot be used with tools", "grammar");
    }
    in.json_schema = schema.is_null() ? "" : schema.dump();
    in.grammar     = grammar;

    const auto caps = common_chat_templates_get_caps(t.tmpls.get());
    in.parallel_tool_calls   = get_bool(request, "parallel_tool_calls", caps.at("supports_parallel_tool_calls"));
    in.add_generation_prompt = get_bool(request, "add_generation_prompt", true);
    if (has(request, "continue_final_message")) {
        in.continue_final_message = common_chat_continuation_parse(request.at("continue_final_message"));
        if (in.continue_final_message != COMMON_CHAT_CONTINUATION_NONE) {
            if (in.messages.back().role != "assistant" || !in.messages.back().tool_calls.empty()) {
                throw request_error("continue_final_message needs a last assistant message without tool calls",
                                    "continue_final_message");
            }
            in.add_generation_prompt = false;
        }
    }

    in.reasoning_format = COMMON_REASONING_FORMAT_DEEPSEEK;  // llama-server's default
    if (has(request, "reasoning_format")) {
        std::string tmp;
        const auto  name = require_string(request, "reasoning_format", "reasoning_format", tmp);
        if (name != "none" && name != "auto" && name != "deepseek" && name != "deepseek-legacy") {
            throw request_error("reasoning_format must be none, auto, deepseek or deepseek-legacy, got '" + name + "'",
                                "reasoning_format");
        }
        in.reasoning_format = common_reasoning_format_from_name(name);
    }

    // thinking: on when the template supports it (llama-server's --reasoning auto), then the request's
    // enable_thinking, then chat_template_kwargs.enable_thinking, then reasoning_effort "none"
    in.enable_thinking = get_bool(request, "enable_thinking", t.supports_thinking);
    if (has(request, "chat_template_kwargs")) {
        const json & kw = request.at("chat_template_kwargs");
        if (!kw.is_object()) {
            throw request_error("chat_template_kwargs must be an object", "chat_template_kwargs");
        }
        for (const auto & [key, value] : kw.items()) {
            in.chat_template_kwargs[key] = value.dump();
        }
        if (kw.contains("enable_thinking")) {
            if (!kw.at("enable_thinking").is_boolean()) {
                throw request_error("chat_template_kwargs.enable_thinking must be a boolean",
                                    "chat_template_kwargs.enable_thinking");
            }
            in.enable_thinking = kw.at("enable_thinking").get<bool>();
        }
    }
    if (has(request, "reasoning_effort")) {
        std::string tmp;
        const auto  effort = require_string(request, "reasoning_effort", "reasoning_effort", tmp);
        if (effort == "none") {
            in.enable_thinking = false;
            in.chat_template_kwargs.erase("reasoning_effort");
        } else if (!effort.empty()) {
            in.chat_template_kwargs["reasoning_effort"] = json(effort).dump();
        }
    }
    if (has(request, "now")) {  // seconds since the epoch, for reproducible renders of date-aware templates
        in.now = std::chrono::system_clock::time_point(std::chrono::seconds(request.at("now").get<long long>()));
    }
    return in;
}

}  // namespace

json apply_request(templates & t, const json & request) {
    if (!request.is_object()) {
        throw request_error("the request must be a JSON object", "");
    }
    json tools;
    auto in = build_inputs(t, request, tools);

    common_chat_params cp;
    {
        std::lock_guard<std::mutex> lock(t.mutex);
        try {
            cp = common_chat_templates_apply(t.tmpls.get(), in);
        } catch (const request_error &) {
            throw;
        } catch (const std::exception & e) {
            throw request_error(std::string("the chat template failed to render these messages: ") + e.what(),
                                "messages");
        }
    }

    if (in.tool_choice == COMMON_CHAT_TOOL_CHOICE_REQUIRED && cp.grammar.empty()) {
        // llama.cpp ignores tools on a template without a tool-call format; "required" cannot be kept
        throw request_error("this chat template has no tool-call format, so tool calls cannot be required; "
                            "serve the model with a template that has one (--chat-template-file)", "tool_choice");
    }

    const llama_vocab * vocab = t.model ? llama_model_get_vocab(t.model) : nullptr;
    json out = json::object();
    out["prompt"]      = cp.prompt;
    out["format"]      = (int) cp.format;
    out["format_name"] = common_chat_format_name(cp.format);

    // the grammar: the template's (tools, response schema; prefilled with the generation prompt when
    // not lazy) or the request's own GBNF, applied from the first token
    std::string grammar = cp.grammar;
    std::string grammar_type;
    if (!t.use_jinja) {  // the built-in templates' path: the request's grammar or its schema's
        grammar_type = grammar.empty() ? "" : (in.grammar.empty() ? "output_format" : "user");
    } else if (!grammar.empty()) {
        grammar_type = "tool_calls";  // the template's grammar (tools, response schema)
    } else if (!in.grammar.empty()) {
        grammar      = in.grammar;
        grammar_type = "user";
    }
    const bool lazy = cp.grammar_lazy && grammar_type == "tool_calls";
    const bool strict = in.tool_choice == COMMON_CHAT_TOOL_CHOICE_REQUIRED && grammar_type == "tool_calls" &&
                        strict_required(grammar, cp.thinking_start_tag);
    out["tool_calls_strict"] = strict;
    out["grammar_type"] = grammar_type;
    out["grammar_lazy"] = lazy;

    std::set<int> preserved_ids;
    json          preserved     = json::array();
    json          preserved_tok = json::array();
    for (const auto & s : cp.preserved_tokens) {
        preserved.push_back(s);
        const int tok = single_token(vocab, s);
        if (tok >= 0) {
            preserved_ids.insert(tok);
            preserved_tok.push_back(tok);
        }
    }
    out["preserved_tokens"]    = preserved;
    out["preserved_token_ids"] = preserved_tok;
    describe_triggers(cp, vocab, preserved_ids, out);
    if (lazy && out.at("trigger_patterns").empty() && out.at("trigger_tokens").empty()) {
        throw request_error("the template gave a lazy grammar without triggers", "tools");
    }
    // a non-lazy chat grammar starts with the generation prompt: cut it, prefill what the cut left
    json prefill = json::array();
    if (!lazy && grammar_type == "tool_calls") {
        const size_t cut = cut_generation_prompt(grammar, cp.generation_prompt, cp.thinking_start_tag);
        prefill = prefill_tokens(vocab, cp.generation_prompt.substr(cut));
        out["grammar_prefill_text"] = cp.generation_prompt.substr(cut);
    } else {
        out["grammar_prefill_text"] = "";
    }
    out["grammar"]                = grammar;
    out["grammar_prefill_tokens"] = prefill;
    check_grammar(vocab, grammar, lazy, out.at("trigger_patterns"), out.at("trigger_tokens"),
                  grammar_type == "user" ? "grammar" : (tools.empty() ? "response_format" : "tools"));

    out["additional_stops"]   = cp.additional_stops;
    out["generation_prompt"]  = cp.generation_prompt;
    out["supports_thinking"]  = cp.supports_thinking;
    out["thinking_start_tag"] = cp.thinking_start_tag;
    out["thinking_end_tags"]  = cp.thinking_end_tags;
    out["enable_thinking"]    = in.enable_thinking;

    const bool stream = get_bool(request, "stream", false);
    json parser = json::object();
    parser["format"]               = (int) cp.format;
    parser["parser"]               = cp.parser;
    parser["generation_prompt"]    = cp.generation_prompt;
    parser["reasoning_format"]     = common_reasoning_format_name(in.reasoning_format);
    parser["reasoning_in_content"] = stream && in.reasoning_format == COMMON_REASONING_FORMAT_DEEPSEEK_LEGACY;
    parser["parse_tool_calls"]     = !in.tools.empty() && in.tool_choice != COMMON_CHAT_TOOL_CHOICE_NONE;
    parser["is_continuation"]      = in.continue_final_message != COMMON_CHAT_CONTINUATION_NONE;
    out["parser"] = parser;
    return out;
}

}  // namespace llama_vq_chat
