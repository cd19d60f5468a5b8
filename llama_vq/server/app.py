"""The FastAPI application: llama-server's routes (from the engine's own route table) behind llama-vq's front end.

Every route the engine lists is registered under --api-prefix with FastAPI's path syntax and served by the
bridge (bridge.py), /metrics included (the front end's metrics follow llama-server's). Around the routes, outermost
first: header names as llama-server's, CORS and OPTIONS, HEAD as GET, the one readiness check (503 "Loading model"
on every route, the OpenAPI document included, until the model is loaded and its task loop runs), API keys, the
body limit. 404 and 405 have llama-server's error shape.
"""

from __future__ import annotations

import re

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import __version__, protocol
from .bridge import Bridge
from .cors_proxy import CorsProxy
from .engine import Engine, EngineError, Route
from .gcp import Predictor
from .metrics import Metrics, SleepSnapshot
from .middleware import HeaderCaseMiddleware, HeadMiddleware, Readiness, ReadinessMiddleware
from .responses import JSON_TYPE, error_body
from .security import OPEN_PATHS, ApiKeyMiddleware, BodyLimitMiddleware, add_cors
from .settings import Settings
from .workers import Workers

TITLE = "llama-vq-server"
DESCRIPTION = (
    "llama-server's API (OpenAI, Anthropic, llama-server's own) on llama-vq: a quantized V cache with flash "
    "attention off, and llama-server's engine."
)

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


def create_app(settings: Settings, engine: Engine, metrics: Metrics, workers: Workers, readiness: Readiness) -> FastAPI:
    """The app for one engine; `readiness` is set by the caller once the model is loaded and slots restored."""
    app = FastAPI(title=TITLE, version=__version__, description=DESCRIPTION)
    metrics.engine_ready.set_function(lambda: 1.0 if readiness.ready() else 0.0)
    snapshot = SleepSnapshot(metrics, lambda: engine.state().get("state") == "sleeping")
    appendix = {"/metrics": snapshot.render}
    bridge = Bridge(engine, workers, metrics, settings.sse_keepalive, settings.api_prefix, appendix)
    app.state.bridge = bridge

    def endpoint_for(route: Route):  # noqa: ANN202
        async def endpoint(request: Request) -> Response:
            return await bridge.serve(request, route)

        return endpoint

    for route in engine.routes:
        path = fastapi_path(route.path)
        tag, summary = _DOC.get(path, ("llama-server", f"llama-server's {route.method} {route.path}"))
        extra = protocol.operation_extra(route.method, route.path)
        if settings.api_keys and route.path in OPEN_PATHS:
            extra["security"] = []
        app.add_api_route(
            settings.api_prefix + path,
            endpoint_for(route),
            methods=[route.method],
            tags=[tag],
            summary=summary,
            name=f"{route.method} {route.path}",
            response_model=None,
            openapi_extra=extra,
        )
    proxy = CorsProxy(settings.ui_mcp_proxy, workers)
    app.add_api_route(
        settings.api_prefix + "/cors-proxy",
        proxy.handle,
        methods=["GET", "POST"],
        tags=["llama-server"],
        summary="The web UI's CORS proxy for MCP servers: ?url=... (--ui-mcp-proxy; 403 without it)",
        response_model=None,
    )
    if settings.gcp.enabled:
        _add_gcp_routes(app, settings, engine, workers, endpoint_for)
    app.openapi = lambda: _openapi(app, settings)  # type: ignore[method-assign]

    app.add_exception_handler(StarletteHTTPException, _http_error)
    # innermost first: the body limit, keys, readiness, HEAD, CORS (OPTIONS before the readiness and key checks)
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_body_size)
    if settings.api_keys:
        app.add_middleware(ApiKeyMiddleware, keys=settings.api_keys, prefix=settings.api_prefix)
    app.add_middleware(ReadinessMiddleware, readiness=readiness)
    app.add_middleware(HeadMiddleware)
    add_cors(app, settings.cors_origins, settings.cors_methods, settings.cors_headers, settings.cors_credentials)
    app.add_middleware(HeaderCaseMiddleware)  # outermost: every answer's header names as llama-server's
    return app


def _add_gcp_routes(app: FastAPI, settings: Settings, engine: Engine, workers: Workers, endpoint_for) -> None:  # noqa: ANN001
    """Vertex AI's prediction route (and its health route, when named), as llama-server adds them (gcp.py)."""
    gcp = settings.gcp
    if any(r.path == gcp.path_predict for r in engine.routes):
        raise EngineError(f"AIP_PREDICT_ROUTE={gcp.path_predict} conflicts with an existing llama-server route")
    predictor = Predictor(engine, workers)
    app.add_api_route(
        settings.api_prefix + gcp.path_predict,
        predictor.predict,
        methods=["POST"],
        tags=["Vertex AI"],
        summary="Vertex AI prediction: {instances: [...]} -> {predictions: [...]} (AIP_MODE=PREDICTION)",
        response_model=None,
    )
    health = next((r for r in engine.routes if r.method == "GET" and r.path == "/health"), None)
    if gcp.path_health and health is not None:
        app.add_api_route(
            settings.api_prefix + gcp.path_health,
            endpoint_for(health),
            methods=["GET"],
            tags=["Vertex AI"],
            summary="Health (AIP_HEALTH_ROUTE): as /health",
            response_model=None,
        )


def _openapi(app: FastAPI, settings: Settings) -> dict:
    if app.openapi_schema is None:
        doc = get_openapi(title=TITLE, version=__version__, description=DESCRIPTION, routes=app.routes)
        doc.setdefault("components", {}).setdefault("schemas", {}).update(protocol.component_schemas())
        if settings.api_keys:  # every route but /health needs one of the keys, in either header
            doc["components"]["securitySchemes"] = {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "X-Api-Key"},
            }
            doc["security"] = [{"bearer": []}, {"apiKey": []}]
        app.openapi_schema = doc
    return app.openapi_schema


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)  # registered for that class only
    if exc.status_code == 404:
        body = error_body(404, "File Not Found", "not_found_error")
    elif exc.status_code == 405:
        body = error_body(405, f"method {request.method} not allowed for {request.url.path}", "invalid_request_error")
    else:
        body = error_body(exc.status_code, str(exc.detail), "invalid_request_error")
    return Response(body, exc.status_code, media_type=JSON_TYPE.decode())
