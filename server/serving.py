"""Turns HTTP requests into engine requests (no model access): chats through the chat layer
(llama.cpp's common/chat: prompt, lazy grammar, stops, output parser), text completions, llama-server's
native /completion, and its utility endpoints (/tokenize, /detokenize, /apply-template, /props).

Running a plan and shaping its answer (JSON or Server-Sent Events) is streaming.py's job. Errors are
raised as ApiError, or as engine / chat-layer exceptions that errors.from_exception maps in one place.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

from . import errors, protocol
from .chat_layer import ChatLayer, ChatPlan
from .engine.request import GenerationRequest, Grammar, Reasoning, Sampling
from .settings import Settings

_MAX_STOPS = 16


def _schema_gbnf(schema: dict[str, Any], param: str) -> str:
    """GBNF for a JSON schema with llama_cpp's converter; 400 naming ``param`` if it cannot."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf  # noqa: PLC0415

    try:
        return json_schema_to_gbnf(json.dumps(schema))
    except Exception as e:  # noqa: BLE001 (the converter raises many kinds on odd schemas)
        raise errors.bad_request(
            f"{param}: cannot turn this JSON schema into a grammar: {type(e).__name__}: {e}", param=param
        ) from None


@dataclass
class Plan:
    """An engine request plus what its answer needs."""

    request: GenerationRequest
    model: str
    kind: str  # "chat" | "completion" | "native"
    stream: bool
    include_usage: bool = False
    echo: str = ""  # text completions with echo: the prompt text, sent first
    chat: ChatPlan | None = None  # chats: the parser of the output
    prompt_text: str | None = None  # native /completion: echoed as "prompt"
    grammar_param: str = "grammar"  # the field a grammar the engine refuses came from
    single_tool_call: bool = False  # parallel_tool_calls false: the answer ends with its first call


