"""The chat ABI under abuse: malformed input is an error document, never a crash; any model output, cut
anywhere, streams deltas that concatenate to the final message; concurrent renders are safe."""

from __future__ import annotations

import ctypes
import random
from concurrent.futures import ThreadPoolExecutor

import pytest
from chat_support import GET_TIME, GET_WEATHER, merge_deltas, template_text

from llama_vq import ChatTemplateError, ChatTemplates
from llama_vq.chat import ChatStream, _lib, _take

# pieces of the formats under test, glued at random into outputs the parsers must survive
ATOMS = [
    "<tool_call>",
    "</tool_call>",
    "\n",
    "{",
    "}",
    '"name"',
    ": ",
    '"get_time"',
    ", ",
    '"arguments"',
    '{"city": "Paris"}',
    "<think>",
    "</think>",
    "<function=get_time>",
    "<parameter=city>",
    "</parameter>",
    "</function>",
    "Paris",
    "hello ",
    "é",
    "日本",
    '"',
    "\\",
    "[",
    "]",
    "<|channel|>",
    "analysis",
    "final",
    "<|message|>",
    " to=functions.get_time",
    "<|end|>",
    "<|start|>assistant",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>",
    "get_time<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁calls▁end｜>",
    "<arg_key>city</arg_key>",
    "<arg_value>Paris</arg_value>",
]
# one well-formed output per format (a get_time call, reasoning where the format has it), mutated below
SEEDS = {
    "MiMo-VL.jinja": 'Let me see.<tool_call>\n{"name": "get_time", "arguments": {"city": "Paris"}}\n</tool_call>',
    "Qwen3.5-4B.jinja": "hm\n</think>\n\n<tool_call>\n<function=get_time>\n<parameter=city>\nParis\n</parameter>\n"
    "</function>\n</tool_call>",
    "Qwen-Qwen3-0.6B.jinja": '<think>\nhm\n</think>\n\n<tool_call>\n{"name": "get_time", '
    '"arguments": {"city": "Paris"}}\n</tool_call>',
    "GLM-4.6.jinja": "<tool_call>get_time\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",
    "Qwen3-Coder.jinja": "<tool_call>\n<function=get_time>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
    "</tool_call>",
    "deepseek-ai-DeepSeek-V3.1.jinja": "hm</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>"
    '{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "openai-gpt-oss-120b.jinja": ' to=functions.get_time<|channel|>analysis<|message|>{"city": "Paris"}',
}
TEMPLATES = list(SEEDS)


def _mutant(rng: random.Random, seed: str) -> str:
    """The seed intact, twice, cut, with atoms inserted or a span deleted: near-valid outputs."""
    text = seed * rng.choice([1, 1, 2])
    for _ in range(rng.choice([0, 0, 1, 2, 3])):
        i = rng.randrange(len(text) + 1)
        op = rng.random()
        if op < 0.4:
            text = text[:i] + rng.choice(ATOMS) + text[i:]
        elif op < 0.7:
            text = text[:i] + text[i + rng.randint(1, 8) :]
        else:
            text = text[:i]
    return text or "x"


@pytest.fixture(scope="module")
def plans():
    out = {}
    for name in TEMPLATES:
        t = ChatTemplates(template=template_text(name))
        out[name] = (
            t,
            t.apply(
                {
                    "messages": [{"role": "user", "content": "hi"}],
                    "tools": [GET_TIME, GET_WEATHER],
                    "parallel_tool_calls": True,
                    "reasoning_format": "deepseek",
                }
            ),
        )
    return out


