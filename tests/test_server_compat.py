"""llama-server and OpenAI compatibility of a real llama-vq-server with SmolLM2 (issue 9 items 3-4).

Nulls as "not given", the developer role, routes without /v1, llama-server's native endpoints
(/completion, /tokenize, /detokenize, /props, /apply-template), the grammar / json_schema
extensions, X-Api-Key, CORS and llama-server's metric names.

CPU cost: two servers (~2 s each to load) and ~25 generations of <= 16 tokens; 10-30 s on 2 cores.
"""

from __future__ import annotations

import json

import httpx
import pytest
from conftest import ROOT
from server_support import ServerProcess, sse_events

pytestmark = pytest.mark.slow

KEY = "sk-compat-test"
ORIGIN = "http://ui.test"
# A vendored llama.cpp template that reads enable_thinking (Qwen3 adds an empty think block when it
# is false). Its ChatML markers are special tokens of SmolLM2 too.
QWEN3 = ROOT / "vendor" / "llama.cpp" / "models" / "templates" / "Qwen-Qwen3-0.6B.jinja"
CHAT = [{"role": "user", "content": "Name a color."}]


@pytest.fixture(scope="module")
def srv(smollm2_path, tmp_path_factory):
    if not QWEN3.is_file():
        pytest.fail(f"{QWEN3} is missing: run `python tools/vendor.py fetch` (scripts/run.sh does)")
    s = ServerProcess(
        smollm2_path,
        "--alias",
        "smol",
        "--api-key",
        KEY,
        "--cors-origin",
        ORIGIN,
        "--chat-template-file",
        str(QWEN3),
        log_dir=tmp_path_factory.mktemp("compat"),
        api_key=KEY,
    )
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def http(srv):
    with httpx.Client(base_url=srv.url, timeout=120, headers={"Authorization": f"Bearer {KEY}"}) as c:
        yield c


def _error(r: httpx.Response, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    if param is not None:
        assert err["param"] == param and param in err["message"], err
    return err


# ---- OpenAI: nulls, developer, aliases ------------------------------------------------------------


def test_null_optional_fields_mean_not_given(http):
    nulls = dict.fromkeys(
        ["temperature", "top_p", "top_k", "min_p", "max_tokens", "stop", "seed", "n", "stream",
         "stream_options", "tools", "tool_choice", "response_format", "logprobs", "user",
         "presence_penalty", "frequency_penalty", "logit_bias", "parallel_tool_calls",
         "chat_template_kwargs", "reasoning_format", "grammar", "json_schema"]
    )
    messages = [{"role": "user", "content": "Hi", "name": None, "tool_calls": None}]
    r = http.post("/v1/chat/completions", json={**nulls, "messages": messages, "max_completion_tokens": 4})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] <= 4
    r = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": None, "temperature": None,
                                          "echo": None, "suffix": None})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] <= 16  # OpenAI's default max_tokens of completions


def test_null_for_a_required_field_is_a_400_naming_it(http):
    _error(http.post("/v1/chat/completions", json={"messages": None}), 400, "messages")
    # strict JSON types stay: a string for a number is still refused
    _error(http.post("/v1/chat/completions", json={"messages": CHAT, "temperature": "0.5"}), 400,
           "temperature")


def test_developer_role_is_rendered_as_system(http):
    def prompt(role: str) -> str:
        body = {"messages": [{"role": role, "content": "Be brief."}, *CHAT]}
        r = http.post("/apply-template", json=body)
        assert r.status_code == 200, r.text
        return r.json()["prompt"]

    assert prompt("developer") == prompt("system")
    assert "<|im_start|>system\nBe brief." in prompt("developer")


def test_routes_without_v1_answer_like_their_v1_twins(http):
    assert http.get("/models").json() == http.get("/v1/models").json()
    body = {"messages": CHAT, "max_tokens": 8, "temperature": 0}
    a = http.post("/chat/completions", json=body).json()
    b = http.post("/v1/chat/completions", json=body).json()
    assert a["object"] == "chat.completion" and a["choices"][0]["message"] == b["choices"][0]["message"]
    body = {"prompt": "The sky is", "max_tokens": 8, "temperature": 0}
    a, b = http.post("/completions", json=body).json(), http.post("/v1/completions", json=body).json()
    assert a["object"] == "text_completion" and a["choices"][0]["text"] == b["choices"][0]["text"]


def test_openai_responses_carry_llama_server_timings(http):
    r = http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 4, "temperature": 0}).json()
    t = r["timings"]
    assert t["predicted_n"] == r["usage"]["completion_tokens"] and t["predicted_ms"] >= 0
    assert t["prompt_n"] + t["cache_n"] == r["usage"]["prompt_tokens"]


