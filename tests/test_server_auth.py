"""API keys: every endpoint but /health needs 'Authorization: Bearer <key>'; exposure warning.

CPU cost: one server, one 4-token generation; a few seconds.
"""

from __future__ import annotations

import logging

import httpx
import openai
import pytest
from server_support import ServerProcess

from server.auth import warn_if_exposed
from server.settings import is_loopback

pytestmark = pytest.mark.slow

KEY = "sk-test-0123456789"


@pytest.fixture(scope="module")
def srv(smollm2_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("auth")
    (d / "keys").write_text(f"# server keys\n{KEY}\nsecond-key\n")
    s = ServerProcess(
        smollm2_path, "--api-key-file", str(d / "keys"), "--alias", "smol", log_dir=d, api_key=KEY
    )
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


def _error_401(r: httpx.Response) -> dict:
    assert r.status_code == 401, r.text
    assert r.headers["www-authenticate"] == "Bearer"
    err = r.json()["error"]
    assert err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error"
    return err


def test_health_needs_no_key(srv):
    assert httpx.get(srv.url + "/health").status_code == 200


@pytest.mark.parametrize("path", ["/v1/models", "/metrics", "/openapi.json", "/docs"])
def test_every_other_endpoint_needs_the_key(srv, path):
    assert "missing API key" in _error_401(httpx.get(srv.url + path))["message"]
    assert _error_401(httpx.get(srv.url + path, headers={"Authorization": "Bearer nope"}))
    assert _error_401(httpx.get(srv.url + path, headers={"Authorization": f"Basic {KEY}"}))
    assert httpx.get(srv.url + path, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


def test_generation_needs_the_key_and_any_listed_key_works(srv):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    _error_401(httpx.post(srv.url + "/v1/chat/completions", json=body))
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=srv.url + "/v1", api_key="wrong", max_retries=0).models.list()
    for key in (KEY, "second-key"):
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0, timeout=120)
        r = client.chat.completions.create(model="smol", messages=body["messages"], max_tokens=4)
        assert r.choices[0].message.content is not None


def test_schema_declares_bearer_auth(srv):
    schema = httpx.get(srv.url + "/openapi.json", headers=srv.headers()).json()
    assert schema["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    assert schema["paths"]["/v1/models"]["get"]["security"] == [{"bearer": []}]
    assert "security" not in schema["paths"]["/health"]["get"]


def test_the_key_never_appears_in_the_log(srv):
    # self-contained: this test sends the key (right and wrong) and a generation itself, then reads the log
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, headers=srv.headers(), timeout=120)
    assert r.status_code == 200, r.text
    wrong = httpx.get(srv.url + "/v1/models", headers={"Authorization": f"Bearer {KEY}-wrong"}, timeout=30)
    assert wrong.status_code == 401
    assert KEY not in srv.log()


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("192.168.1.5", False),
        ("::", False),
    ],
)
def test_loopback_addresses_are_recognised(host, loopback):
    assert is_loopback(host) is loopback


def test_non_loopback_bind_without_a_key_logs_a_warning(caplog):
    caplog.set_level(logging.WARNING, "llama_vq.server.auth")
    warn_if_exposed("0.0.0.0", loopback=False, has_key=False)
    assert "without an API key" in caplog.text
    caplog.clear()
    warn_if_exposed("0.0.0.0", loopback=False, has_key=True)
    warn_if_exposed("127.0.0.1", loopback=True, has_key=False)
    assert caplog.text == ""
