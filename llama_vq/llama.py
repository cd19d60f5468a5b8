"""llama_vq.Llama: a llama_cpp.Llama that takes cache types by name and reports its KV cache."""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import llama_cpp

from . import _chat_completion, _llama_cpp, _logs, attn_choice
from . import _llama_steps as _steps
from .cache_types import (
    FLASH_ATTN_OFF,
    FLASH_ATTN_ON,
    CacheType,
    flash_attn_name,
    parse_cache_type,
)
from .chat import ChatTemplates
from .errors import CacheConfigError, ContextCreationError, ModelLoadError


@dataclass(frozen=True)
class KVCacheInfo:
    """The KV cache a context allocated: element types, cells, and bytes of K and of V (all layers).

    For an iSWA model (sliding-window + full-attention layers) ``type_k_swa``/``type_v_swa`` are the
    sliding-window layers' types and ``swa_k_bytes``/``swa_v_bytes`` their share of ``k_bytes``/``v_bytes``;
    None and 0 for other models.
    """

    type_k: str
    type_v: str
    n_cells: int
    k_bytes: int
    v_bytes: int
    type_k_swa: str | None = None
    type_v_swa: str | None = None
    swa_k_bytes: int = 0
    swa_v_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.k_bytes + self.v_bytes


class Llama(llama_cpp.Llama):
    """A llama_cpp.Llama (its whole API works) with llama-vq's additions.

    Args beyond llama_cpp.Llama's:
        type_k, type_v: KV cache element types by name (any case) or ggml_type number; default f16.
        type_k_swa, type_v_swa: the cache types of an iSWA model's sliding-window layers (e.g. f16 for
            MiMo's 128-token windows while the full layers hold q4_0); default: type_k / type_v.
            Ignored (llama.cpp logs a warning) for models without sliding-window layers.
        flash_attn: True/False or "on"/"off"/"auto"/"prefill". "prefill": flash attention for prompt batches
            and llama-vq's attention without it for decode batches (up to LLAMA_VQ_DECODE_TOKENS tokens per
            sequence, default 8), one cache for both; it needs a quantized V to differ from "on". "auto":
            measured on this device the first time (prompt and decode batches with and without flash attention;
            cached on disk, llama_vq.attn_choice), else the static rule: with a quantized V "prefill" on an
            accelerator and "off" on the CPU alone; a mode that would move a layer's attention off its device is
            passed over. ``flash_attn_mode`` and ``flash_attn_why`` say what the context runs and why.
        attn_scratch_mib: without flash attention, a batch's attention scores are computed in splits of at
            most this many MiB (default: LLAMA_VQ_ATTN_SCRATCH_MIB, else 256). Process-wide: it applies to
            every context created from then on.
        tensor_overrides: llama-server's --override-tensor: [("exps", "CPU")] or ["exps=CPU"];
            tensors whose name matches the regex are stored in that buffer type.
        rpc_servers: "host:port,host:port" of llama.cpp rpc-server processes to use as devices (before the local
            GPUs, as llama.cpp orders them). Each must answer when the model loads (else ConfigError). A model
            uses only its own rpc_servers: those of earlier models of the process are not reached for.
        swa_full: cache size of sliding-window-attention layers (SWA/iSWA models such as MiMo, Gemma).
            True (llama.cpp's C default, hence this default): as large as the context, so any cached
            prefix can be cut back and reused, as llama_cpp.Llama's prefix reuse assumes. False: only
            the window (plus a micro-batch) per sequence, as llama-server does by default; a fraction
            of the memory (MiMo-V2-Flash at 64K: ~1.3 GB instead of ~14 GB f16), but a cached sequence
            can then only be extended, or cut back to within its window. ``kv_cache_info()`` reports
            the bytes allocated either way. No effect on models without SWA layers.
        n_seq_max: sequences the context holds (parallel slots of a server). Default 1.
        kv_unified: one KV buffer shared by all sequences (llama-server's default with slots).
        chat_template: for create_chat_completion, a template in place of the model's own: a built-in name
            (``llama_vq.builtin_templates()``) or Jinja source, as llama-server's --chat-template. Without
            chat_format / chat_handler (llama-cpp-python's formatters, which then run instead), chats go through
            llama.cpp's chat layer: tools, tool_choice and reasoning parsed as llama-server parses them.

    Raises:
        CacheConfigError (ValueError): unknown type name, or an impossible combination, before any
            native call; the message names the fix.
        ModelLoadError / ContextCreationError: llama.cpp refused; ``.reason`` is llama.cpp's own.
    """

    def __init__(
        self,
        model_path: str,
        *,
        type_k: str | int | CacheType | None = None,
        type_v: str | int | CacheType | None = None,
        type_k_swa: str | int | CacheType | None = None,
        type_v_swa: str | int | CacheType | None = None,
        flash_attn: bool | str | int = False,
        attn_scratch_mib: int | None = None,
        tensor_overrides: Sequence[tuple[str, str] | str] | None = None,
        rpc_servers: str | Sequence[str] | None = None,
        swa_full: bool = True,
        n_seq_max: int = 1,
        kv_unified: bool = False,
        chat_template: str | None = None,
        **kwargs: Any,
    ) -> None:
        cfg = _steps.Config.checked(
            model_path, type_k, type_v, type_k_swa, type_v_swa, flash_attn, attn_scratch_mib, tensor_overrides
        )
        rpc_devices = _steps.rpc_devices(rpc_servers)
        keep: list[Any] = []  # ctypes objects the model params point to: alive as long as self
        choice = _steps.measured_choice(model_path, cfg, kwargs)
        preferred = choice.mode if choice is not None and choice.how != "static" else None
        with (
            attn_choice.preferred(preferred),
            _llama_cpp.adjusting(
                model=_steps.model_adjuster(cfg.overrides, rpc_devices, keep),
                context=_steps.context_adjuster(cfg, attn_scratch_mib, n_seq_max, kv_unified),
            ),
            _logs.Capture() as cap,
        ):
            self._create_or_explain(model_path, cfg, swa_full, kwargs, cap)
        self._vq_keep = keep
        self._vq_type_k, self._vq_type_v = cfg.tk, cfg.tv
        self._vq_type_k_swa, self._vq_type_v_swa = cfg.tk_swa, cfg.tv_swa
        self._vq_flash_attn_requested = cfg.fa
        self._vq_flash_attn_mode = _llama_cpp.flash_attn_type(self._ctx.ctx)
        self._vq_attn_layers = attn_choice.parse_layers(_llama_cpp.attn_layers(self._ctx.ctx))
        self._vq_flash_attn_why = _steps.why(cfg.fa, choice, flash_attn_name(self._vq_flash_attn_mode))
        if kwargs.get("verbose", True):  # llama-cpp-python's default; llama.cpp has logged each layer kind's line
            print(f"llama_vq: attention mode {self.flash_attn_mode} ({self._vq_flash_attn_why})", file=sys.stderr)
        self._vq_swa_full = bool(swa_full)
        self._vq_chat_template = chat_template
        # llama-cpp-python's formatters only when asked for by name or handler
        self._vq_chat_layer = kwargs.get("chat_format") is None and kwargs.get("chat_handler") is None

    def _create_or_explain(
        self, model_path: str, cfg: _steps.Config, swa_full: bool, kwargs: dict[str, Any], cap: _logs.Capture
    ) -> None:
        """llama_cpp.Llama's constructor with the cache types and mode; its ValueErrors become our errors with the
        reason llama.cpp logged."""
        try:
            super().__init__(
                model_path,
                type_k=cfg.tk.ggml_type,
                type_v=cfg.tv.ggml_type,
                flash_attn=cfg.fa == FLASH_ATTN_ON,
                swa_full=swa_full,
                **kwargs,
            )
        except ValueError as e:
            why = _logs.reason(cap)
            if "Failed to create llama_context" in str(e):
                swa = f", type_k_swa={cfg.tk_swa.name}, type_v_swa={cfg.tv_swa.name}" if cfg.swa_differs else ""
                raise ContextCreationError(
                    f"llama.cpp refused to create the context (type_k={cfg.tk.name}, type_v={cfg.tv.name}{swa}, "
                    f"flash_attn={flash_attn_name(cfg.fa)}): {why or 'no reason logged'}",
                    why,
                ) from None
            if "Failed to load model" in str(e):
                raise ModelLoadError(f"llama.cpp could not load {model_path}: {why or e}", why) from None
            raise

    @property
    def swa_full(self) -> bool:
        """Whether sliding-window layers got a full-size cache (see the constructor)."""
        return self._vq_swa_full

    def close(self) -> None:
        # the chat templates hold the model's vocabulary: they go first
        templates = self.__dict__.pop("chat_templates", None)
        if templates is not None:
            templates.close()
        # llama_cpp.Llama.close() assumes its __init__ ran; ours may refuse before calling it.
        if hasattr(self, "_stack"):
            super().close()

    @functools.cached_property
    def chat_templates(self) -> ChatTemplates:
        """The chat layer's templates of this model (or of ``chat_template``), made on first use.

        Raises ChatTemplateError when the template does not parse.
        """
        return ChatTemplates(self, self._vq_chat_template)

    def create_chat_completion(  # type: ignore[override]
        self,
        messages: list[Any],
        functions: list[Any] | None = None,
        function_call: Any = None,
        tools: list[Any] | None = None,
        tool_choice: Any = None,
        temperature: float = 0.2,
        top_p: float = 0.95,
        top_k: int = 40,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        stream: bool = False,
        stop: str | list[str] | None = None,
        seed: int | None = None,
        response_format: Any = None,
        max_tokens: int | None = None,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        repeat_penalty: float = 1.0,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        model: str | None = None,
        logits_processor: Any = None,
        grammar: Any = None,
        logit_bias: Mapping[int, float] | None = None,
        logprobs: bool | None = None,
        top_logprobs: int | None = None,
        *,
        parallel_tool_calls: bool | None = None,
        reasoning_format: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """An OpenAI chat completion (a dict) or, with stream=True, its chunks, through llama.cpp's chat layer.

        The arguments are llama_cpp.Llama's; the message, as OpenAI's, holds ``content``, ``reasoning_content``
        (a model's thinking, split off per ``reasoning_format``: "auto" (default), "none", "deepseek") and
        ``tool_calls`` (id, type "function", name, arguments as JSON text), and ``finish_reason`` is
        "tool_calls" when it has any. ``tool_choice``: "auto" lets the model answer or call (its tool-call
        grammar applies once it starts a call), "required" or {"type": "function", "function": {"name": ...}}
        makes it call, "none" gives it no tools. ``parallel_tool_calls``: several calls in one answer.
        ``chat_template_kwargs``: extra template variables (e.g. {"enable_thinking": False}).
        Created with chat_format or chat_handler, the Llama runs llama-cpp-python's formatter instead.

        Raises ChatTemplateError (a ValueError, ``param`` naming the field) for a request the template refuses,
        ValueError for a prompt longer than the context and for logprobs, which this path does not compute.
        """
        if not self._vq_chat_layer:
            result = super().create_chat_completion(
                messages,
                functions,
                function_call,
                tools,
                tool_choice,
                temperature,
                top_p,
                top_k,
                min_p,
                typical_p,
                stream,
                [] if stop is None else stop,
                seed,
                response_format,
                max_tokens,
                presence_penalty,
                frequency_penalty,
                repeat_penalty,
                tfs_z,
                mirostat_mode,
                mirostat_tau,
                mirostat_eta,
                model,
                logits_processor,
                grammar,
                None if logit_bias is None else dict(logit_bias),
                logprobs,
                top_logprobs,
            )
            return cast("dict[str, Any] | Iterator[dict[str, Any]]", result)
        given = {"logprobs": logprobs, "top_logprobs": top_logprobs}
        for name, what in _chat_completion.UNSUPPORTED.items():
            if given[name]:
                raise ValueError(
                    f"{name}={given[name]!r}: the chat layer does not return {what}. Fix: leave it "
                    "unset, or create the Llama with chat_format=... (llama-cpp-python's formatter)"
                )
        request = _chat_completion.request_from_openai(
            messages,
            tools=tools,
            tool_choice=tool_choice,
            functions=functions,
            function_call=function_call,
            response_format=response_format,
            grammar=grammar,
            parallel_tool_calls=parallel_tool_calls,
            reasoning_format=reasoning_format,
            chat_template_kwargs=chat_template_kwargs,
            stream=stream,
        )
        sampling = {
            "temp": temperature,
            "top_p": top_p,
            "top_k": top_k,
            "min_p": min_p,
            "typical_p": typical_p,
            "repeat_penalty": repeat_penalty,
            "frequency_penalty": frequency_penalty,
            "presence_penalty": presence_penalty,
            "mirostat_mode": mirostat_mode,
            "mirostat_tau": mirostat_tau,
            "mirostat_eta": mirostat_eta,
        }
        return _chat_completion.create(
            self,
            self.chat_templates,
            request,
            stream=stream,
            max_tokens=max_tokens,
            stop=stop,
            seed=seed,
            model=model,
            logit_bias=logit_bias,
            logits_processor=logits_processor,
            sampling=sampling,
        )

    def _init_sampler(self, **kwargs: Any) -> Any:  # type: ignore[override]  # llama_cpp passes keywords only
        # a chat plan's grammar (lazy, prefilled) goes first in the chain, before llama-cpp-python's samplers
        grammar = kwargs.pop("grammar", None)
        if not isinstance(grammar, _chat_completion.ChatGrammar):
            return super()._init_sampler(**kwargs, grammar=grammar)
        rest = super()._init_sampler(**kwargs)
        return grammar.chain(llama_cpp.llama_model_get_vocab(self.model), rest)

    @property
    def flash_attn(self) -> bool:
        """Whether the context runs flash attention, for every batch ("on") or for prompt batches ("prefill")."""
        return self._vq_flash_attn_mode != FLASH_ATTN_OFF

    @property
    def flash_attn_mode(self) -> str:
        """The attention the context runs, "auto" resolved: "on", "off" or "prefill" (see the constructor)."""
        return flash_attn_name(self._vq_flash_attn_mode)

    @property
    def flash_attn_why(self) -> str:
        """Why the context runs flash_attn_mode: "asked for", or for "auto" "measured ..." / "cached ..." (the
        timings on this device, attn_choice.py), "static rule" (measuring off: LLAMA_VQ_ATTN_TUNE=0), or the
        measured mode "passed over by the placement check" when it would move a layer's attention off its device."""
        return self._vq_flash_attn_why

    @property
    def attention_layers(self) -> list[attn_choice.AttnLayers]:
        """Per distinct layer kind (full, swa, mtp), types and device: the path of prompt and of decode batches,
        as the context's placement check found them on that device (empty for a build without it)."""
        return list(self._vq_attn_layers)

    @property
    def cache_types(self) -> tuple[str, str]:
        return self._vq_type_k.name, self._vq_type_v.name

    @property
    def swa_cache_types(self) -> tuple[str, str]:
        """The cache types requested for sliding-window layers (kv_cache_info() says what was allocated)."""
        return self._vq_type_k_swa.name, self._vq_type_v_swa.name

    def compute_buffer_bytes(self) -> int:
        """Bytes of the context's compute buffers on all its devices (the graph's scratch, logits excluded)."""
        return _llama_cpp.compute_buffer_size(self._ctx.ctx)

    def kv_cache_info(self) -> KVCacheInfo:
        """Types, cells and bytes of K and of V as llama.cpp allocated them (llama_kv_cache_size)."""
        sizes = _llama_cpp.kv_cache_size(self._ctx.ctx)
        if sizes is None:
            raise RuntimeError("this model's memory is not a KV cache (recurrent or hybrid model)")
        k, v, n = sizes
        swa = _llama_cpp.kv_cache_swa(self._ctx.ctx)
        if swa is None:
            return KVCacheInfo(self._vq_type_k.name, self._vq_type_v.name, n, k, v)
        tk_swa, tv_swa, k_swa, v_swa = swa
        return KVCacheInfo(
            self._vq_type_k.name, self._vq_type_v.name, n, k, v, _type_name(tk_swa), _type_name(tv_swa), k_swa, v_swa
        )


def _type_name(ggml_type: int) -> str | None:
    try:
        return parse_cache_type(ggml_type).name
    except CacheConfigError:
        return None  # GGML_TYPE_COUNT: that cache has no layers
