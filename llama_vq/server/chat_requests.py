"""What the front end changes in a chat request's body before llama-server's handler reads it: two request fields
that llama-server reads differently from the APIs that define them.

- A named ``tool_choice`` (chat completions ``{"type": "function", "function": {"name": N}}``, Responses
  ``{"type": "function", "name": N}``, Anthropic ``{"type": "tool", "name": N}``) must call N. llama-server reads
  the first two as "auto" and the third as "required" over every tool; here each becomes "required" over N alone
  (as llama_vq's own chat layer does, native/chat/request.cpp). A name that is not among the tools is a 400.
- Anthropic's ``"thinking": {"type": "enabled" | "disabled"}`` turns the template's thinking on or off
  (``chat_template_kwargs.enable_thinking``); llama-server reads only its ``budget_tokens``, so a request could not
  switch it (MiMo-V2-Flash's template thinks only when ``enable_thinking`` is true; llama-server's --reasoning auto
  turns it on wherever a template can think). The client's own ``chat_template_kwargs.enable_thinking`` wins; other
  types ("adaptive") keep the server's default.

Bodies that are not JSON objects, or whose fields have other shapes, go to the engine unchanged: its errors apply.
"""

from __future__ import annotations

import json
from typing import Any

CHAT = ("/v1/chat/completions", "/chat/completions")
RESPONSES = ("/v1/responses", "/responses")
ANTHROPIC = ("/v1/messages", "/v1/messages/count_tokens")
ROUTES = frozenset(CHAT + RESPONSES + ANTHROPIC)
_THINKING = {"enabled": True, "disabled": False}


class RequestError(ValueError):
    """A request the front end answers 400 itself; ``param`` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def adapt(route: str, body: bytes) -> bytes:
    """``body`` as llama-server's handler for ``route`` should read it (see the module); raises RequestError."""
    if route not in ROUTES or (b'"tool_choice"' not in body and b'"thinking"' not in body):
        return body
    try:
        doc = json.loads(body)
    except ValueError:
        return body
    if not isinstance(doc, dict):
        return body
    changed = _named_tool_choice(route, doc)
    if route in ANTHROPIC:
        changed = _thinking(doc) or changed
    # ASCII with escapes: a lone surrogate escape the client sent stays one (the engine answers it) instead of
    # failing to encode here
    return json.dumps(doc).encode("ascii") if changed else body


def _tool_name(route: str, tool: Any) -> Any:
    if not isinstance(tool, dict):
        return None
    if route in CHAT:
        fn = tool.get("function")
        return fn.get("name") if isinstance(fn, dict) else None
    return tool.get("name")


def _named_tool_choice(route: str, doc: dict[str, Any]) -> bool:
    choice = doc.get("tool_choice")
    if not isinstance(choice, dict):
        return False
    if route in CHAT and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
    elif route in RESPONSES and choice.get("type") == "function":
        name = choice.get("name")
    elif route in ANTHROPIC and choice.get("type") == "tool":
        name = choice.get("name")
    else:
        return False
    tools = doc.get("tools")
    if not isinstance(name, str) or not isinstance(tools, list):
        return False
    kept = [t for t in tools if _tool_name(route, t) == name]
    if not kept:
        raise RequestError(f"tool_choice names function '{name}', which is not in tools", "tool_choice")
    doc["tools"] = kept
    if route in ANTHROPIC:
        doc["tool_choice"] = {**choice, "type": "any"}
        del doc["tool_choice"]["name"]
    else:
        doc["tool_choice"] = "required"
    return True


def _thinking(doc: dict[str, Any]) -> bool:
    thinking = doc.get("thinking")
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    switch = _THINKING.get(kind) if isinstance(kind, str) else None
    kwargs = doc.get("chat_template_kwargs", {})
    if switch is None or not isinstance(kwargs, dict) or "enable_thinking" in kwargs:
        return False
    doc["chat_template_kwargs"] = {**kwargs, "enable_thinking": switch}
    return True
