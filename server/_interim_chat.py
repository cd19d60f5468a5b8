"""Interim stand-in for server/chat_layer.py (llama.cpp's common/chat) until the chat branch lands.

Same interface (plan / apply_template / props, a plan's new_stream with feed / finish), but renders
with a sandboxed Jinja2 environment, parses nothing (all output is content) and refuses tools.
Deleted when the chat layer is merged.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .engine.request import Grammar


class ChatRequestError(ValueError):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(frozen=True)
class ChatPlan:
    prompt: str
    grammar: Grammar | None
    stop: tuple[str, ...]
    render_special: bool = False
    add_special: bool = True
    parse_special: bool = True
    has_tools: bool = False

    def new_stream(self) -> _Stream:
        return _Stream()


class _Stream:
    def __init__(self) -> None:
        self.text: list[str] = []

    def feed(self, text: str) -> list[dict[str, Any]]:
        self.text.append(text)
        return [{"content": text}] if text else []

    def finish(self, finish_reason: str) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
        return {"role": "assistant", "content": "".join(self.text)}, [], finish_reason


class ChatLayer:
    def __init__(self, source: str, bos: str, eos: str, *, chat_template_kwargs: Mapping[str, Any] | None = None,
                 reasoning_format: str = "auto") -> None:
        import jinja2  # noqa: PLC0415
        from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: PLC0415

        def raise_exception(message: str) -> None:
            raise jinja2.TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loader=jinja2.BaseLoader())
        env.globals.update(raise_exception=raise_exception,
                           strftime_now=lambda fmt: datetime.datetime.now().strftime(fmt))
        self._jinja = jinja2
        self.template = env.from_string(source)
        self.source, self.bos, self.eos = source, bos, eos
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.reasoning_format = reasoning_format

    @classmethod
    def for_model(cls, llm: Any, *, chat_template: str | None = None, chat_template_file: str | Path | None = None,
                  **defaults: Any) -> ChatLayer:
        source = str(llm.metadata.get("tokenizer.chat_template", ""))
        if chat_template_file:
            source = Path(chat_template_file).read_text(encoding="utf-8")
        elif chat_template:
            source = chat_template

        def text(tok: int) -> str:
            return llm.detokenize([tok], special=True).decode("utf-8", "replace") if tok >= 0 else ""

        return cls(source, text(llm.token_bos()), text(llm.token_eos()), **defaults)

    def apply_template(self, body: Mapping[str, Any]) -> str:
        kwargs = {**self.chat_template_kwargs, **(body.get("chat_template_kwargs") or {})}
        try:
            return self.template.render(messages=body["messages"], tools=body.get("tools"), add_generation_prompt=True,
                                        bos_token=self.bos, eos_token=self.eos, **kwargs)
        except Exception as e:  # noqa: BLE001 (a template fails on odd input in many ways)
            raise ChatRequestError(f"the chat template failed to render: {e}", "messages") from None

    def plan(self, body: Mapping[str, Any]) -> ChatPlan:
        if body.get("tools") and body.get("tool_choice") != "none":
            raise ChatRequestError(
                "tools: the interim chat template path renders no tools (llama.cpp's chat layer brings them)", "tools"
            )
        prompt = self.apply_template(body)
        stop = body.get("stop") or []
        return ChatPlan(prompt, _grammar(body), tuple(stop) + ((self.eos,) if self.eos else ()),
                        add_special=not (self.bos and prompt.startswith(self.bos)))

    def props(self) -> dict[str, Any]:
        return {"chat_template": self.source, "chat_template_caps": {}, "reasoning_format": self.reasoning_format,
                "chat_template_kwargs": self.chat_template_kwargs}


def _grammar(body: Mapping[str, Any]) -> Grammar | None:
    from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf  # noqa: PLC0415

    rf = body.get("response_format") or {}
    schema, param = body.get("json_schema"), "json_schema"
    if body.get("grammar") is not None:
        if schema is not None:
            raise ChatRequestError("grammar and json_schema: give one of them, not both", "grammar")
        return Grammar(body["grammar"])
    if rf.get("type") == "json_object":
        schema, param = rf.get("schema"), "response_format.schema"
        if schema is None:
            return Grammar(JSON_GBNF)
    elif rf.get("type") == "json_schema":
        schema, param = (rf.get("json_schema") or {}).get("schema"), "response_format.json_schema.schema"
        if schema is None:
            return Grammar(JSON_GBNF)
    if schema is None:
        return None
    import json  # noqa: PLC0415

    try:
        return Grammar(json_schema_to_gbnf(json.dumps(schema)))
    except Exception as e:  # noqa: BLE001
        raise ChatRequestError(f"{param}: cannot turn this JSON schema into a grammar: {e}", param) from None
