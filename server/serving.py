"""Turns OpenAI requests into engine requests and engine events into OpenAI responses (no model access).

Interim (engine branch): the chat prompt is rendered with llama_cpp's Jinja2 chat formatter from the
model's own template; the serving branch replaces this with llama.cpp's common/chat (issue 9). Tools
are refused until then.

Engine exceptions become OpenAI error bodies in ONE place (``api_error``). Streaming is Server-Sent
Events: headers go out as soon as the engine accepted the request (its checks raise before that),
``: keepalive`` comments keep proxies and clients alive while a long prompt is processed, then one
``data: {json}`` per piece of text and ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from . import errors, protocol
from .engine import errors as engine_errors
from .engine.request import DoneEvent, GenerationRequest, Grammar, ProgressEvent, Sampling, TokenEvent

log = logging.getLogger("llama_vq.server")

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_MAX_STOPS = 16


def api_error(e: engine_errors.EngineError) -> errors.ApiError:
    """The one mapping of engine exceptions to OpenAI error answers."""
    if isinstance(e, engine_errors.QueueFull):
        return errors.overloaded(e.retry_after_s, e.waiting)
    if isinstance(e, engine_errors.NotReady):
        return errors.unavailable(str(e), retry_after_s=e.retry_after_s)
    if isinstance(e, engine_errors.Draining):
        return errors.unavailable(str(e))
    if isinstance(e, engine_errors.PromptTooLong):
        return errors.context_exceeded(e.n_prompt, e.n_ctx)
    if isinstance(e, engine_errors.InvalidRequest):
        return errors.bad_request(str(e), param=e.param)
    return errors.internal(f"generation failed: {e}")


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


@dataclass
class Plan:
    """An engine request plus what the response needs."""

    request: GenerationRequest
    model: str
    stream: bool
    include_usage: bool
    echo: str = ""
    grammar_param: str = "response_format"


class Serving:
    def __init__(self, engine: Any, keepalive_s: float = 5.0) -> None:
        self.engine = engine
        self.keepalive_s = keepalive_s
        self._formatter: Any = None

    def model_name(self, requested: str | None) -> str:
        names = self.engine.names
        if requested is None or requested == "":
            return names[0]
        if requested not in names:
            raise errors.ApiError(
                404,
                f"the model {requested!r} does not exist; this server serves {', '.join(repr(n) for n in names)}",
                param="model",
                code="model_not_found",
            )
        return requested

    @staticmethod
    def _sampling(req: protocol._Sampling) -> tuple[Sampling, tuple[str, ...]]:
        if req.logit_bias:
            raise errors.not_supported("logit_bias", "a non-empty logit_bias")
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        if len(stop) > _MAX_STOPS:
            raise errors.bad_request(f"stop: at most {_MAX_STOPS} stop strings, got {len(stop)}", param="stop")
        sampling = Sampling(
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            min_p=req.min_p,
            repeat_penalty=req.repeat_penalty,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            seed=None if req.seed is None else req.seed % (2**32),
        )
        return sampling, tuple(stop)

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

    def _format_chat(self, messages: list[dict[str, Any]]) -> tuple[str, bool, tuple[str, ...]]:
        """(prompt text, whether it already holds the special tokens, template stops)."""
        if self._formatter is None:
            from llama_cpp import llama_chat_format  # noqa: PLC0415

            llm = self.engine.llama
            if llm is None:
                raise api_error(engine_errors.NotReady("the model is still loading; retry shortly", 5))
            template = llm.metadata.get("tokenizer.chat_template") or _CHATML
            text = lambda t: llm._model.token_get_text(t) if t != -1 else ""  # noqa: E731
            self._formatter = llama_chat_format.Jinja2ChatFormatter(
                template=template,
                eos_token=text(llm.token_eos()),
                bos_token=text(llm.token_bos()),
                stop_token_ids=[llm.token_eos()],
            )
        try:
            r = self._formatter(messages=messages)
        except Exception as e:  # noqa: BLE001 (template errors are the request's)
            raise errors.bad_request(f"messages: the chat template cannot render them: {e}", param="messages") from None
        stops = (r.stop,) if isinstance(r.stop, str) else tuple(r.stop or ())
        return r.prompt, bool(r.added_special), stops

    def chat_plan(self, req: protocol.ChatCompletionRequest) -> Plan:
        model = self.model_name(req.model)
        if req.logprobs:
            raise errors.not_supported("logprobs", "logprobs=true")
        if req.tools and req.tool_choice != "none":
            raise errors.bad_request(
                "tools: the interim chat path renders prompts with the model's chat template only and "
                "parses no tool calls (the common/chat layer brings them)",
                param="tools",
            )
        sampling, stop = self._sampling(req)
        grammar, param = None, "response_format"
        rf = req.response_format
        if isinstance(rf, protocol.ResponseFormatJsonObject):
            grammar = _schema_gbnf(rf.schema_, "response_format.schema") if rf.schema_ else _json_gbnf()
        elif isinstance(rf, protocol.ResponseFormatJsonSchema):
            schema = rf.json_schema.schema_
            param = "response_format.json_schema.schema"
            grammar = _schema_gbnf(schema, param) if schema else _json_gbnf()
        messages = [self._message(m, i) for i, m in enumerate(req.messages)]
        prompt, added_special, tmpl_stops = self._format_chat(messages)
        tokens = self._tokenize(prompt, add_special=not added_special)
        gen = GenerationRequest(
            prompt=tuple(tokens),
            sampling=sampling,
            grammar=Grammar(grammar) if grammar else None,
            stop=stop + tuple(s for s in tmpl_stops if s and s not in stop),
            max_tokens=req.max_completion_tokens or req.max_tokens,
        )
        return Plan(gen, model, req.stream, _include_usage(req), grammar_param=param)

    def completion_plan(self, req: protocol.CompletionRequest) -> Plan:
        model = self.model_name(req.model)
        if req.suffix is not None:
            raise errors.not_supported("suffix", "suffix (fill-in-the-middle)")
        if req.logprobs is not None:
            raise errors.not_supported("logprobs", "logprobs")
        sampling, stop = self._sampling(req)
        prompt: Any = req.prompt
        if isinstance(prompt, list):
            if not prompt:
                raise errors.bad_request("prompt: must not be empty", param="prompt")
            if all(isinstance(p, str) for p in prompt):
                if len(prompt) != 1:
                    raise errors.not_supported("prompt", "a batch of several prompts")
                prompt = prompt[0]
        if isinstance(prompt, str) and not prompt:
            raise errors.bad_request("prompt: must not be empty", param="prompt")
        if isinstance(prompt, str):
            tokens, echo = self._tokenize(prompt, add_special=True), prompt
        else:
            tokens = [int(t) for t in prompt]
            echo = ""
            if req.echo:
                n_vocab = self.engine.info.n_vocab if self.engine.info else 0
                if all(0 <= t < n_vocab for t in tokens):
                    echo = self.engine.detokenize(tokens)
        gen = GenerationRequest(prompt=tuple(tokens), sampling=sampling, stop=stop, max_tokens=req.max_tokens)
        return Plan(gen, model, req.stream, _include_usage(req), echo=echo if req.echo else "")

    def _tokenize(self, text: str, add_special: bool) -> list[int]:
        try:
            return self.engine.tokenize(text, add_special=add_special, parse_special=True)
        except engine_errors.EngineError as e:
            raise api_error(e) from None

    # ---- running ------------------------------------------------------------------------------

    async def run(self, request: Request, plan: Plan, kind: str) -> Response:
        try:
            job = self.engine.submit(plan.request, asyncio.get_running_loop())
        except engine_errors.InvalidGrammar as e:
            raise errors.bad_request(f"{plan.grammar_param}: {e}", param=plan.grammar_param) from None
        except engine_errors.EngineError as e:
            raise api_error(e) from None
        shape = _Shaper(kind, plan)
        if plan.stream:
            return StreamingResponse(self._sse(job, shape), media_type="text/event-stream", headers=_SSE_HEADERS)
        watcher = asyncio.create_task(_watch_disconnect(request, job))
        try:
            parts: list[str] = []
            async for ev in job.events():
                if isinstance(ev, TokenEvent):
                    parts.append(ev.text)
                elif isinstance(ev, DoneEvent):
                    done = ev
            if done.finish_reason == "error":
                raise errors.internal(f"generation failed: {done.error}")
            return JSONResponse(shape.result("".join(parts), done))
        finally:
            watcher.cancel()
            job.cancel()

    async def _sse(self, job: Any, shape: _Shaper) -> AsyncIterator[str]:
        try:
            first = shape.first_chunk()
            if first:
                yield _data(first)
            last = time.monotonic()
            while True:
                ev = await job.next_event(max(0.0, last + self.keepalive_s - time.monotonic()))
                if ev is None or isinstance(ev, ProgressEvent):
                    if time.monotonic() - last >= self.keepalive_s:  # nothing sent for a period
                        last = time.monotonic()
                        yield ": keepalive\n\n"
                    continue
                if isinstance(ev, TokenEvent):
                    if ev.text:
                        last = time.monotonic()
                        yield _data(shape.chunk(ev.text))
                    continue
                if ev.finish_reason == "error":
                    yield _data(errors.internal(f"generation failed: {ev.error}").body())
                else:
                    yield _data(shape.chunk("", ev))
                    if shape.plan.include_usage:
                        yield _data(shape.usage_chunk(ev))
                break
            yield "data: [DONE]\n\n"
        finally:
            job.cancel()


_CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _include_usage(body: protocol._Sampling) -> bool:
    return bool(body.stream and body.stream_options and body.stream_options.include_usage)


def _data(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _watch_disconnect(request: Request, job: Any) -> None:
    """Cancel ``job`` when the client of a non-streamed request goes away."""
    try:
        while not job.finished.is_set():
            if await request.is_disconnected():
                job.cancel()
                return
            await asyncio.sleep(0.2)
    except asyncio.CancelledError:
        pass


def usage(done: DoneEvent) -> protocol.Usage:
    return protocol.Usage(
        prompt_tokens=done.prompt_tokens,
        completion_tokens=done.completion_tokens,
        total_tokens=done.prompt_tokens + done.completion_tokens,
        prompt_tokens_details=protocol.PromptTokensDetails(cached_tokens=done.cached_tokens),
    )


def _finish(done: DoneEvent) -> str:
    # timeout, or cancelled by the server (drain deadline): the text was cut, as at a length limit
    return "stop" if done.finish_reason == "stop" else "length"


class _Shaper:
    """OpenAI bodies for one response: chat.completion(.chunk) or text_completion."""

    def __init__(self, kind: str, plan: Plan) -> None:
        self.kind, self.plan = kind, plan
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def _base(self) -> dict[str, Any]:
        return {"id": self.id, "created": self.created, "model": self.plan.model}

    def result(self, text: str, done: DoneEvent) -> dict[str, Any]:
        u = usage(done)
        if self.kind == "chat":
            body = protocol.ChatCompletionResponse(
                **self._base(),
                choices=[
                    protocol.ChatChoice(
                        index=0, finish_reason=_finish(done), message=protocol.ResponseMessage(content=text)
                    )
                ],
                usage=u,
                timings=done.timings,
            )
        else:
            body = protocol.CompletionResponse(
                **self._base(),
                choices=[protocol.CompletionChoice(index=0, text=self.plan.echo + text, finish_reason=_finish(done))],
                usage=u,
                timings=done.timings,
            )
        return body.model_dump(exclude_none=True)

    def first_chunk(self) -> dict[str, Any] | None:
        if self.kind == "chat":
            return protocol.ChatCompletionChunk(
                **self._base(), choices=[protocol.ChatChunkChoice(index=0, delta=protocol.Delta(role="assistant"))]
            ).model_dump(exclude_none=True)
        if self.plan.echo:
            return self.chunk(self.plan.echo)
        return None

    def chunk(self, text: str, done: DoneEvent | None = None) -> dict[str, Any]:
        finish = _finish(done) if done else None
        timings = done.timings if done else None
        if self.kind == "chat":
            delta = protocol.Delta(content=text) if text else protocol.Delta()
            body: Any = protocol.ChatCompletionChunk(
                **self._base(),
                choices=[protocol.ChatChunkChoice(index=0, delta=delta, finish_reason=finish)],
                timings=timings,
            )
        else:
            body = protocol.CompletionResponse(
                **self._base(),
                choices=[protocol.CompletionChoice(index=0, text=text, finish_reason=finish)],
                timings=timings,
            )
        return body.model_dump(exclude_none=True)

    def usage_chunk(self, done: DoneEvent) -> dict[str, Any]:
        cls: Any = protocol.ChatCompletionChunk if self.kind == "chat" else protocol.CompletionResponse
        return cls(**self._base(), choices=[], usage=usage(done)).model_dump(exclude_none=True)
