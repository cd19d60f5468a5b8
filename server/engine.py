"""The engine adapter: the only code that touches the model.

One model per process, driven by one worker thread. Requests become Jobs in a FIFO queue of bounded
depth; each Job streams its events (chunks, result, error, end) to the event loop. A Job is
cancelled when its client goes away: queued, it is dropped; running, generation stops at the next
token.

Generation goes through llama_cpp's own create_chat_completion / create_completion (chat templates,
sampling, grammars, stop strings). The served model class overrides only ``generate`` to (1) restore
a saved KV state sharing the prompt's prefix before the prompt is evaluated, (2) stop a cancelled
job, (3) count tokens and time them. KV states are saved after a request with llama.cpp's
per-sequence state API (KV cells only, no logits) into kv_store.KVStore.

Sliding-window attention (MiMo): llama_cpp reuses the cached prefix of the previous request by
deleting the cache tail, which is wrong for SWA layers whose older cells are gone. Before each
generation we check the cache's oldest position against the window (llama-server's rule) and
recompute from scratch when the reuse would need evicted cells.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import errors
from .errors import ApiError
from .kv_store import KVStore, StateFileError, common_prefix, fingerprint_model
from .metrics import Metrics
from .settings import Settings

log = logging.getLogger("llama_vq.server.engine")

# Branch `chat` only, until the engine package (server/engine/) replaces this module: lets the data
# classes of server/engine/request.py (INTERFACES.md section 1) import as server.engine.request.
# Drop these lines when merging `engine`.
__path__ = [str(Path(__file__).with_suffix(""))]

# llama_cpp chat formats that understand OpenAI tools (beyond a Jinja template that renders them).
_TOOL_FORMATS = {"chatml-function-calling", "functionary", "functionary-v1", "functionary-v2"}
_CTX_EXCEEDED = re.compile(r"Requested tokens \((\d+)\) exceed context window of (\d+)")
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
    supports_tools: bool
    created: int


@dataclass
class Work:
    """One generation request, already translated into llama_cpp keyword arguments."""

    kind: str  # "chat" | "completion"
    kwargs: dict[str, Any]
    stream: bool
    grammar: str | None = None  # GBNF text; checked by llama.cpp before the job runs
    grammar_param: str = "response_format"
    prompt_ids: list[int] | None = None  # token-id prompt of a text completion (range-checked)
    check_grammars: list[tuple[str, str]] = field(
        default_factory=list
    )  # (param, GBNF) llama_cpp builds


@dataclass
class JobStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    restored_tokens: int = 0
    cancelled: bool = False
    failed: bool = False


class Job:
    """A queued or running request. Events go to ``events`` on the event loop:
    ("chunk", dict) | ("result", dict) | ("error", ApiError) | ("end", JobStats)."""

    def __init__(self, work: Work, loop: asyncio.AbstractEventLoop, engine: Engine) -> None:
        self.work = work
        self.arrival = time.monotonic()
        self.events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.stats = JobStats()
        self.prompt_started = False
        self.t_first: float | None = None
        self.t_last: float | None = None
        self._loop = loop
        self._engine = engine
        self._cancel = threading.Event()
        self.finished = False

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def cancel(self) -> None:
        """Stop this job (idempotent): dropped if queued, stopped at the next token if running."""
        if self.finished or self._cancel.is_set():
            return
        self._cancel.set()
        self._engine._dequeue(self)

    def emit(self, kind: str, data: Any) -> None:
        if kind == "end":
            self.finished = True
        try:
            self._loop.call_soon_threadsafe(self.events.put_nowait, (kind, data))
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass


def _served_class(base: type) -> type:
    """A subclass of llama_vq.Llama whose generate() reports to the engine (see module doc)."""

    class ServedLlama(base):  # type: ignore[misc,valid-type]
        _engine: Engine | None = None

        def generate(self, tokens, *args, **kwargs):  # type: ignore[no-untyped-def]
            engine = self._engine
            tokens = list(tokens)
            if engine is None or engine._current is None:
                yield from super().generate(tokens, *args, **kwargs)
                return
            job = engine._current
            engine._before_generate(self, job, tokens)
            inner = super().generate(tokens, *args, **kwargs)
            n_ctx = self.n_ctx()
            try:
                sent = None
                first = True
                while not job.cancelled:
                    # llama_cpp's max_tokens check is skipped while a multi-byte character is
                    # incomplete, so it can ask for one token more than the context holds
                    # (llama_decode then fails): stop when the next token has no cell left.
                    if not first and self.n_tokens >= n_ctx:
                        return
                    first = False
                    try:
                        token = inner.send(sent)
                    except StopIteration:
                        return
                    engine._on_token(self, job, token)
                    sent = yield token
            finally:
                inner.close()

    return ServedLlama


class Engine:
    """Loads the model on a thread, then runs Jobs one at a time in arrival order."""

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
        self.store: KVStore | None = None
        self._on_fatal = on_fatal or (lambda e: None)
        self._llm: Any = None
        self._cv = threading.Condition()
        self._waiting: collections.deque[Job] = collections.deque()
        self._current: Job | None = None
        self._stop = False
        self._job_seconds = 2.0  # moving average, for Retry-After
        self._thread = threading.Thread(target=self._main, name="llama-vq-engine", daemon=True)
        self.names: tuple[str, ...] = settings.alias or (model_path.name.removesuffix(".gguf"),)
        metrics.gauge(
            "queue_depth",
            "Requests waiting for the model.",
            (),
            lambda: {(): float(len(self._waiting))},
        )
        metrics.gauge(
            "requests_running",
            "Requests being generated (0 or 1).",
            (),
            lambda: {(): float(self._current is not None)},
        )
        metrics.gauge(
            "kv_cache_bytes",
            "Bytes of the allocated KV cache, by tensor.",
            ("tensor",),
            self._kv_bytes,
        )
        metrics.gauge(
            "n_ctx",
            "Context size in tokens.",
            (),
            lambda: {(): float(self.info.n_ctx)} if self.info else {},
        )
        metrics.gauge(
            "kv_state_files",
            "KV state files in --state-dir for this model.",
            (),
            lambda: {(): float(len(self.store))} if self.store else {},
        )
        metrics.gauge(
            "kv_state_disk_bytes",
            "Bytes of KV state files in --state-dir for this model.",
            (),
            lambda: {(): float(self.store.total_bytes)} if self.store else {},
        )

    def _kv_bytes(self) -> dict[tuple[str, ...], float]:
        if not self.info:
            return {}
        return {("k",): float(self.info.kv_k_bytes), ("v",): float(self.info.kv_v_bytes)}

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def _main(self) -> None:
        try:
            self._load()
        except BaseException as e:  # noqa: BLE001 (reported to the CLI, which exits with it)
            self.load_error = e
            self.status = "error"
            log.error("loading the model failed: %s", e)
            self._on_fatal(e)
            return
        with self._cv:
            if self.status == "loading":
                self.status = "ready"
        log.info(
            "ready: %s (n_ctx %d, K %s, V %s, flash attention %s, KV %.1f MiB)",
            self.info.names[0],
            self.info.n_ctx,
            self.info.cache_type_k,
            self.info.cache_type_v,
            "on" if self.info.flash_attn else "off",
            (self.info.kv_k_bytes + self.info.kv_v_bytes) / 2**20,
        )
        self._loop()

    def _load(self) -> None:
        import llama_cpp  # noqa: PLC0415 (after llama_vq bound it)

        import llama_vq  # noqa: PLC0415

        s = self.settings
        cls = _served_class(llama_vq.Llama)
        t0 = time.monotonic()
        llm = cls(
            str(self.model_path),
            n_ctx=s.ctx_size,
            n_gpu_layers=s.n_gpu_layers,
            split_mode=s.split_mode_value,
            main_gpu=s.main_gpu,
            tensor_split=list(s.tensor_split) if s.tensor_split else None,
            tensor_overrides=list(s.override_tensor) or None,
            rpc_servers=",".join(s.rpc) or None,
            type_k=s.cache_type_k,
            type_v=s.cache_type_v,
            flash_attn=s.flash_attn,
            n_threads=s.threads,
            n_batch=s.batch_size,
            n_ubatch=s.ubatch_size,
            chat_format=s.chat_format,
            verbose=s.verbose,
        )
        try:
            kv = llm.kv_cache_info()
        except RuntimeError:  # recurrent / hybrid memory: no plain KV cache to report
            kv = llama_vq.KVCacheInfo(s.cache_type_k, s.cache_type_v, 0, 0, 0)
        n_swa = int(llama_cpp.llama_model_n_swa(llm.model))
        template = str(llm.metadata.get("tokenizer.chat_template", ""))
        if s.chat_format:
            tools = s.chat_format in _TOOL_FORMATS
        else:
            tools = llm.chat_format == "chat_template.default" and "tools" in template
        self.info = ModelInfo(
            names=self.names,
            path=str(self.model_path),
            n_ctx=llm.n_ctx(),
            n_vocab=llm.n_vocab(),
            cache_type_k=kv.type_k,
            cache_type_v=kv.type_v,
            flash_attn=bool(llm.flash_attn),
            kv_k_bytes=kv.k_bytes,
            kv_v_bytes=kv.v_bytes,
            n_swa=n_swa,
            supports_tools=tools,
            created=int(time.time()),
        )
        log.info(
            "model loaded in %.1f s: %s (chat format %s, tools %s, SWA window %d)",
            time.monotonic() - t0,
            self.model_path.name,
            llm.chat_format,
            "yes" if tools else "no",
            n_swa,
        )
        if s.state_dir is not None:
            bi = llama_vq.build_info()
            identity = {
                "model": fingerprint_model(self.model_path),
                "type_k": kv.type_k,
                "type_v": kv.type_v,
                "flash_attn": bool(llm.flash_attn),
                "llama_cpp": bi.llama_cpp_commit,
                "patches": list(bi.patches),
            }
            if attn_rotation_disabled():
                # only when off, so that state files written with llama.cpp's default keep matching
                identity["kv_rotation"] = False
            events = {
                "save": self.metrics.state_saves,
                "reject": self.metrics.state_rejected,
                "evict": self.metrics.state_evictions,
            }
            self.store = KVStore(
                s.state_dir, identity, s.state_budget, on_event=lambda kind, n: events[kind].inc(n)
            )
        llm._engine = self
        self._llm = llm

    def begin_drain(self) -> None:
        """Refuse new requests from now on; queued and running ones finish."""
        with self._cv:
            if self.status in ("ready", "loading"):
                self.status = "shutting_down"
            self._cv.notify_all()

    def shutdown(self, timeout: float = 600.0) -> None:
        """Finish queued work, stop the worker, write pending KV states, free the model."""
        self.begin_drain()
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread.is_alive() and self._llm is not None:
            self._thread.join(timeout)
        if self.store is not None:
            self.store.close()
        if self._llm is not None and not self._thread.is_alive():
            self._llm.close()
            self._llm = None
        self.status = "stopped"

    # ---- queue --------------------------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        return len(self._waiting)

    def submit(self, work: Work, loop: asyncio.AbstractEventLoop) -> Job:
        """Queue a job, or raise ApiError: 503 while loading / shutting down, 429 when full."""
        with self._cv:
            if self.status == "loading":
                raise errors.unavailable(
                    "the model is still loading; retry shortly", retry_after_s=5
                )
            if self.status == "error":
                raise errors.unavailable(f"the model failed to load: {self.load_error}")
            if self.status != "ready":
                self.metrics.rejected.inc(1, "shutting_down")
                raise errors.unavailable("the server is shutting down")
            busy = self._current is not None or bool(self._waiting)
            if busy and len(self._waiting) >= self.settings.max_queue:
                self.metrics.rejected.inc(1, "queue_full")
                retry = max(1, int(self._job_seconds * (len(self._waiting) + 1) + 0.999))
                raise errors.overloaded(min(retry, 3600), len(self._waiting))
            job = Job(work, loop, self)
            self._waiting.append(job)
            self._cv.notify_all()
            return job

    def _dequeue(self, job: Job) -> None:
        with self._cv:
            try:
                self._waiting.remove(job)
            except ValueError:
                return  # running (stops at the next token) or already done
        self.metrics.cancelled.inc()
        job.stats.cancelled = True
        job.emit("end", job.stats)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._waiting and not self._stop:
                    self._cv.wait()
                if not self._waiting:
                    return
                job = self._waiting.popleft()
                self._current = job
            try:
                self._run(job)
            finally:
                with self._cv:
                    self._current = None

    # ---- one job ------------------------------------------------------------------------------

    def _run(self, job: Job) -> None:
        llm, w = self._llm, job.work
        t0 = time.monotonic()
        out = None
        try:
            self._check(w)
            kwargs = dict(w.kwargs)
            if w.grammar is not None:
                from llama_cpp import LlamaGrammar  # noqa: PLC0415

                kwargs["grammar"] = LlamaGrammar.from_string(w.grammar, verbose=False)
            fn = llm.create_chat_completion if w.kind == "chat" else llm.create_completion
            out = fn(**kwargs, stream=w.stream)
            if w.stream:
                for chunk in out:
                    if job.cancelled:
                        break
                    job.emit("chunk", chunk)
            elif not job.cancelled:
                job.emit("result", out)
        except Exception as e:  # noqa: BLE001 (every failure becomes an answer, never a dead worker)
            job.stats.failed = True
            job.emit("error", self._classify(job, e))
        finally:
            if w.stream and out is not None and hasattr(out, "close"):
                out.close()
        job.stats.cancelled = job.stats.cancelled or job.cancelled
        if job.stats.cancelled:
            self.metrics.cancelled.inc()
        self._account(job, time.monotonic() - t0)
        job.emit("end", job.stats)
        if not job.stats.cancelled and not job.stats.failed:
            self._save_state(llm)

    def _check(self, w: Work) -> None:
        import llama_cpp  # noqa: PLC0415

        info = self.info
        if w.prompt_ids is not None:
            bad = [t for t in w.prompt_ids if not 0 <= t < info.n_vocab]
            if bad:
                raise errors.bad_request(
                    f"prompt: token id {bad[0]} is outside this model's vocabulary "
                    f"[0, {info.n_vocab})",
                    param="prompt",
                )
        grammars = list(w.check_grammars)
        if w.grammar is not None:
            grammars.append((w.grammar_param, w.grammar))
        for param, text in grammars:
            smpl = llama_cpp.llama_sampler_init_grammar(
                self._llm._model.vocab, text.encode(), b"root"
            )
            if not smpl:
                raise errors.bad_request(
                    f"{param}: llama.cpp could not build a grammar from this schema", param=param
                )
            llama_cpp.llama_sampler_free(smpl)

    def _classify(self, job: Job, e: Exception) -> ApiError:
        if isinstance(e, ApiError):
            return e
        m = _CTX_EXCEEDED.search(str(e))
        if m:
            return errors.context_exceeded(int(m.group(1)), int(m.group(2)))
        if not job.prompt_started or isinstance(e, ValueError):
            # Raised while turning the request into a prompt (chat template, tokenizer, grammar), or
            # llama_cpp refusing a combination it does not support: the request's fault.
            log.info("request refused: %s: %s", type(e).__name__, e)
            return errors.bad_request(f"the request cannot be served: {e}")
        log.exception("generation failed")
        return errors.internal(f"generation failed: {type(e).__name__}: {e}")

    def _account(self, job: Job, seconds: float) -> None:
        st, m = job.stats, self.metrics
        m.prompt_tokens.inc(st.prompt_tokens)
        m.cached_prompt_tokens.inc(st.cached_tokens)
        m.generated_tokens.inc(st.completion_tokens)
        if st.restored_tokens:
            m.state_restored_tokens.inc(st.restored_tokens)
        if job.prompt_started:
            m.request_seconds.observe(time.monotonic() - job.arrival)
            self._job_seconds = 0.8 * self._job_seconds + 0.2 * seconds

    # ---- hooks called from ServedLlama.generate (worker thread) -------------------------------

    def _before_generate(self, llm: Any, job: Job, tokens: list[int]) -> None:
        job.prompt_started = True
        toks = np.asarray(tokens, dtype=np.int32)
        job.stats.prompt_tokens = len(toks)
        if self.store is not None:
            job.stats.restored_tokens = self._restore(llm, toks)
        self._guard_swa(llm, toks)
        job.stats.cached_tokens = self._reuse_len(llm, toks)

    def _on_token(self, llm: Any, job: Job, token: int) -> None:
        import llama_cpp  # noqa: PLC0415

        now = time.monotonic()
        if job.t_first is None:
            self.metrics.ttft.observe(now - job.arrival)
        else:
            self.metrics.token_latency.observe(now - job.t_last)
        job.t_first = job.t_first or now
        job.t_last = now
        if not llama_cpp.llama_vocab_is_eog(llm._model.vocab, token):
            job.stats.completion_tokens += 1

    @staticmethod
    def _reuse_len(llm: Any, toks: np.ndarray) -> int:
        """How many prompt tokens llama_cpp's generate() will take from the cache (its own rule)."""
        if llm.n_tokens <= 0:
            return 0
        n = common_prefix(np.asarray(llm.input_ids[: llm.n_tokens], dtype=np.int32), toks)
        if n == len(toks):
            if llm.n_tokens == len(toks) and not llm._requires_eval:
                return n
            return n - 1
        return n

    def _guard_swa(self, llm: Any, toks: np.ndarray) -> None:
        import llama_cpp  # noqa: PLC0415

        n_swa = self.info.n_swa
        if n_swa <= 0 or llm.n_tokens <= 0:
            return
        reuse = self._reuse_len(llm, toks)
        if reuse == len(toks):
            return  # nothing is evaluated: the cache is used as it is
        mem = llama_cpp.llama_get_memory(llm.ctx)
        pos_min = int(llama_cpp.llama_memory_seq_pos_min(mem, 0))
        if reuse <= 0 or pos_min > max(0, reuse - n_swa):
            log.debug(
                "SWA cache lacks positions before %d (reuse %d, window %d): recomputing",
                pos_min,
                reuse,
                n_swa,
            )
            llm.n_tokens = 0

    def _restore(self, llm: Any, toks: np.ndarray) -> int:
        """Load the saved state sharing the longest prefix with the prompt, if it beats memory."""
        import llama_cpp  # noqa: PLC0415

        current = self._reuse_len(llm, toks)
        # Only worth a file read when it saves at least --state-min-tokens over the in-memory cache.
        floor = max(current, self.settings.state_min_tokens - 1)
        found = self.store.lookup(toks, better_than=floor, prefix_only=self.info.n_swa > 0)
        if found is None:
            return 0
        entry, n_common = found
        if len(entry.tokens) >= self.info.n_ctx:
            return 0
        try:
            payload = self.store.load(entry)
        except StateFileError:
            return 0
        mem = llama_cpp.llama_get_memory(llm.ctx)
        llama_cpp.llama_memory_clear(mem, True)
        llm.n_tokens = 0
        buf = (ctypes.c_uint8 * len(payload)).from_buffer(payload)
        got = llama_cpp.llama_state_seq_set_data(llm.ctx, buf, len(payload), 0)
        del buf
        if got != len(payload):
            llama_cpp.llama_memory_clear(mem, True)
            self.store.reject(entry, f"llama.cpp refused it (read {got} of {len(payload)} bytes)")
            return 0
        k = len(entry.tokens)
        llm.input_ids[:k] = entry.tokens
        llm.n_tokens = k
        llm._requires_eval = True
        log.info(
            "restored KV state of %d tokens from %s (%d shared with the prompt)",
            k,
            entry.path.name,
            n_common,
        )
        return min(n_common, len(toks))

    def _save_state(self, llm: Any) -> None:
        import llama_cpp  # noqa: PLC0415

        n = llm.n_tokens
        if self.store is None or n < self.settings.state_min_tokens:
            return
        toks = np.asarray(llm.input_ids[:n], dtype=np.int32)
        existing = self.store.has(toks)
        if existing is not None:
            self.store.touch(existing)
            return
        size = llama_cpp.llama_state_seq_get_size(llm.ctx, 0)
        data = bytearray(size)
        got = llama_cpp.llama_state_seq_get_data(
            llm.ctx, (ctypes.c_uint8 * size).from_buffer(data), size, 0
        )
        if got == 0:
            log.warning("llama.cpp returned no KV state for %d tokens; not saved", n)
            return
        self.store.save(toks, memoryview(data)[:got], supersede=self.info.n_swa == 0)
