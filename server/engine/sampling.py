"""Per-slot sampler chains: llama.cpp's samplers through the llama_cpp bindings.

The chain follows llama.cpp's common sampler order: grammar (lazy with triggers when asked), logit
bias, penalties, top-k, typical, top-p, min-p, temperature, then a seeded distribution (greedy when
the temperature is <= 0).
"""

from __future__ import annotations

import ctypes
from typing import Any

import llama_cpp

from .errors import InvalidGrammar
from .request import Grammar, Sampling

_DEFAULT_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: a random seed


def grammar_sampler(vocab: Any, g: Grammar) -> Any:
    """A grammar sampler (the caller owns it), or InvalidGrammar when llama.cpp refuses the GBNF."""
    if g.lazy:
        pats = [p.encode() for p in g.trigger_patterns]
        arr = (ctypes.c_char_p * max(1, len(pats)))(*pats)
        toks = (llama_cpp.llama_token * max(1, len(g.trigger_tokens)))(*g.trigger_tokens)
        smpl = llama_cpp.llama_sampler_init_grammar_lazy_patterns(
            vocab, g.gbnf.encode(), g.root.encode(), arr, len(pats), toks, len(g.trigger_tokens)
        )
    else:
        smpl = llama_cpp.llama_sampler_init_grammar(vocab, g.gbnf.encode(), g.root.encode())
    if not smpl:
        raise InvalidGrammar("llama.cpp could not build a grammar from this request", param="grammar")
    return smpl


def check_grammar(vocab: Any, g: Grammar) -> None:
    """Raise InvalidGrammar when llama.cpp cannot parse ``g`` (called at submit time)."""
    llama_cpp.llama_sampler_free(grammar_sampler(vocab, g))


def build_chain(vocab: Any, n_vocab: int, n_ctx: int, s: Sampling, grammar: Grammar | None) -> Any:
    """A sampler chain for one request; free it with ``llama_sampler_free``."""
    params = llama_cpp.llama_sampler_chain_default_params()
    chain = llama_cpp.llama_sampler_chain_init(params)
    add = lambda smpl: llama_cpp.llama_sampler_chain_add(chain, smpl)  # noqa: E731
    try:
        if grammar is not None:
            add(grammar_sampler(vocab, grammar))
    except InvalidGrammar:
        llama_cpp.llama_sampler_free(chain)
        raise
    if s.logit_bias:
        arr = (llama_cpp.llama_logit_bias * len(s.logit_bias))()
        for i, (tok, bias) in enumerate(s.logit_bias):
            arr[i].token, arr[i].bias = tok, bias
        add(llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(s.logit_bias), arr))
    if s.repeat_penalty != 1.0 or s.presence_penalty or s.frequency_penalty:
        last_n = n_ctx if s.repeat_last_n < 0 else s.repeat_last_n  # -1: the whole context
        add(
            llama_cpp.llama_sampler_init_penalties(
                n_vocab, last_n, s.repeat_penalty, s.frequency_penalty, s.presence_penalty
            )
        )
    if s.temperature <= 0:
        add(llama_cpp.llama_sampler_init_greedy())
        return chain
    add(llama_cpp.llama_sampler_init_top_k(s.top_k))
    if s.typical_p < 1.0:
        add(llama_cpp.llama_sampler_init_typical(s.typical_p, 1))
    add(llama_cpp.llama_sampler_init_top_p(s.top_p, 1))
    add(llama_cpp.llama_sampler_init_min_p(s.min_p, 1))
    add(llama_cpp.llama_sampler_init_temp(s.temperature))
    seed = _DEFAULT_SEED if s.seed is None else s.seed % (2**32)
    add(llama_cpp.llama_sampler_init_dist(seed))
    return chain


def token_piece(vocab: Any, token: int, special: bool) -> bytes:
    buf = ctypes.create_string_buffer(64)
    n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
    return buf.raw[:n]
