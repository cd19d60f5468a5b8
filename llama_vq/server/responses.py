"""HTTP response plumbing for every part of the front end: llama-server's error body, a JSON answer sent straight
through ASGI, an engine answer's headers as ASGI headers, and header names cased as llama-server writes them."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from starlette.types import Send

JSON_TYPE = b"application/json; charset=utf-8"
# headers the ASGI server writes itself: an engine answer's own values for them are dropped
_FRAMING = frozenset({"content-type", "content-length", "transfer-encoding", "connection"})


def error_body(status: int, message: str, type_: str) -> bytes:
    """llama-server's (OpenAI-shaped) error body: {"error": {"code", "message", "type"}}."""
    return json.dumps({"error": {"code": status, "message": message, "type": type_}}).encode()


async def send_json(send: Send, status: int, body: bytes, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    """A whole JSON answer through ASGI, with its Content-Length."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", JSON_TYPE), (b"content-length", str(len(body)).encode()), *headers],
        }
    )
    await send({"type": "http.response.body", "body": body})


def asgi_headers(content_type: str, headers: Mapping[str, str], length: int | None) -> list[tuple[bytes, bytes]]:
    """An engine answer's content type and headers (llama-server's own, such as Process-Start-Time-Unix) as ASGI
    headers; Content-Length when the body is whole."""
    out = [(b"content-type", content_type.encode())]
    if length is not None:
        out.append((b"content-length", str(length).encode()))
    for k, v in headers.items():
        if k.lower() not in _FRAMING:
            out.append((k.encode("latin-1", "replace"), v.encode("latin-1", "replace")))
    return out


def header_case(name: bytes) -> bytes:
    """b"access-control-allow-origin" -> b"Access-Control-Allow-Origin" (what is already upper stays)."""
    return b"-".join(p[:1].upper() + p[1:] for p in name.split(b"-"))


def first_header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    """The first value of a header that a request may repeat (cpp-httplib's get_header_value, which llama-server's
    key check reads, takes the first); `name` lowercase, as ASGI gives names."""
    for k, v in headers:
        if k == name:
            return v
    return None
