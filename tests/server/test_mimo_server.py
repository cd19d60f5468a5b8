"""MiMo-V2-Flash's tool calls and thinking end to end through llama-vq-server, with the official openai and anthropic
clients: the tiny MiMo-shaped model carrying the template (tests/data/mimo-v2-flash.jinja) in its GGUF, MiMo's
markup single tokens of its vocabulary.

The weights are random, so the model is steered by logit biases 30 apart (random logits differ by a few units):
<tool_call> +60 opens a call, and the chat grammar (lazy under tool_choice "auto", from the first token under
"required" or a named function) writes the rest of it, an integer parameter whose schema allows one value;
</tool_call> +30 closes it with that token, and the end-of-generation token +90 ends the answer there, where the
grammar first allows it (else its parallel calls let the model spell a next "<tool_call>" out of smaller tokens).
The server starts with these biases (-l), which Anthropic requests cannot carry; an OpenAI request's own
logit_bias replaces them (without the end's: under "auto" the grammar is not active before the call opens). A
call inside <think> comes from an assistant message that ends in reasoning, which the model continues
(llama-server's assistant prefill). A named tool_choice is offered with another tool first in the list. What is
tested is everything after the sampler: the parser, the APIs' shapes, streaming, the rendering of multi-turn agent
loops, the front end's request changes (llama_vq/server/chat_requests.py).

CPU cost: one server (~2 s to load), ~20 generations of <= 64 tokens over ~300-600-token prompts (mostly cached).
"""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest
from chat_support import merge_deltas
from mimo_support import call, mimo_template, token_ids, write_mimo_chat_gguf
from server_support import openai_client, running

from llama_vq import ChatTemplates

pytestmark = pytest.mark.slow

PARAMS = {"type": "object", "properties": {"offset": {"type": "integer", "enum": [9]}}, "required": ["offset"]}
TOOL = {"type": "function", "function": {"name": "get_time", "description": "Time in a city", "parameters": PARAMS}}
OTHER = {"type": "function", "function": {"name": "get_date", "description": "Date in a city", "parameters": PARAMS}}
Q = {"role": "user", "content": "What time is it in Tokyo?"}
CALLED = [("get_time", {"offset": 9})]
MAX = 64
OFF = {"chat_template_kwargs": {"enable_thinking": False}}
OPEN_CALL = {"<tool_call>": 60, "</tool_call>": 30}  # an OpenAI request's own bias: no longer favours the end
# an assistant turn that ends in reasoning: the model continues it inside <think>
THINKING = {"role": "assistant", "content": "", "reasoning_content": "I need the time."}


