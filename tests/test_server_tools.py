"""Tool calls, reasoning and templates over HTTP through llama.cpp's chat layer (issue 9 item 2, 5).

A real llama-vq-server with SmolLM2 and a vendored llama.cpp template that renders tools (Qwen3: Hermes
``<tool_call>`` JSON, reads ``enable_thinking``); the official openai client as agents use it.

CPU cost: one server (~2 s to load), ~15 generations of <= 96 tokens; 15-40 s on 2 cores.
"""

from __future__ import annotations

import json

import httpx
import pytest
from conftest import ROOT
from server_support import openai_client, running, sse_events

pytestmark = pytest.mark.slow

QWEN3 = ROOT / "vendor" / "llama.cpp" / "models" / "templates" / "Qwen-Qwen3-0.6B.jinja"
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {
                "type": "object",
                "required": ["city"],
                "additionalProperties": False,
                "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Current time in a time zone",
            "parameters": {
                "type": "object",
                "required": ["zone", "hours24"],
                "additionalProperties": False,
                "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}, "hours24": {"type": "boolean"}},
            },
        },
    },
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris, and the time in CET?"}]


def satisfies(schema: dict, args: dict) -> bool:
    """The schema subset TOOLS use: object, required, no additional properties, enum, string, boolean."""
    props = schema["properties"]
    if set(schema["required"]) - set(args) or set(args) - set(props):
        return False
    for k, v in args.items():
        p = props[k]
        if p["type"] == "string" and not (isinstance(v, str) and v in p.get("enum", [v])):
            return False
        if p["type"] == "boolean" and not isinstance(v, bool):
            return False
    return True


@pytest.fixture(scope="module")
def srv(smollm2_path, tmp_path_factory):
    with running(smollm2_path, "--alias", "smol", "--chat-template-file", str(QWEN3), "--sse-keepalive", "0.02",
                 "-ub", "16", "-b", "16", log_dir=tmp_path_factory.mktemp("tools")) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    return openai_client(srv)


def _create(client, **kw):
    # parallel_tool_calls false: a 135M model under a grammar that allows several calls repeats them
    base = {"model": "smol", "messages": ASK, "tools": TOOLS, "max_tokens": 96, "temperature": 0,
            "parallel_tool_calls": False, "extra_body": NO_THINK}
    return client.chat.completions.create(**{**base, **kw})


@pytest.fixture(scope="module")
def required(client):
    """One non-streamed `required` answer, the reference of the streamed tests (grammar steps are slow)."""
    return _create(client, tool_choice="required")


