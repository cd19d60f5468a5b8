"""Llama.create_chat_completion through llama.cpp's chat layer (llama_vq.chat), as llama-server runs a chat request.

The model's template (or ``chat_template=``) renders the messages with their tools; sampling is constrained as
llama-server constrains it (the template's tool-call grammar, lazy until one of its triggers appears when
tool_choice is "auto", from the first token when it is "required" or names a function; a response_format or a
GBNF grammar likewise); the output is parsed into content, reasoning_content and tool_calls, and streamed as
OpenAI deltas. llama-cpp-python's own chat formats parse none of this.
"""

from __future__ import annotations

import codecs
import ctypes
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import llama_cpp
import numpy as np
from llama_cpp import _internals

from .chat import ChatParams, ChatTemplates

if TYPE_CHECKING:
    from .llama import Llama

# arguments of llama_cpp.Llama.create_chat_completion that this path cannot honour, and why
UNSUPPORTED = {
    "logprobs": "token log-probabilities",
    "top_logprobs": "token log-probabilities",
}


@dataclass(frozen=True)
class ChatGrammar:
    """A plan's grammar for Llama._init_sampler: first in the sampler chain, lazy or not, prefilled."""

    gbnf: str
    lazy: bool
    trigger_patterns: tuple[str, ...]
    trigger_tokens: tuple[int, ...]
    prefill_tokens: tuple[int, ...]

    @classmethod
    def from_plan(cls, plan: ChatParams) -> ChatGrammar | None:
        if not plan.grammar:
            return None
        return cls(
            plan.grammar, plan.grammar_lazy, plan.trigger_patterns, plan.trigger_tokens, plan.grammar_prefill_tokens
        )

    def sampler(self, vocab: Any) -> Any:
        """The grammar sampler (llama_sampler *), its prefill tokens accepted."""
        if self.lazy:
            patterns = (ctypes.c_char_p * len(self.trigger_patterns))(*(p.encode() for p in self.trigger_patterns))
            tokens = (llama_cpp.llama_token * len(self.trigger_tokens))(*self.trigger_tokens)
            smpl = llama_cpp.llama_sampler_init_grammar_lazy_patterns(
                vocab,
                self.gbnf.encode(),
                b"root",
                patterns,
                len(self.trigger_patterns),
                tokens,
                len(self.trigger_tokens),
            )
        else:
            smpl = llama_cpp.llama_sampler_init_grammar(vocab, self.gbnf.encode(), b"root")
        if not smpl:
            raise ValueError("llama.cpp refused the chat grammar (its log says why)")
        for tok in self.prefill_tokens:
            llama_cpp.llama_sampler_accept(smpl, tok)
        return smpl

    def chain(self, vocab: Any, rest: _internals.LlamaSampler) -> _internals.LlamaSampler:
        """A chain of this grammar followed by the samplers of ``rest`` (moved out of it, custom ones included)."""
        out = _internals.LlamaSampler()
        llama_cpp.llama_sampler_chain_add(out.sampler, self.sampler(vocab))
        for _ in range(llama_cpp.llama_sampler_chain_n(rest.sampler)):
            llama_cpp.llama_sampler_chain_add(out.sampler, llama_cpp.llama_sampler_chain_remove(rest.sampler, 0))
        out.custom_samplers = [(i + 1, s) for i, s in rest.custom_samplers]
        rest.custom_samplers = []
        return out


