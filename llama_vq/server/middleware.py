"""llama-server's HTTP behaviours that are not about access: the one readiness check (503 "Loading model" on every
route until the model is loaded and its task loop runs), HEAD answered as GET without the body, and response
header names cased as llama-server writes them."""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .engine import Engine
from .responses import error_body, header_case, send_json


class Readiness:
    """Whether the server answers requests: the model is loaded, slots saved in --state-dir are restored (set()),
    and the engine's task loop still runs. The one place that decides it, for every route and for the metrics."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._ready = asyncio.Event()

    def set(self) -> None:
        self._ready.set()

    @property
    def loaded(self) -> bool:
        """Whether set() was called (the engine may have stopped since)."""
        return self._ready.is_set()

    def ready(self) -> bool:
        return self._ready.is_set() and self.engine.loop_alive

    def refusal(self) -> bytes:
        """The 503 body while not ready: llama-server's "Loading model", or why the engine is gone."""
        state = self.engine.state().get("state")
        if state in ("failed", "stopped"):
            return error_body(503, f"the engine has {state}", "unavailable_error")
        return error_body(503, "Loading model", "unavailable_error")


class ReadinessMiddleware:
    """503 on every request until ready, /health and the OpenAPI document included (llama-server checks its state
    before the key; CORS pre-flights are answered before either)."""

    def __init__(self, app: ASGIApp, readiness: Readiness) -> None:
        self.app = app
        self.readiness = readiness

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.readiness.ready():
            await self.app(scope, receive, send)
            return
        await send_json(send, 503, self.readiness.refusal())


class HeadMiddleware:
    """HEAD is answered as GET without the body (cpp-httplib does so for every GET route): the inner app sees a GET;
    the ASGI server, which still sees the HEAD, writes the headers only."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "HEAD":
            scope = {**scope, "method": "GET"}
        await self.app(scope, receive, send)


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

        async def cased(msg: Message) -> None:
            if msg["type"] == "http.response.start":
                msg = dict(msg)
                msg["headers"] = [(header_case(k), v) for k, v in msg.get("headers", [])]
            await send(msg)

        await self.app(scope, receive, cased)
