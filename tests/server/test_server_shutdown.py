"""SIGTERM ends open streams cleanly: at the end of --drain-timeout each open SSE stream gets a final error event in
its API's shape and a proper end of its chunked body, a request not yet answered gets a 503, the process exits 0
within llama-swap's 5 s with no traceback in its log, and --state-dir still saves every slot.

Four slots stream at once with --ignore-eos (OpenAI chat, Anthropic messages, OpenAI Responses, llama-server's
/completion), a fifth request waits for a slot without a stream. A body cut short would make httpx raise
(RemoteProtocolError: the peer closed the connection without the end of the chunked body).

CPU cost: one server, ~4 x 1 s of generation.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import signal
import time

import httpx
import pytest
from server_support import ServerProcess

pytestmark = [pytest.mark.slow, pytest.mark.timing]

CHAT = [{"role": "user", "content": "Count from one to one thousand."}]
STREAMS = {
    "openai": ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 900, "stream": True}),
    "anthropic": ("/v1/messages", {"messages": CHAT, "max_tokens": 900, "stream": True}),
    "responses": ("/v1/responses", {"input": "Count to one thousand.", "max_output_tokens": 900, "stream": True}),
    "completion": ("/completion", {"prompt": "One, two,", "n_predict": 900, "stream": True}),
}
SHUTTING_DOWN = "the server is shutting down"


def _read_stream(url: str, path: str, body: dict, started: cf.Future) -> tuple[int, list[str]]:
    lines: list[str] = []
    with httpx.Client(timeout=60) as c, c.stream("POST", url + path, json=body) as r:
        for line in r.iter_lines():  # raises if the chunked body ends without its last chunk
            lines.append(line)
            if line.startswith("data: ") and not started.done():
                started.set_result(True)
    return r.status_code, lines


def _events(lines: list[str]) -> list[tuple[str | None, str]]:
    """(event name or None, data) of each SSE event."""
    out, name = [], None
    for line in lines:
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            out.append((name, line[len("data: ") :]))
            name = None
    return out


def test_sigterm_ends_every_open_stream_with_its_apis_error_event_and_saves_the_slots(smollm2_path, tmp_path):
    state = tmp_path / "state"
    flags = ("-np", "4", "-c", "4096", "--ignore-eos", "--slots", "--metrics", "--drain-timeout", "1")
    s = ServerProcess(smollm2_path, *flags, "--state-dir", str(state), log_dir=tmp_path)
    try:
        s.wait_ready()
        with cf.ThreadPoolExecutor(len(STREAMS) + 1) as pool:
            started = {name: cf.Future() for name in STREAMS}
            running = {
                name: pool.submit(_read_stream, s.url, path, body, started[name])
                for name, (path, body) in STREAMS.items()
            }
            cf.wait(list(started.values()), timeout=120)
            assert all(f.done() for f in started.values()), {n: f.done() for n, f in started.items()}
            queued = pool.submit(httpx.post, s.url + "/completion", json={"prompt": "Hi", "n_predict": 8}, timeout=60)
            end = time.monotonic() + 30
            while s.metrics()["llamavq_http_requests_in_flight"] < len(STREAMS) + 1:  # the fifth waits for a slot
                assert time.monotonic() < end, "the fifth request never arrived"
                time.sleep(0.01)
            t0 = time.monotonic()
            s.proc.send_signal(signal.SIGTERM)
            results = {name: f.result(timeout=30) for name, f in running.items()}
            waiting = queued.result(timeout=30)
            rc = s.proc.wait(timeout=30)
            elapsed = time.monotonic() - t0
        log = s.log()
        print(f"\nSIGTERM to exit: {elapsed:.2f} s")
        assert rc == 0 and elapsed < 5.0, (rc, elapsed, log[-3000:])
        assert "Traceback" not in log and "CancelledError" not in log, log[-5000:]

        for name, (status, lines) in results.items():
            assert status == 200, (name, lines[:5])
            events = _events(lines)
            assert len(events) > 2, (name, lines[:10])
            if name == "openai":
                (_, err), (_, done) = events[-2:]
                assert json.loads(err)["error"] == {"code": 503, "message": SHUTTING_DOWN, "type": "unavailable_error"}
                assert done == "[DONE]"
            elif name == "anthropic":
                event, data = events[-1]
                assert event == "error" and json.loads(data) == {
                    "type": "error",
                    "error": {"type": "overloaded_error", "message": SHUTTING_DOWN},
                }
            elif name == "responses":
                event, data = events[-1]
                doc = json.loads(data)
                assert event == "error" and doc["type"] == "error" and doc["code"] == "server_shutting_down"
                assert doc["message"] == SHUTTING_DOWN and doc["sequence_number"] == len(events) - 1
            else:  # llama-server's own stream: the error event, no [DONE] (it never sends one)
                assert json.loads(events[-1][1])["error"]["message"] == SHUTTING_DOWN
        assert waiting.status_code == 503 and waiting.json()["error"]["message"] == SHUTTING_DOWN, waiting.text

        assert "state dir: 4 slots saved" in log, log[-3000:]
        assert sorted(p.name for p in state.glob("slot-*.bin")) == [f"slot-{i}.bin" for i in range(4)]
    finally:
        s.stop()
