"""Server-Sent Events as each API frames them: the keep-alive comment, an error the engine answered once a stream
had begun, and the final error event that ends an open stream when the server stops (OpenAI, Anthropic, OpenAI
Responses)."""

from __future__ import annotations

import json
from typing import Any

KEEPALIVE = b": keepalive\n\n"

ANTHROPIC = frozenset({"/v1/messages"})
RESPONSES = frozenset({"/v1/responses", "/responses"})
# the OpenAI streams, which llama-server ends with "data: [DONE]" (its own /completion and /infill do not)
OPENAI_DONE = frozenset({"/v1/chat/completions", "/chat/completions", "/v1/completions"})


def engine_error(route_path: str, body: bytes) -> bytes:
    """The error body a handler answered after keep-alives had opened the stream (status 200 already sent), framed
    as llama-server frames an error during a stream."""
    if not body:
        return b""
    if route_path in ANTHROPIC:
        return b"event: error\ndata: " + body + b"\n\n"
    return b"data: " + body + b"\n\n"


def final_error(route_path: str, message: str, n_events: int) -> bytes:
    """The last events of a stream that the server ends (it is stopping): an error event in the route's API shape,
    then "data: [DONE]" for the OpenAI streams that end with it. `n_events`: events sent so far (a Responses event's
    sequence_number)."""
    if route_path in ANTHROPIC:
        anthropic = {"type": "error", "error": {"type": "overloaded_error", "message": message}}
        return b"event: error\ndata: " + json.dumps(anthropic).encode() + b"\n\n"
    if route_path in RESPONSES:
        doc: dict[str, Any] = {
            "type": "error",
            "code": "server_shutting_down",
            "message": message,
            "param": None,
            "sequence_number": n_events,
        }
        return b"event: error\ndata: " + json.dumps(doc).encode() + b"\n\n"
    out = b"data: " + json.dumps({"error": {"code": 503, "message": message, "type": "unavailable_error"}}).encode()
    out += b"\n\n"
    if route_path in OPENAI_DONE:
        out += b"data: [DONE]\n\n"
    return out


def count_events(chunk: bytes) -> int:
    """SSE events in a chunk of the engine's stream (each ends with an empty line)."""
    return chunk.count(b"\n\n")
