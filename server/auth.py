"""Who may call: the API key (``Authorization: Bearer <key>`` or ``X-Api-Key: <key>``) on every path
but /health, and CORS (``--cors-origin``; pre-flight OPTIONS answered before the key is checked).
Both are ASGI middlewares."""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import ApiError, unauthorized

log = logging.getLogger("llama_vq.server.auth")

OPEN_PATHS = frozenset({"/health", "/v1/health"})


async def send_error(send: Send, e: ApiError, extra: list[tuple[bytes, bytes]] = ()) -> None:
    """Answer ``e`` (OpenAI's body) from a middleware, before any route runs."""
    raw = json.dumps(e.body()).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(raw)).encode()),
        *((k.lower().encode(), v.encode()) for k, v in e.headers.items()),
        *extra,
    ]
    await send({"type": "http.response.start", "status": e.status, "headers": headers})
    await send({"type": "http.response.body", "body": raw})


def _header(scope: Scope, name: bytes) -> bytes | None:
    return next((v for k, v in scope["headers"] if k == name), None)


class ApiKeyMiddleware:
    """401 with OpenAI's error body unless the request carries one of ``keys``.

    The key comes from ``Authorization: Bearer <key>`` or, as llama-server accepts it (Anthropic's
    clients send it), from ``X-Api-Key: <key>``. Every key is compared with hmac.compare_digest (time
    independent of where the strings differ), and all keys are compared, so the answer time does not
    tell which key nearly matched.
    """

    def __init__(self, app: ASGIApp, keys: Iterable[str], open_paths: frozenset[str] = OPEN_PATHS):
        self.app = app
        self.keys = tuple(k.encode() for k in keys)
        self.open_paths = open_paths

    def _matches(self, token: bytes) -> bool:
        results = [hmac.compare_digest(token.strip(), k) for k in self.keys]
        return any(results)

    def allowed(self, authorization: bytes | None, x_api_key: bytes | None = None) -> bool:
        if authorization:
            scheme, _, token = authorization.partition(b" ")
            if scheme.lower() == b"bearer" and self._matches(token):
                return True
        return bool(x_api_key) and self._matches(x_api_key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        authorization = _header(scope, b"authorization")
        x_api_key = _header(scope, b"x-api-key")
        if self.allowed(authorization, x_api_key):
            await self.app(scope, receive, send)
            return
        missing = authorization is None and x_api_key is None
        await send_error(
            send,
            unauthorized(
                "missing API key: send 'Authorization: Bearer <key>' or 'X-Api-Key: <key>'"
                if missing
                else "invalid API key"
            ),
        )


class CorsMiddleware:
    """CORS for browsers (``--cors-origin``): ``origins`` is ``("*",)`` or exact origins.

    A pre-flight (OPTIONS with Origin and Access-Control-Request-Method) is answered here with 204,
    before the API key is checked: browsers never send credentials on a pre-flight. Other requests
    from an allowed origin get Access-Control-Allow-Origin on every answer, errors included.
    """

    METHODS = b"GET, POST, OPTIONS"
    HEADERS = b"Authorization, Content-Type, X-Api-Key"

    def __init__(self, app: ASGIApp, origins: Iterable[str]) -> None:
        self.app = app
        self.origins = tuple(origins)

    def _allow(self, origin: bytes | None) -> bytes | None:
        if origin is None:
            return None
        if "*" in self.origins:
            return b"*"
        return origin if origin.decode("latin-1") in self.origins else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        allow = self._allow(_header(scope, b"origin"))
        requested = _header(scope, b"access-control-request-method")
        if scope["method"] == "OPTIONS" and requested is not None:
            headers = [(b"vary", b"Origin"), (b"content-length", b"0")]
            if allow is not None:
                headers += [
                    (b"access-control-allow-origin", allow),
                    (b"access-control-allow-methods", self.METHODS),
                    (
                        b"access-control-allow-headers",
                        _header(scope, b"access-control-request-headers") or self.HEADERS,
                    ),
                    (b"access-control-max-age", b"600"),
                ]
            await send({"type": "http.response.start", "status": 204, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return
        if allow is None:
            await self.app(scope, receive, send)
            return

        async def with_cors(msg: Message) -> None:
            if msg["type"] == "http.response.start":
                msg = dict(msg)
                msg["headers"] = [
                    *msg.get("headers", []),
                    (b"access-control-allow-origin", allow),
                    (b"vary", b"Origin"),
                ]
            await send(msg)

        await self.app(scope, receive, with_cors)


def warn_if_exposed(host: str, loopback: bool, has_key: bool) -> None:
    if not loopback and not has_key:
        log.warning(
            "listening on %s without an API key: anyone who can reach this address can use "
            "the model. Set --api-key-file (or LLAMA_VQ_API_KEY), or bind to 127.0.0.1.",
            host,
        )
