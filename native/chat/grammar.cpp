// Grammar side of a rendered request: lazy triggers as llama.cpp's sampler takes them, the prefill of a
// non-lazy chat grammar, a load check with the model's vocab, and "required" without free text first.

#include "chat_internal.h"

#include "common.h"
#include "json-schema-to-grammar.h"

#include <cctype>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace llama_vq_chat {

namespace {

const char * trigger_type_name(common_grammar_trigger_type type) {
    switch (type) {
        case COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN:        return "token";
        case COMMON_GRAMMAR_TRIGGER_TYPE_WORD:         return "word";
        case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN:      return "pattern";
        case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN_FULL: return "pattern_full";
    }
    return "unknown";
}

}  // namespace

// one token id when text is exactly one token of this vocab, else -1
int single_token(const llama_vocab * vocab, const std::string & text) {
    if (!vocab) {
        return -1;
    }
    const auto ids = common_tokenize(vocab, text, false, true);
    return ids.size() == 1 ? ids[0] : -1;
}

// The triggers as llama_sampler_init_grammar_lazy_patterns takes them (as common/sampling.cpp converts
// them): words of one preserved token become token triggers, other words escaped regexes, full patterns
// anchored.
void describe_triggers(const common_chat_params & cp, const llama_vocab * vocab, const std::set<int> & preserved,
                       json & out) {
    json triggers = json::array();
    json patterns = json::array();
    json tokens   = json::array();
    for (const auto & tr : cp.grammar_triggers) {
        json d     = json::object();
        d["type"]  = trigger_type_name(tr.type);
        d["value"] = tr.value;
        triggers.push_back(d);
        switch (tr.type) {
            case COMMON_GRAMMAR_TRIGGER_TYPE_WORD: {
                const int tok = single_token(vocab, tr.value);
                if (tok >= 0 && preserved.count(tok)) {
                    tokens.push_back(tok);
                } else {
                    patterns.push_back(regex_escape(tr.value));
                }
                break;
            }
            case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN:
                patterns.push_back(tr.value);
                break;
            case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN_FULL: {
                const auto & p = tr.value;
                patterns.push_back(p.empty() ? std::string("^$") :
                                   (p.front() != '^' ? "^" : "") + p + (p.back() != '$' ? "$" : ""));
                break;
            }
            case COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN:
                tokens.push_back(tr.token);
                break;
        }
    }
    out["grammar_triggers"] = triggers;
    out["trigger_patterns"] = patterns;
    out["trigger_tokens"]   = tokens;
}

// Tokens of the generation prompt that a non-lazy chat grammar must accept before sampling starts
// (its rules begin with that text), as common/sampling.cpp prefills them.
json prefill_tokens(const llama_vocab * vocab, const std::string & generation_prompt) {
    json out = json::array();
    if (!vocab || generation_prompt.empty()) {
        return out;
    }
    const auto ids = common_tokenize(vocab, generation_prompt, false, true);
    for (size_t i = 0; i < ids.size(); i++) {
        const auto piece = common_token_to_piece(vocab, ids[i], true);
        if (i == 0 && !piece.empty() && std::isspace((unsigned char) piece[0]) &&
            !std::isspace((unsigned char) generation_prompt[0])) {
            continue;  // a tokenizer's leading space before the first special token
        }
        out.push_back(ids[i]);
    }
    return out;
}

// A grammar llama.cpp cannot load is the request's fault: check it here, with the model's vocab.
void check_grammar(const llama_vocab * vocab, const std::string & gbnf, bool lazy, const json & patterns,
                   const json & tokens, const std::string & param) {
    if (!vocab || gbnf.empty()) {
        return;
    }
    std::vector<std::string>  pats;
    std::vector<const char *> pat_c;
    std::vector<llama_token>  toks;
    for (size_t i = 0; i < patterns.size(); i++) {
        pats.push_back(patterns.at(i).get<std::string>());
    }
    for (const auto & p : pats) {
        pat_c.push_back(p.c_str());
    }
    for (size_t i = 0; i < tokens.size(); i++) {
        toks.push_back(tokens.at(i).get<int>());
    }
    llama_sampler * smpl = lazy ? llama_sampler_init_grammar_lazy_patterns(vocab, gbnf.c_str(), "root", pat_c.data(),
                                                                           pat_c.size(), toks.data(), toks.size()) :
                                  llama_sampler_init_grammar(vocab, gbnf.c_str(), "root");
    if (!smpl) {
        throw request_error("the grammar built for this request does not parse (see the server log)", param);
    }
    llama_sampler_free(smpl);
}

