"""Parallel slots, client disconnects, SSE keep-alives and shutdown of a real llama-vq-server with SmolLM2.

Requests that must keep running use a JSON-schema grammar that forbids stopping early
(server_support.long_string_format), so their length does not depend on what the model says; bounds are in
tokens, not seconds, except the shutdown's: llama-swap kills a server that has not exited 5 s after SIGTERM.

CPU cost: four servers (~2 s each to load), ~250 generated tokens in all.
"""

from __future__ import annotations

import concurrent.futures as cf
import signal
import threading
import time

import httpx
import pytest
from server_support import ServerProcess, long_string_format, running

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
]
LONG = {
    "messages": [{"role": "user", "content": "Write."}],
    "max_tokens": 900,
    "temperature": 0,
    "response_format": long_string_format(4000),
}


def _complete(url: str, prompt: str) -> str:
    r = httpx.post(
        url + "/completion",
        json={"prompt": prompt, "n_predict": 12, "temperature": 0, "cache_prompt": False},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r.json()["content"]


def _slots_busy(url: str) -> list[bool]:
    return [s["is_processing"] for s in httpx.get(url + "/slots", timeout=30).json()]


def _wait(predicate, deadline_s: float, what: str) -> float:  # noqa: ANN001
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        if predicate():
            return time.monotonic() - t0
        time.sleep(0.02)
    raise TimeoutError(f"{what}: not within {deadline_s} s")


def test_parallel_greedy_completions_equal_the_ones_alone(smollm2_path, tmp_path):
    with running(smollm2_path, "-np", "4", "-c", "2048", "--metrics", log_dir=tmp_path) as s:
        alone = [_complete(s.url, p) for p in PROMPTS]
        assert s.metrics()["llamacpp:n_busy_slots_per_decode"] == 1.0
        with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
            together = list(pool.map(lambda p: _complete(s.url, p), PROMPTS))
        assert together == alone
        # the four were decoded in common batches (the average over every decode is above 1 only then)
        assert s.metrics()["llamacpp:n_busy_slots_per_decode"] > 1.0


@pytest.fixture(scope="module")
def one_slot(smollm2_path, tmp_path_factory):
    """One slot, SSE keep-alives every 50 ms, small batches (slow prompt processing), --slots and --metrics."""
    flags = ("-np", "1", "--sse-keepalive", "0.05", "-b", "16", "-ub", "16", "--slots", "--metrics")
    with running(smollm2_path, *flags, log_dir=tmp_path_factory.mktemp("conc")) as s:
        yield s


def test_client_disconnect_cancels_the_task_and_frees_the_slot(one_slot):
    s = one_slot
    before = s.metrics()
    with (
        httpx.Client(timeout=60) as c,
        c.stream("POST", s.url + "/v1/chat/completions", json={**LONG, "stream": True}) as r,
    ):
        assert r.status_code == 200
        lines = r.iter_lines()  # kept: closing the iterator (a `break` out of a for loop) closes the connection
        data = 0
        while data < 4:  # a few tokens: generation is under way
            data += next(lines).startswith("data: ")
        assert _slots_busy(s.url) == [True]
        assert s.metrics()["llamavq_http_requests_in_flight"] == 1
    # the client is gone: the task is cancelled at once (tests/server/test_server_disconnect.py bounds it in tokens)
    _wait(lambda: _slots_busy(s.url) == [False], 10, "the slot stays busy after the client left")
    after = s.metrics()
    assert after["llamavq_http_client_disconnects_total"] == before.get("llamavq_http_client_disconnects_total", 0) + 1
    assert after["llamavq_http_requests_in_flight"] == 0
    generated = after["llamacpp:tokens_predicted_total"] - before.get("llamacpp:tokens_predicted_total", 0)
    assert generated < 300, generated  # of 900 asked for
    r = httpx.post(
        s.url + "/v1/chat/completions",
        timeout=120,
        json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
    )
    assert r.status_code == 200, r.text


def test_disconnect_while_waiting_for_the_slot_drops_the_queued_task(one_slot):
    s = one_slot
    done = threading.Event()

    def blocker() -> None:
        body = {**LONG, "max_tokens": 60}
        httpx.post(s.url + "/v1/chat/completions", json=body, timeout=120)
        done.set()

    t = threading.Thread(target=blocker)
    t.start()
    _wait(lambda: _slots_busy(s.url) == [True], 30, "the blocker never started")
    # a second request waits for the one slot; its client gives up
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(s.url + "/completion", json={"prompt": "Hi", "n_predict": 400, "ignore_eos": True}, timeout=0.5)
    t.join(120)
    assert done.is_set()
    # the abandoned request does not run after the blocker: the slot is idle again
    _wait(lambda: _slots_busy(s.url) == [False], 10, "the abandoned request ran")
    time.sleep(1.5)
    assert _slots_busy(s.url) == [False]


def test_keepalive_comments_while_a_streamed_prompt_is_processed(one_slot):
    s = one_slot
    before = s.metrics().get("llamavq_sse_keepalives_total", 0)
    prompt = " ".join(f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(10))  # ~150 tokens
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 2, "stream": True, "cache_prompt": False}
    with httpx.stream("POST", s.url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    first_data = next(i for i, ln in enumerate(lines) if ln.startswith("data: "))
    assert first_data >= 2 and all(ln == ": keepalive" for ln in lines[:first_data]), lines[: first_data + 1]
    assert not any(ln.startswith(":") for ln in lines[first_data:])  # none once tokens flow
    assert lines[-1] == "data: [DONE]"
    assert s.metrics()["llamavq_sse_keepalives_total"] - before == first_data


@pytest.mark.timing
def test_sigterm_with_a_request_running_exits_0_within_5_s(smollm2_path, tmp_path):
    s = ServerProcess(smollm2_path, "-np", "1", "--slots", log_dir=tmp_path)
    try:
        s.wait_ready()
        with cf.ThreadPoolExecutor(1) as pool:
            fut = pool.submit(httpx.post, s.url + "/v1/chat/completions", json=LONG, timeout=120)
            _wait(lambda: _slots_busy(s.url) == [True], 30, "the request never started")
            t0 = time.monotonic()
            s.proc.send_signal(signal.SIGTERM)
            rc = s.proc.wait(timeout=30)
            elapsed = time.monotonic() - t0
            print(f"\nSIGTERM to exit: {elapsed:.2f} s")
            assert rc == 0 and elapsed < 5.0, (rc, elapsed, s.log()[-3000:])
            try:  # the request was cut: an error answer or a closed connection, never a full answer
                r = fut.result(timeout=30)
                assert r.status_code != 200 or len(r.text) < 3000, r.text[:300]
            except httpx.HTTPError:
                pass
        assert "stopped in" in s.log()
    finally:
        s.stop()


def test_sigterm_drains_a_running_request_then_exits_0(smollm2_path, tmp_path):
    s = ServerProcess(smollm2_path, "-np", "1", "--slots", "--drain-timeout", "60", log_dir=tmp_path)
    try:
        s.wait_ready()
        body = {**LONG, "max_tokens": 40}  # fixed length: the string may not close
        with cf.ThreadPoolExecutor(1) as pool:
            fut = pool.submit(httpx.post, s.url + "/v1/chat/completions", json=body, timeout=120)
            _wait(lambda: _slots_busy(s.url) == [True], 30, "the request never started")
            s.proc.send_signal(signal.SIGTERM)
            r = fut.result(timeout=120)
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == 40
        assert s.proc.wait(timeout=60) == 0, s.log()
        # no new connections once it has stopped
        with pytest.raises(httpx.TransportError):
            httpx.get(s.url + "/health", timeout=5)
    finally:
        s.stop()
