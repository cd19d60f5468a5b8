"""What goes into the engine and what comes out: pure data, no llama_cpp import (cheap to import).

A ``GenerationRequest`` holds token ids (serving tokenizes with ``engine.tokenize``), sampling
parameters, an optional (lazy) grammar and stop strings. A running ``Job`` yields
``ProgressEvent`` while its prompt is processed, ``TokenEvent`` per piece of text, then exactly one
``DoneEvent``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class Grammar:
    """Handed to llama_sampler_init_grammar (or ..._lazy_patterns when ``lazy``)."""

    gbnf: str
    root: str = "root"
    lazy: bool = False
    trigger_patterns: tuple[str, ...] = ()  # regexes as llama.cpp's lazy grammar takes them
    trigger_tokens: tuple[int, ...] = ()
    # accepted into the grammar before the first sampled token: the generation prompt's tail that a
    # non-lazy chat grammar starts with (e.g. Qwen3's "<think>\n\n</think>\n\n" with thinking off), as
    # llama-server's common sampler prefills it
    prefill_tokens: tuple[int, ...] = ()


@dataclass(frozen=True)
class Reasoning:
    """The request's reasoning block (the chat plan's ``thinking``): a lazy grammar is neither applied
    nor fed while the block is open, as llama-server gates it; its triggers scan only the text after."""

    start: str = "<think>"
    ends: tuple[str, ...] = ("</think>",)
    open_at_start: bool = False  # the prompt ends inside the block (the template opened it)


@dataclass(frozen=True)
class Sampling:
    """llama.cpp's sampler chain parameters (llama-server's defaults). temperature <= 0 is greedy."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    n_probs: int = 0


@dataclass(frozen=True)
class GenerationRequest:
    prompt: tuple[int, ...]
    sampling: Sampling = Sampling()
    grammar: Grammar | None = None
    stop: tuple[str, ...] = ()  # never emitted; a partial match at the end of the text is held back
    max_tokens: int | None = None  # None: the server's --n-predict, else up to the context end
    ignore_eos: bool = False
    render_special: bool = False  # detokenize generated special tokens as text
    cache_prompt: bool = True
    timeout_s: float | None = None  # None: the server's --timeout
    reasoning: Reasoning | None = None  # gate a lazy grammar on this reasoning block
    preserved_token_ids: tuple[int, ...] = ()  # with render_special: render only these special tokens


@dataclass(frozen=True)
class ProgressEvent:
    """The prompt is being processed (sent after each batch that advanced it; a liveness signal)."""

    processed: int  # prompt tokens in the KV cache so far (cached ones included)
    total: int
    cached: int


@dataclass(frozen=True)
class TokenEvent:
    text: str
    token_ids: tuple[int, ...]
    logprobs: Any = None


FinishReason = Literal["stop", "length", "cancelled", "timeout", "error"]


@dataclass(frozen=True)
class DoneEvent:
    finish_reason: FinishReason
    stop_word: str | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    timings: dict[str, float] = field(default_factory=dict)  # llama-server's keys
    error: str | None = None  # finish_reason "error": llama.cpp failed while running the request


Event = ProgressEvent | TokenEvent | DoneEvent
