// The C ABI of llama_vq_chat.h: JSON in, JSON out, every exception caught here.

#include "llama_vq_chat.h"

#include "chat_internal.h"
#include "log.h"

#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

using namespace llama_vq_chat;

struct llama_vq_chat_templates : templates {};

struct llama_vq_chat_stream {
    common_chat_parser_params params;
    std::string               text;       // everything fed so far
    common_chat_msg           msg;        // the last message whose deltas went out
    std::vector<std::string>  ids;        // tool call ids, stable across parses
    std::set<size_t>          announced;  // tool calls whose id and name went out
};

namespace {

char * dup(const std::string & s) {
    char * out = (char *) std::malloc(s.size() + 1);
    if (out) {
        std::memcpy(out, s.data(), s.size());
        out[s.size()] = '\0';
    }
    return out;
}

std::string error_json(const std::string & message, const std::string & param) {
    json err       = json::object();
    err["message"] = message;
    err["param"]   = param.empty() ? json(nullptr) : json(param);
    json out       = json::object();
    out["error"]   = err;
    return out.dump_safe();
}

// Run fn (returning json); any exception becomes the error document.
template <typename F> char * guarded(F && fn) {
    try {
        return dup(fn().dump_safe());
    } catch (const request_error & e) {
        return dup(error_json(e.what(), e.param));
    } catch (const std::exception & e) {
        return dup(error_json(e.what(), ""));
    } catch (...) {
        return dup(error_json("unknown error", ""));
    }
}

json parse_input(const char * text, const char * what) {
    if (!text) {
        throw request_error(std::string(what) + " is NULL", "");
    }
    json j = json::parse_no_throw(text);
    if (j.is_discarded()) {
        throw request_error(std::string(what) + " is not valid JSON", "");
    }
    return j;
}

std::vector<std::string> builtin_names() {
    std::vector<const char *> names(256);
    int n = llama_chat_builtin_templates(names.data(), names.size());
    if (n > (int) names.size()) {
        names.resize(n);
        n = llama_chat_builtin_templates(names.data(), names.size());
    }
    return std::vector<std::string>(names.begin(), names.begin() + std::max(n, 0));
}

// Parse the first len bytes of the text fed so far (all of it by default).
common_chat_msg parse_text(const llama_vq_chat_stream & s, bool partial, size_t len = std::string::npos) {
    return common_chat_parse(len >= s.text.size() ? s.text : s.text.substr(0, len), partial, s.params);
}

// Length of text without a trailing incomplete UTF-8 sequence: a piece may end inside a character.
size_t complete_utf8_len(const std::string & text) {
    const size_t n = text.size();
    for (size_t back = 1; back <= 4 && back <= n; back++) {
        const unsigned char c = (unsigned char) text[n - back];
        if ((c & 0xC0) == 0x80) {
            continue;  // a continuation byte: look further back for the lead byte
        }
        const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > back ? n - back : n;
    }
    return n;
}

json delta_json(const common_chat_msg_diff & d) {
    json delta = json::object();
    if (!d.reasoning_content_delta.empty()) {
        delta["reasoning_content"] = d.reasoning_content_delta;
    }
    if (!d.content_delta.empty()) {
        delta["content"] = d.content_delta;
    }
    if (d.tool_call_index != std::string::npos) {
        json call     = json::object();
        call["index"] = d.tool_call_index;
        if (!d.tool_call_delta.id.empty()) {
            call["id"]   = d.tool_call_delta.id;
            call["type"] = "function";
        }
        json fn = json::object();
        if (!d.tool_call_delta.name.empty()) {
            fn["name"] = d.tool_call_delta.name;
        }
        if (!d.tool_call_delta.arguments.empty()) {
            fn["arguments"] = d.tool_call_delta.arguments;
        }
        if (!fn.empty()) {
            call["function"] = fn;
        }
        json calls = json::array();
        calls.push_back(call);
        delta["tool_calls"] = calls;
    }
    return delta;
}

// A tool call's id and name go out once, in its first delta, when the name is final: when its
// arguments begin, another delta follows it, or the stream ends (names can grow while parsing).
void announce(llama_vq_chat_stream & s, size_t i, const std::string & args, json & deltas) {
    common_chat_msg_diff h;
    h.tool_call_index           = i;
    h.tool_call_delta.id        = s.msg.tool_calls[i].id;
    h.tool_call_delta.name      = s.msg.tool_calls[i].name;
    h.tool_call_delta.arguments = args;
    deltas.push_back(delta_json(h));
    s.announced.insert(i);
}

void announce_pending(llama_vq_chat_stream & s, size_t except, json & deltas) {
    for (size_t i = 0; i < s.msg.tool_calls.size(); i++) {
        if (i != except && !s.announced.count(i) && !s.msg.tool_calls[i].name.empty()) {
            announce(s, i, "", deltas);
        }
    }
}

bool starts_with(const std::string & s, const std::string & prefix) {
    return s.compare(0, prefix.size(), prefix) == 0;
}

// next only adds to prev: what was sent as deltas stays a prefix of every field (compute_diffs alone
// lets a string shrink, for stop words llama-server erases; we erase none here).
bool extends(const common_chat_msg & prev, const common_chat_msg & next) {
    if (!starts_with(next.content, prev.content) || !starts_with(next.reasoning_content, prev.reasoning_content) ||
        next.tool_calls.size() < prev.tool_calls.size()) {
        return false;
    }
    for (size_t i = 0; i < prev.tool_calls.size(); i++) {
        const auto & a = prev.tool_calls[i];
        const auto & b = next.tool_calls[i];
        if (!starts_with(b.name, a.name) || !starts_with(b.arguments, a.arguments)) {
            return false;
        }
    }
    return true;
}

// Move s.msg to next; return the OpenAI deltas between them.
json advance(llama_vq_chat_stream & s, common_chat_msg next, bool final) {
    json deltas = json::array();
    if ((next.empty() && !final) || !extends(s.msg, next)) {
        return deltas;  // nothing yet, or this parse went back on what was sent: wait for more text
    }
    for (size_t i : s.announced) {
        if (next.tool_calls[i].name != s.msg.tool_calls[i].name) {
            return deltas;  // a name already sent cannot change
        }
    }
    next.set_tool_call_ids(s.ids, random_tool_call_id);
    std::vector<common_chat_msg_diff> diffs;
    try {
        diffs = common_chat_msg_diff::compute_diffs(s.msg, next);
    } catch (const std::exception &) {
        return deltas;
    }
    s.msg = next;
    for (const auto & d : diffs) {
        if (d.tool_call_index == std::string::npos) {
            announce_pending(s, std::string::npos, deltas);
            deltas.push_back(delta_json(d));
            continue;
        }
        const size_t i = d.tool_call_index;
        announce_pending(s, i, deltas);
        if (s.announced.count(i)) {
            if (!d.tool_call_delta.arguments.empty()) {
                common_chat_msg_diff a;
                a.tool_call_index           = i;
                a.tool_call_delta.arguments = d.tool_call_delta.arguments;
                deltas.push_back(delta_json(a));
            }
        } else if (!d.tool_call_delta.arguments.empty() && !s.msg.tool_calls[i].name.empty()) {
            announce(s, i, s.msg.tool_calls[i].arguments, deltas);
        }
    }
    if (final) {
        announce_pending(s, std::string::npos, deltas);
    }
    return deltas;
}

// The full parse; when the output does not match the format (or its parse goes back on what was
// streamed), the most of it that keeps the sent deltas a prefix: the raw text as content, else the
// lenient partial parse, else what was sent.
common_chat_msg final_message(const llama_vq_chat_stream & s, std::string & parse_error) {
    try {
        auto msg = parse_text(s, false);
        if (extends(s.msg, msg)) {
            return msg;
        }
        parse_error = "the full parse does not extend the streamed message";
    } catch (const std::exception & e) {
        parse_error = e.what();
    }
    common_chat_msg raw;
    raw.role    = "assistant";
    raw.content = s.text;
    if (s.msg.tool_calls.empty() && s.msg.reasoning_content.empty() && extends(s.msg, raw)) {
        return raw;
    }
    try {
        auto msg = parse_text(s, true);
        if (extends(s.msg, msg)) {
            return msg;
        }
    } catch (const std::exception &) {
    }
    return s.msg;
}

// A trailing tool call whose name never came was never announced: leave it out of the message.
void drop_unnamed_tail(common_chat_msg & msg) {
    while (!msg.tool_calls.empty() && msg.tool_calls.back().name.empty()) {
        msg.tool_calls.pop_back();
    }
}

}  // namespace

