"""The engine honours a real chat plan: Qwen3's template (llama.cpp's vendored one) through the chat
layer, on SmolLM2. With thinking off, the template leaves "<think>\\n\\n</think>\\n\\n" in the prompt and the
non-lazy grammar of a required tool call or a json_schema starts with it: the engine must prefill the
grammar with those tokens, else the model is forced to write them again.

Needs the chat binding (llama_vq.chat, server.chat_layer): skipped where they are not in the tree.
CPU cost: one engine, 4 greedy generations of <= 64 tokens.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from engine_support import run_one, start_engine

from server.engine import GenerationRequest, Sampling

chat_layer = pytest.importorskip("server.chat_layer", reason="the chat layer is not in this tree")

QWEN3 = (
    Path(__file__).resolve().parent.parent / "vendor" / "llama.cpp" / "models" / "templates" / "Qwen-Qwen3-0.6B.jinja"
)
USER = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city, in a unit",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
        },
    },
}
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
BODIES = {
    "required_tool": {"messages": USER, "tools": [WEATHER], "tool_choice": "required"},
    "json_schema": {
        "messages": USER,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}},
    },
}


@pytest.fixture(scope="module")
def engine(smollm2_path):
    e = start_engine(smollm2_path, "-c", "2048", "-np", "1")
    yield e
    e.shutdown()


@pytest.fixture(scope="module")
def layer(engine):
    from llama_vq.chat import ChatTemplates

    templates = ChatTemplates.from_llama(engine.llama, QWEN3.read_text(encoding="utf-8"))
    return chat_layer.ChatLayer(templates, chat_template_kwargs={"enable_thinking": False})


def _generate(engine, plan, grammar, **sampling):
    prompt = tuple(engine.tokenize(plan.prompt, plan.add_special, plan.parse_special))
    req = GenerationRequest(
        prompt,
        Sampling(temperature=0, **sampling),
        grammar=grammar,
        stop=plan.stop,
        max_tokens=64,
        render_special=plan.render_special,
        preserved_token_ids=plan.preserved_token_ids,
    )
    return run_one(engine, req)


def _parse(plan, text):
    stream = plan.new_stream()
    stream.feed(text)
    return stream.finish("stop")


@pytest.mark.parametrize("kind", sorted(BODIES))
def test_a_thinking_off_qwen3_plan_gives_grammar_valid_output(engine, layer, kind):
    plan = layer.plan(BODIES[kind])
    assert plan.grammar is not None and not plan.grammar.lazy
    assert plan.grammar.prefill_tokens, "this template's grammar starts inside the prompt: the case under test"
    _, text, done = _generate(engine, plan, plan.grammar)
    if kind == "json_schema":
        assert done.finish_reason == "stop", (text, done)
        message, _, _ = _parse(plan, text)
        assert isinstance(json.loads(message["content"])["n"], int), text
    else:  # the grammar allows parallel calls, which a 135M model repeats: the first one is checked
        end = text.index("</tool_call>") + len("</tool_call>")
        message, _, reason = _parse(plan, text[:end])
        assert reason == "tool_calls", text
        (call,) = message["tool_calls"]
        args = json.loads(call["function"]["arguments"])
        assert call["function"]["name"] == "get_weather" and args["unit"] in ("celsius", "fahrenheit"), text
        assert isinstance(args["city"], str)


def test_the_prefilled_grammar_cannot_open_a_second_reasoning_block(engine, layer):
    """The grammar allows an optional "<think>...</think>" before the JSON: prefilled with the prompt's
    block, it no longer does. A strong bias toward "<" shows the difference."""
    plan = layer.plan(BODIES["json_schema"])
    lt = engine.tokenize("<", False, False)[0]
    assert lt == plan.grammar.prefill_tokens[0]
    _, text, done = _generate(engine, plan, plan.grammar, logit_bias=((lt, 50.0),))
    assert done.finish_reason == "stop" and isinstance(json.loads(_parse(plan, text)[0]["content"])["n"], int), text
    unfilled = dataclasses.replace(plan.grammar, prefill_tokens=())
    assert _generate(engine, plan, unfilled, logit_bias=((lt, 50.0),))[1].startswith("<"), "the control failed"
