"""Engine results -> protocol models: OpenAI's chat/text completion shapes and llama-server's
native /completion shape (content, tokens_predicted, stop_type, timings ...)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import protocol
from .engine import JobStats


def _timings(stats: JobStats) -> protocol.Timings | None:
    return protocol.Timings(**stats.timings) if stats.timings else None




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
                        content=msg.get("content"),
                        reasoning_content=msg.get("reasoning_content"),
                        tool_calls=calls or None,
                    ),
                )
            ],
            usage=usage(stats),
            timings=_timings(stats),
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
            id=last["id"],
            created=last["created"],
            model=model,
            choices=[],
            usage=usage(stats),
            timings=_timings(stats),
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


# ---- llama-server's native /completion -----------------------------------------------------------

_STOP_TYPE = {"length": "limit", "stop": "eos"}


def native_result(
    model: str, prompt: str | None
) -> Callable[[dict[str, Any], JobStats], protocol.NativeCompletionResponse]:
    def shape(r: dict[str, Any], stats: JobStats) -> protocol.NativeCompletionResponse:
        ch = r["choices"][0]
        text = ch.get("text") or ""
        return protocol.NativeCompletionResponse(
            content=text,
            stop=True,
            model=model,
            tokens_predicted=stats.completion_tokens,
            tokens_evaluated=stats.prompt_tokens,
            prompt=prompt,
            has_new_line="\n" in text,
            truncated=False,
            stop_type=_STOP_TYPE.get(ch.get("finish_reason"), "none"),
            stopping_word="",
            tokens_cached=stats.cached_tokens,
            timings=_timings(stats),
        )

    return shape


def native_chunk(model: str) -> Callable[[dict[str, Any]], protocol.NativeCompletionResponse]:
    def shape(c: dict[str, Any]) -> protocol.NativeCompletionResponse:
        ch = (c.get("choices") or [{}])[0]
        return protocol.NativeCompletionResponse(content=ch.get("text") or "", stop=False)

    return shape


def native_final_chunk(
    model: str,
) -> Callable[[dict[str, Any], JobStats], protocol.NativeCompletionResponse]:
    def shape(last: dict[str, Any], stats: JobStats) -> protocol.NativeCompletionResponse:
        ch = (last.get("choices") or [{}])[0]
        return protocol.NativeCompletionResponse(
            content="",
            stop=True,
            model=model,
            tokens_predicted=stats.completion_tokens,
            tokens_evaluated=stats.prompt_tokens,
            stop_type=_STOP_TYPE.get(ch.get("finish_reason"), "none"),
            stopping_word="",
            tokens_cached=stats.cached_tokens,
            timings=_timings(stats),
        )

    return shape
