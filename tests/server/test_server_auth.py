"""API keys as llama-server checks them (--api-key, repeatable and comma-separated, --api-key-file): every route
but /health and /v1/health needs `Authorization: Bearer KEY` or `X-Api-Key: KEY`; a wrong or missing key is a
401 with llama-server's body. And the 503 "Loading model" that every route answers before the model is loaded.

CPU cost: two servers (one never loads a model), a few 2-4 token generations; a few seconds.
"""

from __future__ import annotations

import os
import time

import anthropic
import httpx
import openai
import pytest
from server_support import ServerProcess, free_port

pytestmark = pytest.mark.slow

KEY = "sk-test-0123456789"
KEYS = (KEY, "second-key", "third-key", "file-key")
UNAUTHORIZED = {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}}
LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}


@pytest.fixture(scope="module")
def srv(smollm2_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("auth")
    (d / "keys").write_text("# server keys\nfile-key\n")
    s = ServerProcess(
        smollm2_path,
        "--api-key",
        KEY,
        "--api-key",
        "second-key,third-key",
        "--api-key-file",
        str(d / "keys"),
        "--alias",
        "smol",
        log_dir=d,
        api_key=KEY,
    )
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


def _is_401(r: httpx.Response) -> None:
    assert r.status_code == 401, r.text
    assert r.json() == UNAUTHORIZED and r.headers["content-type"].startswith("application/json")


@pytest.mark.parametrize("path", ["/health", "/v1/health"])
def test_health_needs_no_key(srv, path):
    r = httpx.get(srv.url + path)
    assert r.status_code == 200 and r.json() == {"status": "ok"}


@pytest.mark.parametrize("path", ["/v1/models", "/props", "/slots", "/metrics", "/openapi.json", "/docs"])
def test_every_other_route_needs_a_key(srv, path):
    _is_401(httpx.get(srv.url + path))
    _is_401(httpx.get(srv.url + path, headers={"Authorization": "Bearer nope"}))
    _is_401(httpx.get(srv.url + path, headers={"Authorization": f"Basic {KEY}"}))
    _is_401(httpx.get(srv.url + path, headers={"X-Api-Key": "nope"}))
    r = httpx.get(srv.url + path, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code != 401, r.text


def test_every_listed_key_works_by_bearer_or_x_api_key(srv):
    for key in KEYS:
        assert httpx.get(srv.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
        assert httpx.get(srv.url + "/v1/models", headers={"X-Api-Key": key}).status_code == 200
    # the "Bearer " prefix is optional, as llama-server strips it only when present
    assert httpx.get(srv.url + "/v1/models", headers={"Authorization": KEY}).status_code == 200
    # a key that is a prefix or extension of a valid one is not one
    for wrong in (KEY[:-1], KEY + "0", "x"):
        _is_401(httpx.get(srv.url + "/v1/models", headers={"Authorization": f"Bearer {wrong}"}))


def test_generation_needs_the_key_through_the_clients(srv):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    _is_401(httpx.post(srv.url + "/v1/chat/completions", json=body))
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=srv.url + "/v1", api_key="wrong", max_retries=0).models.list()
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="second-key", max_retries=0, timeout=120)
    assert client.chat.completions.create(model="smol", max_tokens=2, **{"messages": body["messages"]}).choices
    # the anthropic client sends X-Api-Key
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=srv.url, api_key="wrong", max_retries=0).messages.create(
            model="smol", max_tokens=2, messages=body["messages"]
        )
    msg = anthropic.Anthropic(base_url=srv.url, api_key="file-key", max_retries=0, timeout=120).messages.create(
        model="smol", max_tokens=2, messages=body["messages"]
    )
    assert msg.role == "assistant" and msg.usage.output_tokens <= 2


def test_cors_preflight_needs_no_key(srv):
    pre = {
        "Origin": "http://ui.test",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type",
    }
    r = httpx.options(srv.url + "/v1/chat/completions", headers=pre)
    assert r.status_code in (200, 204), r.text
    # llama-server's default CORS: any origin, with credentials, so the origin is echoed
    assert r.headers["access-control-allow-origin"] == "http://ui.test"
    denied = httpx.get(srv.url + "/v1/models", headers={"Origin": "http://ui.test"})
    assert denied.status_code == 401 and denied.headers["access-control-allow-origin"] == "http://ui.test"


