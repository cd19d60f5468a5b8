"""The FastAPI application: middlewares, OpenAI-shaped error handling, OpenAPI schema, lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import __version__
from .api_router import ROUTES, router
from .auth import ApiKeyMiddleware, CorsMiddleware, send_error
from .engine import Engine
from .engine.errors import EngineError
from .errors import ApiError, error_body, from_exception
from .metrics import Metrics
from .serving import Serving
from .settings import Settings

log = logging.getLogger("llama_vq.server")


def create_app(
    settings: Settings, engine: Engine, metrics: Metrics, *, manage_engine: bool = True
) -> FastAPI:
    """The app for one engine. With manage_engine, its lifespan starts the engine (model load) and
    shuts it down; without, the caller does (tests that run many lifespans on one engine)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if manage_engine and engine.status == "loading" and not engine._thread.is_alive():
            engine.start()
        yield
        if manage_engine:
            await asyncio.to_thread(engine.shutdown)  # waits for the worker: keep the loop free

    app = FastAPI(
        title="llama-vq-server",
        version=__version__,
        lifespan=lifespan,
        description="OpenAI-compatible API of llama-vq (quantized V cache without flash "
        "attention).",
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.metrics = metrics
    app.state.serving = Serving(engine, settings)
    app.include_router(router)

    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    # Engine and chat-layer exceptions (ValueError covers the chat layer's) become answers in
    # errors.from_exception; registered by class because Starlette re-raises what reaches `Exception`.
    app.add_exception_handler(EngineError, _unexpected)
    app.add_exception_handler(ValueError, _unexpected)
    app.add_exception_handler(Exception, _unexpected)

    # Outermost first: count every answer, then CORS (pre-flights answered before the key check),
    # then check the key, then the body size.
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_body_bytes)
    if settings.api_keys:
        app.add_middleware(ApiKeyMiddleware, keys=settings.api_keys)
    if settings.cors_origins:
        app.add_middleware(CorsMiddleware, origins=settings.cors_origins)
    app.add_middleware(RequestMetricsMiddleware, metrics=metrics)

    app.openapi = lambda: _openapi(app, bool(settings.api_keys))  # type: ignore[method-assign]
    return app


# ---- errors ------------------------------------------------------------------------------------


def _error(
    status: int,
    message: str,
    type_: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(message, type_, param, code), status_code=status, headers=headers)


async def _api_error(request: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, ApiError)
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


_ROLE_TAGS = {"system", "developer", "user", "assistant", "tool"}
_UNION_LABELS = {"str", "int", "float", "bool", "list", "dict", "none", "tagged-union", "literal"}


def _param(loc: tuple[Any, ...]) -> str:
    """('body', 'messages', 0, 'role') -> 'messages[0].role' (pydantic's union labels dropped)."""
    out = ""
    prev: Any = None
    for part in loc:
        prev, was = part, prev
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(was, int) and part in _ROLE_TAGS:
            continue  # the discriminator of a message's union (messages[0].tool.tool_call_id)
        elif part == "body" and not out:
            continue
        elif isinstance(part, str) and (
            part in _UNION_LABELS
            or "[" in part
            or part.startswith(("constrained-", "function-"))
            or part[:1].isupper()  # a model class name: our fields are snake_case
        ):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out


async def _validation_error(request: Request, e: Exception) -> JSONResponse:
    """FastAPI's 422 becomes OpenAI's 400, naming the first offending parameter."""
    assert isinstance(e, RequestValidationError)
    errs = e.errors()
    # Of a union's alternatives, the deepest error is the most specific one.
    first = (
        max(errs, key=lambda x: len(x.get("loc", ()))) if errs else {"loc": (), "msg": "invalid"}
    )
    if first.get("type") == "json_invalid":
        return _error(
            400,
            f"the request body is not valid JSON: {first.get('ctx', {}).get('error', '')}",
            code="invalid_json",
        )
    param = _param(tuple(first.get("loc", ())))
    if first.get("type") in ("union_tag_invalid", "union_tag_not_found"):  # a message's role
        param += "." + str(first.get("ctx", {}).get("discriminator", "role")).strip("'")
    if not param and first.get("type") in ("missing", "model_attributes_type", "dict_type"):
        return _error(400, "the request body must be a JSON object", code="invalid_request")
    more = f" (and {len(errs) - 1} more problems)" if len(errs) > 1 else ""
    return _error(
        400,
        f"{param or 'body'}: {first.get('msg', 'invalid')}{more}",
        param=param or None,
        code="invalid_value",
    )


async def _http_error(request: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, StarletteHTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
    return _error(e.status_code, str(e.detail), code=code, headers=getattr(e, "headers", None))


async def _unexpected(request: Request, e: Exception) -> JSONResponse:
    """Engine and chat-layer exceptions get their status (errors.from_exception); others are 500s."""
    err = from_exception(e)
    if err.status >= 500:
        log.error("error on %s %s: %s", request.method, request.url.path, err.message)
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


# ---- middlewares --------------------------------------------------------------------------------


_CLOSE = [(b"connection", b"close")]


class BodyLimitMiddleware:
    """413 for bodies over ``limit`` bytes: by Content-Length before reading, else while reading."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    def _too_large(self) -> ApiError:
        return ApiError(
            413, f"request body larger than {self.limit} bytes (--max-body-size)", code="body_too_large"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if length is not None:
            if not length.strip().isdigit():
                await send_error(send, ApiError(400, "invalid Content-Length", code="invalid_request"), _CLOSE)
                return
            if int(length) > self.limit:
                await send_error(send, self._too_large(), _CLOSE)
                return
            await self.app(scope, receive, send)
            return
        # No length (chunked): read up to the limit, then replay the body to the app.
        body = bytearray()
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body += msg.get("body", b"")
            if len(body) > self.limit:
                await send_error(send, self._too_large(), _CLOSE)
                return
            if not msg.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class RequestMetricsMiddleware:
    """Counts answers by route and status for /metrics."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = scope["path"] if scope["path"] in ROUTES else "other"
        status = 0

        async def counting_send(msg: Message) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            await send(msg)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            self.metrics.requests.inc(1, route, str(status or 500))


# ---- OpenAPI ------------------------------------------------------------------------------------


def _openapi(app: FastAPI, with_key: bool) -> dict[str, Any]:
    """FastAPI's schema without its 422 answers (we answer 400), plus bearer auth with keys."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    for methods in schema.get("paths", {}).values():
        for op in methods.values():
            op.get("responses", {}).pop("422", None)
    comps = schema.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        comps.pop(name, None)
    if with_key:
        schema.setdefault("components", {})["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer"}
        }
        for path, methods in schema.get("paths", {}).items():
            for op in methods.values():
                if path != "/health":
                    op["security"] = [{"bearer": []}]
                    op.setdefault("responses", {}).setdefault(
                        "401",
                        {
                            "description": "Missing or wrong API key",
                            "content": {
                                "application/json": {
                                    "schema": {"$ref": "#/components/schemas/ErrorResponse"}
                                }
                            },
                        },
                    )
    app.openapi_schema = schema
    return schema
