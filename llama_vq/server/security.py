"""Access, answered as llama-server answers it (tools/server/server-http.cpp's middlewares): API keys, CORS and
the request size limit.

- Keys: `Authorization: Bearer KEY` or `X-Api-Key: KEY` (Anthropic's header), any of several keys; of a header
  sent twice the first counts, as cpp-httplib reads it; /health, /v1/health, OPTIONS and the web UI's root (a
  404 here) are open; a wrong or missing key is a 401 with llama-server's body.
- CORS: llama-server's --cors-origins/--cors-methods/--cors-headers/--cors-credentials, answered as llama-server
  answers them (CorsMiddleware): "*" (with credentials the request's Origin is echoed), "localhost" (only
  http(s)://localhost / 127.0.0.1 / [::1] origins, any port), one fixed origin, or a comma-separated list; every
  OPTIONS request is a 200 with the Access-Control-Allow-* headers.
- Body size: 413 for a body over --max-body-size, by Content-Length before it is read.
"""

from __future__ import annotations

import hmac
import logging
import re
from collections.abc import Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .responses import error_body, first_header, send_json

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/health", "/v1/health"})
# llama-server's web UI assets are public too; of them only its root, "/", exists here (a 404: no UI is served)
OPEN_UI_PATHS = frozenset({"/"})
LOCALHOST_ORIGINS = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?"


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, keys: Iterable[str], prefix: str = "") -> None:
        self.app = app
        self.keys = [k.encode() for k in keys]
        self.open = frozenset(prefix + p for p in OPEN_PATHS | OPEN_UI_PATHS)

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


class CorsMiddleware:
    """CORS as llama-server's pre-routing handler answers it (server-http.cpp), on every request:

    - Access-Control-Allow-Origin: with --cors-origins "*" and credentials (the default) the request's Origin is
      echoed; "localhost" echoes only an http(s) origin on localhost / 127.0.0.1 / [::1], any port; a fixed origin
      is named on every answer; a comma-separated list (llama-vq's) echoes the origins it lists. A disallowed
      origin gets no Allow-Origin header, and the answer is otherwise the same (the browser refuses it).
    - OPTIONS, a pre-flight or not: 200 with an empty body and Access-Control-Allow-Credentials/-Methods/-Headers
      as configured, on any path, before the readiness and key checks (browsers send no key in a pre-flight).
    """

    def __init__(self, app: ASGIApp, origins: str, methods: str, headers: str, credentials: bool) -> None:
        self.app = app
        self.origins = origins.strip()
        self.credentials = credentials
        self.listed = frozenset(o.strip() for o in self.origins.split(",") if o.strip())
        self.options_headers = [
            (b"access-control-allow-credentials", b"true" if credentials else b"false"),
            (b"access-control-allow-methods", methods.encode()),
            (b"access-control-allow-headers", headers.encode()),
        ]

    def allow_origin(self, origin: str | None) -> str | None:
        """The Access-Control-Allow-Origin value for a request from `origin` (None: no header)."""
        if self.origins == "*" and self.credentials:
            return origin or None
        if self.origins == "localhost":
            return origin if origin and re.fullmatch(LOCALHOST_ORIGINS, origin) else None
        if len(self.listed) > 1:
            return origin if origin in self.listed else None
        return self.origins or None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = first_header(scope["headers"], b"origin")
        origin = raw.decode("latin-1") if raw is not None else None
        allowed = self.allow_origin(origin)
        cors = [] if allowed is None else [(b"access-control-allow-origin", allowed.encode("latin-1"))]
        if allowed is not None and allowed != self.origins:
            cors.append((b"vary", b"Origin"))  # the value depends on the request's Origin
        if origin and allowed is None and self.origins == "localhost":
            log.warning("(CORS) skip non-localhost origin: %s", origin)  # as llama-server logs it
        if scope["method"] == "OPTIONS":
            headers = [(b"content-type", b"text/html"), (b"content-length", b"0"), *cors, *self.options_headers]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return
        if not cors:
            await self.app(scope, receive, send)
            return

        async def with_cors(msg: Message) -> None:
            if msg["type"] == "http.response.start":
                msg = dict(msg)
                kept = [(k, v) for k, v in msg.get("headers", []) if k.lower() != b"access-control-allow-origin"]
                msg["headers"] = [*kept, *cors]
            await send(msg)

        await self.app(scope, receive, with_cors)


def add_cors(app, origins: str, methods: str, headers: str, credentials: bool) -> None:  # noqa: ANN001
    """CORS as llama-server (CorsMiddleware)."""
    app.add_middleware(CorsMiddleware, origins=origins, methods=methods, headers=headers, credentials=credentials)


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
