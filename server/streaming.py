"""Runs a Plan on the engine and answers: one JSON body, or Server-Sent Events.

Streams send their headers as soon as the engine accepted the request (its checks raise before
that, so refusals are real 4xx answers), then ``: keepalive`` comments whenever nothing was sent for
``keepalive_s`` seconds (a long prompt being processed), one ``data: {json}`` per piece, and
``data: [DONE]`` (not on llama-server's native /completion stream, which ends with ``stop: true``).

Chats read the model's output through the chat layer's ChatStream: ``content``,
``reasoning_content`` and ``tool_calls`` deltas (index, id, name, then argument chunks), and
finish_reason ``tool_calls`` when calls were parsed. The non-streamed message is the same parse.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from . import errors, protocol
from .engine import errors as engine_errors
from .engine.request import DoneEvent, ProgressEvent, TokenEvent
from .serving import Plan

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def run(engine: Any, request: Request, plan: Plan, keepalive_s: float) -> Response:
    try:
        job = engine.submit(plan.request, asyncio.get_running_loop())
    except engine_errors.InvalidGrammar as e:
        raise errors.from_exception(e, param=plan.grammar_param) from None
    shaper = _shaper(plan)
    if plan.stream:
        return StreamingResponse(
            _sse(job, shaper, keepalive_s, plan.kind != "native"), media_type="text/event-stream",
            headers=_SSE_HEADERS,
        )
    watcher = asyncio.create_task(_watch_disconnect(request, job))
    try:
        done: DoneEvent | None = None
        async for ev in job.events():
            if isinstance(ev, TokenEvent):
                shaper.collect(ev)
                if shaper.cut:
                    job.cancel()
            elif isinstance(ev, DoneEvent):
                done = ev
        if done is None or done.finish_reason == "error":
            raise errors.internal(f"generation failed: {done.error if done else 'no result'}")
        if done.finish_reason == "cancelled" and await request.is_disconnected():
            raise errors.ApiError(499, "the request was cancelled", code="cancelled")
        return JSONResponse(shaper.result(done))
    finally:
        watcher.cancel()
        job.cancel()


async def _sse(job: Any, shaper: _Shaper, keepalive_s: float, done_marker: bool) -> AsyncIterator[str]:
    last = time.monotonic()
    try:
        for c in shaper.first():
            yield _data(c)
        while True:
            ev = await job.next_event(max(0.0, last + keepalive_s - time.monotonic()))
            if ev is None or isinstance(ev, ProgressEvent):
                if time.monotonic() - last >= keepalive_s:
                    last = time.monotonic()
                    yield ": keepalive\n\n"
                continue
            if isinstance(ev, TokenEvent):
                # the tokens already here go out in one write (several slots' tokens arrive per engine step)
                out: list[str] = []
                while isinstance(ev, TokenEvent):
                    out += [_data(c) for c in shaper.feed(ev)]
                    if shaper.cut:
                        job.cancel()  # the answer is complete (one tool call asked for): stop generating
                        ev = None
                        break
                    ev = job.pending_event()
                if out:
                    last = time.monotonic()
                    yield "".join(out)
                if ev is None or isinstance(ev, ProgressEvent):
                    continue
            if ev.finish_reason == "error":
                yield _data(errors.internal(f"generation failed: {ev.error}").body())
            else:
                for c in shaper.done(ev):
                    yield _data(c)
            break
        if done_marker:
            yield "data: [DONE]\n\n"
    finally:
        job.cancel()


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


# ---- shapes ------------------------------------------------------------------------------------------


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


def _timings(done: DoneEvent) -> protocol.Timings | None:
    if not done.timings:
        return None
    known = protocol.Timings.model_fields
    return protocol.Timings(**{k: v for k, v in done.timings.items() if k in known})


def _dump(model: Any) -> dict[str, Any]:
    return model.model_dump(exclude_none=True)


class _Shaper:
    """One answer's bodies. Streams: first(), feed() per token event, done(); else collect(), result()."""

    def __init__(self, plan: Plan, prefix: str) -> None:
        self.plan = plan
        self.id = prefix + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.text: list[str] = []
        self.token_ids: list[int] = []
        self.cut = False  # the answer is complete before the model ended it: the job is to be cancelled

    def _base(self) -> dict[str, Any]:
        return {"id": self.id, "created": self.created, "model": self.plan.model}

    def collect(self, ev: TokenEvent) -> None:
        self.text.append(ev.text)
        self.token_ids += ev.token_ids

    def first(self) -> list[dict[str, Any]]:
        return []

    def feed(self, ev: TokenEvent) -> list[dict[str, Any]]:
        raise NotImplementedError

    def done(self, done: DoneEvent) -> list[dict[str, Any]]:
        raise NotImplementedError

    def result(self, done: DoneEvent) -> dict[str, Any]:
        raise NotImplementedError