# ---- llama-server's native endpoints ---------------------------------------------------------------


def test_native_completion_takes_text_token_ids_or_both(http):
    ids = http.post("/tokenize", json={"content": "The sky is"}).json()["tokens"]
    base = {"n_predict": 6, "temperature": 0}
    by_text = http.post("/completion", json={**base, "prompt": "The sky is"}).json()
    by_ids = http.post("/completion", json={**base, "prompt": ids}).json()
    mixed = http.post("/completion", json={**base, "prompt": ["The sky", *ids[-1:]]}).json()
    assert by_text["content"] and by_text["content"] == by_ids["content"] == mixed["content"]
    assert by_text["stop"] is True and by_text["stop_type"] == "limit" and by_text["tokens_predicted"] == 6
    assert by_text["tokens_evaluated"] == len(ids)
    t = by_text["timings"]
    assert {"prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "predicted_per_second", "cache_n"} <= set(t)
    assert t["predicted_n"] == 6


def test_native_completion_streams_partials_then_one_final_stop_without_done(http):
    body = {"prompt": "Once upon a time", "n_predict": 8, "temperature": 0}
    whole = http.post("/completion", json=body).json()
    with http.stream("POST", "/completion", json={**body, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.iter_lines())
    assert "[DONE]" not in events
    *partials, final = events
    assert all(e["stop"] is False for e in partials) and final["stop"] is True
    assert "".join(e["content"] for e in events) == whole["content"]
    assert final["tokens_predicted"] == 8 and final["timings"]["predicted_n"] == 8


def test_grammar_and_json_schema_constrain_native_and_openai_routes(http):
    yes_no = 'root ::= "yes" | "no"'
    r = http.post("/completion", json={"prompt": "Is water wet?", "grammar": yes_no, "n_predict": 4}).json()
    assert r["content"] in ("yes", "no")
    r = http.post("/v1/chat/completions", json={"messages": CHAT, "grammar": yes_no, "max_tokens": 4}).json()
    assert r["choices"][0]["message"]["content"] in ("yes", "no")
    schema = {"type": "boolean"}
    r = http.post("/v1/completions", json={"prompt": "True or false:", "json_schema": schema, "max_tokens": 4}).json()
    assert isinstance(json.loads(r["choices"][0]["text"]), bool)
    r = http.post("/completion", json={"prompt": "True or false:", "json_schema": schema, "n_predict": 4}).json()
    assert isinstance(json.loads(r["content"]), bool)


def test_bad_grammar_or_schema_is_a_400_naming_the_field(http):
    _error(http.post("/completion", json={"prompt": "x", "grammar": "root ::= (", "n_predict": 2}), 400, "grammar")
    _error(http.post("/v1/chat/completions", json={"messages": CHAT, "grammar": "root ::= ("}), 400, "grammar")
    _error(http.post("/v1/chat/completions", json={"messages": CHAT, "grammar": "root ::= \"a\"",
                                                   "json_schema": {"type": "string"}}), 400, "grammar")
    assert http.post("/completion", json={"prompt": "Hi", "n_predict": 2}).status_code == 200  # still serving


def test_tokenize_detokenize_round_trip(http):
    text = "Héllo wörld, 3 + 4 = 7 🌍"
    tokens = http.post("/tokenize", json={"content": text}).json()["tokens"]
    assert tokens and all(isinstance(t, int) for t in tokens)
    assert http.post("/detokenize", json={"tokens": tokens}).json() == {"content": text}
    pieces = http.post("/tokenize", json={"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == tokens
    raw = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces)
    assert raw.decode() == text
    special = http.post("/tokenize", json={"content": "<|im_start|>"}).json()["tokens"]
    assert len(special) == 1  # parse_special defaults to true, as llama-server's
    assert len(http.post("/tokenize", json={"content": "<|im_start|>", "parse_special": False}).json()["tokens"]) > 1
    _error(http.post("/detokenize", json={"tokens": [10**9]}), 400, "tokens")


def test_props_reports_context_template_cache_types_and_build(http):
    p = http.get("/props").json()
    assert p["default_generation_settings"]["n_ctx"] == 1024 and p["model_alias"] == "smol"
    assert p["default_generation_settings"]["params"]["temperature"] == 0.8
    assert p["chat_template"] == QWEN3.read_text() and "enable_thinking" in p["chat_template"]
    assert (p["cache_type_k"], p["cache_type_v"]) == ("f16", "f16") and p["build_info"]
    assert p["total_slots"] >= 1 and p["jinja"] is True


def test_chat_template_kwargs_change_the_rendered_prompt(http):
    def render(**extra) -> str:
        r = http.post("/apply-template", json={"messages": CHAT, **extra})
        assert r.status_code == 200, r.text
        return r.json()["prompt"]

    off = render(chat_template_kwargs={"enable_thinking": False})
    on = render(chat_template_kwargs={"enable_thinking": True})
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n"), off
    assert on.endswith("<|im_start|>assistant\n") and on != off
    assert render() == on  # Qwen3 thinks unless told not to


# ---- access: X-Api-Key, CORS; metrics -------------------------------------------------------------


def test_x_api_key_is_accepted_beside_bearer(srv):
    assert httpx.get(srv.url + "/v1/models", headers={"X-Api-Key": KEY}).status_code == 200
    assert httpx.get(srv.url + "/v1/models", headers={"X-Api-Key": "wrong"}).status_code == 401
    assert httpx.get(srv.url + "/props").status_code == 401


def test_cors_preflight_is_answered_before_the_key_check(srv):
    pre = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "authorization,content-type"}
    r = httpx.options(srv.url + "/v1/chat/completions", headers=pre)
    assert r.status_code == 204, r.text
    assert r.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in r.headers["access-control-allow-methods"]
    assert r.headers["access-control-allow-headers"] == "authorization,content-type"
    other = httpx.options(srv.url + "/v1/chat/completions", headers={**pre, "Origin": "http://evil.test"})
    assert "access-control-allow-origin" not in other.headers
    # answers to an allowed origin carry the header, errors (401) included
    ok = httpx.get(srv.url + "/v1/models", headers={"Origin": ORIGIN, "Authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == ORIGIN
    denied = httpx.get(srv.url + "/v1/models", headers={"Origin": ORIGIN})
    assert denied.status_code == 401 and denied.headers["access-control-allow-origin"] == ORIGIN


def test_metrics_carry_llama_server_names_beside_ours(srv, http):
    before = srv.metrics()
    http.post("/completion", json={"prompt": "Count: one, two,", "n_predict": 5, "temperature": 0})
    after = srv.metrics()
    for name in ("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total", "llamacpp:n_decode_total",
                 "llamacpp:prompt_seconds_total", "llamacpp:tokens_predicted_seconds_total"):
        assert after[name] > before.get(name, 0.0), name
    assert after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"] == 5
    for name in ("llamacpp:requests_processing", "llamacpp:requests_deferred", "llamacpp:prompt_tokens_cached_total",
                 "llama_vq_generated_tokens_total"):
        assert name in after, name


# ---- 400s for malformed history and templates; the worker survives them ------------------------------

RAISING = (
    "{% for m in messages %}{% if 'FORBIDDEN' in m.content %}"
    "{{ raise_exception('the word FORBIDDEN is not supported') }}{% endif %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"
)


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([{"role": "tool", "content": "42"}], "messages[0].tool_call_id"),
        ([{"role": "user", "content": "Hi"},
          {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                "function": {"name": "f", "arguments": "{not json"}}]}],
         "messages[1].tool_calls[0].function.arguments"),
        ([{"role": "user", "content": "Hi"}, {"role": "tool", "tool_call_id": "", "content": "42"}],
         "messages[1].tool_call_id"),
    ],
)
def test_malformed_tool_history_is_a_400_naming_message_and_field(http, messages, param):
    _error(http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2}), 400, param)
    _error(http.post("/apply-template", json={"messages": messages}), 400, param)


def test_a_template_that_fails_is_a_400_and_cors_is_off_by_default(smollm2_path, tmp_path):
    tmpl = tmp_path / "raising.jinja"
    tmpl.write_text(RAISING)
    s = ServerProcess(smollm2_path, "--chat-template-file", str(tmpl), log_dir=tmp_path)
    try:
        s.wait_ready()
        with httpx.Client(base_url=s.url, timeout=120) as c:
            bad = {"messages": [{"role": "user", "content": "say FORBIDDEN"}], "max_tokens": 2}
            for path in ("/apply-template", "/v1/chat/completions"):
                err = _error(c.post(path, json=bad), 400)
                assert "the word FORBIDDEN is not supported" in err["message"], err
            assert c.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2}).status_code == 200
            r = c.options("/v1/models", headers={"Origin": ORIGIN, "Access-Control-Request-Method": "GET"})
            assert "access-control-allow-origin" not in r.headers
            assert "access-control-allow-origin" not in c.get("/v1/models", headers={"Origin": ORIGIN}).headers
    finally:
        s.stop()