@pytest.mark.parametrize("name", ["Authorization", "X-Api-Key"])
def test_of_a_repeated_key_header_the_first_counts(srv, name):
    good = f"Bearer {KEY}" if name == "Authorization" else KEY
    bad = "Bearer nope" if name == "Authorization" else "nope"
    assert httpx.get(srv.url + "/v1/models", headers=[(name, good), (name, bad)]).status_code == 200
    _is_401(httpx.get(srv.url + "/v1/models", headers=[(name, bad), (name, good)]))


def test_head_is_get_without_the_body(srv):
    for path in ("/health", "/v1/health"):
        r = httpx.head(srv.url + path)
        assert r.status_code == 200 and r.content == b"", r
        assert r.headers["content-type"].startswith("application/json")
        assert int(r.headers["content-length"]) == len(httpx.get(srv.url + path).content)
    no_key = httpx.head(srv.url + "/v1/models")
    assert no_key.status_code == 401 and no_key.content == b""
    r = httpx.head(srv.url + "/v1/models", headers=srv.headers())
    assert r.status_code == 200 and r.content == b"", r


@pytest.mark.parametrize("path", ["/health", "/v1/chat/completions", "/no/such/route"])
def test_options_without_an_origin_is_a_200_without_a_key(srv, path):
    r = httpx.options(srv.url + path)
    assert r.status_code == 200 and r.content == b"", (r, r.text)
    assert r.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
    assert r.headers["access-control-allow-headers"] == "*" and r.headers["access-control-allow-credentials"] == "true"


def test_the_key_never_appears_in_the_log(srv):
    r = httpx.post(
        srv.url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
        headers=srv.headers(),
        timeout=120,
    )
    assert r.status_code == 200, r.text
    _is_401(httpx.get(srv.url + "/v1/models", headers={"Authorization": f"Bearer {KEY}-wrong"}))
    log = srv.log()
    assert "unauthorized" in log.lower()  # the refusal is logged, without the key
    assert KEY not in log and "second-key" not in log and "file-key" not in log


def test_every_route_answers_503_loading_model_until_the_model_is_loaded(tmp_path):
    """A model path that is a FIFO: the loader blocks on opening it, deterministically, while the sockets are
    already bound (with a key: until the model is loaded, the answer is 503 with or without one). Opening the FIFO's
    other end (and closing it: an empty file) then makes the load fail, and the server exits 1."""
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    s = ServerProcess(fifo, "--api-key", KEY, log_dir=tmp_path, api_key=KEY)
    try:
        end = time.monotonic() + 60
        r = None
        while time.monotonic() < end and r is None:
            assert s.proc.poll() is None, s.log()
            try:
                r = httpx.get(s.url + "/health", timeout=5)
            except httpx.TransportError:
                time.sleep(0.05)
        assert r is not None, s.log()
        assert r.status_code == 503 and r.json() == LOADING, r.text
        for method, path in (
            ("GET", "/v1/health"),
            ("GET", "/v1/models"),
            ("POST", "/v1/chat/completions"),
            ("GET", "/metrics"),
            ("POST", "/completion"),
            ("GET", "/openapi.json"),
            ("GET", "/docs"),
        ):
            r = httpx.request(method, s.url + path, json={} if method == "POST" else None, timeout=5)
            assert r.status_code == 503 and r.json() == LOADING, (path, r.text)
        # as llama-server, the state is checked before the key: no key, or a wrong one, is a 503 too
        r = httpx.get(s.url + "/v1/models", headers={"Authorization": "Bearer nope"}, timeout=5)
        assert r.status_code == 503 and r.json() == LOADING, r.text
        assert "loading the model" in s.log()
        # unblock the loader: each time it opens the FIFO (llama-server tries the file more than once) it reads an
        # empty file
        end = time.monotonic() + 60
        while s.proc.poll() is None and time.monotonic() < end:
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # ENXIO: no reader at this moment
                pass
            time.sleep(0.01)
        assert s.proc.wait(timeout=10) == 1, s.log()
        assert "could not be loaded" in s.log()
    finally:
        s.stop()


def test_a_busy_port_fails_at_once(smollm2_path, tmp_path):
    import socket

    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen(1)
        s = ServerProcess(smollm2_path, "--port", str(port), log_dir=tmp_path)
        try:
            assert s.proc.wait(timeout=60) == 1
            assert "cannot listen" in s.log()
        finally:
            s.stop()