class _Stops:
    """Stop strings in a stream of text: what may be sent now, holding back a tail that could begin a stop."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = [s for s in stops if s]
        self._held = ""

    def push(self, text: str) -> tuple[str, bool]:
        buf = self._held + text
        hits = [i for i in (buf.find(s) for s in self._stops) if i >= 0]
        if hits:
            self._held = ""
            return buf[: min(hits)], True
        keep = 0
        for s in self._stops:
            for k in range(min(len(s) - 1, len(buf)), keep, -1):
                if buf.endswith(s[:k]):
                    keep = k
                    break
        self._held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held


def _logit_bias_processor(bias: Mapping[int, float]) -> Any:
    biases = {int(k): float(v) for k, v in bias.items()}

    def apply(input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        out = np.copy(scores)
        for tok, b in biases.items():
            out[tok] += b
        return out

    return apply


def request_from_openai(
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None,
    tool_choice: Any,
    functions: Sequence[Mapping[str, Any]] | None,
    function_call: Any,
    response_format: Mapping[str, Any] | None,
    grammar: Any,
    parallel_tool_calls: bool | None,
    reasoning_format: str | None,
    chat_template_kwargs: Mapping[str, Any] | None,
    stream: bool,
) -> dict[str, Any]:
    """The chat layer's request (llama-server's fields) from create_chat_completion's arguments; the deprecated
    `functions` and `function_call` become `tools` and `tool_choice`."""
    req: dict[str, Any] = {"messages": [dict(m) for m in messages], "stream": stream}
    if functions and not tools:
        tools = [{"type": "function", "function": dict(f)} for f in functions]
        if isinstance(function_call, Mapping):
            tool_choice = {"type": "function", "function": {"name": function_call["name"]}}
        elif function_call is not None:
            tool_choice = function_call
    if tools:
        req["tools"] = [dict(t) for t in tools]
    if tool_choice is not None:
        req["tool_choice"] = tool_choice
    if parallel_tool_calls is not None:
        req["parallel_tool_calls"] = parallel_tool_calls
    if response_format is not None:
        req["response_format"] = dict(response_format)
    if grammar is not None:
        req["grammar"] = grammar if isinstance(grammar, str) else grammar._grammar  # a llama_cpp.LlamaGrammar
    if reasoning_format is not None:
        req["reasoning_format"] = reasoning_format
    if chat_template_kwargs:
        req["chat_template_kwargs"] = dict(chat_template_kwargs)
    return req


def create(
    llm: Llama,
    templates: ChatTemplates,
    request: dict[str, Any],
    *,
    stream: bool,
    max_tokens: int | None,
    stop: str | Sequence[str] | None,
    seed: int | None,
    model: str | None,
    logit_bias: Mapping[int, float] | None,
    logits_processor: Any,
    sampling: dict[str, Any],
) -> dict[str, Any] | Iterator[dict[str, Any]]:
    """One chat completion (a dict) or its chunks (an iterator of dicts), in OpenAI's shapes."""
    plan = templates.apply(request)
    prompt = llm.tokenize(plan.prompt.encode("utf-8"), add_bos=True, special=True)
    n_ctx = llm.n_ctx()
    if len(prompt) >= n_ctx:
        raise ValueError(
            f"the rendered chat prompt has {len(prompt)} tokens, the context window {n_ctx}: "
            "shorten the messages or create the Llama with a larger n_ctx"
        )
    limit = n_ctx - len(prompt) if max_tokens is None or max_tokens <= 0 else min(max_tokens, n_ctx - len(prompt))
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if logit_bias:
        procs = llama_cpp.LogitsProcessorList([_logit_bias_processor(logit_bias)])
        logits_processor = procs if logits_processor is None else logits_processor + procs
    if seed is not None:
        llm.set_seed(seed)
    head = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": model if model is not None else llm.model_path,
    }
    gen = _Generation(llm, plan, prompt, limit, stops + list(plan.additional_stops), logits_processor, sampling)
    if stream:
        return _chunks(templates, plan, gen, head)
    parser = templates.stream(plan)
    for piece in gen:
        parser.feed(piece)
    end = parser.finish()
    msg = end.message.to_openai()
    finish = "tool_calls" if end.message.tool_calls else gen.finish_reason
    return {
        **head,
        "object": "chat.completion",
        "choices": [{"index": 0, "message": msg, "logprobs": None, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": len(prompt),
            "completion_tokens": gen.n_tokens,
            "total_tokens": len(prompt) + gen.n_tokens,
        },
    }


def _chunks(templates: ChatTemplates, plan: ChatParams, gen: _Generation, head: dict[str, Any]) -> Iterator[dict]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            **head,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }

    parser = templates.stream(plan)
    yield chunk({"role": "assistant", "content": None})
    for piece in gen:
        for delta in parser.feed(piece):
            yield chunk(delta)
    end = parser.finish()
    for delta in end.deltas:
        yield chunk(delta)
    yield chunk({}, "tool_calls" if end.message.tool_calls else gen.finish_reason)


class _Generation:
    """The generated text, piece by piece: special tokens of the output format rendered as text, stop strings cut
    (and held back while they may still begin), ended by an end-of-generation token, a stop or the token limit."""

    def __init__(
        self,
        llm: Llama,
        plan: ChatParams,
        prompt: list[int],
        limit: int,
        stops: list[str],
        logits_processor: Any,
        sampling: dict[str, Any],
    ) -> None:
        self._llm, self._plan, self._prompt, self._limit = llm, plan, prompt, limit
        self._stops, self._procs, self._sampling = _Stops(stops), logits_processor, sampling
        self.n_tokens = 0
        self.finish_reason = "length"

    def __iter__(self) -> Iterator[str]:
        llm = self._llm
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        preserved = set(self._plan.preserved_token_ids)
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        # Llama._init_sampler takes a ChatGrammar where llama_cpp's signature says LlamaGrammar
        grammar: Any = ChatGrammar.from_plan(self._plan)
        tokens = llm.generate(self._prompt, grammar=grammar, logits_processor=self._procs, **self._sampling)
        try:
            for tok in tokens:
                if llama_cpp.llama_vocab_is_eog(vocab, tok):
                    self.finish_reason = "stop"
                    break
                self.n_tokens += 1
                text, stopped = self._stops.push(decoder.decode(llm.detokenize([tok], special=tok in preserved)))
                if text:
                    yield text
                if stopped:
                    self.finish_reason = "stop"
                    return
                if self.n_tokens >= self._limit:
                    break
        finally:
            tokens.close()
        rest = self._stops.push(decoder.decode(b"", final=True))[0] + self._stops.flush()
        if rest:
            yield rest
