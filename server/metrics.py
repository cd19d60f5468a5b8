"""Prometheus metrics in the text exposition format (0.0.4), without a client library.

Counters, gauges and histograms with fixed label sets; thread-safe (the engine thread and the event
loop both update them). Ours are named ``llama_vq_*``; beside them, llama-server's ``llamacpp:*``
names (same meanings as its /metrics) so that dashboards made for llama-server keep working.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _fmt(v: float) -> str:
    if v == math.inf:
        return "+Inf"
    if float(v).is_integer():
        return str(int(v))
    return repr(float(v))


def _labels(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Metric:
    kind = ""

    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()) -> None:
        self.name, self.help, self.label_names = name, help_text, tuple(labels)
        self._lock = threading.Lock()

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Metric):
    kind = "counter"

    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()) -> None:
        super().__init__(name, help_text, labels)
        self._values: dict[tuple[str, ...], float] = {} if labels else {(): 0.0}

    def inc(self, amount: float = 1.0, *labels: str) -> None:
        with self._lock:
            self._values[labels] = self._values.get(labels, 0.0) + amount

    def value(self, *labels: str) -> float:
        with self._lock:
            return self._values.get(labels, 0.0)

    def render(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return self.header() + [
            f"{self.name}{_labels(self.label_names, k)} {_fmt(v)}" for k, v in items
        ]


class Gauge(_Metric):
    """A gauge whose value is read at scrape time from a callback, or set explicitly."""

    kind = "gauge"

    def __init__(
        self,
        name: str,
        help_text: str,
        labels: Sequence[str] = (),
        read: Callable[[], dict[tuple[str, ...], float]] | None = None,
    ) -> None:
        super().__init__(name, help_text, labels)
        self._read = read
        self._values: dict[tuple[str, ...], float] = {}

    def set(self, value: float, *labels: str) -> None:
        with self._lock:
            self._values[labels] = value

    def render(self) -> list[str]:
        if self._read is not None:
            items = sorted(self._read().items())
        else:
            with self._lock:
                items = sorted(self._values.items())
        return self.header() + [
            f"{self.name}{_labels(self.label_names, k)} {_fmt(v)}" for k, v in items
        ]


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, name: str, help_text: str, buckets: Sequence[float]) -> None:
        super().__init__(name, help_text)
        self.buckets = tuple(sorted(buckets)) + (math.inf,)
        self._counts = [0] * len(self.buckets)
        self._sum = 0.0
        self._n = 0

    def observe(self, v: float) -> None:
        with self._lock:
            self._sum += v
            self._n += 1
            for i, b in enumerate(self.buckets):
                if v <= b:
                    self._counts[i] += 1
                    break

    @property
    def count(self) -> int:
        return self._n

    def render(self) -> list[str]:
        with self._lock:
            counts, total, n = list(self._counts), self._sum, self._n
        out = self.header()
        acc = 0
        for b, c in zip(self.buckets, counts, strict=True):
            acc += c
            out.append(f'{self.name}_bucket{{le="{_fmt(b)}"}} {acc}')
        out += [f"{self.name}_sum {_fmt(total)}", f"{self.name}_count {n}"]
        return out


_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12)


class Metrics:
    """All of the server's metrics. Gauges that reflect engine state are wired by the engine."""

    def __init__(self) -> None:
        p = "llama_vq_"
        self.requests = Counter(
            p + "http_requests_total",
            "HTTP requests answered, by route and status.",
            ("route", "status"),
        )
        self.prompt_tokens = Counter(
            p + "prompt_tokens_total", "Prompt tokens of finished requests."
        )
        self.cached_prompt_tokens = Counter(
            p + "prompt_tokens_cached_total",
            "Prompt tokens not recomputed (KV cache or state file).",
        )
        self.generated_tokens = Counter(p + "generated_tokens_total", "Tokens generated.")
        self.cancelled = Counter(
            p + "requests_cancelled_total", "Requests stopped because the client went away."
        )
        self.rejected = Counter(
            p + "requests_rejected_total", "Requests refused before running.", ("reason",)
        )
        self.ttft = Histogram(
            p + "time_to_first_token_seconds",
            "From request arrival to the first generated token.",
            _LATENCY_BUCKETS,
        )
        self.token_latency = Histogram(
            p + "time_per_output_token_seconds",
            "Time between consecutive generated tokens.",
            _TOKEN_BUCKETS,
        )
        self.request_seconds = Histogram(
            p + "request_duration_seconds",
            "From arrival to the last token of a generation request.",
            _LATENCY_BUCKETS,
        )
        self.state_restored_tokens = Counter(
            p + "kv_state_restored_tokens_total",
            "Tokens whose KV state was restored from --state-dir.",
        )
        self.state_saves = Counter(p + "kv_state_saves_total", "KV state files written.")
        self.state_rejected = Counter(
            p + "kv_state_rejected_total",
            "KV state files skipped as corrupt, truncated or mismatched.",
        )
        self.state_evictions = Counter(
            p + "kv_state_evictions_total", "KV state files deleted to stay within --state-budget."
        )
        self.gauges: list[Gauge] = []
        self.llamacpp = LlamaCppMetrics()

    def record_timings(self, timings: dict[str, float]) -> None:
        """One finished request's llama-server timings (prompt_n, prompt_ms, predicted_n,
        predicted_ms, cache_n) into the llamacpp:* counters."""
        self.llamacpp.record(timings)

    def gauge(
        self,
        name: str,
        help_text: str,
        labels: Sequence[str],
        read: Callable[[], dict[tuple[str, ...], float]],
    ) -> None:
        self.gauges.append(Gauge("llama_vq_" + name, help_text, labels, read))

    def render(self) -> str:
        lines: list[str] = []
        for m in (
            self.requests,
            self.prompt_tokens,
            self.cached_prompt_tokens,
            self.generated_tokens,
            self.cancelled,
            self.rejected,
            self.ttft,
            self.token_latency,
            self.request_seconds,
            self.state_restored_tokens,
            self.state_saves,
            self.state_rejected,
            self.state_evictions,
            *self.gauges,
        ):
            lines += m.render()
        lines += self.llamacpp.render()
        return "\n".join(lines) + "\n"


