"""The server's chat layer: an OpenAI chat body -> a ChatPlan (prompt, grammar, stops) and a ChatStream.

Everything model-specific (templates, tool-call and reasoning formats, grammars and their triggers)
is llama.cpp's common/chat, reached through ``llama_vq.chat``. This module adds the server's defaults
(``--chat-template-kwargs``, ``--reasoning-format``), the stop set, and OpenAI's finish reasons. It knows
neither HTTP nor the engine's internals: plain dicts in, a ``ChatPlan`` out, ``ChatRequestError`` (an
answer-400 error naming the field) on a request the template or grammar cannot take.

    layer = ChatLayer(ChatTemplates.from_llama(llm), chat_template_kwargs={"enable_thinking": False})
    plan = layer.plan(body)                    # body: the request after validation, without None fields
    tokens = engine.tokenize(plan.prompt, plan.add_special, plan.parse_special)
    stream = plan.new_stream()
    for piece in generated: send(stream.feed(piece))
    message, deltas, finish_reason = stream.finish(done.finish_reason)
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llama_vq.chat import ChatParams, ChatTemplateError, ChatTemplates
from llama_vq.chat import ChatStream as _NativeStream

from .engine.request import Grammar

log = logging.getLogger("llama_vq.server.chat")

REASONING_FORMATS = ("none", "deepseek", "deepseek-legacy", "auto")

# Body fields passed to llama.cpp's chat layer as they are (the rest is the engine's or serving's).
_CHAT_FIELDS = ("messages", "tools", "tool_choice", "parallel_tool_calls", "response_format", "json_schema",
                "grammar", "reasoning_effort", "add_generation_prompt", "continue_final_message", "stream")


class ChatRequestError(ValueError):
    """A request the template, its parser or a grammar cannot take: answer 400 with ``param``."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(frozen=True)
class Thinking:
    """The reasoning block of this generation, for an engine that gates a lazy grammar on it.

    llama-server feeds a lazy grammar nothing while a reasoning block is open: its trigger cannot fire
    inside the reasoning, and the trigger regexes scan only the text after it (fed every token, they
    rescan the whole reasoning each step: 52 s over a 13K-token reasoning on a 2-core EPYC).
    """

    start: str                    # "<think>"
    ends: tuple[str, ...]         # ("</think>",)
    open_at_start: bool           # the prompt ends inside the block (the template opened it)


@dataclass(frozen=True)
class ChatPlan:
    """What to generate for one chat request, and how to read the output back."""

    prompt: str
    grammar: Grammar | None               # lazy with triggers for tools in auto mode; None: free text
    stop: tuple[str, ...]                 # the request's stops, then the template's additional stops
    render_special: bool                  # the output format uses special tokens (<tool_call>, <think>)
    add_special: bool = True              # tokenize the prompt as llama-server does: BOS where the
    parse_special: bool = True            # vocab wants it (the template's own BOS is stripped), specials
    grammar_prefill_tokens: tuple[int, ...] = ()  # a non-lazy chat grammar starts after these tokens
    preserved_token_ids: tuple[int, ...] = ()     # the special tokens the format needs rendered as text
    thinking: Thinking | None = None  # the reasoning block, when the template has one and thinking is on
    has_tools: bool = False
    params: ChatParams | None = field(default=None, repr=False)

    def new_stream(self) -> ChatStream:
        """A parser for one generation of this plan (one per choice)."""
        if self.params is None:
            raise ValueError("this plan has no parser")
        return ChatStream(self.params)


class ChatStream:
    """OpenAI deltas from generated text; the deltas of ``feed`` and ``finish`` concatenate to the message."""

    def __init__(self, params: ChatParams) -> None:
        self._native = _NativeStream(params)

    def feed(self, text: str) -> list[dict[str, Any]]:
        """Deltas (``content``, ``reasoning_content``, ``tool_calls`` [{index, id, type, function}]) for a piece."""
        return self._native.feed(text) if text else []

    def finish(self, finish_reason: str) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
        """(assistant message, last deltas, finish_reason): "stop" becomes "tool_calls" when tools were called.

        Output that does not match the template's format comes back as content, never as an error.
        """
        end = self._native.finish()
        if finish_reason == "stop" and end.message.tool_calls:
            finish_reason = "tool_calls"
        return end.message.to_openai(), end.deltas, finish_reason


def _stops(body: Mapping[str, Any], params: ChatParams) -> tuple[str, ...]:
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else list(stop or ())
    for s in params.additional_stops:
        if s not in stops:
            stops.append(s)
    return tuple(s for s in stops if s)