@pytest.fixture(scope="module")
def srv(llama_vq, smollm2_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("mimo-server")
    model = write_mimo_chat_gguf(d, smollm2_path)
    ids = token_ids(model)
    bias = ["-l", f"{ids['<tool_call>']}+60", "-l", f"{ids['</tool_call>']}+30", "-l", f"{ids['eos']}+90"]
    with running(model, "--alias", "mimo", "--jinja", "--ctx-size", "4096", "--threads", "2", *bias, log_dir=d) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    return openai_client(srv)


@pytest.fixture(scope="module")
def claude(srv):
    return anthropic.Anthropic(base_url=srv.url, api_key="not-needed", max_retries=0, timeout=120)


def _chat(client, messages=(Q,), **kw):
    base = {"model": "mimo", "messages": list(messages), "tools": [TOOL], "max_tokens": MAX, "temperature": 0}
    return client.chat.completions.create(**{**base, "parallel_tool_calls": False, **kw})


def _calls(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


def _prompt(srv, messages, **fields) -> str:
    r = httpx.post(srv.url + "/apply-template", json={"messages": messages, "tools": [TOOL], **fields}, timeout=60)
    r.raise_for_status()
    return r.json()["prompt"]


# ---- the template, from the GGUF --------------------------------------------------------------------------


def test_the_server_serves_the_template_its_gguf_carries(srv):
    props = httpx.get(srv.url + "/props", timeout=30).json()
    assert props["chat_template"] == mimo_template().rstrip("\n")
    history = [Q, {**THINKING, "tool_calls": [_call_dict("c1")]}, _result("c1")]
    local = ChatTemplates(template=mimo_template(), eos_token="<|im_end|>")
    assert _prompt(srv, history) == local.apply({"messages": history, "tools": [TOOL]}).prompt


def _call_dict(call_id: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": "get_time", "arguments": '{"offset": 9}'}}


def _result(call_id: str, text: str = "14:05 JST") -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


# ---- OpenAI chat completions ------------------------------------------------------------------------------

CHOICES = {
    "auto": {"tool_choice": "auto", "logit_bias": OPEN_CALL},
    "required": {"tool_choice": "required"},
    "named": {"tool_choice": {"type": "function", "function": {"name": "get_time"}}, "tools": [OTHER, TOOL]},
}


@pytest.mark.parametrize("choice", list(CHOICES))
def test_openai_chat_returns_mimos_call_under_each_tool_choice_streamed_or_not(client, choice):
    r = _chat(client, **CHOICES[choice], extra_body=OFF)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls", r
    assert _calls(msg) == CALLED and msg.tool_calls[0].id and not msg.content
    chunks = list(_chat(client, **CHOICES[choice], extra_body=OFF, stream=True))
    deltas = [c.choices[0].delta.model_dump(exclude_none=True) for c in chunks if c.choices]
    merged = merge_deltas(deltas)
    assert [(c["name"], json.loads(c["arguments"])) for c in merged["tool_calls"]] == CALLED
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_a_named_tool_choice_that_names_no_tool_is_a_400(srv):
    for path, body in (
        ("/v1/chat/completions", {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
        ("/v1/responses", {"tools": [R_TOOL], "tool_choice": {"type": "function", "name": "nope"}}),
        ("/v1/messages", {"tools": [A_TOOL], "tool_choice": {"type": "tool", "name": "nope"}, "max_tokens": 8}),
    ):
        msg = {"input": "Hi"} if "responses" in path else {"messages": [Q]}
        r = httpx.post(srv.url + path, json={**msg, **body}, timeout=60)
        assert r.status_code == 400 and "'nope'" in r.json()["error"]["message"], (path, r.text)


def test_a_call_inside_think_is_a_call_and_the_reasoning_stays_reasoning(client):
    r = _chat(client, [Q, THINKING], tool_choice="auto", logit_bias=OPEN_CALL)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    assert _calls(msg) == CALLED
    assert msg.model_extra["reasoning_content"] == "I need the time." and not msg.content
    chunks = list(_chat(client, [Q, THINKING], tool_choice="auto", logit_bias=OPEN_CALL, stream=True))
    merged = merge_deltas([c.choices[0].delta.model_dump(exclude_none=True) for c in chunks if c.choices])
    assert merged["reasoning_content"] == "I need the time." and merged["content"] == ""
    assert [(c["name"], json.loads(c["arguments"])) for c in merged["tool_calls"]] == CALLED


# ---- Responses API ----------------------------------------------------------------------------------------

R_TOOL = {"type": "function", "name": "get_time", "description": "Time in a city", "parameters": PARAMS}
R_OTHER = {**R_TOOL, "name": "get_date", "description": "Date in a city"}


def test_responses_api_returns_the_named_function_call_item_streamed_or_not(client):
    kw = dict(
        model="mimo",
        input="What time is it in Tokyo?",
        tools=[R_OTHER, R_TOOL],
        tool_choice={"type": "function", "name": "get_time"},
        max_output_tokens=MAX,
        parallel_tool_calls=False,
        extra_body=OFF,
    )
    r = client.responses.create(**kw)
    calls = [o for o in r.output if o.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == CALLED and calls[0].call_id
    events = list(client.responses.create(**kw, stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"]
    assert json.loads(deltas) == {"offset": 9}
    assert [(i.name, json.loads(i.arguments)) for i in done] == CALLED
    assert events[-1].type == "response.completed"


# ---- Anthropic Messages -----------------------------------------------------------------------------------

A_TOOL = {"name": "get_time", "description": "Time in a city", "input_schema": PARAMS}
A_OTHER = {**A_TOOL, "name": "get_date", "description": "Date in a city"}
A_Q = {"role": "user", "content": "What time is it in Tokyo?"}


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_time"}], ids=["any", "tool"])
def test_anthropic_messages_return_a_tool_use_block_streamed_or_not(claude, choice):
    kw = dict(
        model="mimo",
        max_tokens=MAX,
        messages=[A_Q],
        tools=[A_OTHER, A_TOOL] if choice["type"] == "tool" else [A_TOOL],
        tool_choice=choice,
        thinking={"type": "disabled"},
    )
    m = claude.messages.create(**kw)
    assert m.stop_reason == "tool_use", m
    uses = [b for b in m.content if b.type == "tool_use"]
    assert [(b.name, b.input) for b in uses] == CALLED and uses[0].id
    with claude.messages.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_message()
    partial = "".join(
        e.delta.partial_json for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    )
    assert json.loads(partial) == {"offset": 9}
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == CALLED


# ---- thinking on and off per request ----------------------------------------------------------------------


def test_thinking_is_switched_per_request_in_every_api(srv, client, claude):
    """Off adds the template's empty <think></think> (two tokens) after the generation prompt; on adds nothing."""

    def chat_tokens(**kw) -> int:
        return _chat(client, tools=None, max_tokens=1, logit_bias={}, **kw).usage.prompt_tokens

    on = chat_tokens()  # llama-server's default (--reasoning auto): on, as the template can think
    assert chat_tokens(extra_body={"chat_template_kwargs": {"enable_thinking": True}}) == on
    assert chat_tokens(extra_body=OFF) == on + 2
    assert chat_tokens(reasoning_effort="none") == on + 2
    assert _prompt(srv, [Q], **OFF).endswith("<|im_start|>assistant\n<think></think>")

    def responses_tokens(**kw) -> int:
        r = client.responses.create(model="mimo", input=Q["content"], max_output_tokens=1, **kw)
        return r.usage.input_tokens

    assert responses_tokens(reasoning={"effort": "none"}) == responses_tokens() + 2

    def claude_tokens(**kw) -> int:
        return claude.messages.count_tokens(model="mimo", messages=[A_Q], **kw).input_tokens

    assert claude_tokens(thinking={"type": "enabled", "budget_tokens": 1024}) == claude_tokens()
    assert claude_tokens(thinking={"type": "disabled"}) == claude_tokens() + 2
    # the client's own chat_template_kwargs win over thinking
    assert claude_tokens(
        thinking={"type": "disabled"}, extra_body={"chat_template_kwargs": {"enable_thinking": True}}
    ) == (claude_tokens())


# ---- multi-turn agent loops -------------------------------------------------------------------------------


def test_an_openai_agent_loop_keeps_reasoning_calls_and_results_over_rounds(srv, client):
    """Each round: the model calls (inside <think>), the client sends back its reasoning_content and tool_calls
    with the tool's result (as MiMo's API asks), and the next round's prompt renders them all."""
    history = [Q]
    for rnd in range(3):
        r = _chat(client, [*history, THINKING], tool_choice="auto", logit_bias=OPEN_CALL)
        msg = r.choices[0].message
        assert _calls(msg) == CALLED, (rnd, msg)
        turn = msg.model_dump(exclude_none=True)
        assert turn["reasoning_content"] == "I need the time."
        history += [turn, _result(msg.tool_calls[0].id, f"result {rnd}")]
    prompt = _prompt(srv, history)
    rendered = f"<think>I need the time.</think>{call('get_time', offset=9)}<|im_end|><|im_start|>tool\n"
    assert prompt.count(rendered) == 3, prompt
    for rnd in range(3):
        assert f"<tool_response>\nresult {rnd}\n</tool_response>\n<|im_end|>" in prompt


def test_an_anthropic_agent_turn_renders_as_the_openai_one(srv, claude):
    """thinking + tool_use blocks, then a tool_result: the same prompt as reasoning_content + tool_calls + a tool
    message (counted in tokens), with the reasoning in it."""
    turn = [
        {"type": "thinking", "thinking": "I need the time.", "signature": ""},
        {"type": "tool_use", "id": "c1", "name": "get_time", "input": {"offset": 9}},
    ]
    result = [{"type": "tool_result", "tool_use_id": "c1", "content": "14:05 JST"}]
    messages = [A_Q, {"role": "assistant", "content": turn}, {"role": "user", "content": result}]
    n = claude.messages.count_tokens(model="mimo", messages=messages, tools=[A_TOOL]).input_tokens
    openai_prompt = _prompt(srv, [Q, {**THINKING, "tool_calls": [_call_dict("c1")]}, _result("c1")])
    assert "<think>I need the time.</think><tool_call>" in openai_prompt
    tokens = httpx.post(srv.url + "/tokenize", json={"content": openai_prompt, "with_pieces": False}, timeout=60)
    assert n == len(tokens.json()["tokens"])
    without = claude.messages.count_tokens(
        model="mimo", messages=[A_Q, {"role": "assistant", "content": turn[1:]}, messages[2]], tools=[A_TOOL]
    ).input_tokens
    assert without < n, "the thinking block is rendered"
