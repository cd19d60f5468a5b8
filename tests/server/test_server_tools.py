"""Tool calls and reasoning through llama-server's chat layer, with the official openai and anthropic clients, on a
real llama-vq-server with SmolLM2 and a vendored llama.cpp template that renders tools (Qwen3: Hermes
``<tool_call>`` JSON).

A 135M model does not call tools on its own, and llama-server's `required` grammar lets content come before the
call; one earlier call in the history (the conversation's first turn) is what makes SmolLM2 answer the second
question with a call, at temperature 0. The grammar then makes the call's arguments valid for the schema.

CPU cost: one server (~2 s to load), ~12 generations of <= 40 tokens over ~230-token prompts (mostly cached).
"""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest
from conftest import ROOT
from server_support import openai_client, running, sse_events

pytestmark = pytest.mark.slow

QWEN3 = ROOT / "vendor" / "llama.cpp" / "models" / "templates" / "Qwen-Qwen3-0.6B.jinja"
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Get the weather of a city", "parameters": PARAMS},
    }
]
ASK = [
    {"role": "user", "content": "Weather in Rome?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}
        ],
    },
    {"role": "user", "content": "Weather in Paris?"},
]
# the same conversation in Anthropic's form
A_TOOLS = [{"name": "get_weather", "description": "Get the weather of a city", "input_schema": PARAMS}]
A_ASK = [
    {"role": "user", "content": "Weather in Rome?"},
    {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "c0", "name": "get_weather", "input": {"city": "Rome"}}],
    },
    {"role": "user", "content": "Weather in Paris?"},
]
MAX = 40


@pytest.fixture(scope="module")
def srv(smollm2_path, tmp_path_factory):
    if not QWEN3.is_file():
        pytest.fail(f"{QWEN3} is missing: run `python tools/vendor.py fetch` (scripts/run.sh does)")
    with running(
        smollm2_path,
        "--alias",
        "smol",
        "--jinja",
        "--chat-template-file",
        str(QWEN3),
        log_dir=tmp_path_factory.mktemp("tools"),
    ) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    return openai_client(srv)


@pytest.fixture(scope="module")
def claude(srv):
    return anthropic.Anthropic(base_url=srv.url, api_key="not-needed", max_retries=0, timeout=120)


def _create(client, **kw):
    base = {"model": "smol", "messages": ASK, "tools": TOOLS, "max_tokens": MAX, "temperature": 0}
    return client.chat.completions.create(**{**base, **kw})


@pytest.fixture(scope="module")
def required(client):
    """One non-streamed `required` answer, the reference of the streamed tests."""
    return _create(client, tool_choice="required")


def _calls(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


# ---- OpenAI -----------------------------------------------------------------------------------------


def test_required_tool_choice_returns_a_call_whose_arguments_satisfy_the_schema(required):
    choice = required.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert _calls(choice.message) == [("get_weather", {"city": "Paris"})], choice.message
    assert all(c.id and c.type == "function" for c in choice.message.tool_calls)
    assert not choice.message.content


def test_streamed_tool_call_deltas_concatenate_to_the_non_streamed_call(client, required):
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
    streamed = [(d["name"], json.loads(d["arguments"])) for _, d in sorted(by_index.items())]
    assert streamed == _calls(whole)
    assert all(d["id"] for d in by_index.values())


def test_openai_streaming_helper_with_tools(client, required):
    with client.chat.completions.stream(
        model="smol", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=MAX, temperature=0
    ) as stream:
        kinds = {event.type for event in stream}
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.done" in kinds, kinds
    assert _calls(final.choices[0].message) == _calls(required.choices[0].message)


def test_tool_choice_none_answers_with_text(client):
    r = _create(client, tool_choice="none", max_tokens=8)
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason in ("stop", "length")


def test_tool_results_in_history_are_rendered(srv):
    history = [
        *ASK[:2],
        {"role": "tool", "tool_call_id": "c0", "content": '{"sky": "clear"}'},
    ]
    r = httpx.post(srv.url + "/apply-template", json={"messages": history, "tools": TOOLS}, timeout=60)
    prompt = r.json()["prompt"]
    assert '<tool_response>\n{"sky": "clear"}\n</tool_response>' in prompt
    assert '"name": "get_weather"' in prompt and '<tool_call>\n{"name": "get_weather", "arguments"' in prompt


# ---- Anthropic ----------------------------------------------------------------------------------------


def test_anthropic_messages_with_tools_return_a_tool_use_block(claude):
    m = claude.messages.create(
        model="smol",
        max_tokens=MAX,
        messages=A_ASK,
        tools=A_TOOLS,
        tool_choice={"type": "any"},
        extra_body={"temperature": 0},
    )
    assert m.stop_reason == "tool_use", m
    uses = [b for b in m.content if b.type == "tool_use"]
    assert [(b.name, b.input) for b in uses] == [("get_weather", {"city": "Paris"})] and uses[0].id


def test_anthropic_streamed_tool_use_equals_the_non_streamed_one(claude):
    kw = dict(
        model="smol",
        max_tokens=MAX,
        messages=A_ASK,
        tools=A_TOOLS,
        tool_choice={"type": "any"},
        extra_body={"temperature": 0},
    )
    with claude.messages.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_message()
    deltas = [
        e.delta.partial_json for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    assert deltas and json.loads("".join(deltas)) == {"city": "Paris"}
    assert final.stop_reason == "tool_use"
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [("get_weather", {"city": "Paris"})]


def test_anthropic_count_tokens_with_tools_is_the_openai_prompt(claude, client):
    n = claude.messages.count_tokens(model="smol", messages=A_ASK, tools=A_TOOLS).input_tokens
    r = _create(client, max_tokens=1)
    assert n == r.usage.prompt_tokens > 100  # the tools' description is part of the prompt
    assert claude.messages.count_tokens(model="smol", messages=A_ASK).input_tokens < n


# ---- reasoning ----------------------------------------------------------------------------------------

# The model's thinking forced by a request grammar (a 135M model does not think on its own); the template's
# parser splits it off as it would a real model's.
THINK = r'root ::= "<think>\nI should greet.\n</think>\n\nHello!"'


def test_reasoning_content_is_split_off_streamed_and_not(srv):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 24, "temperature": 0, "grammar": THINK}
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        msg = c.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
        assert msg["content"] == "Hello!" and msg["reasoning_content"].strip() == "I should greet.", msg
        with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
            events = [e for e in sse_events(r.iter_lines()) if e != "[DONE]"]
        deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
        assert "".join(d.get("reasoning_content") or "" for d in deltas) == msg["reasoning_content"]
        assert "".join(d.get("content") or "" for d in deltas) == "Hello!"
        kept = c.post("/v1/chat/completions", json={**body, "reasoning_format": "none"}).json()
        assert "<think>" in kept["choices"][0]["message"]["content"]


def test_grammar_with_tools_is_refused_and_the_server_lives(srv):
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        r = c.post(
            "/v1/chat/completions",
            json={
                "messages": ASK,
                "tools": TOOLS,
                "tool_choice": "required",
                "grammar": 'root ::= "x"',
                "max_tokens": 2,
            },
        )
        assert 400 <= r.status_code < 600 and r.json()["error"]["message"], r.text
        assert c.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 2}).status_code == 200