@pytest.mark.parametrize("name", TEMPLATES)
def test_random_outputs_stream_deltas_that_concatenate_to_the_final_message(plans, name):
    tmpl, plan = plans[name]
    rng = random.Random(1234)  # fixed: a failure reproduces
    with_calls = 0
    for k in range(300):
        text = _mutant(rng, SEEDS[name]) if k % 3 else "".join(rng.choice(ATOMS) for _ in range(rng.randint(1, 25)))
        raw = text.encode()
        stream = tmpl.stream(plan)
        deltas, i = [], 0
        while i < len(raw):  # cut anywhere, also inside a character
            n = rng.randint(1, 6)
            deltas += stream.feed(raw[i : i + n])
            i += n
        end = stream.finish()
        merged = merge_deltas(deltas + end.deltas)
        msg = end.message
        assert merged["content"] == msg.content, text
        assert merged["reasoning_content"] == msg.reasoning_content, text
        assert [(c["id"], c["name"], c["arguments"]) for c in merged["tool_calls"]] == [
            (c.id, c.name, c.arguments) for c in msg.tool_calls
        ], text
        assert all(c.name for c in msg.tool_calls), text
        with_calls += bool(msg.tool_calls)
    assert with_calls >= 50, f"only {with_calls} of 300 outputs parsed into tool calls: the test lost its teeth"


def _raw(call):
    return _take(call)


def test_malformed_inputs_return_error_documents_not_crashes():
    lib = _lib()
    with pytest.raises(ChatTemplateError, match="not valid JSON"):
        _raw(lib.llama_vq_chat_parse(b"{not json", b"x", 1, 0))
    with pytest.raises(ChatTemplateError) as e:
        _raw(lib.llama_vq_chat_parse(b'{"format": 99}', b"x", 1, 0))
    assert e.value.param == "parser.format"
    with pytest.raises(ChatTemplateError) as e:
        _raw(lib.llama_vq_chat_parse(b'{"format": 1, "parser": "garbage"}', b"x", 1, 0))
    assert e.value.param == "parser.parser"
    with pytest.raises(ChatTemplateError, match="NULL"):
        _raw(lib.llama_vq_chat_apply(None, b"{}"))
    with pytest.raises(ChatTemplateError, match="NULL"):
        _raw(lib.llama_vq_chat_stream_feed(None, b"x", 1))
    err = ctypes.c_void_p()
    assert not lib.llama_vq_chat_templates_init(None, b"{}", ctypes.byref(err))
    with pytest.raises(ChatTemplateError) as e:
        _raw(err.value)
    assert e.value.param == "template"


def test_requests_of_the_wrong_shape_are_refused_naming_the_field():
    t = ChatTemplates(template=template_text("MiMo-VL.jinja"))
    cases = [
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": {}}, "tools"),
        ({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": []}, "chat_template_kwargs"),
        (
            {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"enable_thinking": "yes"}},
            "chat_template_kwargs.enable_thinking",
        ),
        ({"messages": [{"role": "user", "content": "x"}], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ]
    for body, param in cases:
        with pytest.raises(ChatTemplateError) as e:
            t.apply(body)
        assert e.value.param == param, body


def test_a_finished_stream_refuses_more_text():
    t = ChatTemplates(template=template_text("MiMo-VL.jinja"))
    stream = ChatStream(t.apply({"messages": [{"role": "user", "content": "x"}]}))
    stream.feed("hello")
    assert stream.finish().message.content == "hello"
    with pytest.raises(ChatTemplateError):
        stream.feed("more")


def test_concurrent_renders_and_streams_agree_with_serial_ones():
    t = ChatTemplates(template=template_text("Qwen-Qwen3-0.6B.jinja"))
    bodies = [
        {"messages": [{"role": "user", "content": f"question {i}"}], "tools": [GET_TIME] if i % 2 else []}
        for i in range(16)
    ]
    serial = [t.apply(b).prompt for b in bodies]

    def work(i):
        plan = t.apply(bodies[i])
        stream = t.stream(plan)
        stream.feed(f"<think>r{i}</think>answer {i}")
        return plan.prompt, stream.finish().message

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(work, range(16)))
    assert [r[0] for r in results] == serial
    assert [(m.reasoning_content, m.content) for _, m in results] == [(f"r{i}", f"answer {i}") for i in range(16)]
