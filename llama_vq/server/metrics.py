"""Prometheus metrics of the HTTP front end (prometheus_client), served at /metrics after llama-server's own
llamacpp:* metrics (with --metrics, as llama-server): requests and their latency by route, time to the first
streamed byte, requests in flight, disconnects, and the Python process's own memory and CPU."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(namespace="llamavq_server", registry=self.registry)
        r = self.registry
        self.requests = Counter(
            "llamavq_http_requests",
            "HTTP requests answered, by route and status",
            ["method", "route", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "llamavq_http_request_seconds",
            "Time to the end of the answer, by route",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttfb = Histogram(
            "llamavq_http_first_byte_seconds",
            "Time to the first byte of a streamed answer (first token or error), by route",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge("llamavq_http_requests_in_flight", "Requests being answered", registry=r)
        self.disconnects = Counter(
            "llamavq_http_client_disconnects",
            "Requests whose client left before the answer ended (their task was cancelled)",
            registry=r,
        )
        self.keepalives = Counter(
            "llamavq_sse_keepalives", "SSE keep-alive comments sent during prompt processing", registry=r
        )
        self.engine_ready = Gauge(
            "llamavq_engine_ready", "1 when the model is loaded and the task loop runs", registry=r
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)


class SleepSnapshot:
    """The front end's part of /metrics, frozen while the engine sleeps (--sleep-idle-seconds), as llama-server
    serves its own part from the snapshot it takes on entering sleep: while asleep, every scrape is the last one
    taken awake, byte for byte (a scraper sees no change where nothing ran)."""

    def __init__(self, metrics: Metrics, sleeping: Callable[[], bool]) -> None:
        self.metrics = metrics
        self.sleeping = sleeping
        self.last: bytes | None = None

    def render(self) -> bytes:
        if self.last is not None and self.sleeping():
            return self.last
        self.last = self.metrics.render()
        return self.last
