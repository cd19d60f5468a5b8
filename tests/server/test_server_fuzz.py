"""Fuzzing a real llama-vq-server (llama-server's engine) with SmolLM2: schemathesis over the server's own OpenAPI
document (its request bodies are the schemas of protocol.py), valid and schema-violating requests, then targeted
inputs (token ids out of range, lone surrogates, invalid UTF-8, huge and deeply nested JSON schemas and grammars,
truncated and invalid JSON, wrong types, out-of-range parameters).

What must hold: the process never dies, every answer is HTTP (no dropped connection), and no answer is a 5xx other
than a 501 for a feature that is off (embeddings, reranking, infill without FIM tokens, POST /props without
--props, audio without --mmproj), in llama-server's error shape: a client's mistake is a 4xx (patch
0020-server-client-errors-are-4xx).

CPU cost: one server, ~600 requests whose generations are capped at 4 tokens (-n 4, and the generated lengths
clamped); about two minutes on 2 cores.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from server_support import running

pytestmark = pytest.mark.slow

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis.core import NOT_SET  # noqa: E402
from schemathesis.generation.modes import GenerationMode  # noqa: E402

# the answers that are server errors by design: a feature that is off (llama-server's 501 not_supported_error)
ALLOWED_5XX = {501: "not_supported_error"}
# the routes whose request bodies the document must describe
MAIN_ROUTES = (
    "/v1/chat/completions",
    "/v1/completions",
    "/completion",
    "/infill",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/tokenize",
    "/detokenize",
    "/apply-template",
    "/v1/embeddings",
)
# generated lengths are clamped so that no request generates more than a few tokens
LENGTH_KEYS = ("max_tokens", "n_predict", "max_completion_tokens", "max_output_tokens", "n", "n_cmpl")
EXAMPLES_WITH_BODY = 30
EXAMPLES_OTHER = 2


@pytest.fixture(scope="module")
def srv(smollm2_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    flags = ("-np", "2", "-n", "4", "--metrics", "--slots", "--slot-save-path", str(d))
    with running(smollm2_path, *flags, log_dir=d) as s:
        yield s


@pytest.fixture(scope="module")
def seen_5xx() -> list[tuple[str, int, str]]:
    return []


def _clamp(body: Any) -> Any:
    if isinstance(body, dict):
        return {
            k: (min(v, 4) if k in LENGTH_KEYS and isinstance(v, int) and not isinstance(v, bool) else _clamp(v))
            for k, v in body.items()
        }
    if isinstance(body, list):
        return [_clamp(v) for v in body]
    return body


def judge(srv, what: str, status: int, content: bytes, seen: list) -> None:
    """The process lives; a 5xx is a 501 for a feature that is off, in llama-server's error shape."""
    assert srv.proc.poll() is None, f"the server died on {what}:\n{srv.log()[-4000:]}"
    if status < 500:
        return
    try:
        err = json.loads(content)["error"]
    except (ValueError, KeyError, TypeError):
        raise AssertionError(f"{what}: {status} that is not llama-server's error body: {content[:300]!r}") from None
    assert err.get("code") == status and isinstance(err.get("message"), str), (what, err)
    assert ALLOWED_5XX.get(status) == err.get("type"), f"{what}: {status} {err['message'][:300]!r}"
    seen.append((what, status, err["message"][:120]))


def _document(srv) -> dict:
    doc = httpx.get(srv.url + "/openapi.json", timeout=30).json()
    doc["servers"] = [{"url": srv.url}]
    return doc


def test_the_openapi_document_declares_request_bodies_and_path_parameters(srv):
    doc = _document(srv)
    schemas = doc["components"]["schemas"]
    for path in MAIN_ROUTES:
        body = doc["paths"][path]["post"]["requestBody"]
        ref = body["content"]["application/json"]["schema"]["$ref"]
        assert body["required"] and ref.rsplit("/", 1)[1] in schemas, (path, body)
    assert schemas["ChatCompletionRequest"]["required"] == ["messages"]
    assert schemas["MessagesRequest"]["required"] == ["messages", "max_tokens"]
    slot = doc["paths"]["/slots/{id_slot}"]["post"]
    assert {(p["name"], p["in"], p["required"]) for p in slot["parameters"]} == {
        ("id_slot", "path", True),
        ("action", "query", True),
    }
    upload = doc["paths"]["/v1/audio/transcriptions"]["post"]["requestBody"]["content"]["multipart/form-data"]
    assert upload["schema"]["required"] == ["file"]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
def test_schemathesis_over_the_openapi_document(srv, seen_5xx, mode):
    schema = schemathesis.openapi.from_dict(_document(srv))
    operations = [r.ok() for r in schema.get_all_operations()]
    paths = {op.path for op in operations}
    assert {"/v1/chat/completions", "/completion", "/tokenize", "/v1/messages"} <= paths, paths
    client = httpx.Client(base_url=srv.url, timeout=120)
    counts: dict[str, int] = {}
    for op in operations:
        if op.path != "/metrics":  # not the engine's answer alone; parsed in test_server_api
            _fuzz_operation(srv, client, op, mode, counts, seen_5xx)
    client.close()
    print(f"\nschemathesis ({mode.value}): {sum(counts.values())} requests: {counts}")
    assert sum(counts.values()) >= 200, counts
    assert httpx.get(srv.url + "/health", timeout=30).status_code == 200


