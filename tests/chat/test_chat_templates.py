"""llama.cpp's vendored model templates through llama_vq.chat (no model: the template text alone).

Every template that declares tools renders a conversation with a tool call and its result; canned outputs
of the main tool-call formats parse into tool calls and reasoning; streamed at every byte boundary, their
deltas concatenate to the full parse.
"""

from __future__ import annotations

import json

import pytest
from chat_support import GET_TIME, SPECIAL_FUNCTION, args, merge_deltas, message_calls, template_text, tool_templates

from llama_vq import ChatTemplates

HISTORY = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What time is it in Tokyo?"},
    # 9 alphanumerics: the id shape Mistral's templates insist on
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "Abc123xyz", "type": "function", "function": {"name": "get_time", "arguments": '{"city": "Tokyo"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "Abc123xyz", "name": "get_time", "content": "14:05 JST"},
]


@pytest.fixture(scope="module")
def loaded():
    cache: dict[str, ChatTemplates] = {}

    def get(name: str) -> ChatTemplates:
        if name not in cache:
            cache[name] = ChatTemplates(template=template_text(name), bos_token="<s>", eos_token="</s>")
        return cache[name]

    return get


@pytest.mark.parametrize("name", tool_templates())
def test_template_renders_tools_and_a_tool_result(loaded, name):
    tmpl = loaded(name)
    plan = tmpl.apply({"messages": HISTORY, "tools": [GET_TIME], "now": 1767225600})
    assert "14:05 JST" in plan.prompt, "the tool result is not in the prompt"
    assert "Tokyo" in plan.prompt, "the assistant's tool call is not in the prompt"
    assert "get_time" in plan.prompt
    without = tmpl.apply({"messages": HISTORY, "now": 1767225600})
    if tmpl.info.caps["supports_tools"]:
        assert "Current time in a city" in plan.prompt, "a template that renders tools left out their description"
        assert "Current time in a city" not in without.prompt


# (id, template, request fields, model output, expected content, reasoning, [(tool, arguments)])
CASES = [
    (
        "hermes2pro",
        "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
        {"tools": [SPECIAL_FUNCTION]},
        '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}</tool_call>',
        "",
        "",
        [("special_function", {"arg1": 1})],
    ),
    (
        "hermes2pro-content",
        "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
        {"tools": [SPECIAL_FUNCTION]},
        'Hello, world!\nWhat\'s up?<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}</tool_call>',
        "Hello, world!\nWhat's up?",
        "",
        [("special_function", {"arg1": 1})],
    ),
    (
        "hermes3",
        "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
        {"tools": [SPECIAL_FUNCTION]},
        '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call>',
        "",
        "",
        [("special_function", {"arg1": 1})],
    ),
    (
        "mimo-vl",
        "MiMo-VL.jinja",
        {"tools": [SPECIAL_FUNCTION]},
        '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call>',
        "",
        "",
        [("special_function", {"arg1": 1})],
    ),
    (
        "qwen2.5-parallel",
        "Qwen-Qwen2.5-7B-Instruct.jinja",
        {"tools": [SPECIAL_FUNCTION, GET_TIME], "parallel_tool_calls": True},
        '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"city": "Paris"}}\n</tool_call>',
        "",
        "",
        [("special_function", {"arg1": 1}), ("get_time", {"city": "Paris"})],
    ),
    (
        "qwen3-coder-xml",
        "Qwen3-Coder.jinja",
        {"tools": [SPECIAL_FUNCTION]},
        "<tool_call>\n<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n</tool_call>",
        "",
        "",
        [("special_function", {"arg1": 1})],
    ),
    (
        "qwen3.5-xml-thinking",
        "Qwen3.5-4B.jinja",
        {"tools": [SPECIAL_FUNCTION], "reasoning_format": "auto"},
        "I'm\nthinking\n</think>\n\n<tool_call>\n<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n"
        "</function>\n</tool_call>",
        "",
        "I'm\nthinking\n",
        [("special_function", {"arg1": 1})],
    ),
    (
        "deepseek-v3.1",
        "deepseek-ai-DeepSeek-V3.1.jinja",
        {"tools": [GET_TIME], "enable_thinking": True, "reasoning_format": "deepseek"},
        "REASONING</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>"
        '{"city": "Tokyo"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        "",
        "REASONING",
        [("get_time", {"city": "Tokyo"})],
    ),
    (
        "glm-4.6",
        "GLM-4.6.jinja",
        {"tools": [SPECIAL_FUNCTION], "reasoning_format": "none"},
        "<tool_call>special_function\n<arg_key>arg1</arg_key>\n<arg_value>1</arg_value>\n</tool_call>",
        "",
        "",
        [("special_function", {"arg1": 1})],
    ),
    (
        "gpt-oss-reasoning",
        "openai-gpt-oss-120b.jinja",
        {"reasoning_format": "auto"},
        "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>final<|message|>"
        "Hello, world!\nWhat's up?",
        "Hello, world!\nWhat's up?",
        "I'm\nthinking",
        [],
    ),
    (
        "gpt-oss-call",
        "openai-gpt-oss-120b.jinja",
        {"tools": [SPECIAL_FUNCTION], "reasoning_format": "auto"},
        ' to=functions.special_function<|channel|>analysis<|message|>{"arg1": 1}',
        "",
        "",
        [("special_function", {"arg1": 1})],
    ),
]
CASE_IDS = [c[0] for c in CASES]


def _plan(loaded, template, fields):
    return loaded(template).apply({"messages": [{"role": "user", "content": "Hey there!"}], **fields})


