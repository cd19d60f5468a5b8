"""Access, answered as llama-server answers it (tools/server/server-http.cpp's middlewares): API keys, CORS and
the request size limit.

- Keys: `Authorization: Bearer KEY` or `X-Api-Key: KEY` (Anthropic's header), any of several keys; of a header
  sent twice the first counts, as cpp-httplib reads it; /health, /v1/health and OPTIONS are open; a wrong or
  missing key is a 401 with llama-server's body.
- CORS: Starlette's middleware for pre-flights, configured from llama-server's --cors-origins/--cors-methods/
  --cors-headers/--cors-credentials: "*" (with credentials the request's Origin is echoed, as llama-server does),
  "localhost" (only http(s)://localhost / 127.0.0.1 / [::1] origins, any port), or a comma-separated list. Any
  other OPTIONS request is answered 200 with the Access-Control-Allow-* headers, as llama-server answers it.
- Body size: 413 for a body over --max-body-size, by Content-Length before it is read.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterable

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .responses import error_body, first_header, send_json

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/health", "/v1/health"})
LOCALHOST_ORIGINS = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?"


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, keys: Iterable[str], prefix: str = "") -> None:
        self.app = app
        self.keys = [k.encode() for k in keys]
        self.open = frozenset(prefix + p for p in OPEN_PATHS)

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
        headers = scope["headers"]
        if self.allowed(first_header(headers, b"authorization"), first_header(headers, b"x-api-key")):
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

        async def wrapped(msg: Message) -> None:
            if msg["type"] == "http.response.start":
                names = {k.lower() for k, _ in msg.get("headers", [])}
                if b"access-control-allow-origin" not in names:
                    msg = dict(msg)
                    msg["headers"] = [*msg.get("headers", []), (b"access-control-allow-origin", self.value)]
            await send(msg)

        await self.app(scope, receive, wrapped)


class OptionsMiddleware:
    """An OPTIONS request that is not a CORS pre-flight (no Origin, or no Access-Control-Request-Method): 200 with an
    empty body and llama-server's Access-Control-Allow-Credentials/-Methods/-Headers, on any path, without a key."""

    def __init__(self, app: ASGIApp, methods: str, headers: str, credentials: bool) -> None:
        self.app = app
        self.headers = [
            (b"access-control-allow-credentials", b"true" if credentials else b"false"),
            (b"access-control-allow-methods", methods.encode()),
            (b"access-control-allow-headers", headers.encode()),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "OPTIONS":
            await self.app(scope, receive, send)
            return
        names = {k for k, _ in scope["headers"]}
        if b"origin" in names and b"access-control-request-method" in names:
            await self.app(scope, receive, send)
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/html"), (b"content-length", b"0"), *self.headers],
            }
        )
        await send({"type": "http.response.body", "body": b""})


def add_cors(app, origins: str, methods: str, headers: str, credentials: bool) -> None:  # noqa: ANN001
    """CORS as llama-server: plain OPTIONS answered, pre-flights by Starlette, Allow-Origin on every answer."""
    app.add_middleware(OptionsMiddleware, methods=methods, headers=headers, credentials=credentials)
    app.add_middleware(AlwaysAllowOrigin, origins=origins)
    app.add_middleware(CORSMiddleware, **cors_options(origins, methods, headers, credentials))


class BodyLimitMiddleware:
    """413 for a body over the limit, by Content-Length at once and by counting a chunked body."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.limit <= 0:
            await self.app(scope, receive, send)
            return
        length = first_header(scope["headers"], b"content-length")
        too_big = error_body(413, f"request body over --max-body-size ({self.limit} bytes)", "invalid_request_error")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await send_json(send, 413, too_big)
            return
        seen = 0
        started = False

        async def counted() -> Message:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge
            return msg

        async def tracked(msg: Message) -> None:
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