def _calls(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


def test_required_with_two_tools_returns_calls_whose_arguments_satisfy_the_schemas(required):
    choice = required.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = _calls(choice.message)
    assert len(calls) == 1 and all(name in SCHEMAS and satisfies(SCHEMAS[name], args) for name, args in calls), calls
    assert all(c.id for c in choice.message.tool_calls)


def test_streamed_tool_call_deltas_concatenate_to_the_non_streamed_calls(client, required):
    whole = required.choices[0].message
    chunks = list(_create(client, tool_choice="required", stream=True))
    by_index: dict[int, dict] = {}
    for c in chunks:
        for tc in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            d = by_index.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            d["id"] = d["id"] or tc.id
            d["name"] += (tc.function.name or "") if tc.function else ""
            d["arguments"] += (tc.function.arguments or "") if tc.function else ""
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    streamed = [(d["name"], d["arguments"]) for _, d in sorted(by_index.items())]
    assert streamed == [(c.function.name, c.function.arguments) for c in whole.tool_calls]
    assert all(d["id"] for d in by_index.values())


def test_named_tool_choice_calls_that_tool(client):
    r = _create(client, tool_choice={"type": "function", "function": {"name": "get_time"}})
    calls = _calls(r.choices[0].message)
    assert r.choices[0].finish_reason == "tool_calls" and [n for n, _ in calls] == ["get_time"], r.choices[0]
    assert all(satisfies(SCHEMAS["get_time"], a) for _, a in calls)


def test_parallel_tool_calls_lets_the_model_call_several(client):
    r = _create(client, tool_choice={"type": "function", "function": {"name": "get_time"}}, parallel_tool_calls=True)
    calls = r.choices[0].message.tool_calls or []  # this model repeats the call until max_tokens
    assert len(calls) > 1, r.choices[0]
    for c in calls[:-1]:  # the last one may be cut by max_tokens
        assert c.function.name == "get_time" and satisfies(SCHEMAS["get_time"], json.loads(c.function.arguments))


def test_tool_choice_none_and_auto_answer_without_errors(client):
    r = _create(client, tool_choice="none", max_tokens=8)
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason in ("stop", "length")
    r = _create(client, tool_choice="auto", max_tokens=32)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    if r.choices[0].finish_reason == "tool_calls":
        assert all(satisfies(SCHEMAS[n], a) for n, a in _calls(r.choices[0].message))


def test_openai_streaming_helper_with_tools_works_unchanged(client, required):
    whole = required.choices[0].message
    with client.chat.completions.stream(model="smol", messages=ASK, tools=TOOLS, tool_choice="required",
                                        parallel_tool_calls=False, max_tokens=96, temperature=0,
                                        extra_body=NO_THINK) as stream:
        kinds = {event.type for event in stream}
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.done" in kinds, kinds
    assert _calls(final.choices[0].message) == _calls(whole)


def test_tool_results_in_history_are_rendered_and_answered(srv, client):
    history = [
        *ASK,
        {"role": "assistant", "content": None, "reasoning_content": "The user wants weather.",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "clear"}'},
    ]
    prompt = httpx.post(srv.url + "/apply-template", json={"messages": history, "tools": TOOLS}).json()["prompt"]
    assert '<tool_response>\n{"sky": "clear"}\n</tool_response>' in prompt
    assert '"name": "get_weather"' in prompt and "The user wants weather." in prompt
    r = client.chat.completions.create(model="smol", messages=history, tools=TOOLS, max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
            "a": {"$ref": "#/definitions/missing"}}}}}], "tool_choice": "required"}, "tools[0].function.parameters"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice.function.name"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ],
)
def test_bad_tools_and_history_are_400s_naming_the_field_and_the_worker_lives(srv, body, param):
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        r = c.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 4, **body})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param, r.json()
        assert c.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 2}).status_code == 200


def test_stream_sends_headers_and_keepalives_while_the_prompt_is_processed(srv):
    long_prompt = " ".join(["The quick brown fox jumps over the lazy dog."] * 60)  # ~600 tokens, 16 per ubatch
    body = {"messages": [{"role": "user", "content": long_prompt}], "max_tokens": 2, "stream": True}
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    first_data = next(i for i, ln in enumerate(lines) if ln.startswith("data: "))
    events = sse_events(lines)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"  # sent before the prompt was processed
    content_at = next(i for i, ln in enumerate(lines) if i > first_data and ln.startswith("data: "))
    assert any(ln == ": keepalive" for ln in lines[first_data:content_at]), lines[:8]
    assert events[-1] == "[DONE]" and "timings" in events[-2]


# The model's thinking forced by a request grammar (a 135M model does not think on its own); the
# template's parser splits it off as it would a real model's.
THINK = r'root ::= "<think>\nI should greet.\n</think>\n\nHello!"'


def test_reasoning_content_is_split_off_streamed_and_not(srv):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 40, "temperature": 0, "grammar": THINK,
            "chat_template_kwargs": {"enable_thinking": True}}
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        msg = c.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
        assert msg["content"] == "Hello!" and msg["reasoning_content"].strip() == "I should greet.", msg
        with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
            events = [e for e in sse_events(r.iter_lines()) if e != "[DONE]"]
        deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
        assert "".join(d.get("reasoning_content", "") for d in deltas) == msg["reasoning_content"]
        assert "".join(d.get("content", "") for d in deltas) == "Hello!"
        kept = c.post("/v1/chat/completions", json={**body, "reasoning_format": "none"}).json()
        assert "<think>" in kept["choices"][0]["message"]["content"]
        assert "reasoning_content" not in kept["choices"][0]["message"]