class _ChatShaper(_Shaper):
    """With ``parallel_tool_calls: false`` one call is the answer: llama.cpp's grammars for formats with
    a marker per call (Hermes ``<tool_call>``, Qwen3, MiMo) allow several whatever the flag says, so the
    deltas of a second call are dropped and generation is stopped as it begins (finish_reason tool_calls).
    """

    def __init__(self, plan: Plan) -> None:
        super().__init__(plan, "chatcmpl-")
        self.stream = plan.chat.new_stream()
        self.single = plan.single_tool_call

    def _keep(self, deltas: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not self.single:
            return deltas
        out = []
        for d in deltas:
            if self.cut:
                break
            calls = d.get("tool_calls")
            if calls:
                first = [tc for tc in calls if tc.get("index", 0) == 0]
                if len(first) < len(calls):
                    self.cut = True
                d = {**d, "tool_calls": first} if first else {k: v for k, v in d.items() if k != "tool_calls"}
            if d:
                out.append(d)
        return out

    def _finish_message(self, done: DoneEvent) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
        msg, deltas, finish = self.stream.finish("stop" if self.cut else _finish(done))
        if self.single and msg.get("tool_calls"):
            msg = {**msg, "tool_calls": msg["tool_calls"][:1]}
        return msg, self._keep(deltas), finish

    def collect(self, ev: TokenEvent) -> None:
        self._keep(self.stream.feed(ev.text))

    def _chunk(self, delta: dict[str, Any], finish: str | None = None, done: DoneEvent | None = None) -> dict:
        calls = None
        if delta.get("tool_calls"):
            calls = [
                protocol.DeltaToolCall(
                    index=tc.get("index", i), id=tc.get("id") or None, type=tc.get("type") or None,
                    function=protocol.DeltaFunctionCall(**{k: v for k, v in (tc.get("function") or {}).items()
                                                           if k in ("name", "arguments")}),
                )
                for i, tc in enumerate(delta["tool_calls"])
            ]
        d = protocol.Delta(role=delta.get("role"), content=delta.get("content"),
                           reasoning_content=delta.get("reasoning_content"), tool_calls=calls)
        return _dump(protocol.ChatCompletionChunk(
            **self._base(), choices=[protocol.ChatChunkChoice(index=0, delta=d, finish_reason=finish)],
            timings=_timings(done) if done else None,
        ))

    def first(self) -> list[dict[str, Any]]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def feed(self, ev: TokenEvent) -> list[dict[str, Any]]:
        if self.cut:
            return []
        return [self._chunk(d) for d in self._keep(self.stream.feed(ev.text))]

    def done(self, done: DoneEvent) -> list[dict[str, Any]]:
        _, deltas, finish = self._finish_message(done)
        out = [self._chunk(d) for d in deltas]
        out.append(self._chunk({}, finish, done))
        if self.plan.include_usage:
            out.append(_dump(protocol.ChatCompletionChunk(**self._base(), choices=[], usage=usage(done))))
        return out

    def result(self, done: DoneEvent) -> dict[str, Any]:
        msg, _, finish = self._finish_message(done)
        calls = [
            protocol.ResponseToolCall(
                id=c.get("id") or f"call_{i}",
                function=protocol.ResponseFunctionCall(name=c["function"]["name"],
                                                       arguments=c["function"].get("arguments") or ""),
            )
            for i, c in enumerate(msg.get("tool_calls") or [])
        ]
        message = protocol.ResponseMessage(content=msg.get("content"), reasoning_content=msg.get("reasoning_content"),
                                           tool_calls=calls or None)
        return _dump(protocol.ChatCompletionResponse(
            **self._base(), choices=[protocol.ChatChoice(index=0, finish_reason=finish, message=message)],
            usage=usage(done), timings=_timings(done),
        ))


class _CompletionShaper(_Shaper):
    def __init__(self, plan: Plan) -> None:
        super().__init__(plan, "cmpl-")

    def _chunk(self, text: str, done: DoneEvent | None = None) -> dict[str, Any]:
        choice = protocol.CompletionChoice(index=0, text=text, finish_reason=_finish(done) if done else None)
        return _dump(protocol.CompletionResponse(**self._base(), choices=[choice],
                                                 timings=_timings(done) if done else None))

    def first(self) -> list[dict[str, Any]]:
        return [self._chunk(self.plan.echo)] if self.plan.echo else []

    def feed(self, ev: TokenEvent) -> list[dict[str, Any]]:
        return [self._chunk(ev.text)] if ev.text else []

    def done(self, done: DoneEvent) -> list[dict[str, Any]]:
        out = [self._chunk("", done)]
        if self.plan.include_usage:
            out.append(_dump(protocol.CompletionResponse(**self._base(), choices=[], usage=usage(done))))
        return out

    def result(self, done: DoneEvent) -> dict[str, Any]:
        choice = protocol.CompletionChoice(index=0, text=self.plan.echo + "".join(self.text),
                                           finish_reason=_finish(done))
        return _dump(protocol.CompletionResponse(**self._base(), choices=[choice], usage=usage(done),
                                                 timings=_timings(done)))


class _NativeShaper(_Shaper):
    """llama-server's /completion bodies (server-task.cpp, to_json_non_oaicompat)."""

    def __init__(self, plan: Plan) -> None:
        super().__init__(plan, "")
        self.n = 0

    def _stop_type(self, done: DoneEvent) -> str:
        if done.finish_reason == "stop":
            return "word" if done.stop_word else "eos"
        return "limit" if done.finish_reason == "length" else "none"

    def feed(self, ev: TokenEvent) -> list[dict[str, Any]]:
        self.n += len(ev.token_ids)
        if not ev.text and not ev.token_ids:
            return []
        return [_dump(protocol.NativeCompletionResponse(
            content=ev.text, tokens=list(ev.token_ids), stop=False, tokens_predicted=self.n,
            tokens_evaluated=len(self.plan.request.prompt),
        ))]

    def _final(self, done: DoneEvent, content: str, tokens: list[int]) -> dict[str, Any]:
        return _dump(protocol.NativeCompletionResponse(
            content=content, tokens=tokens, stop=True, model=self.plan.model,
            tokens_predicted=done.completion_tokens, tokens_evaluated=done.prompt_tokens,
            prompt=self.plan.prompt_text, has_new_line="\n" in content, truncated=False,
            stop_type=self._stop_type(done), stopping_word=done.stop_word or "",
            tokens_cached=done.cached_tokens, timings=_timings(done),
        ))

    def done(self, done: DoneEvent) -> list[dict[str, Any]]:
        return [self._final(done, "", [])]

    def result(self, done: DoneEvent) -> dict[str, Any]:
        return self._final(done, "".join(self.text), self.token_ids)


def _shaper(plan: Plan) -> _Shaper:
    return {"chat": _ChatShaper, "completion": _CompletionShaper, "native": _NativeShaper}[plan.kind](plan)
