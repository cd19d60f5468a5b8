"""The engine facade: loads the model on a worker thread, takes requests (``submit`` -> Job), runs the
batch loop (scheduler.py) over ``--parallel`` slots of one context, and shuts down within a deadline.

One llama_vq.Llama holds the model and the context (n_seq_max = slots, unified KV, windowed SWA cache
unless --swa-full); the scheduler drives llama.cpp's low-level API beside it. Route handlers never
touch llama_cpp; serving maps this module's exceptions (errors.py) to HTTP answers.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..metrics import Metrics, register_engine_gauges
from ..settings import Settings
from . import errors
from .job import Job, JobQueue
from .request import DoneEvent, GenerationRequest

log = logging.getLogger("llama_vq.server.engine")
_LEADING_INT = re.compile(r"\s*([+-]?\d+)")


def attn_rotation_disabled(environ: dict[str, str] | None = None) -> bool:
    """Whether llama.cpp will skip its Hadamard rotation of quantized K/V caches.

    llama.cpp reads LLAMA_ATTN_ROT_DISABLE with atoi() when it creates a KV cache. Caches written with the
    rotation hold rotated rows, so a state saved with one setting is garbage to a context with the other.
    """
    value = (os.environ if environ is None else environ).get("LLAMA_ATTN_ROT_DISABLE")
    m = _LEADING_INT.match(value or "")
    return bool(m and int(m.group(1)) != 0)


@dataclass(frozen=True)
class ModelInfo:
    """What clients and /health learn about the loaded model."""

    names: tuple[str, ...]
    path: str
    n_ctx: int
    n_vocab: int
    cache_type_k: str
    cache_type_v: str
    flash_attn: bool
    kv_k_bytes: int
    kv_v_bytes: int
    n_swa: int
    swa_full: bool
    n_slots: int
    supports_tools: bool
    created: int


class Core:
    """What the scheduler and the cache policy need: the context, sizes and per-request defaults."""

    def __init__(self, llm: Any, s: Settings, n_swa: int, on_done: Callable[[Job, DoneEvent], None]) -> None:
        import llama_cpp  # noqa: PLC0415

        self.llm = llm
        self.ctx = llm._ctx.ctx
        self.vocab = llm._model.vocab
        self.n_vocab = llm.n_vocab()
        self.n_ctx = int(llama_cpp.llama_n_ctx_seq(self.ctx))
        self.n_batch = int(llama_cpp.llama_n_batch(self.ctx))
        self.n_ubatch = int(llama_cpp.llama_n_ubatch(self.ctx))
        self.n_slots = s.parallel
        self.n_swa = n_swa
        self.n_swa_eff = 0 if s.swa_full else n_swa
        self.n_predict = s.n_predict
        self.timeout_s = s.timeout
        self.state_min_tokens = s.state_min_tokens
        self.checkpoint_every = s.checkpoint_every
        self.max_checkpoints = s.ctx_checkpoints
        self.on_done = on_done


class Engine:
    """Loads the model on a thread, then serves Jobs from a FIFO queue over parallel slots."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        model_path: Path,
        on_fatal: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.model_path = model_path
        self.status = "loading"  # loading | ready | error | shutting_down | stopped
        self.load_error: BaseException | None = None
        self.info: ModelInfo | None = None
        self.store: Any = None
        self.ram: Any = None
        self.llama: Any = None  # the llama_vq.Llama holding model + context (for the chat layer)
        self._core: Core | None = None
        self._sched: Any = None
        self._on_fatal = on_fatal or (lambda e: None)
        self._queue = JobQueue()
        self._lock = threading.Lock()
        self._job_seconds = 2.0  # moving average, for Retry-After
        self._thread = threading.Thread(target=self._main, name="llama-vq-engine", daemon=True)
        self.names: tuple[str, ...] = settings.alias or (model_path.name.removesuffix(".gguf"),)
        register_engine_gauges(self, metrics)
        metrics.llamacpp.processing = lambda: float(self.running)
        metrics.llamacpp.deferred = lambda: float(self.queue_depth)

    # ---- public API ----------------------------------------------------------------------------

    @property
    def model_ptr(self) -> Any:
        return self.llama.model if self.llama is not None else None

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> int:
        return sum(1 for s in self._sched.slots if s.busy) if self._sched else 0

    def slots(self) -> list[dict[str, Any]]:
        """GET /slots: one dict per slot (id, state, n_ctx, cached tokens ...)."""
        if self._sched is None:
            return []
        return [s.info(self.info.n_ctx) for s in self._sched.slots]

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        self._require_model()
        return list(self.llama.tokenize(text.encode(), add_bos=add_special, special=parse_special))

    def detokenize(self, tokens: list[int] | tuple[int, ...], render_special: bool = False) -> str:
        self._require_model()
        from .sampling import token_piece  # noqa: PLC0415

        raw = b"".join(token_piece(self._core.vocab, int(t), render_special) for t in tokens)
        return raw.decode("utf-8", errors="replace")

    def token_piece(self, token: int) -> bytes:
        """The bytes of one token (special tokens rendered), for /tokenize's with_pieces."""
        self._require_model()
        from .sampling import token_piece  # noqa: PLC0415

        return token_piece(self._core.vocab, int(token), True)

    def submit(self, req: GenerationRequest, loop: asyncio.AbstractEventLoop | None = None) -> Job:
        """Queue a request (thread-safe). Raises NotReady, Draining, QueueFull, PromptTooLong,
        InvalidRequest or InvalidGrammar; never blocks on the model."""
        self._check_status()
        self._validate(req)
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
        with self._lock:
            self._check_status()
            busy = self.running + self.queue_depth >= self.settings.parallel
            if busy and self.queue_depth >= self.settings.max_queue:
                self.metrics.rejected.inc(1, "queue_full")
                waiting = self.queue_depth
                retry = max(1, int(self._job_seconds * (waiting + 1) / self.settings.parallel + 0.999))
                raise errors.QueueFull(waiting, min(retry, 3600))
            job = Job(req, loop, self._cancel)
            self._queue.push(job)
        return job

    def begin_drain(self) -> None:
        """Refuse new requests; running and queued ones get --drain-timeout seconds, then stop."""
        with self._lock:
            if self.status in ("ready", "loading"):
                self.status = "shutting_down"
        if self._sched is not None and self._sched.drain_deadline is None:
            self._sched.drain_deadline = time.monotonic() + self.settings.drain_timeout
            self._sched.stopping = True
        self._queue.wake()

    def shutdown(self, timeout: float = 4.5) -> None:
        """Stop the worker (cancelling what still runs at the drain deadline), flush state files
        within what is left of ``timeout``, free the model."""
        t0 = time.monotonic()
        self.begin_drain()
        if self._sched is not None:
            self._sched.stopping = True
            dd = self._sched.drain_deadline or t0
            self._sched.drain_deadline = min(dd, t0 + max(0.0, timeout - 1.0))
        self._queue.wake()
        if self._thread.is_alive():
            self._thread.join(max(0.1, timeout - 1.0 - (time.monotonic() - t0)))
        if self.store is not None:
            if not self.store.close(timeout=max(0.1, timeout - (time.monotonic() - t0))):
                log.warning("state files still being written at the shutdown deadline: left incomplete (.tmp)")
        if self.llama is not None and not self._thread.is_alive():
            if self._sched is not None:
                self._sched.close()
            self.llama.close()
            self.llama = None
        self.status = "stopped"

    def start(self) -> None:
        self._thread.start()

    # ---- submit helpers ------------------------------------------------------------------------

    def _check_status(self) -> None:
        if self.status == "loading":
            raise errors.NotReady("the model is still loading; retry shortly", retry_after_s=5)
        if self.status == "error":
            raise errors.NotReady(f"the model failed to load: {self.load_error}")
        if self.status != "ready":
            self.metrics.rejected.inc(1, "shutting_down")
            raise errors.Draining("the server is shutting down")

    def _require_model(self) -> None:
        if self._core is None:
            raise errors.NotReady("the model is still loading; retry shortly", retry_after_s=5)

    def _validate(self, req: GenerationRequest) -> None:
        info = self.info
        if not req.prompt:
            raise errors.InvalidRequest("the prompt is empty", param="prompt")
        bad = [t for t in req.prompt if not 0 <= t < info.n_vocab]
        if bad:
            raise errors.InvalidRequest(
                f"prompt: token id {bad[0]} is outside this model's vocabulary [0, {info.n_vocab})", param="prompt"
            )
        if len(req.prompt) >= info.n_ctx:
            raise errors.PromptTooLong(len(req.prompt), info.n_ctx)
        if req.grammar is not None:
            from .sampling import check_grammar  # noqa: PLC0415

            check_grammar(self._core.vocab, req.grammar)

    def _cancel(self, job: Job) -> None:
        if self._queue.remove(job):
            self.metrics.cancelled.inc()
            job.emit(DoneEvent(job.cancel_reason, None, len(job.request.prompt), 0, 0))
        else:
            self._queue.wake()  # running: the worker ends it (abort callback / next step)

    # ---- worker thread -------------------------------------------------------------------------

    def _main(self) -> None:
        try:
            self._load()
        except BaseException as e:  # noqa: BLE001 (reported to the CLI, which exits with it)
            self.load_error = e
            self.status = "error"
            log.error("loading the model failed: %s", e)
            self._on_fatal(e)
            return
        with self._lock:
            if self.status == "loading":
                self.status = "ready"
        i = self.info
        log.info(
            "ready: %s (%d slots, n_ctx %d, K %s, V %s, flash attention %s, KV %.1f MiB, SWA %s)",
            i.names[0],
            i.n_slots,
            i.n_ctx,
            i.cache_type_k,
            i.cache_type_v,
            "on" if i.flash_attn else "off",
            (i.kv_k_bytes + i.kv_v_bytes) / 2**20,
            "none" if not i.n_swa else ("full" if i.swa_full else f"window {i.n_swa}"),
        )
        self._sched.run()

    def _load(self) -> None:
        from .loader import load  # noqa: PLC0415

        load(self)

    def _on_done(self, job: Job, done: DoneEvent) -> None:
        m = self.metrics
        m.prompt_tokens.inc(done.prompt_tokens)
        m.cached_prompt_tokens.inc(done.cached_tokens)
        m.generated_tokens.inc(done.completion_tokens)
        if done.timings:
            m.record_timings(done.timings)
        if done.finish_reason in ("cancelled", "timeout"):
            m.cancelled.inc()
        seconds = time.monotonic() - job.arrival
        m.request_seconds.observe(seconds)
        self._job_seconds = 0.8 * self._job_seconds + 0.2 * seconds

    def identity(self, kv: Any, flash_attn: bool) -> dict[str, Any]:
        """What a saved state must match to be loaded here (``kv``: the context's llama_vq.KVCacheInfo)."""
        import llama_vq  # noqa: PLC0415

        from ..kv_store import cache_types_identity, fingerprint_model  # noqa: PLC0415

        bi = llama_vq.build_info()
        ident: dict[str, Any] = {
            "model": fingerprint_model(self.model_path),
            **cache_types_identity(kv.type_k, kv.type_v, kv.type_k_swa, kv.type_v_swa),
            "flash_attn": flash_attn,
            "llama_cpp": bi.llama_cpp_commit,
            "patches": list(bi.patches),
        }
        if attn_rotation_disabled():
            ident["kv_rotation"] = False  # only when off: files written with the default keep matching
        if self.settings.swa_full:
            ident["swa_full"] = True
        return ident

    @staticmethod
    def identity_hash(ident: dict[str, Any]) -> str:
        return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()