class LlamaCppMetrics:
    """llama-server's metric names (tools/server/server-task.cpp, to_metrics), fed by the engine.

    Differences: the throughput gauges are averages over the server's life (llama-server averages
    over the window between two scrapes, so a scrape changes what the next one reads).
    """

    def __init__(self) -> None:
        p = "llamacpp:"
        self.prompt_tokens = Counter(
            p + "prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens"
        )
        self.prompt_cached = Counter(
            p + "prompt_tokens_cached_total", "Number of prompt tokens reused from the cache"
        )
        self.prompt_seconds = Counter(p + "prompt_seconds_total", "Total time spent processing prompts")
        self.predicted = Counter(p + "tokens_predicted_total", "Number of generation tokens processed")
        self.predicted_seconds = Counter(
            p + "tokens_predicted_seconds_total", "Total time spent generating tokens"
        )
        self.n_decode = Counter(
            p + "n_decode_total",
            "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding",
        )
        self.busy_slots = Counter("_busy_slots", "")  # not rendered: numerator of the per-decode average
        self._n_tokens_max = 0.0
        self.processing: Callable[[], float] = lambda: 0.0
        self.deferred: Callable[[], float] = lambda: 0.0

    def record(self, t: dict[str, float]) -> None:
        prompt_n, predicted_n = float(t.get("prompt_n", 0)), float(t.get("predicted_n", 0))
        self.prompt_tokens.inc(prompt_n)
        self.prompt_cached.inc(float(t.get("cache_n", 0)))
        self.prompt_seconds.inc(float(t.get("prompt_ms", 0.0)) / 1e3)
        self.predicted.inc(predicted_n)
        self.predicted_seconds.inc(float(t.get("predicted_ms", 0.0)) / 1e3)
        total = prompt_n + float(t.get("cache_n", 0)) + predicted_n
        self._n_tokens_max = max(self._n_tokens_max, total)

    def decoded(self, n_busy_slots: int = 1, calls: int = 1) -> None:
        """``calls`` llama_decode() calls, each over ``n_busy_slots`` sequences."""
        self.n_decode.inc(calls)
        self.busy_slots.inc(calls * n_busy_slots)

    def render(self) -> list[str]:
        def gauge(name: str, help_text: str, value: float) -> list[str]:
            g = Gauge("llamacpp:" + name, help_text)
            g.set(value)
            return g.render()

        def rate(n: Counter, s: Counter) -> float:
            return n.value() / s.value() if s.value() > 0 else 0.0

        out: list[str] = []
        for c in (
            self.prompt_tokens,
            self.prompt_cached,
            self.prompt_seconds,
            self.predicted,
            self.predicted_seconds,
            self.n_decode,
        ):
            out += c.render()
        out += Counter("llamacpp:n_tokens_max", "Largest observed sequence length (prompt + generation)").render()[:2]
        out.append(f"llamacpp:n_tokens_max {_fmt(self._n_tokens_max)}")
        out += gauge(
            "prompt_tokens_seconds",
            "Average prompt throughput in tokens/s",
            rate(self.prompt_tokens, self.prompt_seconds),
        )
        out += gauge(
            "predicted_tokens_seconds",
            "Average generation throughput in tokens/s",
            rate(self.predicted, self.predicted_seconds),
        )
        out += gauge("requests_processing", "Number of requests processing", self.processing())
        out += gauge("requests_deferred", "Number of requests deferred", self.deferred())
        out += gauge(
            "n_busy_slots_per_decode",
            "Average number of busy slots per llama_decode() call",
            self.busy_slots.value() / max(self.n_decode.value(), 1.0),
        )
        return out
