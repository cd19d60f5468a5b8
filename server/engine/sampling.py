"""Per-slot sampler chains: llama.cpp's samplers through the llama_cpp bindings.

The chain follows llama.cpp's common sampler order: grammar (lazy with triggers when asked), logit
bias, penalties, top-k, typical, top-p, min-p, temperature, then a seeded distribution (greedy when
the temperature is <= 0). With a grammar the chain is ``[grammar, rest]``: ``rest`` (everything but
the grammar, a chain of its own) is sampled from alone while the grammar is gated (inside a reasoning
block), so the grammar is then neither applied nor fed.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Any

import llama_cpp

from . import held
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
    """Raise InvalidGrammar when llama.cpp cannot parse ``g`` or take its prefill (called at submit time)."""
    smpl = grammar_sampler(vocab, g)
    try:
        prefill(smpl, g.prefill_tokens)
    finally:
        llama_cpp.llama_sampler_free(smpl)


@dataclass
class Samplers:
    chain: Any  # [grammar, rest] (or rest alone): sample from it; freeing it frees everything
    rest: Any  # the chain without the grammar
    grammar: Any = None  # owned by ``chain``


def build_samplers(vocab: Any, n_vocab: int, n_ctx: int, s: Sampling, grammar: Grammar | None) -> Samplers:
    """The samplers of one request (InvalidGrammar when llama.cpp refuses the grammar or its prefill)."""
    rest = _rest_chain(n_vocab, n_ctx, s)
    if grammar is None:
        return Samplers(rest, rest)
    try:
        g = grammar_sampler(vocab, grammar)
    except InvalidGrammar:
        llama_cpp.llama_sampler_free(rest)
        raise
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    llama_cpp.llama_sampler_chain_add(chain, g)
    llama_cpp.llama_sampler_chain_add(chain, rest)
    try:
        prefill(g, grammar.prefill_tokens)
    except InvalidGrammar:
        llama_cpp.llama_sampler_free(chain)
        raise
    return Samplers(chain, rest, g)


def build_chain(vocab: Any, n_vocab: int, n_ctx: int, s: Sampling, grammar: Grammar | None) -> Any:
    """A sampler chain for one request; free it with ``llama_sampler_free``."""
    return build_samplers(vocab, n_vocab, n_ctx, s, grammar).chain


def prefill(g: Any, tokens: tuple[int, ...]) -> None:
    """Accept ``tokens`` into grammar sampler ``g``, each checked first (llama.cpp throws through the C
    API on a token its grammar cannot take, which would end the process)."""
    one = (llama_cpp.llama_token_data * 1)()
    arr = llama_cpp.llama_token_data_array(one, 1, -1, False)
    for t in tokens:
        one[0].id, one[0].logit, one[0].p = t, 0.0, 0.0
        arr.size, arr.selected = 1, -1
        llama_cpp.llama_sampler_apply(g, ctypes.byref(arr))
        if math.isinf(one[0].logit):
            raise InvalidGrammar(f"the grammar does not accept its prefill token {t}", param="grammar")
        llama_cpp.llama_sampler_accept(g, t)


def _rest_chain(n_vocab: int, n_ctx: int, s: Sampling) -> Any:
    params = llama_cpp.llama_sampler_chain_default_params()
    chain = llama_cpp.llama_sampler_chain_init(params)
    add = lambda smpl: llama_cpp.llama_sampler_chain_add(chain, smpl)  # noqa: E731
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
    n = held.token_to_piece(vocab, token, buf, len(buf), 0, special)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = held.token_to_piece(vocab, token, buf, len(buf), 0, special)
    return buf.raw[:n]
