"""Helpers of the chat tests: llama.cpp's vendored templates, tools, and OpenAI delta merging."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
# models/ is left out of the sdist but is in a checkout's vendored llama.cpp: the tests read it there.
TEMPLATES = ROOT / "vendor" / "llama.cpp" / "models" / "templates"

SPECIAL_FUNCTION = {
    "type": "function",
    "function": {
        "name": "special_function",
        "description": "I'm special",
        "parameters": {
            "type": "object",
            "properties": {"arg1": {"type": "integer", "description": "The arg."}},
            "required": ["arg1"],
        },
    },
}
GET_TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
GET_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city, in a unit",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
        },
    },
}


@cache
def template_text(name: str) -> str:
    return (TEMPLATES / name).read_text(encoding="utf-8")


def tool_templates() -> list[str]:
    """The vendored templates that declare tools (they mention the ``tools`` variable)."""
    return sorted(p.name for p in TEMPLATES.glob("*.jinja") if "tools" in p.read_text(encoding="utf-8"))


def merge_deltas(deltas: list[dict[str, Any]]) -> dict[str, Any]:
    """Concatenate OpenAI chat deltas as a client does; fail on a tool call's id or name sent twice."""
    content, reasoning, calls = "", "", {}
    for d in deltas:
        content += d.get("content") or ""
        reasoning += d.get("reasoning_content") or ""
        for tc in d.get("tool_calls") or ():
            i = tc["index"]
            call = calls.setdefault(i, {"id": None, "name": None, "arguments": ""})
            if "id" in tc:
                assert call["id"] is None, f"tool call {i}: id sent twice"
                assert tc["type"] == "function"
                call["id"] = tc["id"]
            fn = tc.get("function") or {}
            if "name" in fn:
                assert call["name"] is None, f"tool call {i}: name sent twice"
                call["name"] = fn["name"]
            call["arguments"] += fn.get("arguments") or ""
    assert sorted(calls) == list(range(len(calls))), f"tool call indexes {sorted(calls)} are not 0..n-1"
    return {"content": content, "reasoning_content": reasoning, "tool_calls": [calls[i] for i in range(len(calls))]}


def message_calls(message: Any) -> list[dict[str, Any]]:
    """Tool calls of a ChatMessage as plain dicts (id, name, arguments)."""
    return [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in message.tool_calls]


def args(call: dict[str, Any]) -> Any:
    return json.loads(call["arguments"])
