"""Turns OpenAI requests into engine Work and engine events into OpenAI responses (no model access).

Streaming is Server-Sent Events: one ``data: {json}`` per chunk, ``data: [DONE]`` at the end. The
first event of a stream is awaited before the HTTP status is sent, so errors found while building
the prompt (too long, bad template input, bad grammar) are real 4xx answers, not a broken stream.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from . import errors, protocol
from .engine import Engine, Job, JobStats, Work

log = logging.getLogger("llama_vq.server.serving")

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_MAX_STOPS = 16


def _json_gbnf() -> str:
    from llama_cpp.llama_grammar import JSON_GBNF  # noqa: PLC0415

    return JSON_GBNF


def _schema_gbnf(schema: dict[str, Any], param: str) -> str:
    """GBNF for a JSON schema with llama_cpp's converter; 400 naming ``param`` if it cannot."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf  # noqa: PLC0415

    try:
        return json_schema_to_gbnf(json.dumps(schema))
    except Exception as e:  # noqa: BLE001 (the converter raises many kinds on odd schemas)
        raise errors.bad_request(
            f"{param}: cannot turn this JSON schema into a grammar: {type(e).__name__}: {e}",
            param=param,
        ) from None


class Serving:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # ---- request -> Work ----------------------------------------------------------------------

    def model_name(self, requested: str | None) -> str:
        names = self.engine.names
        if requested is None or requested == "":
            return names[0]
        if requested not in names:
            raise errors.ApiError(
                404,
                f"the model {requested!r} does not exist; this server serves "
                f"{', '.join(repr(n) for n in names)}",
                param="model",
                code="model_not_found",
            )
        return requested

    @staticmethod
    def _sampling(req: protocol._Sampling) -> dict[str, Any]:
        if req.logit_bias:
            raise errors.not_supported("logit_bias", "a non-empty logit_bias")
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        if len(stop) > _MAX_STOPS:
            raise errors.bad_request(
                f"stop: at most {_MAX_STOPS} stop strings, got {len(stop)}", param="stop"
            )
        return {
            "temperature": req.temperature,
            "top_p": req.top_p,
            "top_k": req.top_k,
            "min_p": req.min_p,
            "repeat_penalty": req.repeat_penalty,
            "presence_penalty": req.presence_penalty,
            "frequency_penalty": req.frequency_penalty,
            "seed": None if req.seed is None else req.seed % (2**32),
            "stop": stop,
        }

    @staticmethod
    def _message(m: protocol.ChatMessage, i: int) -> dict[str, Any]:
        out: dict[str, Any] = {"role": m.role}
        if isinstance(m.content, list):
            texts = []
            for part in m.content:
                if isinstance(part, protocol.ImagePart):
                    raise errors.not_supported(f"messages[{i}].content", "image input")
                texts.append(part.text)
            out["content"] = "\n".join(texts)
        elif m.content is not None:
            out["content"] = m.content
        else:
            # Chat templates concatenate content as a string; only an assistant message that calls
            # tools may really have none.
            out["content"] = None if m.role == "assistant" and m.tool_calls else ""
        if m.name is not None:
            out["name"] = m.name
        if m.tool_calls:
            out["tool_calls"] = [tc.model_dump() for tc in m.tool_calls]
        if m.tool_call_id is not None:
            out["tool_call_id"] = m.tool_call_id
        return out

    def chat_work(self, req: protocol.ChatCompletionRequest) -> tuple[Work, str]:
        model = self.model_name(req.model)
        if req.logprobs:
            raise errors.not_supported("logprobs", "logprobs=true")
        kw = self._sampling(req)
        kw["messages"] = [self._message(m, i) for i, m in enumerate(req.messages)]
        kw["max_tokens"] = req.max_completion_tokens or req.max_tokens
        kw["model"] = model
        work = Work(kind="chat", kwargs=kw, stream=req.stream)

        rf = req.response_format
        if isinstance(rf, protocol.ResponseFormatJsonObject):
            work.grammar = (
                _schema_gbnf(rf.schema_, "response_format.schema") if rf.schema_ else _json_gbnf()
            )
        elif isinstance(rf, protocol.ResponseFormatJsonSchema):
            schema = rf.json_schema.schema_
            work.grammar = (
                _schema_gbnf(schema, "response_format.json_schema.schema")
                if schema
                else _json_gbnf()
            )
            work.grammar_param = "response_format.json_schema.schema"

        if req.tools and req.tool_choice != "none":
            info = self.engine.info
            if info is not None and not info.supports_tools:
                raise errors.bad_request(
                    "tools: this model's chat template does not render tools (start the server "
                    "with "
                    "a --chat-format that does, e.g. chatml-function-calling)",
                    param="tools",
                )
            tools = []
            for t in req.tools:
                d = t.model_dump(exclude_none=True)
                d["function"].setdefault("parameters", {"type": "object", "properties": {}})
                tools.append(d)
            kw["tools"] = tools
            choice = req.tool_choice
            if choice == "required":
                if len(tools) != 1:
                    raise errors.bad_request(
                        "tool_choice: 'required' is supported with exactly one tool; name the tool "
                        "with {'type': 'function', 'function': {'name': ...}}",
                        param="tool_choice",
                    )
                choice = protocol.NamedToolChoice(
                    type="function", function={"name": tools[0]["function"]["name"]}
                )
            if isinstance(choice, protocol.NamedToolChoice):
                names = [t["function"]["name"] for t in tools]
                if choice.function.name not in names:
                    raise errors.bad_request(
                        f"tool_choice: names {choice.function.name!r}, which is not in tools "
                        f"({', '.join(names)})",
                        param="tool_choice",
                    )
                if work.grammar is not None:
                    raise errors.bad_request(
                        "response_format: cannot be combined with a forced tool_choice",
                        param="response_format",
                    )
                kw["tool_choice"] = choice.model_dump()
                # llama_cpp builds this grammar itself; check llama.cpp accepts it before running.
                params = next(t for t in tools if t["function"]["name"] == choice.function.name)
                try:
                    from llama_cpp.llama_grammar import json_schema_to_gbnf  # noqa: PLC0415

                    work.check_grammars.append(
                        ("tools", json_schema_to_gbnf(json.dumps(params["function"]["parameters"])))
                    )
                except Exception:  # noqa: BLE001 (llama_cpp falls back to plain JSON then)
                    pass
            else:
                kw["tool_choice"] = "auto"
        return work, model

    def completion_work(self, req: protocol.CompletionRequest) -> tuple[Work, str]:
        model = self.model_name(req.model)
        if req.suffix is not None:
            raise errors.not_supported("suffix", "suffix (fill-in-the-middle)")
        if req.logprobs is not None:
            raise errors.not_supported("logprobs", "logprobs")
        kw = self._sampling(req)
        prompt: Any = req.prompt
        ids = None
        if isinstance(prompt, list):
            if not prompt:
                raise errors.bad_request("prompt: must not be empty", param="prompt")
            if all(isinstance(p, str) for p in prompt):
                if len(prompt) != 1:
                    raise errors.not_supported("prompt", "a batch of several prompts")
                prompt = prompt[0]
            else:
                ids = [int(t) for t in prompt]
                prompt = ids
        if isinstance(prompt, str) and not prompt:
            raise errors.bad_request("prompt: must not be empty", param="prompt")
        kw.update(prompt=prompt, max_tokens=req.max_tokens, echo=req.echo, model=model)
        return Work(kind="completion", kwargs=kw, stream=req.stream, prompt_ids=ids), model

    # ---- running ------------------------------------------------------------------------------

    async def run(
        self,
        request: Request,
        work: Work,
        *,
        shape_result: Callable[[dict[str, Any], JobStats], Any],
        shape_chunk: Callable[[dict[str, Any]], Any],
        usage_chunk: Callable[[dict[str, Any], JobStats], Any] | None,
    ) -> Response:
        job = self.engine.submit(work, asyncio.get_running_loop())
        watcher = asyncio.create_task(_watch_disconnect(request, job))
        handed_over = False
        try:
            kind, data = await job.events.get()
            if kind == "error":
                raise data
            if work.stream:
                handed_over = True
                return StreamingResponse(
                    self._sse(job, (kind, data), shape_chunk, usage_chunk),
                    media_type="text/event-stream",
                    headers=_SSE_HEADERS,
                )
            result = None
            while kind != "end":
                if kind == "error":
                    raise data
                if kind == "result":
                    result = data
                kind, data = await job.events.get()
            if result is None:
                raise errors.ApiError(499, "the request was cancelled", code="cancelled")
            body = shape_result(result, data)
            return JSONResponse(body.model_dump(exclude_none=True))
        finally:
            watcher.cancel()
            if not handed_over:
                job.cancel()

    async def _sse(
        self,
        job: Job,
        first: tuple[str, Any],
        shape_chunk: Callable[[dict[str, Any]], Any],
        usage_chunk: Callable[[dict[str, Any], JobStats], Any] | None,
    ) -> AsyncIterator[str]:
        last: dict[str, Any] = {}
        try:
            kind, data = first
            while True:
                if kind == "chunk":
                    last = data
                    yield f"data: {shape_chunk(data).model_dump_json(exclude_none=True)}\n\n"
                elif kind == "error":
                    yield f"data: {json.dumps(data.body())}\n\n"
                elif kind == "end":
                    if usage_chunk is not None and last and not data.cancelled:
                        final = usage_chunk(last, data)
                        yield f"data: {final.model_dump_json(exclude_none=True)}\n\n"
                    break
                kind, data = await job.events.get()
            yield "data: [DONE]\n\n"
        finally:
            job.cancel()


