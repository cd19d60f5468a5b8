"""MiMo-V2-Flash's chat format as test data (tests/data/mimo-v2-flash.jinja, each rule's source in its header),
rendered by llama.cpp's chat layer: its turns and special tokens, the default system text, tools in the system
turn, assistant turns with <think> reasoning and calls in MiMo's markup, tool results, and the thinking switch.
Loaded by ``llama_vq.Llama(chat_template=...)`` and from a MiMo-shaped GGUF that carries it (the server's side:
tests/server/test_mimo_server.py).

CPU cost: the tiny MiMo-shaped model (twice: with and without the template in the file), two forced generations
of < 40 tokens over ~400-token prompts.
"""

from __future__ import annotations

import json

import jinja2
import pytest
from mimo_support import DEFAULT_SYSTEM, GET_TIME, call, mimo_template, write_mimo_chat_gguf
from test_chat_completion import forcing

from llama_vq import ChatTemplates

Q = {"role": "user", "content": "What time is it in Tokyo?"}
CALL = {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": '{"city": "Tokyo"}'}}
AGENT_TURN = {"role": "assistant", "content": "", "reasoning_content": "I need the time.", "tool_calls": [CALL]}
RESULT = {"role": "tool", "tool_call_id": "c1", "content": "14:05 JST"}


@pytest.fixture(scope="module")
def mimo():
    return ChatTemplates(template=mimo_template(), eos_token="<|im_end|>")


def _prompt(tmpl, messages, **fields):
    return tmpl.apply({"messages": messages, **fields}).prompt


def test_turns_are_chatml_without_newlines_between_them_and_mimos_default_system_text(mimo):
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    assert _prompt(mimo, [Q], **off) == (
        f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>"
        "<|im_start|>user\nWhat time is it in Tokyo?<|im_end|><|im_start|>assistant\n<think></think>"
    )
    own = [{"role": "system", "content": "Be brief."}, Q]
    assert _prompt(mimo, own, **off).startswith("<|im_start|>system\nBe brief.<|im_end|><|im_start|>user\n")


def test_tools_are_listed_in_the_system_turn_with_mimos_call_instructions(mimo):
    p = _prompt(mimo, [Q], tools=[GET_TIME])
    head = p.split("<|im_end|>", 1)[0]
    assert head.startswith(f"<|im_start|>system\n{DEFAULT_SYSTEM}\n\n# Tools\n")
    assert "<tools>\n<function>\n<name>get_time</name>\n<description>Current time in a city</description>" in head
    assert "<parameter>\n<name>city</name>\n<type>string</type>\n</parameter>" in head
    assert '<required>["city"]</required>' in head
    assert "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>value_1</parameter>" in head
    assert "DO NOT use function calls inside <think></think> tags." in head


def test_an_agent_turn_renders_reasoning_call_and_results_as_mimo_reads_them(mimo):
    second = {**RESULT, "tool_call_id": "c2", "content": "09:05 CET"}
    p = _prompt(mimo, [Q, AGENT_TURN, RESULT, second], tools=[GET_TIME])
    assert (
        "<|im_start|>assistant\n<think>I need the time.</think>"
        f"{call('get_time', city='Tokyo')}<|im_end|>"
        "<|im_start|>tool\n<tool_response>\n14:05 JST\n</tool_response>\n"
        "<tool_response>\n09:05 CET\n</tool_response>\n<|im_end|><|im_start|>assistant\n"
    ) in p


def test_reasoning_is_kept_on_every_turn_unless_keep_all_reasoning_is_false(mimo):
    history = [Q, AGENT_TURN, RESULT, {"role": "assistant", "content": "14:05."}, {"role": "user", "content": "Paris?"}]
    kept = _prompt(mimo, history)
    assert "<think>I need the time.</think>" in kept
    assert "<|im_start|>assistant\n<think></think>14:05.<|im_end|>" in kept, "a turn without reasoning"
    dropped = _prompt(mimo, history, chat_template_kwargs={"keep_all_reasoning": False})
    assert "I need the time." not in dropped and "<|im_start|>assistant\n<think></think><tool_call>" in dropped
    # reasoning a client left inside the content (no reasoning_content) is split out the same way
    inline = {"role": "assistant", "content": "<think>I need the time.</think>", "tool_calls": [CALL]}
    assert _prompt(mimo, [Q, inline, RESULT]) == _prompt(mimo, [Q, AGENT_TURN, RESULT])


def test_thinking_is_off_unless_the_request_turns_it_on(mimo):
    # the template alone (any Jinja): off when nothing sets enable_thinking
    alone = jinja2.Environment().from_string(mimo_template())
    assert alone.render(messages=[Q], add_generation_prompt=True).endswith("<|im_start|>assistant\n<think></think>")
    # llama.cpp always sets it: on by default where the template can think (llama-server's --reasoning auto)
    assert mimo.info.supports_thinking
    assert _prompt(mimo, [Q]).endswith("<|im_start|>assistant\n")
    for off in (
        {"chat_template_kwargs": {"enable_thinking": False}},
        {"enable_thinking": False},
        {"reasoning_effort": "none"},
    ):
        plan = mimo.apply({"messages": [Q], **off})
        assert plan.prompt.endswith("<|im_start|>assistant\n<think></think>") and not plan.enable_thinking, off
    on = mimo.apply({"messages": [Q], "chat_template_kwargs": {"enable_thinking": True}})
    assert on.prompt.endswith("<|im_start|>assistant\n") and on.enable_thinking


def test_llama_with_chat_template_renders_and_parses_mimo(llama_vq, mimo_path):
    # the tiny MiMo-shaped model as written for the other tests carries SmolLM2's template: chat_template replaces it
    llm = llama_vq.Llama(str(mimo_path), n_ctx=1024, n_threads=2, verbose=False, chat_template=mimo_template())
    try:
        assert "You are MiMo" not in llm.metadata["tokenizer.chat_template"]
        assert llm.chat_templates.info.source == mimo_template().rstrip("\n")
        text = f"<think>I need the time.\n{call('get_time', city='Tokyo')}"
        r = llm.create_chat_completion([Q], tools=[GET_TIME], logits_processor=forcing(llm, text))
        msg = r["choices"][0]["message"]
        assert r["choices"][0]["finish_reason"] == "tool_calls"
        assert msg["reasoning_content"] == "I need the time.\n"
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg["tool_calls"]] == [
            ("get_time", {"city": "Tokyo"})
        ]
    finally:
        llm.close()


