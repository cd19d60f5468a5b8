"""A client that goes away frees its slot, whatever it asked: every generating route (chat, completions, responses,
messages, infill), streamed or not. The server runs one slot with --ignore-eos, so a generation runs until its
900 tokens unless it is cancelled; the client sends its request on a raw socket, waits until the slot has
decoded a few tokens, and closes the socket.

What must hold: the task is cancelled (the engine logs it) and the slot is idle within one iteration of the task
loop after the disconnect (a slot decodes one token per iteration): the slot's tokens at its release, as the
engine logs them, exceed those of the last look before the close by at most 2 (the iteration running when the
close was seen, and the one the cancel waited for). Before the cancel woke the waiting handler, a non-streamed
request (and a stream whose prompt was processed) kept its slot until llama-server's 1 s poll, dozens of tokens.

CPU cost: two servers (SmolLM2; Qwen2.5-Coder-0.5B for /infill), 12 requests of ~10 tokens each.
"""

from __future__ import annotations

import json
import re
import socket
import time

import httpx
import pytest
from server_support import running

pytestmark = pytest.mark.slow

N_PREDICT = 900
AFTER_DISCONNECT_MAX = 2  # tokens decoded after the close was seen (see above)
CHAT = [{"role": "user", "content": "Count from one to one thousand."}]
ROUTES = {
    "chat": ("/v1/chat/completions", {"messages": CHAT, "max_tokens": N_PREDICT}),
    "completions": ("/v1/completions", {"prompt": "One, two, three,", "max_tokens": N_PREDICT}),
    "completion": ("/completion", {"prompt": "One, two, three,", "n_predict": N_PREDICT}),
    "responses": ("/v1/responses", {"input": "Count from one to one thousand.", "max_output_tokens": N_PREDICT}),
    "messages": ("/v1/messages", {"messages": CHAT, "max_tokens": N_PREDICT}),
}
INFILL = {"input_prefix": "def count():\n    ", "input_suffix": "\n", "n_predict": N_PREDICT}
FLAGS = ("-np", "1", "--ignore-eos", "--slots", "--metrics")


@pytest.fixture(scope="module")
def srv(smollm2_path, tmp_path_factory):
    with running(smollm2_path, *FLAGS, log_dir=tmp_path_factory.mktemp("disconnect")) as s:
        yield s


@pytest.fixture(scope="module")
def coder(qwen_coder_path, tmp_path_factory):
    """Qwen2.5-Coder: a model with fill-in-the-middle tokens (SmolLM2 has none: its /infill is a 501)."""
    with running(qwen_coder_path, *FLAGS, log_dir=tmp_path_factory.mktemp("disconnect-fim")) as s:
        yield s


def _slot(srv) -> dict:  # noqa: ANN001
    return httpx.get(srv.url + "/slots", timeout=30).json()[0]


def _decoded(slot: dict) -> int:
    return slot["next_token"][0]["n_decoded"] if "next_token" in slot else 0


def _send(srv, path: str, body: dict) -> socket.socket:  # noqa: ANN001
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", srv.port))
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len(data)}"
    s.sendall(head.encode() + b"\r\n\r\n" + data)
    return s


def _until(predicate, deadline_s: float, what: str):  # noqa: ANN001, ANN202
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.005)
    raise TimeoutError(what)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("route", list(ROUTES))
def test_a_disconnect_frees_the_slot_within_one_iteration(srv, route, stream):
    path, body = ROUTES[route]
    _disconnect_and_measure(srv, path, {**body, "stream": stream}, f"{route} stream={stream}")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_an_infill_disconnect_frees_the_slot_within_one_iteration(coder, stream):
    _disconnect_and_measure(coder, "/infill", {**INFILL, "stream": stream}, f"infill stream={stream}")


def _disconnect_and_measure(srv, path: str, body: dict, what: str) -> None:  # noqa: ANN001
    before = srv.metrics().get("llamavq_http_client_disconnects_total", 0)
    previous = _slot(srv).get("id_task")
    sock = _send(srv, path, body)
    try:
        snap = _until(
            lambda: (s := _slot(srv))["is_processing"] and s.get("id_task") != previous and _decoded(s) >= 8 and s,
            120,
            "the request never started generating",
        )
    finally:
        sock.close()
    _until(lambda: not _slot(srv)["is_processing"], 10, "the slot stays busy after the client left")
    # the slot's tokens (prompt and generated) when it stopped, as the engine logs it; at the last look before the
    # close it held snap["n_prompt_tokens"]
    task = snap["id_task"]
    stopped = _until(
        lambda: re.search(rf"task {task} \| stop processing: n_tokens = (\d+)", srv.log()), 10, "no release logged"
    )
    after = int(stopped.group(1)) - snap["n_prompt_tokens"]
    print(f"\n{what}: {_decoded(snap)} tokens decoded before the close, {after} after")
    assert f"cancel task, id_task = {task}" in srv.log(), "the task finished instead of being cancelled"
    assert 0 <= after <= AFTER_DISCONNECT_MAX, after
    assert srv.metrics()["llamavq_http_client_disconnects_total"] == before + 1
