"""HTTP routes only: parse, hand over to serving / engine, answer. No model access here."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from . import protocol
from .metrics import CONTENT_TYPE
from .streaming import run

router = APIRouter()

# llama-server's paths without /v1 answer as their /v1 twins (hidden from the OpenAPI document).
ALIASES = {"/models": "/v1/models", "/chat/completions": "/v1/chat/completions",
           "/completions": "/v1/completions", "/v1/health": "/health"}
ROUTES = frozenset(
    {"/v1/models", "/v1/chat/completions", "/v1/completions", "/health", "/metrics", "/completion",
     "/tokenize", "/detokenize", "/apply-template", "/props", "/slots", *ALIASES}
)

_ERR = {"model": protocol.ErrorResponse}
_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {
        **_ERR,
        "description": "Malformed JSON, wrong types, out-of-range or unsupported values, "
        "prompt longer than the context",
    },
    404: {**_ERR, "description": "Unknown model"},
    413: {**_ERR, "description": "Request body larger than --max-body-size"},
    429: {**_ERR, "description": "Queue full (--max-queue); see Retry-After"},
    503: {**_ERR, "description": "Model loading, failed to load, or server shutting down"},
}
# One Server-Sent Event: ``data`` is a JSON chunk, or "[DONE]" as the last event.
_SSE = {
    "text/event-stream": {
        "schema": {
            "type": "object",
            "required": ["data"],
            "properties": {
                "data": {"type": "string"},
                "event": {"type": "string"},
                "id": {"type": "string"},
            },
        },
        "example": "data: {...}\n\ndata: [DONE]\n\n",
    }
}


@router.get("/models", include_in_schema=False)
@router.get("/v1/models", response_model=protocol.ModelList, responses={503: _ERRORS[503]})
async def list_models(request: Request) -> Response:
    engine = request.app.state.engine
    created = engine.info.created if engine.info else 0
    cards = [protocol.ModelCard(id=n, created=created) for n in engine.names]
    return JSONResponse(protocol.ModelList(data=cards).model_dump())


@router.post("/chat/completions", include_in_schema=False)
@router.post(
    "/v1/chat/completions",
    response_model=protocol.ChatCompletionResponse,
    responses={
        200: {
            "content": _SSE,
            "description": "A chat completion; with stream=true, "
            "Server-Sent Events of chat.completion.chunk objects",
        },
        **_ERRORS,
    },
)
async def chat_completions(request: Request, body: protocol.ChatCompletionRequest) -> Response:
    serving = request.app.state.serving
    return await run(serving.engine, request, serving.chat_plan(body), serving.keepalive_s)


@router.post("/completions", include_in_schema=False)
@router.post(
    "/v1/completions",
    response_model=protocol.CompletionResponse,
    responses={
        200: {
            "content": _SSE,
            "description": "A text completion; with stream=true, "
            "Server-Sent Events of text_completion objects",
        },
        **_ERRORS,
    },
)
async def completions(request: Request, body: protocol.CompletionRequest) -> Response:
    serving = request.app.state.serving
    return await run(serving.engine, request, serving.completion_plan(body), serving.keepalive_s)


@router.get("/v1/health", include_in_schema=False)
@router.get(
    "/health",
    response_model=protocol.Health,
    responses={503: {"model": protocol.Health, "description": "Loading, failed or shutting down"}},
)
async def health(request: Request) -> Response:
    engine = request.app.state.engine
    info = engine.info
    status = {"ready": "ok", "loading": "loading", "error": "error"}.get(
        engine.status, "shutting_down"
    )
    body = protocol.Health(
        status=status,
        queue_depth=engine.queue_depth,
        error=str(engine.load_error) if engine.load_error else None,
    )
    if info is not None:
        body = body.model_copy(
            update=dict(
                model=info.names[0],
                n_ctx=info.n_ctx,
                cache_type_k=info.cache_type_k,
                cache_type_v=info.cache_type_v,
                flash_attn=info.flash_attn,
                kv_cache_bytes=protocol.KVBytes(
                    k=info.kv_k_bytes, v=info.kv_v_bytes, total=info.kv_k_bytes + info.kv_v_bytes
                ),
            )
        )
    return JSONResponse(
        body.model_dump(exclude_none=True), status_code=200 if status == "ok" else 503
    )


# ---- llama-server's native endpoints --------------------------------------------------------------


@router.post(
    "/completion",
    response_model=protocol.NativeCompletionResponse,
    responses={
        200: {
            "content": _SSE,
            "description": "llama-server's completion; with stream=true, Server-Sent Events of "
            "partial results, the last one with stop=true and timings (no [DONE])",
        },
        **_ERRORS,
    },
)
async def native_completion(request: Request, body: protocol.NativeCompletionRequest) -> Response:
    serving = request.app.state.serving
    return await run(serving.engine, request, serving.native_completion_plan(body), serving.keepalive_s)


_UTIL_ERRORS: dict[int | str, dict[str, Any]] = {400: _ERRORS[400], 503: _ERRORS[503]}


@router.post("/tokenize", response_model=protocol.TokenizeResponse, responses=_UTIL_ERRORS)
async def tokenize(request: Request, body: protocol.TokenizeRequest) -> Response:
    out = request.app.state.serving.tokenize(body)
    return JSONResponse(out.model_dump())


@router.post("/detokenize", response_model=protocol.DetokenizeResponse, responses=_UTIL_ERRORS)
async def detokenize(request: Request, body: protocol.DetokenizeRequest) -> Response:
    return JSONResponse(request.app.state.serving.detokenize(body).model_dump())


@router.post("/apply-template", response_model=protocol.ApplyTemplateResponse, responses=_UTIL_ERRORS)
async def apply_template(request: Request, body: protocol.ChatCompletionRequest) -> Response:
    prompt = request.app.state.serving.apply_template(body)
    return JSONResponse(protocol.ApplyTemplateResponse(prompt=prompt).model_dump())


@router.get("/props", response_model=protocol.Props, responses={503: _ERRORS[503]})
async def props(request: Request) -> Response:
    return JSONResponse(request.app.state.serving.props().model_dump(exclude_none=True))


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses={
        200: {
            "content": {CONTENT_TYPE.split(";")[0]: {"schema": {"type": "string"}}},
            "description": "Prometheus text format",
        }
    },
)
async def metrics(request: Request) -> Response:
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE)


@router.get("/slots", responses={200: {"description": "One entry per slot (read-only)"}})
async def slots(request: Request) -> Response:
    """llama-server's GET /slots, read-only: id, state, context, cached tokens, checkpoints."""
    return JSONResponse(request.app.state.engine.slots())