async def _watch_disconnect(request: Request, job: Job) -> None:
    """Cancel ``job`` when the client goes away before the response starts."""
    try:
        while not job.finished:
            if await request.is_disconnected():
                job.cancel()
                return
            await asyncio.sleep(0.2)
    except asyncio.CancelledError:
        pass


# ---- llama_cpp dicts -> protocol models ------------------------------------------------------


def usage(stats: JobStats) -> protocol.Usage:
    return protocol.Usage(
        prompt_tokens=stats.prompt_tokens,
        completion_tokens=stats.completion_tokens,
        total_tokens=stats.prompt_tokens + stats.completion_tokens,
        prompt_tokens_details=protocol.PromptTokensDetails(cached_tokens=stats.cached_tokens),
    )


def _finish(reason: Any) -> Any:
    return (
        reason
        if reason in ("stop", "length", "tool_calls", "function_call", "content_filter")
        else (None if reason is None else "stop")
    )


def chat_result(
    model: str,
) -> Callable[[dict[str, Any], JobStats], protocol.ChatCompletionResponse]:
    def shape(r: dict[str, Any], stats: JobStats) -> protocol.ChatCompletionResponse:
        choice = r["choices"][0]
        msg = choice.get("message") or {}
        calls = [
            protocol.ResponseToolCall(
                id=c.get("id") or f"call_{i}",
                function=protocol.ResponseFunctionCall(
                    name=c["function"]["name"], arguments=c["function"].get("arguments") or ""
                ),
            )
            for i, c in enumerate(msg.get("tool_calls") or [])
        ]
        finish = "tool_calls" if calls else _finish(choice.get("finish_reason"))
        return protocol.ChatCompletionResponse(
            id=r["id"],
            created=r["created"],
            model=model,
            choices=[
                protocol.ChatChoice(
                    index=0,
                    finish_reason=finish,
                    message=protocol.ResponseMessage(
                        content=msg.get("content"), tool_calls=calls or None
                    ),
                )
            ],
            usage=usage(stats),
        )

    return shape


