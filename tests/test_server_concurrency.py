"""Queueing, cancellation and shutdown of a real llama-vq-server process with SmolLM2.

Requests that must keep running use a JSON-schema grammar that forbids stopping early
(server_support.long_string_format), so their length does not depend on what the model says.
These servers run one slot (-np 1), so that requests beyond it queue: the queue's order, 429 and the
drain are what is tested here (parallel slots: test_engine_*.py).
CPU cost: two servers, ~600 generated tokens in all; about 15-25 s on 2 cores.
"""

from __future__ import annotations

import concurrent.futures as cf
import signal
import threading
import time

import httpx
import openai
import pytest
from server_support import ServerProcess, long_string_format

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def srv(smollm2_path, tmp_path_factory):
    s = ServerProcess(smollm2_path, "-np", "1", "--max-queue", "8", log_dir=tmp_path_factory.mktemp("conc"))
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


def _chat(url: str, content: str, **kw) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": content}], "temperature": 0, **kw}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=120)


def test_parallel_clients_all_succeed(srv):
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
    questions = [f"What is {i} plus {i}?" for i in range(6)]

    def ask(q: str):
        return client.chat.completions.create(
            model=client.models.list().data[0].id,
            max_tokens=8,
            messages=[{"role": "user", "content": q}],
            temperature=0,
        )

    with cf.ThreadPoolExecutor(len(questions)) as pool:
        answers = list(pool.map(ask, questions))
    assert all(a.choices[0].message.content and a.usage.completion_tokens > 0 for a in answers)


def test_queue_is_first_in_first_out(srv):
    done: list[int] = []
    lock = threading.Lock()

    def run(i: int, **kw) -> None:
        r = _chat(srv.url, "Count to ten.", **kw)
        assert r.status_code == 200
        with lock:
            done.append(i)

    # The blocker's length is fixed (150 tokens, no early stop), so it is still running while the
    # other three queue up; each is started only once the one before it is seen waiting.
    blocker = threading.Thread(
        target=run, args=(0,), kwargs={"max_tokens": 150, "response_format": long_string_format(4000)}
    )
    blocker.start()
    srv.wait_metric("llama_vq_requests_running", lambda v: v == 1)
    threads = [blocker]
    for i in range(1, 4):
        t = threading.Thread(target=run, args=(i,), kwargs={"max_tokens": 12})
        t.start()
        threads.append(t)
        srv.wait_metric("llama_vq_queue_depth", lambda v, i=i: v >= i)
    assert not done, "the blocker ended before the queue was built; the test proves nothing"
    for t in threads:
        t.join(120)
    assert done == [0, 1, 2, 3]


def test_client_disconnect_mid_stream_stops_generation_and_frees_the_model(srv):
    before = srv.metrics()
    body = {
        "messages": [{"role": "user", "content": "Write."}],
        "max_tokens": 900,
        "stream": True,
        "response_format": long_string_format(4000),
    }
    with (
        httpx.Client(timeout=60) as c,
        c.stream("POST", srv.url + "/v1/chat/completions", json=body) as r,
    ):
        assert r.status_code == 200
        lines = r.iter_lines()
        for _ in range(6):  # a few chunks: generation is under way
            next(lines)
    srv.wait_metric(
        "llama_vq_requests_cancelled_total",
        lambda v: v >= before.get("llama_vq_requests_cancelled_total", 0) + 1,
    )
    srv.wait_metric("llama_vq_requests_running", lambda v: v == 0)
    r = _chat(srv.url, "Hi", max_tokens=4)
    assert r.status_code == 200
    generated = (
        srv.metrics()["llama_vq_generated_tokens_total"] - before["llama_vq_generated_tokens_total"]
    )
    # 900 tokens were asked for; stopping at the next token leaves far fewer (6 read + in flight). Counted in
    # tokens, not seconds: a wall-clock bound depends on the machine's load.
    assert generated < 300, generated


def test_full_queue_gets_429_and_sigterm_drains_then_exits_0(smollm2_path, tmp_path):
    # --drain-timeout 60: both requests may finish (by default, a drain cancels after 2.5 s)
    s = ServerProcess(smollm2_path, "-np", "1", "--max-queue", "1", "--drain-timeout", "60", log_dir=tmp_path)
    try:
        s.wait_ready()
        body = {
            "messages": [{"role": "user", "content": "Write."}],
            "temperature": 0,
            "max_tokens": 200,  # fixed length: the string may not close, so both requests run 200 tokens
            "response_format": long_string_format(4000),
        }
        with cf.ThreadPoolExecutor(2) as pool:
            first = pool.submit(httpx.post, s.url + "/v1/chat/completions", json=body, timeout=120)
            s.wait_metric("llama_vq_requests_running", lambda v: v == 1)
            second = pool.submit(httpx.post, s.url + "/v1/chat/completions", json=body, timeout=120)
            s.wait_metric("llama_vq_queue_depth", lambda v: v == 1)

            third = _chat(s.url, "Hi", max_tokens=2)
            assert third.status_code == 429, third.text
            assert int(third.headers["retry-after"]) >= 1
            assert third.json()["error"]["code"] == "queue_full"

            s.proc.send_signal(signal.SIGTERM)
            # New requests are refused (connection refused once the socket closes, 503 before).
            deadline = time.monotonic() + 10
            refused = None
            while time.monotonic() < deadline and refused is None:
                try:
                    r = _chat(s.url, "Hi", max_tokens=2)
                    if r.status_code == 503:
                        refused = "503"
                except httpx.TransportError:
                    refused = "closed"
            assert refused is not None

            for fut in (first, second):  # in-flight and queued requests finish normally
                r = fut.result(timeout=120)
                assert r.status_code == 200, r.text
                assert len(r.json()["choices"][0]["message"]["content"]) >= 120
        assert s.proc.wait(timeout=60) == 0, s.log()
        assert "shut down cleanly" in s.log()
    finally:
        s.stop()