extern "C" {

int llama_vq_chat_abi_version(void) {
    return 1;
}

llama_vq_chat_templates * llama_vq_chat_templates_init(const llama_model * model, const char * options_json,
                                                       char ** error_json) {
    if (error_json) {
        *error_json = nullptr;
    }
    llama_vq_chat_templates * t = nullptr;
    char * res = guarded([&]() {
        json opts = options_json ? parse_input(options_json, "options") : json::object();
        if (!opts.is_object()) {
            throw request_error("options must be a JSON object", "");
        }
        std::string tmpl = opts.value("template", std::string());
        if (tmpl.empty() && !model) {
            throw request_error("no model and no template: give one of them", "template");
        }
        auto out = std::make_unique<llama_vq_chat_templates>();
        out->model = model;
        if (!tmpl.empty() && tmpl != "chatml") {
            for (const auto & name : builtin_names()) {
                if (name == tmpl) {
                    out->use_jinja    = false;
                    out->builtin_name = name;
                }
            }
        }
        try {
            out->tmpls = common_chat_templates_init(model, tmpl, opts.value("bos_token", std::string()),
                                                    opts.value("eos_token", std::string()));
        } catch (const std::exception & e) {
            throw request_error(std::string("the chat template does not parse: ") + e.what(), "template");
        }
        if (out->use_jinja) {
            try {
                out->supports_thinking = common_chat_templates_support_enable_thinking(out->tmpls.get());
            } catch (const std::exception &) {
                out->supports_thinking = false;  // apply reports the template's errors, per request
            }
        }
        t = out.release();
        return json::object();
    });
    if (!t && error_json) {
        *error_json = res;
    } else {
        llama_vq_chat_string_free(res);
    }
    return t;
}

void llama_vq_chat_templates_free(llama_vq_chat_templates * tmpls) {
    delete tmpls;
}

char * llama_vq_chat_templates_info(const llama_vq_chat_templates * t) {
    return guarded([&]() {
        if (!t) {
            throw request_error("templates is NULL", "");
        }
        json info = json::object();
        info["source"]            = common_chat_templates_source(t->tmpls.get(), "");
        const auto tool_use       = common_chat_templates_source(t->tmpls.get(), "tool_use");
        info["tool_use_source"]   = tool_use.empty() ? json(nullptr) : json(tool_use);
        info["use_jinja"]         = t->use_jinja;
        info["was_explicit"]      = common_chat_templates_was_explicit(t->tmpls.get());
        info["builtin_name"]      = t->builtin_name.empty() ? json(nullptr) : json(t->builtin_name);
        info["supports_thinking"] = t->supports_thinking;
        json caps = json::object();
        for (const auto & [key, value] : common_chat_templates_get_caps(t->tmpls.get())) {
            caps[key] = t->use_jinja && value;
        }
        info["caps"] = caps;
        return info;
    });
}

char * llama_vq_chat_apply(const llama_vq_chat_templates * t, const char * request_json) {
    return guarded([&]() {
        if (!t) {
            throw request_error("templates is NULL", "");
        }
        return apply_request(*const_cast<llama_vq_chat_templates *>(t), parse_input(request_json, "request"));
    });
}

char * llama_vq_chat_parse(const char * parser_json, const char * text, size_t len, int is_partial) {
    return guarded([&]() {
        llama_vq_chat_stream s;
        s.params = parser_params_from_json(parse_input(parser_json, "parser"));
        s.text.assign(text ? text : "", text ? len : 0);
        auto msg = parse_text(s, is_partial != 0);
        msg.set_tool_call_ids(s.ids, random_tool_call_id);
        return message_to_json(msg);
    });
}

llama_vq_chat_stream * llama_vq_chat_stream_new(const char * parser_json, char ** error_json) {
    if (error_json) {
        *error_json = nullptr;
    }
    llama_vq_chat_stream * s = nullptr;
    char * res = guarded([&]() {
        auto out    = std::make_unique<llama_vq_chat_stream>();
        out->params = parser_params_from_json(parse_input(parser_json, "parser"));
        if (out->params.is_continuation && !out->params.echo) {
            try {
                out->msg = common_chat_parse("", true, out->params);  // no delta for the prefilled part
            } catch (const std::exception &) {
            }
        }
        s = out.release();
        return json::object();
    });
    if (!s && error_json) {
        *error_json = res;
    } else {
        llama_vq_chat_string_free(res);
    }
    return s;
}

char * llama_vq_chat_stream_feed(llama_vq_chat_stream * s, const char * text, size_t len) {
    return guarded([&]() {
        if (!s) {
            throw request_error("stream is NULL", "");
        }
        s->text.append(text ? text : "", text ? len : 0);
        json out      = json::object();
        out["deltas"] = json::array();
        const size_t n = complete_utf8_len(s->text);
        if (n == 0) {
            return out;
        }
        try {
            out["deltas"] = advance(*s, parse_text(*s, true, n), false);
        } catch (const std::exception &) {
            // not parseable yet: wait for more text
        }
        return out;
    });
}

char * llama_vq_chat_stream_finish(llama_vq_chat_stream * s) {
    return guarded([&]() {
        if (!s) {
            throw request_error("stream is NULL", "");
        }
        std::string parse_error;
        json        out    = json::object();
        out["deltas"]      = advance(*s, final_message(*s, parse_error), true);
        common_chat_msg msg = s->msg;
        drop_unnamed_tail(msg);
        out["message"]     = message_to_json(msg);
        out["parse_error"] = parse_error.empty() ? json(nullptr) : json(parse_error);
        return out;
    });
}

void llama_vq_chat_stream_free(llama_vq_chat_stream * s) {
    delete s;
}

char * llama_vq_chat_builtin_templates(void) {
    return guarded([&]() {
        json out = json::array();
        for (const auto & name : builtin_names()) {
            out.push_back(name);
        }
        return out;
    });
}

void llama_vq_chat_string_free(char * str) {
    std::free(str);
}

void llama_vq_chat_set_log_verbosity(int verbosity) {
    common_log_set_verbosity_thold(verbosity);
}

}  // extern "C"
