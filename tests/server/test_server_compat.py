"""llama-server's own API and the Anthropic API on a real llama-vq-server with SmolLM2: native endpoints
(/completion, /tokenize, /detokenize, /props, /apply-template, /slots), the grammar / json_schema extensions,
routes without /v1, the anthropic client (messages, streaming, count_tokens), CORS with a fixed origin and a
chat template that raises.

CPU cost: two servers (~2 s each to load) and ~20 generations of <= 12 tokens.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest
from conftest import ROOT
from server_support import ServerProcess, running, sse_events

pytestmark = pytest.mark.slow

ORIGIN = "http://ui.test"
# A vendored llama.cpp template that reads enable_thinking (Qwen3 adds an empty think block when it is false). Its
# ChatML markers are special tokens of SmolLM2 too.
QWEN3 = ROOT / "vendor" / "llama.cpp" / "models" / "templates" / "Qwen-Qwen3-0.6B.jinja"
CHAT = [{"role": "user", "content": "Name a color."}]


@pytest.fixture(scope="module")
def srv(smollm2_path, tmp_path_factory):
    if not QWEN3.is_file():
        pytest.fail(f"{QWEN3} is missing: run `python tools/vendor.py fetch` (scripts/run.sh does)")
    flags = (
        "--alias",
        "smol",
        "--cors-origins",
        ORIGIN,
        "--chat-template-file",
        str(QWEN3),
        "--slots",
        "-np",
        "2",
        "--metrics",
    )
    with running(smollm2_path, *flags, log_dir=tmp_path_factory.mktemp("compat")) as s:
        yield s


@pytest.fixture(scope="module")
def http(srv):
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def claude(srv):
    return anthropic.Anthropic(base_url=srv.url, api_key="not-needed", max_retries=0, timeout=120)


def error_of(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and err["message"] and err["type"], err
    return err


# ---- OpenAI routes: aliases, developer role, timings ---------------------------------------------------


def test_routes_without_v1_answer_like_their_v1_twins(http):
    assert http.get("/models").json()["data"] == http.get("/v1/models").json()["data"]
    body = {"messages": CHAT, "max_tokens": 6, "temperature": 0}
    a = http.post("/chat/completions", json=body).json()
    b = http.post("/v1/chat/completions", json=body).json()
    assert a["object"] == "chat.completion" and a["choices"][0]["message"] == b["choices"][0]["message"]
    # as in llama-server, /completions is the native /completion (only /v1/completions is OpenAI's)
    body = {"prompt": "The sky is", "n_predict": 6, "max_tokens": 6, "temperature": 0}
    a, b = http.post("/completions", json=body).json(), http.post("/completion", json=body).json()
    oai = http.post("/v1/completions", json=body).json()
    assert a["content"] == b["content"] == oai["choices"][0]["text"] and oai["object"] == "text_completion"


def test_developer_role_is_rendered_as_system(http):
    def prompt(role: str) -> str:
        r = http.post("/apply-template", json={"messages": [{"role": role, "content": "Be brief."}, *CHAT]})
        assert r.status_code == 200, r.text
        return r.json()["prompt"]

    assert prompt("developer") == prompt("system")
    assert "<|im_start|>system\nBe brief." in prompt("developer")


def test_chat_template_kwargs_change_the_rendered_prompt(http):
    def render(**extra) -> str:
        r = http.post("/apply-template", json={"messages": CHAT, **extra})
        assert r.status_code == 200, r.text
        return r.json()["prompt"]

    off = render(chat_template_kwargs={"enable_thinking": False})
    on = render(chat_template_kwargs={"enable_thinking": True})
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n"), off
    assert on.endswith("<|im_start|>assistant\n") and on != off


def test_openai_responses_carry_llama_server_timings(http):
    r = http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 4, "temperature": 0}).json()
    t = r["timings"]
    assert t["predicted_n"] == r["usage"]["completion_tokens"] and t["predicted_ms"] >= 0
    assert t["prompt_n"] + t["cache_n"] == r["usage"]["prompt_tokens"]


# ---- llama-server's native endpoints ---------------------------------------------------------------


def test_native_completion_takes_text_or_token_ids(http):
    ids = http.post("/tokenize", json={"content": "The sky is"}).json()["tokens"]
    base = {"n_predict": 6, "temperature": 0}
    by_text = http.post("/completion", json={**base, "prompt": "The sky is"}).json()
    by_ids = http.post("/completion", json={**base, "prompt": ids}).json()
    assert by_text["content"] and by_text["content"] == by_ids["content"]
    assert by_text["stop"] is True and by_text["stop_type"] == "limit" and by_text["tokens_predicted"] == 6
    assert by_text["tokens_evaluated"] == len(ids)
    assert {"prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "cache_n"} <= set(by_text["timings"])


def test_native_completion_streams_partials_then_one_final_stop(http):
    body = {"prompt": "Once upon a time", "n_predict": 8, "temperature": 0}
    whole = http.post("/completion", json=body).json()
    with http.stream("POST", "/completion", json={**body, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.iter_lines())
    assert "[DONE]" not in events
    *partials, final = events
    assert all(e["stop"] is False for e in partials) and final["stop"] is True
    assert "".join(e["content"] for e in events) == whole["content"]
    assert final["tokens_predicted"] == 8


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


def test_bad_grammar_is_a_400_and_the_server_keeps_serving(http):
    err = error_of(http.post("/completion", json={"prompt": "x", "grammar": "root ::= (", "n_predict": 2}), 400)
    assert "grammar" in err["message"]
    assert http.post("/completion", json={"prompt": "Hi", "n_predict": 2}).status_code == 200


def test_tokenize_detokenize_round_trip(http):
    text = "Héllo wörld, 3 + 4 = 7 🌍"
    tokens = http.post("/tokenize", json={"content": text}).json()["tokens"]
    assert tokens and all(isinstance(t, int) for t in tokens)
    assert http.post("/detokenize", json={"tokens": tokens}).json() == {"content": text}
    pieces = http.post("/tokenize", json={"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == tokens
    raw = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces)
    assert raw.decode() == text
    assert len(http.post("/tokenize", json={"content": "<|im_start|>"}).json()["tokens"]) == 1  # parse_special
    assert len(http.post("/tokenize", json={"content": "<|im_start|>", "parse_special": False}).json()["tokens"]) > 1
    # a token id outside the vocabulary: llama-server's out_of_range, answered as the client's error
    assert error_of(http.post("/detokenize", json={"tokens": [999999999]}), 400)["type"] == "invalid_request_error"


def test_props_reports_context_template_and_slots(http):
    p = http.get("/props").json()
    assert p["default_generation_settings"]["n_ctx"] == 512  # 1024 cells over 2 slots
    assert p["model_alias"] == "smol" and p["total_slots"] == 2
    assert p["chat_template"] == QWEN3.read_text()
    assert p["endpoint_slots"] is True and p["endpoint_metrics"] is True and p["endpoint_props"] is False
    assert "--props" in error_of(http.post("/props", json={}), 501)["message"]  # as llama-server


def test_slots_lists_each_slot_and_its_state(http):
    slots = http.get("/slots").json()
    assert [s["id"] for s in slots] == [0, 1] and all(s["is_processing"] is False for s in slots)
    assert all(s["n_ctx"] == 512 for s in slots)
    err = error_of(http.post("/slots/0?action=save", json={"filename": "x.bin"}), 501)
    assert "--slot-save-path" in err["message"]


# ---- the Anthropic API -------------------------------------------------------------------------------


def test_anthropic_messages_create(claude):
    m = claude.messages.create(
        model="smol", max_tokens=8, messages=CHAT, system="Be brief.", extra_body={"temperature": 0}
    )
    assert m.type == "message" and m.role == "assistant" and m.content[0].type == "text" and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens") and 0 < m.usage.output_tokens <= 8


def test_anthropic_stream_equals_the_non_streamed_greedy_answer(claude):
    kw = dict(model="smol", max_tokens=8, messages=CHAT, extra_body={"temperature": 0})
    whole = claude.messages.create(**kw)
    with claude.messages.stream(**kw) as stream:
        types = [e.type for e in stream]
        final = stream.get_final_message()
    assert types[0] == "message_start" and types[-1] == "message_stop", types
    assert "content_block_delta" in types and "message_delta" in types
    assert final.content[0].text == whole.content[0].text and final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_anthropic_count_tokens_is_the_prompt_that_create_evaluates(claude, http):
    msgs = [{"role": "user", "content": "Count these tokens, please."}]
    n = claude.messages.count_tokens(model="smol", messages=msgs, system="Be brief.").input_tokens
    r = http.post(
        "/v1/chat/completions", json={"messages": [{"role": "system", "content": "Be brief."}, *msgs], "max_tokens": 1}
    ).json()
    assert n == r["usage"]["prompt_tokens"] > 5
    assert claude.messages.count_tokens(model="smol", messages=msgs).input_tokens < n


# ---- CORS with a fixed origin; metrics ------------------------------------------------------------------


def test_cors_with_a_fixed_origin(srv):
    pre = {
        "Origin": ORIGIN,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type",
    }
    r = httpx.options(srv.url + "/v1/chat/completions", headers=pre)
    assert r.status_code in (200, 204), r.text
    assert r.headers["access-control-allow-origin"] == ORIGIN and "POST" in r.headers["access-control-allow-methods"]
    other = httpx.options(srv.url + "/v1/chat/completions", headers={**pre, "Origin": "http://evil.test"})
    assert other.headers.get("access-control-allow-origin") in (None, ORIGIN)  # never the other origin
    # as llama-server: every answer names the fixed origin, with or without an Origin header
    assert httpx.get(srv.url + "/v1/models", headers={"Origin": ORIGIN}).headers["access-control-allow-origin"] == (
        ORIGIN
    )
    assert httpx.get(srv.url + "/v1/models").headers["access-control-allow-origin"] == ORIGIN


def test_metrics_carry_llama_server_names(srv, http):
    before = srv.metrics()
    http.post("/completion", json={"prompt": "Count: one, two,", "n_predict": 5, "temperature": 0})
    after = srv.metrics()
    assert after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"] == 5
    for name in (
        "llamacpp:prompt_tokens_total",
        "llamacpp:n_decode_total",
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
        "llamavq_http_requests_total",
        "llamavq_engine_ready",
    ):
        assert name in after, name


# ---- a chat template that raises: a 400, and the server lives -----------------------------------------------

RAISING = (
    "{% for m in messages %}{% if 'FORBIDDEN' in m.content %}"
    "{{ raise_exception('the word FORBIDDEN is not supported') }}{% endif %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"
)


def test_a_template_that_raises_is_a_400_and_cors_is_open_by_default(smollm2_path, tmp_path):
    tmpl = tmp_path / "raising.jinja"
    tmpl.write_text(RAISING)
    s = ServerProcess(smollm2_path, "--chat-template-file", str(tmpl), log_dir=tmp_path)
    try:
        s.wait_ready()
        with httpx.Client(base_url=s.url, timeout=120) as c:
            bad = {"messages": [{"role": "user", "content": "say FORBIDDEN"}], "max_tokens": 2}
            for path in ("/apply-template", "/v1/chat/completions"):
                assert "the word FORBIDDEN is not supported" in error_of(c.post(path, json=bad), 400)["message"]
            assert c.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2}).status_code == 200
            # llama-server's default CORS: "*" with credentials, so a request's origin is echoed
            r = c.get("/v1/models", headers={"Origin": ORIGIN})
            assert r.headers["access-control-allow-origin"] == ORIGIN
    finally:
        s.stop()
