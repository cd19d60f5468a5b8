"""Health and control routes never wait for generation: with 120 generations in flight (4 slots, the rest queued,
non-streamed and streamed, on the chat and native routes), /health answers with a p99 under 100 ms on a 2-core
machine, and /metrics, /slots, /props and /v1/models answer too (workers.py: their calls run on threads no
generation holds). Before, every call shared 64 threads and a non-streamed generation held its thread to the end,
so /health queued behind them for seconds.

The bound: llama-swap and load balancers probe /health with timeouts of a second or more; 100 ms at p99 leaves an
order of magnitude below that, and ~17x the p99 measured under this load on the 2-core VM (5.9 ms; p50 1.3 ms).

CPU cost: one server, 120 requests of 16 tokens (~2,000 tokens on 4 slots), ~30 s on 2 cores.
"""

from __future__ import annotations

import concurrent.futures as cf
import statistics
import time

import httpx
import pytest
from server_support import running

pytestmark = [pytest.mark.slow, pytest.mark.timing]

N_GENERATIONS = 120
N_PROBES = 200
P99_MAX_S = 0.100


@pytest.fixture(scope="module")
def srv(smollm2_path, tmp_path_factory):
    flags = ("-np", "4", "-c", "4096", "--ignore-eos", "--slots", "--metrics")
    with running(smollm2_path, *flags, log_dir=tmp_path_factory.mktemp("workers")) as s:
        yield s


def _generate(url: str, i: int) -> int:
    stream = i % 3 == 0
    if i % 2:
        path, body = (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": f"Story {i}."}], "max_tokens": 16, "stream": stream},
        )
    else:
        path, body = "/completion", {"prompt": f"Story {i}:", "n_predict": 16, "stream": stream}
    with httpx.Client(timeout=600) as c, c.stream("POST", url + path, json=body) as r:
        r.read()
        return r.status_code


def _in_flight(srv) -> float:  # noqa: ANN001
    return srv.metrics()["llamavq_http_requests_in_flight"]


def test_health_p99_under_100_ms_with_120_generations_in_flight(srv):
    with cf.ThreadPoolExecutor(N_GENERATIONS) as pool:
        futures = [pool.submit(_generate, srv.url, i) for i in range(N_GENERATIONS)]
        end = time.monotonic() + 120
        while _in_flight(srv) < 100:
            assert time.monotonic() < end, f"only {_in_flight(srv)} requests in flight"
            time.sleep(0.05)
        at_start = _in_flight(srv)
        health: list[float] = []
        others: dict[str, list[float]] = {p: [] for p in ("/metrics", "/slots", "/props", "/v1/models")}
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            for i in range(N_PROBES):
                t0 = time.perf_counter()
                r = c.get("/health")
                health.append(time.perf_counter() - t0)
                assert r.status_code == 200 and r.json() == {"status": "ok"}, r.text
                if i % 10 == 0:
                    for path, times in others.items():
                        t0 = time.perf_counter()
                        assert c.get(path).status_code == 200, path
                        times.append(time.perf_counter() - t0)
        at_end = _in_flight(srv)
        statuses = [f.result() for f in futures]
    health.sort()
    p50, p99 = statistics.median(health), health[int(0.99 * len(health)) - 1]
    print(
        f"\n/health with {at_start:.0f} -> {at_end:.0f} requests in flight: p50 {p50 * 1e3:.1f} ms, "
        f"p99 {p99 * 1e3:.1f} ms, max {health[-1] * 1e3:.1f} ms"
    )
    for path, times in others.items():
        print(f"{path}: median {statistics.median(times) * 1e3:.1f} ms, max {max(times) * 1e3:.1f} ms")
    assert at_end >= 100, f"the load ended during the probes ({at_end} in flight)"
    assert p99 < P99_MAX_S, f"/health p99 {p99 * 1e3:.0f} ms"
    assert statuses == [200] * N_GENERATIONS
