"""A client's mistakes get 4xx with llama-server's error body, never 5xx, and the engine keeps serving: one test per
class of mistake (a body that is not JSON, a field of the wrong type, a missing field or content the model cannot
take, a slot id that names no slot). Answered by llama-server's handlers (patch 0020-server-client-errors-are-4xx),
through our ABI.

CPU cost: one server (~2 s to load), a few 2-token generations.
"""

from __future__ import annotations

import json

import httpx
import pytest
from server_support import running

pytestmark = pytest.mark.slow

CHAT = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def srv(smollm2_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("client-errors")
    with running(smollm2_path, "-np", "2", "--slot-save-path", str(d), log_dir=d) as s:
        yield s


def _post(srv, path: str, body) -> httpx.Response:  # noqa: ANN001
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(srv.url + path, content=raw, headers={"content-type": "application/json"}, timeout=120)


def _is_400(r: httpx.Response) -> str:
    """llama-server's error body for an invalid request; returns its message."""
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("application/json"), r.headers
    err = r.json()["error"]
    assert err["code"] == 400 and err["type"] == "invalid_request_error" and err["message"], err
    return err["message"]


def _still_serves(srv) -> None:  # noqa: ANN001
    assert srv.proc.poll() is None, srv.log()[-3000:]
    r = httpx.post(srv.url + "/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2}, timeout=120)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "cont'),
        ("/v1/chat/completions", b""),
        ("/completion", b'{"prompt": "Hi", "n_predict": 2} trailing'),
        ("/tokenize", b'{"content": "\xff\xfe\xc3"}'),
        ("/tokenize", b'{"content": "\\ud800"}'),
        ("/completion", b'{"prompt": "Hi", "n_predict": 2, "temperature": 1e999}'),
        ("/v1/messages", b"{not json"),
        ("/v1/responses", b'{"input": "Hi'),
    ],
    ids=[
        "truncated",
        "empty",
        "trailing-garbage",
        "invalid-utf8",
        "lone-surrogate",
        "number-overflow",
        "messages",
        "responses",
    ],
)
def test_a_body_that_is_not_json_is_a_400(srv, path, raw):
    _is_400(_post(srv, path, raw))
    _still_serves(srv)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/detokenize", {"tokens": ["a", 5]}),
        ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 2, "reasoning_format": 5}),
        ("/v1/chat/completions", {"messages": 5}),
        ("/v1/chat/completions", {"messages": [{"role": 5, "content": "Hi"}], "max_tokens": 2}),
        ("/completion", {"prompt": {"a": 1}, "n_predict": 2}),
        ("/apply-template", {"messages": [{"role": "user", "content": {"a": 1}}]}),
    ],
    ids=[
        "detokenize-string-token",
        "reasoning-format-number",
        "messages-number",
        "role-number",
        "prompt-object",
        "content-object",
    ],
)
def test_a_field_of_the_wrong_type_is_a_400(srv, path, body):
    _is_400(_post(srv, path, body))
    _still_serves(srv)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"content": "Hi"}], "max_tokens": 2}),
        ("/v1/messages", {"max_tokens": 2}),
        ("/v1/messages/count_tokens", {"model": "x"}),
        ("/slots/0?action=restore", {}),
        ("/slots/0?action=save", {}),
        ("/completion", {"n_predict": 2}),
        (
            "/v1/chat/completions",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}],
                    }
                ],
                "max_tokens": 2,
            },
        ),
        (
            "/v1/chat/completions",
            {
                "messages": CHAT,
                "max_tokens": 2,
                "grammar": 'root ::= "a"',
                "tool_choice": "required",
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            },
        ),
    ],
    ids=[
        "message-without-role",
        "anthropic-without-messages",
        "count-tokens-without-messages",
        "slot-restore-without-filename",
        "slot-save-without-filename",
        "completion-without-prompt",
        "image-part-without-mmproj",
        "tools-with-a-grammar",
    ],
)
def test_a_missing_field_or_content_the_model_cannot_take_is_a_400(srv, path, body):
    _is_400(_post(srv, path, body))
    _still_serves(srv)


@pytest.mark.parametrize("action", ["save", "restore", "erase"])
@pytest.mark.parametrize("slot", ["999", "2", "-1"])
def test_a_slot_id_that_names_no_slot_is_a_400(srv, slot, action):
    # two slots: 0 and 1; llama-server wrapped 999 and 2 around onto a slot and answered 200
    assert _is_400(_post(srv, f"/slots/{slot}?action={action}", {"filename": "x.bin"})) == "Invalid slot ID"
    _still_serves(srv)


def test_a_slot_id_that_names_a_slot_is_served(srv):
    r = _post(srv, "/slots/1?action=save", {"filename": "one.bin"})
    assert r.status_code == 200 and r.json()["id_slot"] == 1, r.text
