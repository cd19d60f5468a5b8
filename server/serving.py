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
        if getattr(req, "logit_bias", None):
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
            "typical_p": req.typical_p,
            "repeat_penalty": req.repeat_penalty,
            "presence_penalty": req.presence_penalty,
            "frequency_penalty": req.frequency_penalty,
            "seed": None if req.seed is None or req.seed == -1 else req.seed % (2**32),
            "stop": stop,
        }

    @staticmethod
    def _extension_grammar(req: Any, work: Work) -> None:
        """llama-server's ``grammar`` (GBNF) and ``json_schema`` request fields."""
        if req.grammar is not None and req.json_schema is not None:
            raise errors.bad_request("grammar and json_schema: give one of them, not both", param="grammar")
        if work.grammar is not None and (req.grammar is not None or req.json_schema is not None):
            raise errors.bad_request(
                "response_format: cannot be combined with grammar or json_schema", param="response_format"
            )
        if req.grammar is not None:
            work.grammar, work.grammar_param = req.grammar, "grammar"
        elif req.json_schema is not None:
            work.grammar = _schema_gbnf(req.json_schema, "json_schema")
            work.grammar_param = "json_schema"

    @staticmethod
    def _message(m: protocol.ChatMessage, i: int) -> dict[str, Any]:
        _check_tool_fields(m, i)
        out: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role}
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
            out["tool_calls"] = [
                {**tc.model_dump(), "id": tc.id or f"call_{i}_{j}", "type": "function"}
                for j, tc in enumerate(m.tool_calls)
            ]
        if m.tool_call_id is not None:
            out["tool_call_id"] = m.tool_call_id
        if m.reasoning_content is not None:
            out["reasoning_content"] = m.reasoning_content
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
        self._extension_grammar(req, work)

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
        work = Work(kind="completion", kwargs=kw, stream=req.stream, prompt_ids=ids)
        self._extension_grammar(req, work)
        return work, model

    def native_completion_work(self, req: protocol.NativeCompletionRequest) -> tuple[Work, str]:
        """llama-server's POST /completion: text, token ids, or a mix (strings tokenized here)."""
        model = self.model_name(None)
        if req.n_probs:
            raise errors.not_supported("n_probs", "n_probs > 0")
        kw = self._sampling(req)
        prompt: Any = req.prompt
        ids = None
        if isinstance(prompt, list):
            ids = []
            for p in prompt:
                ids += self.engine.tokenize(p, False, True) if isinstance(p, str) else [p]
            prompt = ids
        if not prompt:
            raise errors.bad_request("prompt: must not be empty", param="prompt")
        max_tokens = None if req.n_predict is None or req.n_predict < 0 else req.n_predict
        if max_tokens == 0:
            raise errors.bad_request("n_predict: 0 generates nothing; use -1 or a positive count", param="n_predict")
        kw.update(prompt=prompt, max_tokens=max_tokens, model=model)
        work = Work(kind="completion", kwargs=kw, stream=bool(req.stream), prompt_ids=ids)
        self._extension_grammar(req, work)
        return work, model

    # ---- llama-server's utility endpoints ------------------------------------------------------

    def tokenize(self, req: protocol.TokenizeRequest) -> protocol.TokenizeResponse:
        self._ready()
        content = req.content if isinstance(req.content, list) else [req.content]
        tokens: list[int] = []
        for part in content:
            if isinstance(part, str):
                tokens += self.engine.tokenize(part, bool(req.add_special), bool(req.parse_special))
            else:
                tokens.append(part)
        if not req.with_pieces:
            return protocol.TokenizeResponse(tokens=tokens)
        pieces = []
        for t in tokens:
            raw = self.engine.token_piece(t)
            try:
                piece: str | list[int] = raw.decode("utf-8")
            except UnicodeDecodeError:
                piece = list(raw)
            pieces.append(protocol.TokenPiece(id=t, piece=piece))
        return protocol.TokenizeResponse(tokens=pieces)

    def detokenize(self, req: protocol.DetokenizeRequest) -> protocol.DetokenizeResponse:
        info = self._ready()
        bad = [t for t in req.tokens if t >= info.n_vocab]
        if bad:
            raise errors.bad_request(
                f"tokens: token id {bad[0]} is outside this model's vocabulary [0, {info.n_vocab})",
                param="tokens",
            )
        return protocol.DetokenizeResponse(content=self.engine.detokenize(req.tokens, False))

    def apply_template(self, req: protocol.ChatCompletionRequest) -> str:
        """The prompt a chat request renders to (POST /apply-template)."""
        self._ready()
        facts = self.engine.template_facts()
        messages = [self._message(m, i) for i, m in enumerate(req.messages)]
        tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
        kwargs = {**self.engine.settings.chat_template_kwargs, **(req.chat_template_kwargs or {})}
        return _render(facts, messages, tools or None, kwargs)

    def props(self) -> protocol.Props:
        info, s = self._ready(), self.engine.settings
        facts = self.engine.template_facts()
        import llama_vq  # noqa: PLC0415

        bi = llama_vq.build_info()
        params = protocol._Sampling().model_dump(
            include={"temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty",
                     "repeat_last_n", "presence_penalty", "frequency_penalty"}
        )
        return protocol.Props(
            default_generation_settings=protocol.GenerationSettings(n_ctx=info.n_ctx, params=params),
            total_slots=1,
            model_alias=info.names[0],
            model_path=info.path,
            chat_template=facts["template"],
            bos_token=facts["bos_token"],
            eos_token=facts["eos_token"],
            build_info=f"llama-vq {bi.version} llama.cpp {bi.llama_cpp_commit[:10]} {bi.backend}",
            cache_type_k=info.cache_type_k,
            cache_type_v=info.cache_type_v,
            flash_attn=info.flash_attn,
            jinja=s.jinja,
            reasoning_format=s.reasoning_format,
            chat_template_kwargs=s.chat_template_kwargs,
        )

    def _ready(self) -> Any:
        info = self.engine.info
        if info is None or self.engine.status == "loading":
            raise errors.unavailable("the model is still loading; retry shortly", retry_after_s=5)
        return info

    # ---- running ------------------------------------------------------------------------------

    async def run(
        self,
        request: Request,
        work: Work,
        *,
        shape_result: Callable[[dict[str, Any], JobStats], Any],
        shape_chunk: Callable[[dict[str, Any]], Any],
        usage_chunk: Callable[[dict[str, Any], JobStats], Any] | None,
        done_marker: bool = True,
    ) -> Response:
        """Run ``work``; answer JSON, or SSE when streaming (``data: [DONE]`` last unless
        ``done_marker`` is false, as llama-server's native /completion stream)."""
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
                    self._sse(job, (kind, data), shape_chunk, usage_chunk, done_marker),
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
        done_marker: bool,
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
            if done_marker:
                yield "data: [DONE]\n\n"
        finally:
            job.cancel()


