"""Fuzzing a real llama-vq-server (llama-server's engine) with SmolLM2: schemathesis over the server's own OpenAPI
document, then targeted inputs (token ids out of range, lone surrogates, invalid UTF-8, huge and deeply nested
JSON schemas and grammars, truncated and invalid JSON, wrong types, out-of-range parameters).

The routes' request bodies are llama-server's JSON, which the OpenAPI document does not describe; the body schemas
below are added to the document for the main routes, deliberately loose (most fields accept any JSON value), so
that schemathesis generates both valid requests and wrong types.

What must hold: the process never dies, every answer is HTTP (no dropped connection), and a 5xx is only one that
stock llama-server gives to the same request, in llama-server's error shape (never a front-end crash, which would
be Starlette's text "Internal Server Error"). Those 5xx are listed in STOCK_5XX with the reason.

CPU cost: one server, ~250 requests whose generations are capped at 4 tokens (-n 4, and the fuzzed lengths
clamped); about a minute on 2 cores.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import httpx
import pytest
from server_support import running

pytestmark = pytest.mark.slow

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402

# 5xx answers that stock llama-server (tools/server at the pinned commit) gives too, with the same body: its
# ex_wrapper turns any std::exception that is not an invalid_argument into a 500 "server_error", and routes whose
# feature is off answer 501.
STOCK_5XX: list[tuple[int, str, str]] = [
    (500, r"^\[json\.exception\.", "nlohmann::json parse and type errors: a body that is not JSON (truncated, a lone "
                                   "surrogate escape, invalid UTF-8) or a field of the wrong JSON type"),
    (500, r"^'messages' is required", "/v1/messages without messages (the Anthropic conversion's runtime_error)"),
    (500, r"^Cannot specify grammar with tools", "tools with a grammar (common_chat's runtime_error)"),
    (500, r"^(stoi|stol|stoul|stof|stod)\b", "std::stoi on a slot id / number that is not one (std::invalid_argument "
                                             "is mapped to 400; std::out_of_range of stoi too)"),
    (500, r"^image input is not supported", "an image part for a model without --mmproj"),
    (500, r"^Failed to parse tools", "tools that are not tool objects (common_chat_tools_parse_oaicompat)"),
    (501, r"", "features that are off: embeddings, reranking, infill without FIM tokens, slot actions without "
               "--slot-save-path, POST /props without --props"),
]

ANY: dict = {}
SMALL_INT = {"type": "integer", "minimum": -2, "maximum": 8}
TEXT = {"type": "string", "maxLength": 30}
LOOSE_MESSAGE = {
    "type": "object",
    "properties": {"role": {"enum": ["system", "user", "assistant", "developer", "tool", "wizard"]},
                   "content": {"anyOf": [TEXT, {"type": "array", "maxItems": 2}, {"type": "null"}, ANY]},
                   "tool_calls": ANY, "tool_call_id": ANY, "name": ANY},
    "required": ["role"],
}
SAMPLING = {"temperature": ANY, "top_k": ANY, "top_p": ANY, "min_p": ANY, "seed": ANY, "stop": ANY,
            "logit_bias": ANY, "stream": {"type": "boolean"}, "n_probs": SMALL_INT, "logprobs": ANY,
            "top_logprobs": SMALL_INT, "grammar": ANY, "json_schema": ANY, "response_format": ANY,
            "cache_prompt": ANY, "id_slot": ANY, "samplers": ANY, "lora": ANY, "n_keep": ANY}
BODIES: dict[tuple[str, str], dict] = {
    ("post", "/v1/chat/completions"): {"type": "object", "properties": {
        "messages": {"anyOf": [{"type": "array", "items": LOOSE_MESSAGE, "maxItems": 3}, ANY]},
        "max_tokens": SMALL_INT, "n": {"type": "integer", "minimum": 0, "maximum": 2}, "tools": ANY,
        "tool_choice": ANY, "parallel_tool_calls": ANY, "chat_template_kwargs": ANY, "reasoning_format": ANY,
        **SAMPLING}, "required": ["messages"]},
    ("post", "/v1/completions"): {"type": "object", "properties": {
        "prompt": {"anyOf": [TEXT, {"type": "array", "maxItems": 4}, ANY]}, "max_tokens": SMALL_INT,
        "echo": ANY, "suffix": ANY, **SAMPLING}, "required": ["prompt"]},
    ("post", "/completion"): {"type": "object", "properties": {
        "prompt": {"anyOf": [TEXT, {"type": "array", "maxItems": 4}, ANY]}, "n_predict": SMALL_INT,
        "return_tokens": ANY, "post_sampling_probs": ANY, **SAMPLING}, "required": ["prompt"]},
    ("post", "/infill"): {"type": "object", "properties": {
        "input_prefix": ANY, "input_suffix": ANY, "input_extra": ANY, "prompt": ANY, "n_predict": SMALL_INT}},
    ("post", "/tokenize"): {"type": "object", "properties": {
        "content": {"anyOf": [TEXT, ANY]}, "add_special": ANY, "parse_special": ANY, "with_pieces": ANY}},
    ("post", "/detokenize"): {"type": "object", "properties": {
        "tokens": {"anyOf": [{"type": "array", "items": {"type": "integer"}, "maxItems": 6}, ANY]}}},
    ("post", "/apply-template"): {"type": "object", "properties": {
        "messages": {"anyOf": [{"type": "array", "items": LOOSE_MESSAGE, "maxItems": 3}, ANY]}, "tools": ANY,
        "chat_template_kwargs": ANY}},
    ("post", "/v1/messages"): {"type": "object", "properties": {
        "model": ANY, "max_tokens": SMALL_INT, "system": ANY, "tools": ANY, "tool_choice": ANY, "stream": ANY,
        "messages": {"anyOf": [{"type": "array", "items": LOOSE_MESSAGE, "maxItems": 3}, ANY]}, "thinking": ANY}},
    ("post", "/v1/messages/count_tokens"): {"type": "object", "properties": {
        "model": ANY, "system": ANY, "tools": ANY,
        "messages": {"anyOf": [{"type": "array", "items": LOOSE_MESSAGE, "maxItems": 3}, ANY]}}},
    ("post", "/v1/responses"): {"type": "object", "properties": {
        "input": {"anyOf": [TEXT, {"type": "array", "maxItems": 2}, ANY]}, "instructions": ANY,
        "max_output_tokens": SMALL_INT, "stream": ANY, "tools": ANY, "temperature": ANY}},
    ("post", "/lora-adapters"): {"type": "array", "maxItems": 2,
                                 "items": {"type": "object", "properties": {"id": ANY, "scale": ANY}}},
}
for _twin, _of in (("/chat/completions", "/v1/chat/completions"), ("/v1/chat/completions/input_tokens",
                                                                  "/v1/chat/completions"),
                  ("/v1/responses/input_tokens", "/v1/responses"), ("/completions", "/completion")):
    BODIES[("post", _twin)] = BODIES[("post", _of)]
# fuzzed lengths are clamped so that no request generates more than a few tokens
LENGTH_KEYS = ("max_tokens", "n_predict", "max_completion_tokens", "max_output_tokens", "n", "n_cmpl")
EXAMPLES_WITH_BODY = 40
EXAMPLES_OTHER = 2


@pytest.fixture(scope="module")
def srv(smollm2_path, tmp_path_factory):
    flags = ("-np", "2", "-n", "4", "--metrics", "--slots")
    with running(smollm2_path, *flags, log_dir=tmp_path_factory.mktemp("fuzz")) as s:
        yield s


@pytest.fixture(scope="module")
def seen_5xx() -> list[tuple[str, int, str]]:
    return []


def _clamp(body: Any) -> Any:
    if isinstance(body, dict):
        return {k: (min(v, 4) if k in LENGTH_KEYS and isinstance(v, int) and not isinstance(v, bool) else _clamp(v))
                for k, v in body.items()}
    if isinstance(body, list):
        return [_clamp(v) for v in body]
    return body


def judge(srv, what: str, status: int, content: bytes, seen: list) -> None:
    """The process lives; a 5xx is llama-server's own (STOCK_5XX) in llama-server's error shape."""
    assert srv.proc.poll() is None, f"the server died on {what}:\n{srv.log()[-4000:]}"
    if status < 500:
        return
    try:
        err = json.loads(content)["error"]
    except (ValueError, KeyError, TypeError):
        raise AssertionError(f"{what}: {status} that is not llama-server's error body: {content[:300]!r}") from None
    assert err.get("code") == status and isinstance(err.get("message"), str), (what, err)
    if not any(code == status and re.search(rx, err["message"]) for code, rx, _ in STOCK_5XX):
        raise AssertionError(f"{what}: {status} {err['message'][:300]!r} is not one stock llama-server gives")
    seen.append((what, status, err["message"][:120]))


def _document(srv) -> dict:
    doc = httpx.get(srv.url + "/openapi.json", timeout=30).json()
    doc = copy.deepcopy(doc)
    for (method, path), schema in BODIES.items():
        op = doc["paths"][path][method]
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
    doc["servers"] = [{"url": srv.url}]
    return doc


def test_schemathesis_over_the_openapi_document(srv, seen_5xx):
    schema = schemathesis.openapi.from_dict(_document(srv))
    operations = [r.ok() for r in schema.get_all_operations()]
    paths = {op.path for op in operations}
    assert {"/v1/chat/completions", "/completion", "/tokenize", "/v1/messages"} <= paths, paths
    client = httpx.Client(base_url=srv.url, timeout=120)
    counts: dict[str, int] = {}
    for op in operations:
        if op.path != "/metrics":  # not the engine's answer alone; parsed in test_server_api
            _fuzz_operation(srv, client, op, counts, seen_5xx)
    client.close()
    print(f"\nschemathesis: {sum(counts.values())} requests: {counts}")
    assert sum(counts.values()) >= 80, counts
    assert httpx.get(srv.url + "/health", timeout=30).status_code == 200


def _fuzz_operation(srv, client: httpx.Client, op, counts: dict[str, int], seen: list) -> None:  # noqa: ANN001
    key = (op.method.lower(), op.path)
    n = EXAMPLES_WITH_BODY if key in BODIES else EXAMPLES_OTHER

    @settings(max_examples=n, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy())
    def run(case) -> None:  # noqa: ANN001
        body = _clamp(case.body) if key in BODIES else None
        path = case.formatted_path
        what = f"{op.method.upper()} {path} {json.dumps(body)[:200] if body is not None else ''}"
        r = client.request(op.method.upper(), path, params=case.query or None,
                           content=json.dumps(body).encode() if body is not None else None,
                           headers={"content-type": "application/json"} if body is not None else None)
        counts[op.path] = counts.get(op.path, 0) + 1
        judge(srv, what, r.status_code, r.content, seen)

    run()


def _deep_schema(depth: int) -> dict:
    s: dict = {"type": "integer"}
    for _ in range(depth):
        s = {"type": "array", "items": s}
    return s


def _post(srv, path: str, body: Any = None, raw: bytes | None = None) -> httpx.Response:
    content = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(srv.url + path, content=content, headers={"content-type": "application/json"}, timeout=120)


CHAT = [{"role": "user", "content": "Hi"}]
TARGETED: list[tuple[str, str, Any, tuple[int, ...] | None]] = [
    # (id, path, body (bytes: sent as is), expected statuses or None: any answer within the rules)
    ("tokenize-pieces", "/tokenize", {"content": "héllo 🌍", "with_pieces": True}, (200,)),
    ("detokenize-huge-id", "/detokenize", {"tokens": [999999999]}, (400,)),
    ("detokenize-negative-id", "/detokenize", {"tokens": [-1]}, (400,)),
    ("detokenize-int64", "/detokenize", {"tokens": [2**63 - 1]}, (400,)),
    ("detokenize-float", "/detokenize", {"tokens": [1.5]}, None),
    ("detokenize-string", "/detokenize", {"tokens": ["a"]}, None),
    ("completion-bad-token", "/completion", {"prompt": [999999999], "n_predict": 2}, (400,)),
    ("completion-negative-token", "/completion", {"prompt": [-5], "n_predict": 2}, (400,)),
    ("chat-logit-bias-out-of-vocab", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2,
                                                              "logit_bias": {"999999999": 5}}, None),
    ("completion-logit-bias-pairs", "/completion", {"prompt": "Hi", "n_predict": 2,
                                                    "logit_bias": [[999999999, 5], [-3, 1]]}, None),
    ("lone-surrogate-escape", "/tokenize", b'{"content": "\\ud800"}', None),
    ("lone-low-surrogate", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "a\\udc00b"}], "max_tokens": 2}', None),
    ("surrogate-pair-ok", "/tokenize", b'{"content": "\\ud83c\\udf0d"}', (200,)),
    ("invalid-utf8", "/tokenize", b'{"content": "\xff\xfe\xc3"}', None),
    ("invalid-utf8-chat", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "\xed\xa0\x80"}], "max_tokens": 2}', None),
    ("schema-min-items-4e6", "/completion", {"prompt": "x", "n_predict": 2,
                                             "json_schema": {"type": "array", "minItems": 4000000}}, (400,)),
    ("schema-min-items-chat", "/v1/chat/completions", {
        "messages": CHAT, "max_tokens": 2, "response_format": {
            "type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "array", "minItems": 4000000}}}},
     (400,)),
    ("schema-min-length-huge", "/completion", {"prompt": "x", "n_predict": 2,
                                               "json_schema": {"type": "string", "minLength": 2**31}}, None),
    ("schema-nested-200", "/completion", {"prompt": "x", "n_predict": 2, "json_schema": _deep_schema(200)}, None),
    ("schema-bad-ref", "/completion", {"prompt": "x", "n_predict": 2,
                                       "json_schema": {"$ref": "#/definitions/nope"}}, None),
    ("schema-self-ref", "/completion", {"prompt": "x", "n_predict": 2, "json_schema": {
        "$ref": "#/definitions/a", "definitions": {"a": {"$ref": "#/definitions/a"}}}}, None),
    ("schema-not-an-object", "/completion", {"prompt": "x", "n_predict": 2, "json_schema": 5}, None),
    ("grammar-unparsable", "/completion", {"prompt": "x", "n_predict": 2, "grammar": "root ::= ("}, (400,)),
    ("grammar-repetition-huge", "/completion", {"prompt": "x", "n_predict": 2, "grammar": 'root ::= "a"{0,100000}'},
     None),
    ("grammar-left-recursion", "/completion", {"prompt": "x", "n_predict": 2, "grammar": 'root ::= root "a"'},
     (400,)),
    ("grammar-undefined-rule", "/completion", {"prompt": "x", "n_predict": 2, "grammar": "root ::= nope"}, (400,)),
    ("grammar-nested-parens", "/completion", {"prompt": "x", "n_predict": 2,
                                              "grammar": "root ::= " + "(" * 300 + '"a"' + ")" * 300}, None),
    ("grammar-empty", "/completion", {"prompt": "x", "n_predict": 2, "grammar": ""}, None),
    ("grammar-with-tools", "/v1/chat/completions", {
        "messages": CHAT, "max_tokens": 2, "grammar": 'root ::= "a"', "tool_choice": "required",
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}, None),
    ("truncated-chat", "/v1/chat/completions", b'{"messages": [{"role": "user", "cont', None),
    ("truncated-completion", "/completion", b'{"prompt": "Hi", "n_pre', None),
    ("empty-body", "/v1/chat/completions", b"", None),
    ("json-null", "/v1/chat/completions", b"null", None),
    ("json-array", "/completion", b"[1, 2]", None),
    ("json-number", "/tokenize", b"123", None),
    ("json-string", "/v1/messages", b'"hello"', None),
    ("trailing-garbage", "/tokenize", b'{"content": "a"} xyz', None),
    ("nan", "/completion", b'{"prompt": "x", "n_predict": 2, "temperature": NaN}', None),
    ("deep-json-array", "/tokenize", b'{"content": ' + b"[" * 5000 + b"]" * 5000 + b"}", None),
    ("messages-number", "/v1/chat/completions", {"messages": 5}, (400,)),
    ("content-object", "/v1/chat/completions", {"messages": [{"role": "user", "content": {"a": 1}}],
                                                "max_tokens": 2}, None),
    ("content-image-no-mmproj", "/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}], "max_tokens": 2}, None),
    ("max-tokens-negative", "/v1/chat/completions", {"messages": CHAT, "max_tokens": -5}, None),
    ("n-predict-string", "/completion", {"prompt": "x", "n_predict": "x"}, None),
    ("temperature-array", "/completion", {"prompt": "x", "n_predict": 2, "temperature": []}, None),
    ("n-probs-huge", "/completion", {"prompt": "x", "n_predict": 1, "n_probs": 10**9}, None),
    ("top-k-negative", "/completion", {"prompt": "x", "n_predict": 2, "top_k": -7}, None),
    ("n-keep-huge", "/completion", {"prompt": "x", "n_predict": 2, "n_keep": 10**9}, None),
    ("stop-number", "/completion", {"prompt": "x", "n_predict": 2, "stop": 5}, None),
    ("samplers-garbage", "/completion", {"prompt": "x", "n_predict": 2, "samplers": ["nope", 5]}, None),
    ("n-cmpl-many", "/v1/completions", {"prompt": "x", "max_tokens": 1, "n": 50}, None),
    ("id-slot-out-of-range", "/completion", {"prompt": "x", "n_predict": 2, "id_slot": 99}, None),
    ("lora-out-of-range", "/completion", {"prompt": "x", "n_predict": 2, "lora": [{"id": 99, "scale": 1}]}, None),
    ("lora-adapters-out-of-range", "/lora-adapters", [{"id": 99, "scale": 1.0}], None),
    ("slot-not-a-number", "/slots/abc?action=erase", {}, None),
    ("slot-out-of-range", "/slots/99?action=erase", {}, None),
    ("slot-negative", "/slots/-1?action=erase", {}, None),
    ("messages-missing", "/v1/messages", {"max_tokens": 2}, None),
    ("count-tokens-garbage", "/v1/messages/count_tokens", {"messages": [{"role": 5, "content": []}]}, None),
    ("responses-bad-input", "/v1/responses", {"input": [{"type": "function_call_output"}]}, None),
    ("infill-garbage-extra", "/infill", {"input_prefix": "a", "input_suffix": "b", "input_extra": [5]}, None),
    ("apply-template-tools-garbage", "/apply-template", {"messages": CHAT, "tools": [5, "x"]}, None),
    ("tool-call-args-not-json", "/v1/chat/completions", {"messages": [
        *CHAT, {"role": "assistant", "tool_calls": [{"id": "1", "type": "function",
                                                     "function": {"name": "f", "arguments": "{not json"}}]}],
        "max_tokens": 2}, None),
    ("prompt-too-long", "/completion", {"prompt": "word " * 3000, "n_predict": 2}, (400,)),
    ("detokenize-many", "/detokenize", {"tokens": list(range(49152))}, (200,)),
]


@pytest.mark.parametrize(("path", "body", "expected"), [t[1:] for t in TARGETED], ids=[t[0] for t in TARGETED])
def test_targeted_inputs(srv, seen_5xx, path, body, expected):
    raw = body if isinstance(body, bytes) else None
    r = _post(srv, path, None if raw is not None else body, raw)
    sent = raw if raw is not None else json.dumps(body).encode()
    judge(srv, f"POST {path} {sent[:120]!r}", r.status_code, r.content, seen_5xx)
    if expected is not None:
        assert r.status_code in expected, r.text[:500]
    if r.status_code >= 400:
        assert r.headers["content-type"].startswith("application/json"), r.headers
        assert r.json()["error"]["message"], r.text


def test_the_server_lives_and_serves_after_the_fuzzing(srv, seen_5xx):
    assert srv.proc.poll() is None
    r = httpx.post(srv.url + "/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2}, timeout=120)
    assert r.status_code == 200, r.text
    assert [s["is_processing"] for s in httpx.get(srv.url + "/slots", timeout=30).json()] == [False, False]
    assert "Traceback" not in srv.log()
    print(f"\n{len(seen_5xx)} answers were 5xx that stock llama-server gives too:")
    for what, status, message in seen_5xx:
        print(f"  {status} {message!r} <- {what[:160]}")
