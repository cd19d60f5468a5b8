"""Chat templates, tool calls and reasoning through llama.cpp's own common/chat (libllama-vq-chat).

    from llama_vq import Llama, ChatTemplates
    llm = Llama("model.gguf")
    tmpl = ChatTemplates.from_llama(llm)                # the model's template (or template="chatml", Jinja text)
    plan = tmpl.apply({"messages": [...], "tools": [...], "tool_choice": "auto"})
    plan.prompt, plan.grammar, plan.trigger_patterns    # what to generate with
    stream = tmpl.stream(plan)                          # then for each generated piece:
    deltas = stream.feed(piece)                         #   OpenAI deltas (content, reasoning_content, tool_calls)
    end = stream.finish()                               # the message; its deltas complete the stream

Requests are OpenAI chat bodies (plus llama-server's extensions: chat_template_kwargs, reasoning_format,
json_schema, grammar); deltas and messages are OpenAI-shaped dicts. Errors are ChatTemplateError with the
field at fault in ``param``. The C ABI is native/chat/llama_vq_chat.h. LLAMA_VQ_CHAT_LOG_VERBOSITY sets
llama.cpp common's log threshold (default 1: errors only; 2 adds the warnings that print unparsed outputs).
"""

from __future__ import annotations

import ctypes
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import _cdll, _envs
from .errors import LlamaVQError


class ChatTemplateError(LlamaVQError, ValueError):
    """A chat request, template or parser state that llama.cpp's chat layer refused.

    ``param`` names the field at fault (``"messages[2].tool_call_id"``, ``"tools[0].function.parameters"``,
    ``"template"``) or is None when no single field is.
    """

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


_vp, _cp, _sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
CHAT = _cdll.Library(
    "llama-vq-chat",
    {
        "llama_vq_chat_abi_version": ([], ctypes.c_int),
        "llama_vq_chat_templates_init": ([_vp, _cp, ctypes.POINTER(_vp)], _vp),
        "llama_vq_chat_templates_free": ([_vp], None),
        "llama_vq_chat_templates_info": ([_vp], _vp),
        "llama_vq_chat_apply": ([_vp, _cp], _vp),
        "llama_vq_chat_parse": ([_cp, _cp, _sz, ctypes.c_int], _vp),
        "llama_vq_chat_stream_new": ([_cp, ctypes.POINTER(_vp)], _vp),
        "llama_vq_chat_stream_feed": ([_vp, _cp, _sz], _vp),
        "llama_vq_chat_stream_finish": ([_vp], _vp),
        "llama_vq_chat_stream_free": ([_vp], None),
        "llama_vq_chat_builtin_templates": ([], _vp),
        "llama_vq_chat_string_free": ([_vp], None),
        "llama_vq_chat_set_log_verbosity": ([ctypes.c_int], None),
    },
    abi_function="llama_vq_chat_abi_version",
    abi_version=1,
)


@functools.cache
def _lib() -> ctypes.CDLL:
    lib = _cdll.load(CHAT)
    # common/'s warnings would print whole model outputs that fail to parse; StreamEnd.parse_error has it
    lib.llama_vq_chat_set_log_verbosity(int(_envs.get("LLAMA_VQ_CHAT_LOG_VERBOSITY") or "1"))
    return lib


def _take(ptr: int | None) -> Any:
    """Decode and free a JSON string the library returned; raise its error document."""
    if not ptr:
        raise MemoryError("llama_vq chat: the native call returned no result (out of memory)")
    doc = _cdll.take_json(_lib(), "llama_vq_chat_string_free", ptr)
    if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
        err = doc["error"]
        raise ChatTemplateError(err.get("message") or "chat error", err.get("param"))
    return doc


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode("utf-8")


def builtin_templates() -> tuple[str, ...]:
    """Names of llama.cpp's built-in (non-Jinja) templates, usable as ``template=NAME``."""
    return tuple(_take(_lib().llama_vq_chat_builtin_templates()))