def _check(got_content, got_reasoning, got_calls, content, reasoning, calls):
    assert got_content == content
    assert got_reasoning == reasoning
    assert [(c["name"], args(c)) for c in got_calls] == calls


@pytest.mark.parametrize(("case", "template", "fields", "output", "content", "reasoning", "calls"), CASES, ids=CASE_IDS)
def test_canned_output_parses_into_tool_calls_and_reasoning(
    loaded, case, template, fields, output, content, reasoning, calls
):
    plan = _plan(loaded, template, fields)
    msg = loaded(template).parse(plan, output)
    _check(msg.content, msg.reasoning_content, message_calls(msg), content, reasoning, calls)
    assert all(c.id for c in msg.tool_calls), "every parsed tool call gets an id"


@pytest.mark.parametrize(("case", "template", "fields", "output", "content", "reasoning", "calls"), CASES, ids=CASE_IDS)
def test_deltas_at_every_byte_boundary_concatenate_to_the_full_parse(
    loaded, case, template, fields, output, content, reasoning, calls
):
    plan = _plan(loaded, template, fields)
    stream = loaded(template).stream(plan)
    raw = output.encode("utf-8")
    deltas = []
    for i in range(len(raw)):
        deltas += stream.feed(raw[i : i + 1])
    end = stream.finish()
    deltas += end.deltas
    assert end.parse_error is None
    merged = merge_deltas(deltas)
    _check(merged["content"], merged["reasoning_content"], merged["tool_calls"], content, reasoning, calls)
    _check(end.message.content, end.message.reasoning_content, message_calls(end.message), content, reasoning, calls)
    assert [c["id"] for c in merged["tool_calls"]] == [c.id for c in end.message.tool_calls]
    # the streamed arguments are the final text itself, not only equal JSON
    assert [c["arguments"] for c in merged["tool_calls"]] == [c.arguments for c in end.message.tool_calls]


# templates that declare tools but have no tool-call format of llama.cpp's (checked below, so the list stays true)
NO_TOOL_CALL_FORMAT = {"LFM2-8B-A1B.jinja", "LFM2.5-Instruct.jinja", "ibm-granite-granite-3.3-2B-Instruct.jinja"}


def test_the_templates_without_a_tool_call_format_are_the_listed_ones(loaded):
    assert {n for n in tool_templates() if not loaded(n).info.caps["supports_tool_calls"]} == NO_TOOL_CALL_FORMAT


@pytest.mark.parametrize("name", [n for n in tool_templates() if n not in NO_TOOL_CALL_FORMAT])
def test_required_grammar_needs_at_most_the_generation_prompts_tail_prefilled(loaded, name):
    tmpl = loaded(name)
    for thinking in (True, False):
        plan = tmpl.apply(
            {
                "messages": [{"role": "user", "content": "Hi"}],
                "tools": [GET_TIME],
                "tool_choice": "required",
                "enable_thinking": thinking,
            }
        )
        assert plan.grammar and not plan.grammar_lazy
        assert plan.generation_prompt.endswith(plan.grammar_prefill_text)
        root = plan.grammar.split("root ::= ", 1)[1].split("\n", 1)[0]
        if plan.grammar_prefill_text == plan.generation_prompt and plan.generation_prompt:
            # nothing was cut: the root must not start with the generation prompt's literal either
            assert not root.startswith(json.dumps(plan.generation_prompt)[:-1]), root


def test_partial_parse_of_a_cut_tool_call_holds_back_the_markup(loaded):
    plan = _plan(loaded, "MiMo-VL.jinja", {"tools": [SPECIAL_FUNCTION]})
    msg = loaded("MiMo-VL.jinja").parse(plan, 'Sure.<tool_call>\n{"name": "special_fun', partial=True)
    assert msg.content == "Sure."
    assert "<tool_call>" not in msg.content


def test_chat_template_kwargs_change_the_prompt_of_a_template_that_reads_them(loaded):
    tmpl = loaded("Qwen-Qwen3-0.6B.jinja")
    assert tmpl.info.supports_thinking
    messages = [{"role": "user", "content": "Hi"}]
    on = tmpl.apply({"messages": messages, "chat_template_kwargs": {"enable_thinking": True}})
    off = tmpl.apply({"messages": messages, "chat_template_kwargs": {"enable_thinking": False}})
    assert on.prompt != off.prompt
    assert off.prompt.endswith("<think>\n\n</think>\n\n"), off.prompt[-60:]
    assert on.enable_thinking and not off.enable_thinking


def test_reasoning_format_none_keeps_thinking_in_content(loaded):
    output = "<think>I'm\nthinking</think>Hello!"
    tmpl = loaded("Qwen-Qwen3-0.6B.jinja")
    messages = [{"role": "user", "content": "Hi"}]
    split = tmpl.parse(tmpl.apply({"messages": messages, "reasoning_format": "deepseek"}), output)
    kept = tmpl.parse(tmpl.apply({"messages": messages, "reasoning_format": "none"}), output)
    assert (split.reasoning_content, split.content) == ("I'm\nthinking", "Hello!")
    assert kept.reasoning_content == "" and kept.content == output


def test_lazy_tool_grammar_is_triggered_by_the_tool_call_marker(loaded):
    plan = _plan(loaded, "MiMo-VL.jinja", {"tools": [SPECIAL_FUNCTION]})
    assert plan.grammar and plan.grammar_lazy and plan.grammar_type == "tool_calls"
    assert any("tool_call" in p for p in plan.trigger_patterns), plan.trigger_patterns
    assert "<tool_call>" in plan.preserved_tokens
    assert json.dumps(plan.parser)  # the parser state is plain JSON, kept by the caller
