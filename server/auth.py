"""API-key check: ``Authorization: Bearer <key>`` on every path but /health (ASGI middleware)."""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

log = logging.getLogger("llama_vq.server.auth")

OPEN_PATHS = frozenset({"/health"})


def _unauthorized(message: str) -> tuple[dict, bytes]:
    body = {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
    return body, json.dumps(body).encode()


class ApiKeyMiddleware:
    """401 with OpenAI's error body unless the request carries one of ``keys``.

    Every key is compared with hmac.compare_digest (time independent of where the strings differ),
    and all keys are compared, so the answer time does not tell which key nearly matched.
    """

    def __init__(self, app: ASGIApp, keys: Iterable[str], open_paths: frozenset[str] = OPEN_PATHS):
        self.app = app
        self.keys = tuple(k.encode() for k in keys)
        self.open_paths = open_paths

    def allowed(self, header: bytes | None) -> bool:
        if not header:
            return False
        scheme, _, token = header.partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        token = token.strip()
        results = [hmac.compare_digest(token, k) for k in self.keys]
        return any(results)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        if self.allowed(header):
            await self.app(scope, receive, send)
            return
        _, body = _unauthorized(
            "missing API key: send 'Authorization: Bearer <key>'"
            if header is None
            else "invalid API key"
        )
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def warn_if_exposed(host: str, loopback: bool, has_key: bool) -> None:
    if not loopback and not has_key:
        log.warning(
            "listening on %s without an API key: anyone who can reach this address can use "
            "the model. Set --api-key-file (or LLAMA_VQ_API_KEY), or bind to 127.0.0.1.",
            host,
        )