def test_a_mimo_shaped_gguf_carries_the_template_and_mimos_markup_tokens(llama_vq, smollm2_path, tmp_path):
    llm = llama_vq.Llama(str(write_mimo_chat_gguf(tmp_path, smollm2_path)), n_ctx=512, n_threads=2, verbose=False)
    try:
        assert llm.metadata["general.architecture"] == "mimo2"
        assert llm.chat_templates.info.source == mimo_template().rstrip("\n")
        for markup in ("<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>"):
            assert len(llm.tokenize(markup.encode(), add_bos=False, special=False)) == 1, markup
        plan = llm.chat_templates.apply({"messages": [Q], "tools": [GET_TIME]})
        # the lazy grammar waits for the <tool_call> token itself
        assert plan.trigger_tokens == tuple(llm.tokenize(b"<tool_call>", add_bos=False, special=False))
        text = f"<think>Tokyo.</think>{call('get_time', city='Tokyo')}"
        r = llm.create_chat_completion([Q], tools=[GET_TIME], logits_processor=forcing(llm, text))
        msg = r["choices"][0]["message"]
        assert msg["reasoning_content"] == "Tokyo."
        assert [json.loads(c["function"]["arguments"]) for c in msg["tool_calls"]] == [{"city": "Tokyo"}]
    finally:
        llm.close()