def _check_tool_fields(m: protocol.ChatMessage, i: int) -> None:
    """400 naming the message and field for tool history a template cannot render faithfully."""
    if m.role == "tool" and not m.tool_call_id:
        raise errors.bad_request(
            f"messages[{i}].tool_call_id: a tool message needs the id of the call it answers",
            param=f"messages[{i}].tool_call_id",
        )
    if m.tool_calls and m.role != "assistant":
        raise errors.bad_request(
            f"messages[{i}].tool_calls: only assistant messages carry tool calls (role is {m.role!r})",
            param=f"messages[{i}].tool_calls",
        )
    for j, tc in enumerate(m.tool_calls or []):
        try:
            args = json.loads(tc.function.arguments) if tc.function.arguments.strip() else {}
        except json.JSONDecodeError as e:
            args = e
        if not isinstance(args, dict):
            param = f"messages[{i}].tool_calls[{j}].function.arguments"
            raise errors.bad_request(f"{param}: must be a JSON object as text, got {tc.function.arguments[:80]!r}",
                                     param=param)


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



def _render(facts: dict[str, str], messages: list, tools: list | None, kwargs: dict) -> str:
    """Render a Jinja chat template in a sandbox (the variables Hugging Face templates read)."""
    import datetime  # noqa: PLC0415

    import jinja2  # noqa: PLC0415
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: PLC0415

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loader=jinja2.BaseLoader())
    env.globals.update(
        raise_exception=raise_exception,
        strftime_now=lambda fmt: datetime.datetime.now().strftime(fmt),
    )
    try:
        return env.from_string(facts["template"]).render(
            messages=messages,
            tools=tools,
            add_generation_prompt=True,
            bos_token=facts["bos_token"],
            eos_token=facts["eos_token"],
            **kwargs,
        )
    except jinja2.TemplateError as e:
        raise errors.bad_request(f"the chat template failed to render: {e}", param="messages") from None
