"""The FastAPI application: llama-server's routes (from the engine's own route table) behind llama-vq's front end.

Every route the engine lists is registered under --api-prefix with FastAPI's path syntax and served by the
bridge (bridge.py). The front end answers, without the engine: 503 "Loading model" on every route until the
model is loaded and its task loop runs (as llama-server's middleware), 401 for a missing or wrong key, CORS
pre-flights, 413 for a body over --max-body-size, 404 in llama-server's error shape, the OpenAPI page (/docs,
/openapi.json), and Prometheus metrics of its own after llama-server's (/metrics).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import logging
import re

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import __version__
from .bridge import Bridge, EngineResponse
from .engine import Engine, Route
from .metrics import Metrics
from .security import ApiKeyMiddleware, BodyLimitMiddleware, HeaderCaseMiddleware, add_cors, error_body
from .settings import Settings

log = logging.getLogger("llama_vq.server")

# OpenAPI tags and summaries by path (the routes themselves come from the engine)
_DOC = {
    "/v1/chat/completions": ("OpenAI", "Chat completion (OpenAI API; tools, streaming, reasoning, json_schema)"),
    "/v1/completions": ("OpenAI", "Text completion (OpenAI API)"),
    "/v1/responses": ("OpenAI", "Responses API (OpenAI)"),
    "/v1/embeddings": ("OpenAI", "Embeddings (OpenAI API; needs --embeddings)"),
    "/v1/models": ("OpenAI", "The served model"),
    "/v1/messages": ("Anthropic", "Messages API (Anthropic; tools, streaming, thinking)"),
    "/v1/messages/count_tokens": ("Anthropic", "Token count of a Messages request"),
    "/health": ("Server", "200 when ready, 503 while the model loads"),
    "/metrics": ("Server", "Prometheus metrics (llama-server's with --metrics, then llama-vq-server's)"),
    "/props": ("Server", "Server properties (POST needs --props)"),
    "/slots": ("Server", "Slots and their state (--slots)"),
    "/slots/{id_slot}": ("Server", "Save, restore or erase a slot's state (?action=save|restore|erase)"),
    "/completion": ("llama-server", "Native completion (llama-server's API)"),
    "/infill": ("llama-server", "Fill-in-the-middle completion"),
    "/tokenize": ("llama-server", "Text to tokens"),
    "/detokenize": ("llama-server", "Tokens to text"),
    "/apply-template": ("llama-server", "A chat request's prompt, as the chat template renders it"),
    "/lora-adapters": ("llama-server", "LoRA adapters and their scales"),
}


def fastapi_path(path: str) -> str:
    """llama-server's "/slots/:id_slot" -> FastAPI's "/slots/{id_slot}"."""
    return re.sub(r":([A-Za-z_][A-Za-z0-9_]*)", r"{\1}", path)


def create_app(
    settings: Settings,
    engine: Engine,
    metrics: Metrics,
    executor: cf.ThreadPoolExecutor,
    ready: asyncio.Event | None = None,
) -> FastAPI:
    """The app for one engine. `ready` is set by the caller once the model is loaded and the loop runs; until
    then every route answers 503, /health included (as llama-server)."""
    app = FastAPI(
        title="llama-vq-server",
        version=__version__,
        description="llama-server's API (OpenAI, Anthropic, llama-server's own) on llama-vq: a quantized V "
        "cache with flash attention off, and llama-server's engine.",
    )
    app.state.ready = ready or asyncio.Event()
    bridge = Bridge(engine, executor, metrics, settings.sse_keepalive, settings.api_prefix)

    def endpoint_for(route: Route):
        async def endpoint(request: Request) -> Response | EngineResponse:
            if not app.state.ready.is_set() or not engine.loop_alive:
                return _loading(engine)
            return await bridge.serve(request, route)

        return endpoint

    for route in engine.routes:
        path = fastapi_path(route.path)
        tag, summary = _DOC.get(path, ("llama-server", f"llama-server's {route.method} {route.path}"))
        if route.path == "/metrics":
            app.add_api_route(
                settings.api_prefix + path,
                _metrics_endpoint(app, engine, bridge, metrics),
                methods=["GET"],
                tags=[tag],
                summary=summary,
                response_model=None,
            )
            continue
        app.add_api_route(
            settings.api_prefix + path,
            endpoint_for(route),
            methods=[route.method],
            tags=[tag],
            summary=summary,
            name=f"{route.method} {route.path}",
            response_model=None,
        )

    app.add_exception_handler(StarletteHTTPException, _http_error)
    # innermost first: the body limit, keys, CORS (pre-flights before the key check)
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_body_size)
    if settings.api_keys:
        app.add_middleware(
            ApiKeyMiddleware,
            keys=settings.api_keys,
            prefix=settings.api_prefix,
            ready=lambda: app.state.ready.is_set() and engine.loop_alive,
        )
    add_cors(app, settings.cors_origins, settings.cors_methods, settings.cors_headers, settings.cors_credentials)
    app.add_middleware(HeaderCaseMiddleware)  # outermost: every answer's header names as llama-server's
    return app


def _loading(engine: Engine) -> Response:
    state = engine.state().get("state")
    if state in ("failed", "stopped"):
        return Response(
            error_body(503, f"the engine has {state}", "unavailable_error"),
            503,
            media_type="application/json; charset=utf-8",
        )
    return Response(
        error_body(503, "Loading model", "unavailable_error"), 503, media_type="application/json; charset=utf-8"
    )


def _metrics_endpoint(app: FastAPI, engine: Engine, bridge: Bridge, metrics: Metrics):
    route = Route("GET", "/metrics")

    async def get_metrics(request: Request) -> Response:
        metrics.engine_ready.set(1 if app.state.ready.is_set() and engine.loop_alive else 0)
        if not app.state.ready.is_set() or not engine.loop_alive:
            return _loading(engine)

        def upstream() -> tuple[int, bytes, str, dict[str, str]]:
            call = engine.call(
                route,
                "/metrics",
                request.url.query,
                dict(request.query_params),
                {k.lower(): v for k, v in request.headers.items()},
            )
            try:
                head = call.run()
                return head.status, call.body(), head.content_type, head.headers
            finally:
                call.close()

        status, body, ctype, headers = await asyncio.get_running_loop().run_in_executor(bridge.executor, upstream)
        # llama-server's own headers (Process-Start-Time-Unix) go along
        headers = {
            k: v
            for k, v in headers.items()
            if k.lower() not in ("content-type", "content-length", "transfer-encoding", "connection")
        }
        if status != 200:  # llama-server without --metrics: its answer, as it gives it
            return Response(body, status, headers=headers, media_type=ctype)
        return Response(body + b"\n" + metrics.render(), 200, headers=headers, media_type="text/plain; version=0.0.4")

    return get_metrics


async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    if exc.status_code == 404:
        body = error_body(404, "File Not Found", "not_found_error")
    elif exc.status_code == 405:
        body = error_body(405, f"method {request.method} not allowed for {request.url.path}", "invalid_request_error")
    else:
        body = error_body(exc.status_code, str(exc.detail), "invalid_request_error")
    return Response(body, exc.status_code, media_type="application/json; charset=utf-8")