def chat_chunk(model: str) -> Callable[[dict[str, Any]], protocol.ChatCompletionChunk]:
    def shape(c: dict[str, Any]) -> protocol.ChatCompletionChunk:
        choices = []
        for ch in c.get("choices") or []:
            d = ch.get("delta") or {}
            calls = None
            if d.get("tool_calls"):
                calls = [
                    protocol.DeltaToolCall(
                        index=tc.get("index", i),
                        id=tc.get("id"),
                        type=tc.get("type"),
                        function=protocol.DeltaFunctionCall(
                            **{
                                k: v
                                for k, v in (tc.get("function") or {}).items()
                                if k in ("name", "arguments")
                            }
                        ),
                    )
                    for i, tc in enumerate(d["tool_calls"])
                ]
            finish = ch.get("finish_reason")
            choices.append(
                protocol.ChatChunkChoice(
                    index=ch.get("index", 0),
                    delta=protocol.Delta(
                        role=d.get("role"), content=d.get("content"), tool_calls=calls
                    ),
                    finish_reason="tool_calls" if calls and finish else _finish(finish),
                )
            )
        return protocol.ChatCompletionChunk(
            id=c["id"], created=c["created"], model=model, choices=choices
        )

    return shape


def chat_usage_chunk(
    model: str,
) -> Callable[[dict[str, Any], JobStats], protocol.ChatCompletionChunk]:
    def shape(last: dict[str, Any], stats: JobStats) -> protocol.ChatCompletionChunk:
        return protocol.ChatCompletionChunk(
            id=last["id"], created=last["created"], model=model, choices=[], usage=usage(stats)
        )

    return shape


def completion_result(
    model: str,
) -> Callable[[dict[str, Any], JobStats], protocol.CompletionResponse]:
    def shape(r: dict[str, Any], stats: JobStats) -> protocol.CompletionResponse:
        ch = r["choices"][0]
        return protocol.CompletionResponse(
            id=r["id"],
            created=r["created"],
            model=model,
            usage=usage(stats),
            choices=[
                protocol.CompletionChoice(
                    index=0,
                    text=ch.get("text") or "",
                    finish_reason=_finish(ch.get("finish_reason")),
                )
            ],
        )

    return shape


def completion_chunk(model: str) -> Callable[[dict[str, Any]], protocol.CompletionResponse]:
    def shape(c: dict[str, Any]) -> protocol.CompletionResponse:
        return protocol.CompletionResponse(
            id=c["id"],
            created=c["created"],
            model=model,
            choices=[
                protocol.CompletionChoice(
                    index=ch.get("index", 0),
                    text=ch.get("text") or "",
                    finish_reason=_finish(ch.get("finish_reason")),
                )
                for ch in c.get("choices") or []
            ],
        )

    return shape


def completion_usage_chunk(
    model: str,
) -> Callable[[dict[str, Any], JobStats], protocol.CompletionResponse]:
    def shape(last: dict[str, Any], stats: JobStats) -> protocol.CompletionResponse:
        return protocol.CompletionResponse(
            id=last["id"], created=last["created"], model=model, choices=[], usage=usage(stats)
        )

    return shape
