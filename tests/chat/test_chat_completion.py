"""Llama.create_chat_completion through llama.cpp's chat layer, on SmolLM2 and the Qwen2.5-Coder test model, in
OpenAI's shapes (validated with the openai package's own types): tool calls forced by tool_choice ("required", a
named function, the legacy functions/function_call), a tool call the model writes by itself under "auto" (the lazy
grammar and the template's parser), reasoning split from content, stop strings, streaming deltas that add up to
the message, and llama-cpp-python's formatter kept for chat_format.

Where a test needs the model to write a given text (a tool call under "auto", a thinking block), a logits
processor forces those tokens: what is tested is everything after the sampler (special tokens rendered as text,
the stop and end-of-generation handling, the parser, the deltas), which no prompt makes a 135M model do on cue.
CPU cost: SmolLM2 ~10 s; Qwen2.5-Coder 0.5B ~60 s on 2 cores (prompts of ~200 tokens with the tools).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from chat_support import GET_TIME, GET_WEATHER, merge_deltas, template_text
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from llama_vq import ChatTemplateError
from llama_vq._chat_completion import _Stops

WEATHER_Q = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]


@pytest.fixture(scope="module")
def smol(llama_vq, smollm2_path):
    llm = llama_vq.Llama(str(smollm2_path), n_ctx=1024, n_threads=2, verbose=False)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def qwen(llama_vq, qwen_coder_path):
    llm = llama_vq.Llama(
        str(qwen_coder_path), n_ctx=2048, n_threads=2, type_k="q8_0", type_v="q4_0", flash_attn=False, verbose=False
    )
    yield llm
    llm.close()


def forcing(llm, text: str):
    """A logits processor that makes the model write exactly `text` (special tokens parsed), then end."""
    from llama_cpp import LogitsProcessorList  # after llama_vq, which binds llama_cpp to its library

    target = llm.tokenize(text.encode(), add_bos=False, special=True) + [llm.token_eos()]
    start: list[int] = []

    def force(input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        if not start:
            start.append(len(input_ids))
        out = np.full_like(scores, -np.inf)
        out[target[min(len(input_ids) - start[0], len(target) - 1)]] = 0.0
        return out

    return LogitsProcessorList([force])


def _stream(llm, *args, **kwargs) -> tuple[list[dict], dict]:
    chunks = list(llm.create_chat_completion(*args, stream=True, **kwargs))
    for c in chunks:
        ChatCompletionChunk(**c)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": None}
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    return chunks, merge_deltas(deltas[1:])


def _weather_args(call: dict) -> dict:
    assert call["type"] == "function" and call["id"]
    assert call["function"]["name"] == "get_weather"
    args = json.loads(call["function"]["arguments"])
    assert set(args) == {"city", "unit"} and isinstance(args["city"], str) and args["unit"] in ("celsius", "fahrenheit")
    return args


def test_smollm2_answers_in_openai_shape_and_the_stream_adds_up_to_the_message(smol):
    msgs = [{"role": "user", "content": "Say hi"}]
    r = smol.create_chat_completion(msgs, temperature=0, max_tokens=12)
    ChatCompletion(**r)
    msg, choice = r["choices"][0]["message"], r["choices"][0]
    assert r["object"] == "chat.completion" and msg["role"] == "assistant" and msg["content"]
    assert "tool_calls" not in msg and choice["finish_reason"] in ("stop", "length")
    assert r["usage"]["total_tokens"] == r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"]
    assert 0 < r["usage"]["completion_tokens"] <= 12
    chunks, merged = _stream(smol, msgs, temperature=0, max_tokens=12)
    assert merged["content"] == msg["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == choice["finish_reason"]


def test_stop_strings_cut_the_answer_streamed_or_not(smol):
    text = "Hello, world. Goodbye."
    r = smol.create_chat_completion(
        [{"role": "user", "content": "Hi"}], stop=[". G"], logits_processor=forcing(smol, text)
    )
    assert r["choices"][0]["message"]["content"] == "Hello, world"
    assert r["choices"][0]["finish_reason"] == "stop"
    _, merged = _stream(smol, [{"role": "user", "content": "Hi"}], stop=[". G"], logits_processor=forcing(smol, text))
    assert merged["content"] == "Hello, world"


def test_stops_hold_back_a_tail_that_may_begin_a_stop():
    s = _Stops(["</end>", "xyz"])
    assert s.push("abc</e") == ("abc", False)
    assert s.push("nx") == ("</en", False)  # "x" may begin "xyz"
    assert s.push("y") == ("", False)
    assert s.push("z and more") == ("", True)
    t = _Stops(["STOP"])
    assert t.push("a ST") == ("a ", False) and t.flush() == "ST"


def test_reasoning_is_split_from_the_content_and_kept_with_reasoning_format_none(llama_vq, smollm2_path):
    # SmolLM2's weights with Qwen3's template: a thinking block, parsed as llama-server parses it
    llm = llama_vq.Llama(
        str(smollm2_path), n_ctx=1024, n_threads=2, verbose=False, chat_template=template_text("Qwen-Qwen3-0.6B.jinja")
    )
    try:
        text = "<think>\nThe user greets me.\n</think>\n\nHello there!"
        r = llm.create_chat_completion([{"role": "user", "content": "Hi"}], logits_processor=forcing(llm, text))
        msg = r["choices"][0]["message"]
        assert (msg["reasoning_content"], msg["content"]) == ("The user greets me.\n", "Hello there!")
        _, merged = _stream(llm, [{"role": "user", "content": "Hi"}], logits_processor=forcing(llm, text))
        assert (merged["reasoning_content"], merged["content"]) == ("The user greets me.\n", "Hello there!")
        raw = llm.create_chat_completion(
            [{"role": "user", "content": "Hi"}], reasoning_format="none", logits_processor=forcing(llm, text)
        )["choices"][0]["message"]
        assert (
            "reasoning_content" not in raw and "<think>" in raw["content"] and raw["content"].endswith("Hello there!")
        )
    finally:
        llm.close()


def test_smollm2_template_without_a_tool_call_format_refuses_required_naming_tool_choice(smol):
    with pytest.raises(ChatTemplateError) as e:
        smol.create_chat_completion(WEATHER_Q, tools=[GET_WEATHER], tool_choice="required", max_tokens=4)
    assert e.value.param == "tool_choice"


def test_logprobs_are_refused_with_the_fix(smol):
    with pytest.raises(ValueError, match="chat_format"):
        smol.create_chat_completion([{"role": "user", "content": "Hi"}], logprobs=True, max_tokens=2)


def test_chat_format_keeps_llama_cpp_pythons_formatter(llama_vq, smollm2_path):
    llm = llama_vq.Llama(str(smollm2_path), n_ctx=512, n_threads=2, verbose=False, chat_format="chatml")
    try:
        r = llm.create_chat_completion([{"role": "user", "content": "Hi"}], temperature=0, max_tokens=4)
        ChatCompletion(**r)
        assert "chat_templates" not in llm.__dict__  # llama.cpp's chat layer was never made
    finally:
        llm.close()


@pytest.mark.slow
def test_qwen_coder_required_tool_call_is_parsed_into_schema_valid_arguments(qwen):
    r = qwen.create_chat_completion_openai_v1(
        WEATHER_Q, tools=[GET_WEATHER], tool_choice="required", temperature=0, max_tokens=48
    )
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None
    (call,) = r.choices[0].message.tool_calls
    args = _weather_args(call.model_dump())
    assert args["city"] == "Paris" and args["unit"] == "celsius"
    chunks, merged = _stream(qwen, WEATHER_Q, tools=[GET_WEATHER], tool_choice="required", temperature=0, max_tokens=48)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in merged["tool_calls"]] == [
        (call.function.name, call.function.arguments)
    ]


@pytest.mark.slow
def test_qwen_coder_named_tool_choice_and_legacy_function_call_call_that_function(qwen):
    named = {"type": "function", "function": {"name": "get_time"}}
    r = qwen.create_chat_completion(
        WEATHER_Q, tools=[GET_WEATHER, GET_TIME], tool_choice=named, temperature=0, max_tokens=32
    )
    (call,) = r["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "get_time" and "city" in json.loads(call["function"]["arguments"])
    legacy = qwen.create_chat_completion(
        WEATHER_Q,
        functions=[GET_WEATHER["function"]],
        function_call={"name": "get_weather"},
        temperature=0,
        max_tokens=48,
    )
    (call,) = legacy["choices"][0]["message"]["tool_calls"]
    _weather_args(call)


@pytest.mark.slow
def test_qwen_coder_auto_parses_the_tool_call_the_model_writes(qwen):
    # <tool_call> is a special token of Qwen2.5: it must come out as text for the parser (a preserved token), and
    # the lazy grammar of "auto" takes over once it is written
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon", "unit": "celsius"}}\n</tool_call>'
    assert len(qwen.tokenize(b"<tool_call>", add_bos=False, special=True)) == 1
    r = qwen.create_chat_completion(WEATHER_Q, tools=[GET_WEATHER], logits_processor=forcing(qwen, text))
    ChatCompletion(**r)
    assert r["choices"][0]["finish_reason"] == "tool_calls"
    msg = r["choices"][0]["message"]
    assert msg["content"] is None
    (call,) = msg["tool_calls"]
    assert _weather_args(call) == {"city": "Lyon", "unit": "celsius"}
    _, merged = _stream(qwen, WEATHER_Q, tools=[GET_WEATHER], logits_processor=forcing(qwen, text))
    assert [(c["name"], json.loads(c["arguments"])) for c in merged["tool_calls"]] == [
        ("get_weather", {"city": "Lyon", "unit": "celsius"})
    ]
    assert merged["content"] == ""


@pytest.mark.slow
def test_qwen_coder_answers_in_text_with_tool_choice_none(qwen):
    r = qwen.create_chat_completion(WEATHER_Q, tools=[GET_WEATHER], tool_choice="none", temperature=0, max_tokens=16)
    msg = r["choices"][0]["message"]
    assert msg["content"] and "tool_calls" not in msg and r["choices"][0]["finish_reason"] in ("stop", "length")