// The line "root ::= ..." of a GBNF text: [begin, end) without its newline.
bool find_root(const std::string & gbnf, size_t & begin, size_t & end) {
    begin = 0;
    while (begin < gbnf.size() && gbnf.compare(begin, 9, "root ::= ") != 0) {
        const size_t nl = gbnf.find('\n', begin);
        begin = nl == std::string::npos ? gbnf.size() : nl + 1;
    }
    if (begin >= gbnf.size()) {
        return false;
    }
    end = std::min(gbnf.find('\n', begin), gbnf.size());
    return true;
}

// A chat grammar's root starts with the literal generation prompt (up to the reasoning start tag), which
// is already in the prompt: llama-server feeds its tokens to the grammar first. Cut that literal from
// the root instead, so a sampler needs no prefill for it; returns how many bytes of the generation
// prompt the cut covered (0: none; the rest still has to be prefilled, as grammar_prefill_tokens).
size_t cut_generation_prompt(std::string & gbnf, const std::string & generation_prompt,
                             const std::string & thinking_start) {
    size_t begin = 0;
    size_t end   = 0;
    if (generation_prompt.empty() || !find_root(gbnf, begin, end)) {
        return 0;
    }
    std::vector<std::string> candidates = { generation_prompt };
    const size_t think = thinking_start.empty() ? std::string::npos : generation_prompt.find(thinking_start);
    if (think != std::string::npos && think > 0) {
        candidates.push_back(generation_prompt.substr(0, think));
    }
    const size_t rhs = begin + 9;
    for (const auto & text : candidates) {
        const std::string lit = gbnf_format_literal(text) + " ";
        if (gbnf.compare(rhs, lit.size(), lit) == 0 && rhs + lit.size() < end) {
            gbnf.erase(rhs, lit.size());
            return text.size();
        }
    }
    return 0;
}

// tool_choice required (or named): llama.cpp's grammar lets free text come before the first call
// (root ::= PROMPT REASONING? until-N? tool-calls), which a small model may never leave. OpenAI's
// "required" means calls: drop that one `until` reference from the root rule, keeping the reasoning
// block. Returns false (grammar unchanged) unless exactly one such reference is found.
bool strict_required(std::string & gbnf, const std::string & thinking_start) {
    size_t begin = 0;
    size_t end   = 0;
    if (!find_root(gbnf, begin, end)) {
        return false;
    }
    std::string  root = gbnf.substr(begin, end - begin);
    // group 1: the literal before the until, if any; the until must be followed by the calls
    static const std::regex content_then_calls(
        R"re(("(?:[^"\\]|\\.)*"\s+)?until-[0-9]+\??(?=\s+(?:space\s+)?(?:tool-calls?|tool-call-root)\b))re");
    const std::string think_literal = thinking_start.empty() ? "" : json(thinking_start).dump();
    std::vector<std::pair<size_t, size_t>> hits;  // position and length of each `until-N?`
    for (auto it = std::sregex_iterator(root.begin(), root.end(), content_then_calls); it != std::sregex_iterator();
         ++it) {
        const auto & m = *it;
        if (m[1].matched && !think_literal.empty() && m[1].str().find(think_literal) != std::string::npos) {
            continue;  // that until reads a reasoning block: "<think>" until-N tool-call
        }
        const size_t lead = m[1].matched ? (size_t) m.length(1) : 0;
        hits.emplace_back(m.position(0) + lead, m.length(0) - lead);
    }
    if (hits.size() != 1) {
        return false;
    }
    root.erase(hits[0].first, hits[0].second);
    gbnf.replace(begin, end - begin, root);
    return true;
}

}  // namespace llama_vq_chat