def _fuzz_operation(srv, client: httpx.Client, op, mode, counts: dict[str, int], seen: list) -> None:  # noqa: ANN001
    has_body = bool(op.body)
    n = EXAMPLES_WITH_BODY if has_body else EXAMPLES_OTHER

    @settings(max_examples=n, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy(generation_mode=mode))
    def run(case) -> None:  # noqa: ANN001
        kwargs: dict[str, Any] = {"params": case.query or None}
        headers = {k: str(v) for k, v in (case.headers or {}).items()}
        body = None if case.body is NOT_SET else case.body
        if case.media_type == "multipart/form-data" and isinstance(body, dict):
            kwargs["files"] = {k: (k, v if isinstance(v, bytes) else str(v).encode()) for k, v in body.items()}
        elif has_body:
            body = _clamp(body)
            kwargs["content"] = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers["content-type"] = "application/json"
        kwargs["headers"] = headers or None
        what = f"{op.method.upper()} {case.formatted_path} {str(kwargs.get('content', ''))[:200]}"
        r = client.request(op.method.upper(), case.formatted_path, **kwargs)
        counts[op.path] = counts.get(op.path, 0) + 1
        judge(srv, what, r.status_code, r.content, seen)

    try:
        run()
    except Unsatisfiable:
        # nothing of this operation can violate the document (a GET without parameters): no invalid request exists
        assert mode == GenerationMode.NEGATIVE and not has_body, op.path


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
    (
        "chat-logit-bias-out-of-vocab",
        "/v1/chat/completions",
        {"messages": CHAT, "max_tokens": 2, "logit_bias": {"999999999": 5}},
        None,
    ),
    (
        "completion-logit-bias-pairs",
        "/completion",
        {"prompt": "Hi", "n_predict": 2, "logit_bias": [[999999999, 5], [-3, 1]]},
        None,
    ),
    ("lone-surrogate-escape", "/tokenize", b'{"content": "\\ud800"}', None),
    (
        "lone-low-surrogate",
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "a\\udc00b"}], "max_tokens": 2}',
        None,
    ),
    ("surrogate-pair-ok", "/tokenize", b'{"content": "\\ud83c\\udf0d"}', (200,)),
    ("invalid-utf8", "/tokenize", b'{"content": "\xff\xfe\xc3"}', None),
    (
        "invalid-utf8-chat",
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "\xed\xa0\x80"}], "max_tokens": 2}',
        None,
    ),
    (
        "schema-min-items-4e6",
        "/completion",
        {"prompt": "x", "n_predict": 2, "json_schema": {"type": "array", "minItems": 4000000}},
        (400,),
    ),
    (
        "schema-min-items-chat",
        "/v1/chat/completions",
        {
            "messages": CHAT,
            "max_tokens": 2,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "a", "schema": {"type": "array", "minItems": 4000000}},
            },
        },
        (400,),
    ),
    (
        "schema-min-length-huge",
        "/completion",
        {"prompt": "x", "n_predict": 2, "json_schema": {"type": "string", "minLength": 2**31}},
        None,
    ),
    ("schema-nested-200", "/completion", {"prompt": "x", "n_predict": 2, "json_schema": _deep_schema(200)}, None),
    (
        "schema-bad-ref",
        "/completion",
        {"prompt": "x", "n_predict": 2, "json_schema": {"$ref": "#/definitions/nope"}},
        None,
    ),
    (
        "schema-self-ref",
        "/completion",
        {
            "prompt": "x",
            "n_predict": 2,
            "json_schema": {"$ref": "#/definitions/a", "definitions": {"a": {"$ref": "#/definitions/a"}}},
        },
        None,
    ),
    ("schema-not-an-object", "/completion", {"prompt": "x", "n_predict": 2, "json_schema": 5}, None),
    ("grammar-unparsable", "/completion", {"prompt": "x", "n_predict": 2, "grammar": "root ::= ("}, (400,)),
    (
        "grammar-repetition-huge",
        "/completion",
        {"prompt": "x", "n_predict": 2, "grammar": 'root ::= "a"{0,100000}'},
        None,
    ),
    ("grammar-left-recursion", "/completion", {"prompt": "x", "n_predict": 2, "grammar": 'root ::= root "a"'}, (400,)),
    ("grammar-undefined-rule", "/completion", {"prompt": "x", "n_predict": 2, "grammar": "root ::= nope"}, (400,)),
    (
        "grammar-nested-parens",
        "/completion",
        {"prompt": "x", "n_predict": 2, "grammar": "root ::= " + "(" * 300 + '"a"' + ")" * 300},
        None,
    ),
    ("grammar-empty", "/completion", {"prompt": "x", "n_predict": 2, "grammar": ""}, None),
    (
        "grammar-with-tools",
        "/v1/chat/completions",
        {
            "messages": CHAT,
            "max_tokens": 2,
            "grammar": 'root ::= "a"',
            "tool_choice": "required",
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        },
        None,
    ),
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
    (
        "content-object",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": {"a": 1}}], "max_tokens": 2},
        None,
    ),
    (
        "content-image-no-mmproj",
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}
            ],
            "max_tokens": 2,
        },
        None,
    ),
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
    (
        "tool-call-args-not-json",
        "/v1/chat/completions",
        {
            "messages": [
                *CHAT,
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{not json"}}
                    ],
                },
            ],
            "max_tokens": 2,
        },
        None,
    ),
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
    print(f"\n{len(seen_5xx)} answers were 501s (a feature that is off):")
    for what, status, message in seen_5xx:
        print(f"  {status} {message!r} <- {what[:160]}")
