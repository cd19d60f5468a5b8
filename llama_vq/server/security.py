"""API keys and CORS, answered as llama-server answers them (tools/server/server-http.cpp's middlewares).

- Keys: `Authorization: Bearer KEY` or `X-Api-Key: KEY` (Anthropic's header), any of several keys; /health,
  /v1/health and CORS pre-flights are open; a wrong or missing key is a 401 with llama-server's body.
- CORS: Starlette's middleware, configured from llama-server's --cors-origins/--cors-methods/--cors-headers/
  --cors-credentials: "*" (with credentials the request's Origin is echoed, as llama-server does), "localhost"
  (only http(s)://localhost / 127.0.0.1 / [::1] origins, any port), or a comma-separated list.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Callable, Iterable

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

log = logging.getLogger("llama_vq.server")

OPEN_PATHS = frozenset({"/health", "/v1/health"})
LOCALHOST_ORIGINS = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?"


def error_body(status: int, message: str, type_: str) -> bytes:
    return json.dumps({"error": {"code": status, "message": message, "type": type_}}).encode()


async def send_json(send: Send, status: int, body: bytes, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class ApiKeyMiddleware:
    """`ready`: whether the model is loaded; until then requests go on without a key check, to the app's 503
    "Loading model" (llama-server checks its state before the key)."""

    def __init__(
        self, app: ASGIApp, keys: Iterable[str], prefix: str = "", ready: Callable[[], bool] | None = None
    ) -> None:
        self.app = app
        self.keys = [k.encode() for k in keys]
        self.open = frozenset(prefix + p for p in OPEN_PATHS)
        self.ready = ready

    def allowed(self, authorization: bytes | None, x_api_key: bytes | None) -> bool:
        token = authorization or x_api_key or b""
        if token.startswith(b"Bearer "):
            token = token[len(b"Bearer ") :]
        # compare with every key, in constant time per key
        return any([hmac.compare_digest(token, k) for k in self.keys])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or scope["path"] in self.open:
            await self.app(scope, receive, send)
            return
        if self.ready is not None and not self.ready():
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if self.allowed(headers.get(b"authorization"), headers.get(b"x-api-key")):
            await self.app(scope, receive, send)
            return
        log.warning("unauthorized: invalid API key (%s %s)", scope["method"], scope["path"])
        await send_json(send, 401, error_body(401, "Invalid API Key", "authentication_error"))


def cors_options(origins: str, methods: str, headers: str, credentials: bool) -> dict:
    """Keyword arguments of Starlette's CORSMiddleware for llama-server's CORS flags."""
    opts: dict = {
        "allow_methods": [m.strip() for m in methods.split(",") if m.strip()],
        "allow_headers": [h.strip() for h in headers.split(",") if h.strip()],
        "allow_credentials": credentials,
        "expose_headers": [],
    }
    if origins.strip() == "localhost":
        opts["allow_origins"] = []
        opts["allow_origin_regex"] = LOCALHOST_ORIGINS
    else:
        opts["allow_origins"] = [o.strip() for o in origins.split(",") if o.strip()]
    return opts


class AlwaysAllowOrigin:
    """llama-server sets Access-Control-Allow-Origin on every answer, also to requests without an Origin (with
    "*" or one fixed origin); Starlette's middleware answers only requests that have one. This adds the header
    where Starlette did not and the configuration names a fixed value."""

    def __init__(self, app: ASGIApp, origins: str) -> None:
        self.app = app
        value = origins.strip()
        self.value = value.encode() if value and value != "localhost" and "," not in value else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.value is None:
            await self.app(scope, receive, send)
            return

        async def wrapped(msg: dict) -> None:
            if msg["type"] == "http.response.start":
                names = {k.lower() for k, _ in msg.get("headers", [])}
                if b"access-control-allow-origin" not in names:
                    msg = dict(msg)
                    msg["headers"] = [*msg.get("headers", []), (b"access-control-allow-origin", self.value)]
            await send(msg)

        await self.app(scope, receive, wrapped)


def add_cors(app, origins: str, methods: str, headers: str, credentials: bool) -> None:
    app.add_middleware(AlwaysAllowOrigin, origins=origins)
    app.add_middleware(CORSMiddleware, **cors_options(origins, methods, headers, credentials))


def header_case(name: bytes) -> bytes:
    """b"access-control-allow-origin" -> b"Access-Control-Allow-Origin" (what is already upper stays)."""
    return b"-".join(p[:1].upper() + p[1:] for p in name.split(b"-"))


class HeaderCaseMiddleware:
    """Response header names as llama-server writes them ("Access-Control-Allow-Origin", "Content-Type"):
    Starlette lowercases them. Case does not matter in HTTP, but a client that compares names exactly (as
    llama-server's own test suite does, through dict(response.headers)) finds llama-server's names. uvicorn's
    h11 protocol keeps the case it is given; its httptools protocol, when installed, lowercases every name."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def cased(msg: dict) -> None:
            if msg["type"] == "http.response.start":
                msg = dict(msg)
                msg["headers"] = [(header_case(k), v) for k, v in msg.get("headers", [])]
            await send(msg)

        await self.app(scope, receive, cased)


class BodyLimitMiddleware:
    """413 for a body over the limit, by Content-Length at once and by counting a chunked body."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.limit <= 0:
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        too_big = error_body(413, f"request body over --max-body-size ({self.limit} bytes)", "invalid_request_error")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await send_json(send, 413, too_big)
            return
        seen = 0
        started = False

        async def counted() -> dict:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge
            return msg

        async def tracked(msg: dict) -> None:
            nonlocal started
            started = started or msg["type"] == "http.response.start"
            await send(msg)

        try:
            await self.app(scope, counted, tracked)
        except _TooLarge:
            if not started:
                await send_json(send, 413, too_big)


class _TooLarge(Exception):
    pass