# ---- engine gauges (read at scrape time) ----------------------------------------------------------


def register_engine_gauges(engine: Any, metrics: Metrics) -> None:
    """Queue, slots (one series per slot), KV cache, RAM cache and state-file gauges of an engine."""

    def per_slot(read: Callable[[Any], float]) -> Callable[[], dict[tuple[str, ...], float]]:
        def values() -> dict[tuple[str, ...], float]:
            sched = engine._sched
            return {(str(s.id),): float(read(s)) for s in sched.slots} if sched else {}

        return values

    def one(read: Callable[[], float | None]) -> Callable[[], dict[tuple[str, ...], float]]:
        def values() -> dict[tuple[str, ...], float]:
            v = read()
            return {} if v is None else {(): float(v)}

        return values

    g = metrics.gauge
    g("queue_depth", "Requests waiting for a free slot.", (), one(lambda: engine.queue_depth))
    g("requests_running", "Requests being processed (busy slots).", (), one(lambda: engine.running))
    g("slots", "Parallel slots (--parallel).", (), one(lambda: engine.settings.parallel))
    g("slot_busy", "1 while the slot runs a request.", ("slot",), per_slot(lambda s: s.busy))
    g("slot_processing_prompt", "1 while the slot processes a prompt.", ("slot",),
      per_slot(lambda s: s.state == "processing_prompt"))
    g("slot_cached_tokens", "Tokens in the slot's KV sequence.", ("slot",), per_slot(lambda s: s.n_past))
    g("slot_generated_tokens", "Tokens generated by the slot's current request.", ("slot",),
      per_slot(lambda s: s.n_generated if s.busy else 0))
    g("slot_checkpoints", "SWA checkpoints held by the slot.", ("slot",), per_slot(lambda s: len(s.checkpoints)))
    g("kv_cache_bytes", "Bytes of the allocated KV cache, by tensor.", ("tensor",),
      lambda: {("k",): float(engine.info.kv_k_bytes), ("v",): float(engine.info.kv_v_bytes)} if engine.info else {})
    g("n_ctx", "Context size in tokens a slot can hold (the whole context with the unified KV cache, "
      "ctx-size / slots with --no-kv-unified).", (),
      one(lambda: engine.info.n_ctx if engine.info else None))
    g("prompt_cache_ram_bytes", "Bytes of sequence states in the RAM cache (--cache-ram).", (),
      one(lambda: engine.ram.total_bytes if engine.ram else None))
    g("prompt_cache_ram_states", "Sequence states in the RAM cache.", (),
      one(lambda: len(engine.ram) if engine.ram else None))
    g("kv_state_files", "KV state files in --state-dir for this model.", (),
      one(lambda: len(engine.store) if engine.store else None))
    g("kv_state_disk_bytes", "Bytes of KV state files in --state-dir for this model.", (),
      one(lambda: engine.store.total_bytes if engine.store else None))