@dataclass(frozen=True)
class TemplateInfo:
    source: str  # the Jinja source in use (the built-in's name for a built-in)
    tool_use_source: str | None  # the model's separate "tool_use" template, if it has one
    use_jinja: bool  # False for a built-in (non-Jinja) template: no tools
    was_explicit: bool  # the model had a template, or one was given
    builtin_name: str | None
    supports_thinking: bool  # the template has a reasoning (thinking) block
    caps: dict[str, bool]  # supports_tools, supports_tool_calls, supports_parallel_tool_calls, ...


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it


@dataclass(frozen=True)
class ChatMessage:
    content: str
    reasoning_content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ChatMessage:
        calls = tuple(
            ToolCall(c.get("id", ""), c["function"]["name"], c["function"]["arguments"])
            for c in d.get("tool_calls") or ()
        )
        return cls(d.get("content") or "", d.get("reasoning_content") or "", calls)

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI assistant message: content None when there are tool calls and no text."""
        msg: dict[str, Any] = {
            "role": "assistant",
            "content": self.content if self.content or not self.tool_calls else None,
        }
        if self.reasoning_content:
            msg["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            msg["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        return msg


@dataclass(frozen=True)
class ChatParams:
    """One rendered request: the prompt, how to constrain sampling, and how to parse the output."""

    prompt: str
    format_name: str
    grammar: str  # GBNF, "" for none
    grammar_type: str  # "tool_calls" (template's), "user" (request GBNF), "output_format", ""
    grammar_lazy: bool  # apply only once a trigger matched
    trigger_patterns: tuple[str, ...]  # regexes for llama_sampler_init_grammar_lazy_patterns
    trigger_tokens: tuple[int, ...]
    grammar_prefill_tokens: tuple[int, ...]  # accept these into a non-lazy grammar before sampling
    grammar_prefill_text: str  # their text: the generation prompt past the cut (see the ABI)
    tool_calls_strict: bool  # required/named tools: no free text before the calls (see the ABI)
    preserved_tokens: tuple[str, ...]  # special tokens the output format uses (render them as text)
    preserved_token_ids: tuple[int, ...]
    additional_stops: tuple[str, ...]
    generation_prompt: str
    supports_thinking: bool
    enable_thinking: bool
    thinking_start_tag: str
    thinking_end_tags: tuple[str, ...]
    parser: dict[str, Any] = field(repr=False)  # opaque state for parse() / stream()

    @classmethod
    def _from_doc(cls, d: dict[str, Any]) -> ChatParams:
        t = tuple
        return cls(
            d["prompt"],
            d["format_name"],
            d["grammar"],
            d["grammar_type"],
            d["grammar_lazy"],
            t(d["trigger_patterns"]),
            t(d["trigger_tokens"]),
            t(d["grammar_prefill_tokens"]),
            d["grammar_prefill_text"],
            d["tool_calls_strict"],
            t(d["preserved_tokens"]),
            t(d["preserved_token_ids"]),
            t(d["additional_stops"]),
            d["generation_prompt"],
            d["supports_thinking"],
            d["enable_thinking"],
            d["thinking_start_tag"],
            t(d["thinking_end_tags"]),
            d["parser"],
        )


@dataclass(frozen=True)
class StreamEnd:
    message: ChatMessage
    deltas: list[dict[str, Any]]  # the last OpenAI deltas (may be empty)
    parse_error: str | None  # set when the output did not match the format (kept as content)


def _parser_bytes(parser: ChatParams | Mapping[str, Any]) -> bytes:
    return _dumps(parser.parser if isinstance(parser, ChatParams) else dict(parser))


def _model_pointer(model: Any) -> int | None:
    if model is None:
        return None
    if isinstance(model, int):
        return model
    if isinstance(model, ctypes.c_void_p):
        return model.value
    ptr = getattr(model, "model", None)  # a llama_cpp.Llama
    if isinstance(ptr, ctypes.c_void_p):
        ptr = ptr.value
    if not isinstance(ptr, int) or not ptr:
        raise TypeError(f"expected a llama_model pointer or a Llama, got {type(model).__name__}")
    return ptr


class _Native:
    """Owns one handle of the chat library, freed once: by close(), else when collected."""

    _handle: int | None = None
    _free = ""  # the library function that frees the handle

    def close(self) -> None:
        if self._handle:
            getattr(_lib(), self._free)(self._handle)
            self._handle = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone already
            pass


class ChatTemplates(_Native):
    """A model's chat templates (or an override), ready to render requests and parse output.

    ``model``: a ``Llama``, a ``llama_model *`` (int), or None when ``template`` is given. The model must
    outlive this object (a Llama passed here is kept referenced). ``template``: a built-in template name
    (``builtin_templates()``; "chatml" is Jinja) or Jinja source, as llama-server's --chat-template.
    Raises ChatTemplateError when the template does not parse.
    """

    _free = "llama_vq_chat_templates_free"

    def __init__(
        self, model: Any = None, template: str | None = None, *, bos_token: str = "", eos_token: str = ""
    ) -> None:
        self._handle = None
        self._owner = model  # keeps a Llama (and its model) alive
        opts = {"template": template or "", "bos_token": bos_token, "eos_token": eos_token}
        err = ctypes.c_void_p()
        handle = _lib().llama_vq_chat_templates_init(_model_pointer(model), _dumps(opts), ctypes.byref(err))
        if not handle:
            _take(err.value)
            raise ChatTemplateError("the chat templates could not be created", "template")
        self._handle = handle

    @classmethod
    def from_llama(cls, llm: Any, template: str | None = None) -> ChatTemplates:
        return cls(llm, template)

    def _live(self) -> int:
        if not self._handle:
            raise ChatTemplateError("these chat templates were closed")
        return self._handle

    @functools.cached_property
    def info(self) -> TemplateInfo:
        d = _take(_lib().llama_vq_chat_templates_info(self._live()))
        return TemplateInfo(
            d["source"],
            d["tool_use_source"],
            d["use_jinja"],
            d["was_explicit"],
            d["builtin_name"],
            d["supports_thinking"],
            dict(d["caps"]),
        )

    def apply(self, request: Mapping[str, Any]) -> ChatParams:
        """Render an OpenAI chat request; raise ChatTemplateError naming the field at fault."""
        return ChatParams._from_doc(_take(_lib().llama_vq_chat_apply(self._live(), _dumps(dict(request)))))

    def parse(self, parser: ChatParams | Mapping[str, Any], text: str, *, partial: bool = False) -> ChatMessage:
        """Parse model output; raises ChatTemplateError when a full parse does not match the format."""
        raw = text.encode("utf-8")
        return ChatMessage.from_dict(
            _take(_lib().llama_vq_chat_parse(_parser_bytes(parser), raw, len(raw), int(partial)))
        )

    def stream(self, parser: ChatParams | Mapping[str, Any]) -> ChatStream:
        return ChatStream(parser)


class ChatStream(_Native):
    """Incremental parse of one generation: ``feed`` pieces, then ``finish`` once.

    The deltas of all feed calls plus finish's concatenate to finish's message: content and
    reasoning_content pieces, and per tool call (by ``index``) one delta with id, type and name, then
    argument chunks.
    """

    _free = "llama_vq_chat_stream_free"

    def __init__(self, parser: ChatParams | Mapping[str, Any]) -> None:
        err = ctypes.c_void_p()
        self._handle = _lib().llama_vq_chat_stream_new(_parser_bytes(parser), ctypes.byref(err))
        if not self._handle:
            _take(err.value)
            raise ChatTemplateError("the chat stream could not be created", "parser")

    def feed(self, text: str | bytes) -> list[dict[str, Any]]:
        """Deltas for one more piece of output; bytes may end inside a character (it waits for the rest)."""
        raw = text if isinstance(text, bytes) else text.encode("utf-8")
        return _take(_lib().llama_vq_chat_stream_feed(self._live(), raw, len(raw)))["deltas"]

    def finish(self) -> StreamEnd:
        d = _take(_lib().llama_vq_chat_stream_finish(self._live()))
        self.close()
        return StreamEnd(ChatMessage.from_dict(d["message"]), d["deltas"], d["parse_error"])

    def _live(self) -> int:
        if not self._handle:
            raise ChatTemplateError("this chat stream is finished")
        return self._handle
