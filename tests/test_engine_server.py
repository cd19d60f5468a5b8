"""The engine seen through a real llama-vq-server process (SmolLM2): liveness during a long prefill,
/slots, shutdown within llama-swap's 5 s grace, and state files after a SIGKILL.

CPU cost: five short server runs, a ~550-token prefill on one thread; about 20-40 s on 2 cores.
"""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest
from server_support import ServerProcess, long_string_format

from server.kv_store import SUFFIX, read_header

pytestmark = pytest.mark.slow

LONG = " ".join(f"item{i}" for i in range(1000))  # ~4000 tokens


def test_keepalives_arrive_while_a_long_prompt_is_processed(smollm2_path, tmp_path):
    # one thread and 16-token batches: the ~550-token prefill takes well over the 0.2 s period, in
    # many decodes shorter than it (progress events alone must not hold keepalives back)
    s = ServerProcess(
        smollm2_path, "-c", "2048", "-t", "1", "-b", "16", "-ub", "16", "--sse-keepalive", "0.2", log_dir=tmp_path
    )
    try:
        s.wait_ready()
        body = {"prompt": LONG[:1200], "max_tokens": 2, "temperature": 0, "stream": True}
        seen: list[tuple[float, str]] = []
        t0 = time.monotonic()
        with httpx.Client(timeout=120) as c, c.stream("POST", s.url + "/v1/completions", json=body) as r:
            t_headers = time.monotonic() - t0
            assert r.status_code == 200
            for line in r.iter_lines():
                if line:
                    seen.append((time.monotonic() - t0, line))
        first_data = next(t for t, line in seen if line.startswith("data: {"))
        keepalives = [t for t, line in seen if line == ": keepalive" and t < first_data]
        assert len(keepalives) >= 2, seen[:5]
        assert t_headers < keepalives[0]  # headers went out before the prompt was processed
        assert seen[-1][1] == "data: [DONE]"
        final = [json.loads(line[6:]) for _, line in seen if line.startswith("data: {")][-1]
        assert final["timings"]["prompt_n"] > 300
    finally:
        s.stop()


def test_slots_endpoint_lists_every_slot_with_its_cached_tokens(smollm2_path, tmp_path):
    s = ServerProcess(smollm2_path, "-np", "3", log_dir=tmp_path)
    try:
        s.wait_ready()
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "Hello there", "max_tokens": 3}, timeout=60)
        assert r.status_code == 200
        slots = httpx.get(s.url + "/slots", timeout=10).json()
        assert [x["id"] for x in slots] == [0, 1, 2]
        assert all(x["state"] == "idle" and x["n_ctx"] == 1024 for x in slots)
        assert max(x["n_cached_tokens"] for x in slots) >= r.json()["usage"]["prompt_tokens"]
        m = s.metrics()
        assert m['llama_vq_slot_busy{slot="2"}'] == 0 and m["llama_vq_slots"] == 3
    finally:
        s.stop()


def _state_files_are_complete(d) -> int:
    assert not list(d.glob(".*.tmp")), list(d.iterdir())
    files = list(d.glob("*" + SUFFIX))
    for f in files:
        header = json.loads(f.read_bytes()[20 : 20 + int.from_bytes(f.read_bytes()[16:20], "little")])
        read_header(f, header["identity"])  # raises if truncated or damaged
    return len(files)


def test_sigterm_during_a_long_generation_exits_within_5_s_leaving_complete_state_files(smollm2_path, tmp_path):
    d = tmp_path / "kv"
    s = ServerProcess(smollm2_path, "--state-dir", str(d), "--state-min-tokens", "8", log_dir=tmp_path)
    try:
        s.wait_ready()
        body = {
            "messages": [{"role": "user", "content": "Write a very long story."}],
            "max_tokens": 900,
            "response_format": long_string_format(4000),
        }
        result: dict = {}

        def call() -> None:
            result["r"] = httpx.post(s.url + "/v1/chat/completions", json=body, timeout=60)

        t = threading.Thread(target=call)
        t.start()
        s.wait_metric("llama_vq_requests_running", lambda v: v == 1)
        s.wait_metric("llama_vq_generated_tokens_total", lambda v: v >= 0)
        t0 = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        code = s.proc.wait(timeout=30)
        took = time.monotonic() - t0
        t.join(30)
        assert code == 0, s.log()
        assert took < 5.0, (took, s.log()[-4000:])
        r = result["r"]
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
        assert _state_files_are_complete(d) <= 1
    finally:
        s.stop()


def test_sigkill_right_after_a_request_leaves_no_stale_tmp_after_restart(smollm2_path, tmp_path):
    d = tmp_path / "kv"
    flags = ("--state-dir", str(d), "--state-min-tokens", "8")
    s = ServerProcess(smollm2_path, *flags, log_dir=tmp_path)
    s.wait_ready()
    r = httpx.post(s.url + "/v1/completions", json={"prompt": LONG[:1500], "max_tokens": 1}, timeout=120)
    assert r.status_code == 200
    s.proc.send_signal(signal.SIGKILL)  # the state write may be anywhere: queued, mid-file or done
    s.proc.wait(timeout=30)
    s.stop()
    # a write cut short by the kill (simulated for certain: a tmp file of a process that is gone)
    (d / (".feedface" + SUFFIX + f".{s.proc.pid}.tmp")).write_bytes(b"half a state")
    s2 = ServerProcess(smollm2_path, *flags, log_dir=tmp_path)
    try:
        s2.wait_ready()
        assert _state_files_are_complete(d) <= 1
    finally:
        s2.stop()