class Serving:
    def __init__(self, engine: Any, settings: Settings) -> None:
        self.engine = engine
        self.settings = settings
        self.keepalive_s = min(settings.sse_keepalive or 5.0, 10.0)
        self._chat: ChatLayer | None = None
        self._chat_lock = threading.Lock()

    # ---- shared pieces ------------------------------------------------------------------------

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

    def chat_layer(self) -> ChatLayer:
        """The model's templates (or --chat-template / --chat-template-file), built once the model is loaded."""
        if self._chat is None:
            self._ready()
            with self._chat_lock:
                if self._chat is None:
                    s = self.settings
                    self._chat = ChatLayer.for_model(
                        self.engine.llama,
                        chat_template=s.chat_template,
                        chat_template_file=s.chat_template_file,
                        chat_template_kwargs=s.chat_template_kwargs,
                        reasoning_format=s.reasoning_format,
                    )
        return self._chat

    def _ready(self) -> Any:
        info = self.engine.info
        if info is None or self.engine.status == "loading":
            raise errors.unavailable("the model is still loading; retry shortly", retry_after_s=5)
        return info

    @staticmethod
    def _sampling(req: Any) -> tuple[Sampling, tuple[str, ...]]:
        if getattr(req, "logit_bias", None):
            raise errors.not_supported("logit_bias", "a non-empty logit_bias")
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        if len(stop) > _MAX_STOPS:
            raise errors.bad_request(f"stop: at most {_MAX_STOPS} stop strings, got {len(stop)}", param="stop")
        sampling = Sampling(
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            min_p=req.min_p,
            typical_p=req.typical_p,
            repeat_penalty=req.repeat_penalty,
            repeat_last_n=req.repeat_last_n,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            seed=None if req.seed is None or req.seed == -1 else req.seed % (2**32),
        )
        return sampling, tuple(stop)

    @staticmethod
    def _grammar(req: Any) -> tuple[Grammar | None, str]:
        """A text completion's grammar: llama-server's ``grammar`` (GBNF) or ``json_schema``."""
        if req.grammar is not None and req.json_schema is not None:
            raise errors.bad_request("grammar and json_schema: give one of them, not both", param="grammar")
        if req.grammar is not None:
            return Grammar(req.grammar), "grammar"
        if req.json_schema is not None:
            return Grammar(_schema_gbnf(req.json_schema, "json_schema")), "json_schema"
        return None, "grammar"

    def _tokenize(self, text: str, add_special: bool, parse_special: bool = True) -> list[int]:
        return self.engine.tokenize(text, add_special=add_special, parse_special=parse_special)

    # ---- chat ---------------------------------------------------------------------------------

    @staticmethod
    def _message(m: Any, i: int) -> dict[str, Any]:
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
            # Templates concatenate content as a string; only an assistant message that calls tools has none.
            out["content"] = None if getattr(m, "tool_calls", None) else ""
        if m.name is not None:
            out["name"] = m.name
        calls = getattr(m, "tool_calls", None)
        if calls:
            out["tool_calls"] = [
                {"id": tc.id or f"call_{i}_{j}", "type": "function",
                 "function": {"name": tc.function.name, "arguments": tc.function.arguments}}
                for j, tc in enumerate(calls)
            ]
        if isinstance(m, protocol.ToolMessage):
            out["tool_call_id"] = m.tool_call_id
        if getattr(m, "reasoning_content", None) is not None:
            out["reasoning_content"] = m.reasoning_content
        return out

    def chat_body(self, req: protocol.ChatCompletionRequest) -> dict[str, Any]:
        """The request as the chat layer takes it: plain dicts, no nulls, developer as system."""
        body = req.model_dump(exclude_none=True, by_alias=True)
        body["messages"] = [self._message(m, i) for i, m in enumerate(req.messages)]
        return body

    def chat_plan(self, req: protocol.ChatCompletionRequest) -> Plan:
        model = self.model_name(req.model)
        if req.logprobs:
            raise errors.not_supported("logprobs", "logprobs=true")
        sampling, stop = self._sampling(req)
        body = self.chat_body(req)
        body["stop"] = list(stop)
        chat = self.chat_layer().plan(body)  # ChatRequestError -> 400 naming the field (errors.from_exception)
        tokens = self._tokenize(chat.prompt, chat.add_special, chat.parse_special)
        gen = GenerationRequest(
            prompt=tuple(tokens),
            sampling=sampling,
            grammar=chat.grammar,
            stop=chat.stop,
            max_tokens=req.max_completion_tokens or req.max_tokens,
            render_special=chat.render_special,
            preserved_token_ids=chat.preserved_token_ids,
            # a lazy (tool) grammar waits for the end of the reasoning block, as llama-server gates it
            reasoning=Reasoning(chat.thinking.start, tuple(chat.thinking.ends), chat.thinking.open_at_start)
            if chat.thinking
            else None,
            cache_prompt=bool(req.cache_prompt),
        )
        param = "response_format" if req.response_format is not None else "tools" if chat.has_tools else "grammar"
        return Plan(gen, model, "chat", bool(req.stream), _include_usage(req), chat=chat, grammar_param=param,
                    single_tool_call=chat.has_tools and req.parallel_tool_calls is False)

    # ---- text completions ---------------------------------------------------------------------

    def completion_plan(self, req: protocol.CompletionRequest) -> Plan:
        model = self.model_name(req.model)
        if req.suffix is not None:
            raise errors.not_supported("suffix", "suffix (fill-in-the-middle)")
        if req.logprobs is not None:
            raise errors.not_supported("logprobs", "logprobs")
        sampling, stop = self._sampling(req)
        grammar, param = self._grammar(req)
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
        echo = ""
        if isinstance(prompt, str):
            tokens, echo = self._tokenize(prompt, add_special=True), prompt
        else:
            tokens = [int(t) for t in prompt]
            n_vocab = self.engine.info.n_vocab if self.engine.info else 0
            if req.echo and all(0 <= t < n_vocab for t in tokens):
                echo = self.engine.detokenize(tokens)
        gen = GenerationRequest(
            prompt=tuple(tokens), sampling=sampling, grammar=grammar, stop=stop, max_tokens=req.max_tokens,
            cache_prompt=bool(req.cache_prompt),
        )
        return Plan(gen, model, "completion", bool(req.stream), _include_usage(req),
                    echo=echo if req.echo else "", grammar_param=param)

    def native_completion_plan(self, req: protocol.NativeCompletionRequest) -> Plan:
        """llama-server's POST /completion: text, token ids, or a mix (strings tokenized here)."""
        model = self.model_name(None)
        if req.n_probs:
            raise errors.not_supported("n_probs", "n_probs > 0")
        sampling, stop = self._sampling(req)
        grammar, param = self._grammar(req)
        if isinstance(req.prompt, str):
            tokens = self._tokenize(req.prompt, add_special=True) if req.prompt else []
        else:
            tokens = []
            for p in req.prompt:
                tokens += self._tokenize(p, add_special=False) if isinstance(p, str) else [p]
        if not tokens:
            raise errors.bad_request("prompt: must not be empty", param="prompt")
        if req.n_predict == 0:
            raise errors.bad_request("n_predict: 0 generates nothing; use -1 or a positive count", param="n_predict")
        gen = GenerationRequest(
            prompt=tuple(tokens), sampling=sampling, grammar=grammar, stop=stop,
            max_tokens=None if req.n_predict is None or req.n_predict < 0 else req.n_predict,
            ignore_eos=bool(req.ignore_eos), cache_prompt=bool(req.cache_prompt),
        )
        prompt_text = req.prompt if isinstance(req.prompt, str) else None
        return Plan(gen, model, "native", bool(req.stream), prompt_text=prompt_text, grammar_param=param)

    # ---- llama-server's utility endpoints -----------------------------------------------------

    def tokenize(self, req: protocol.TokenizeRequest) -> protocol.TokenizeResponse:
        self._ready()
        content = req.content if isinstance(req.content, list) else [req.content]
        tokens: list[int] = []
        for part in content:
            if isinstance(part, str):
                tokens += self._tokenize(part, bool(req.add_special), bool(req.parse_special))
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
                f"tokens: token id {bad[0]} is outside this model's vocabulary [0, {info.n_vocab})", param="tokens"
            )
        return protocol.DetokenizeResponse(content=self.engine.detokenize(req.tokens))

    def apply_template(self, req: protocol.ChatCompletionRequest) -> str:
        """The prompt a chat request renders to (POST /apply-template), as llama-server."""
        return self.chat_layer().apply_template(self.chat_body(req))

    def props(self) -> protocol.Props:
        info, s = self._ready(), self.settings
        facts = self.chat_layer().props()
        import llama_vq  # noqa: PLC0415

        bi = llama_vq.build_info()
        d = Sampling()
        params = {k: getattr(d, k) for k in ("temperature", "top_k", "top_p", "min_p", "typical_p",
                                             "repeat_penalty", "repeat_last_n", "presence_penalty",
                                             "frequency_penalty")}
        params["n_predict"] = s.n_predict
        llm = self.engine.llama

        def text(tok: int) -> str:
            return self.engine.detokenize([tok], render_special=True) if tok >= 0 else ""

        return protocol.Props(
            default_generation_settings=protocol.GenerationSettings(n_ctx=info.n_ctx, params=params),
            total_slots=info.n_slots,
            model_alias=info.names[0],
            model_path=info.path,
            chat_template=facts["chat_template"],
            chat_template_tool_use=facts.get("chat_template_tool_use"),
            chat_template_caps=facts.get("chat_template_caps", {}),
            bos_token=text(llm.token_bos()),
            eos_token=text(llm.token_eos()),
            build_info=f"llama-vq {bi.version} llama.cpp {bi.llama_cpp_commit[:10]} {bi.backend}",
            cache_type_k=info.cache_type_k,
            cache_type_v=info.cache_type_v,
            flash_attn=info.flash_attn,
            jinja=s.jinja,
            reasoning_format=s.reasoning_format,
            chat_template_kwargs=s.chat_template_kwargs,
        )


def _include_usage(body: Any) -> bool:
    return bool(body.stream and body.stream_options and body.stream_options.include_usage)


def _check_tool_fields(m: Any, i: int) -> None:
    """400 naming the message and field for tool calls whose arguments are not a JSON object."""
    for j, tc in enumerate(getattr(m, "tool_calls", None) or []):
        try:
            args = json.loads(tc.function.arguments) if tc.function.arguments.strip() else {}
        except json.JSONDecodeError as e:
            args = e
        if not isinstance(args, dict):
            param = f"messages[{i}].tool_calls[{j}].function.arguments"
            raise errors.bad_request(f"{param}: must be a JSON object as text, got {tc.function.arguments[:80]!r}",
                                     param=param)