def _grammar(params: ChatParams) -> Grammar | None:
    if not params.grammar:
        return None
    g = Grammar(gbnf=params.grammar, root="root", lazy=params.grammar_lazy,
                trigger_patterns=params.trigger_patterns, trigger_tokens=params.trigger_tokens)
    if params.grammar_prefill_tokens:
        # the grammar starts inside the generation prompt's tail (a reasoning block the template opened or
        # closed): the engine accepts these tokens into it first, as llama-server's common sampler does
        if "prefill_tokens" in {f.name for f in dataclasses.fields(Grammar)}:
            g = dataclasses.replace(g, prefill_tokens=params.grammar_prefill_tokens)
        else:
            log.warning("this engine's Grammar takes no prefill_tokens; the grammar will expect %r from the "
                        "model, which the prompt already holds", params.grammar_prefill_text)
    return g


class ChatLayer:
    """One model's templates plus the server's chat defaults; thread-safe (renders are serialized natively).

    ``chat_template_kwargs``: server defaults merged under each request's own (``--chat-template-kwargs``).
    ``reasoning_format``: none | deepseek | deepseek-legacy | auto (``--reasoning-format``; a request's
    ``reasoning_format`` wins).
    """

    def __init__(self, templates: ChatTemplates, *, chat_template_kwargs: Mapping[str, Any] | None = None,
                 reasoning_format: str = "auto") -> None:
        if reasoning_format not in REASONING_FORMATS:
            raise ValueError(f"reasoning_format={reasoning_format!r} is not one of {', '.join(REASONING_FORMATS)}")
        self.templates = templates
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.reasoning_format = reasoning_format

    @classmethod
    def for_model(cls, model: Any, *, chat_template: str | None = None, chat_template_file: str | Path | None = None,
                  **defaults: Any) -> ChatLayer:
        """Templates of ``model`` (a Llama), overridden by a built-in name / Jinja text or a Jinja file.

        Raises ChatTemplateError (param "template") when the template does not parse, OSError when the
        file cannot be read.
        """
        template = Path(chat_template_file).read_text(encoding="utf-8") if chat_template_file else chat_template
        return cls(ChatTemplates(model, template), **defaults)

    def _native_request(self, body: Mapping[str, Any]) -> dict[str, Any]:
        req = {k: body[k] for k in _CHAT_FIELDS if body.get(k) is not None}
        kwargs = dict(self.chat_template_kwargs)
        kwargs.update(body.get("chat_template_kwargs") or {})
        if kwargs:
            req["chat_template_kwargs"] = kwargs
        req["reasoning_format"] = body.get("reasoning_format") or self.reasoning_format
        return req

    def render(self, body: Mapping[str, Any]) -> ChatParams:
        """llama.cpp's rendering of the request; ChatRequestError naming the field when it cannot be done."""
        try:
            return self.templates.apply(self._native_request(body))
        except ChatTemplateError as e:
            raise ChatRequestError(e.message, e.param) from None

    def plan(self, body: Mapping[str, Any]) -> ChatPlan:
        params = self.render(body)
        thinking = None
        if params.supports_thinking and params.enable_thinking and params.thinking_end_tags:
            gp, start = params.generation_prompt, params.thinking_start_tag
            at = gp.rfind(start) if start else -1
            is_open = at >= 0 and not any(end in gp[at:] for end in params.thinking_end_tags)
            thinking = Thinking(start, params.thinking_end_tags, is_open)
        return ChatPlan(
            prompt=params.prompt,
            grammar=_grammar(params),
            stop=_stops(body, params),
            render_special=bool(params.preserved_tokens or params.thinking_start_tag),
            grammar_prefill_tokens=params.grammar_prefill_tokens,
            preserved_token_ids=params.preserved_token_ids,
            thinking=thinking,
            has_tools=bool(body.get("tools")) and body.get("tool_choice") != "none",
            params=params,
        )

    def apply_template(self, body: Mapping[str, Any]) -> str:
        """The rendered prompt, as llama-server's POST /apply-template returns it."""
        return self.render(body).prompt

    def props(self) -> dict[str, Any]:
        """Template facts for GET /props (llama-server's key names)."""
        info = self.templates.info
        out: dict[str, Any] = {
            "chat_template": info.source,
            "chat_template_caps": info.caps,
            "supports_thinking": info.supports_thinking,
            "reasoning_format": self.reasoning_format,
            "chat_template_kwargs": self.chat_template_kwargs,
        }
        if info.tool_use_source:
            out["chat_template_tool_use"] = info.tool_use_source
        return out
