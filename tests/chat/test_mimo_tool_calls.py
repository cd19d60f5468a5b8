"""MiMo-V2-Flash's output through llama.cpp's chat layer (llama_vq.chat, the parser alone, no model): tool calls in
MiMo's markup (<parameter=NAME>VALUE</parameter>, the value on the tag's line) found after <think>, inside it (MiMo
writes them there: github.com/XiaomiMiMo/MiMo-V2-Flash/issues/23) or with thinking off; one or several; whole and
streamed byte by byte; the reasoning keeps what is reasoning. The grammar that forces a call writes MiMo's markup,
not Qwen3-Coder's. Patch 0023-chat-mimo-v2-tool-calls makes these pass: without it a MiMo call parsed into nothing.
"""

from __future__ import annotations

import json

import pytest
from chat_support import args, merge_deltas, message_calls, template_text
from mimo_support import GET_TIME, RUN, call, mimo_template

from llama_vq import ChatTemplates

USER = [{"role": "user", "content": "What time is it in Tokyo?"}]
TOKYO = call("get_time", city="Tokyo")
PARIS = call("get_time", city="Paris")
MULTILINE = "cd /tmp && ls -la\n  echo 'two spaces kept' \n"

# (id, thinking on, model output, content, reasoning, [(tool, arguments)])
CASES = [
    (
        "after-think",
        True,
        f"<think>The user wants the time.</think>{TOKYO}",
        "",
        "The user wants the time.",
        [("get_time", {"city": "Tokyo"})],
    ),
    (
        "after-think-with-newlines",
        True,
        f"<think>\nThe user wants the time.\n</think>\n\n{TOKYO}",
        "",
        "The user wants the time.\n",
        [("get_time", {"city": "Tokyo"})],
    ),
    # the output a grammar ends: the call inside <think>, nothing after it
    (
        "inside-think",
        True,
        f"<think>I need the time.\n{TOKYO}",
        "",
        "I need the time.\n",
        [("get_time", {"city": "Tokyo"})],
    ),
    (
        "inside-think-closed",
        True,
        f"<think>I need the time.\n{TOKYO}\n</think>",
        "",
        "I need the time.\n",
        [("get_time", {"city": "Tokyo"})],
    ),
    (
        "inside-think-then-answer",
        True,
        f"<think>I need the time.\n{TOKYO}\nThen I answer.</think>\n\nChecking.",
        "Checking.",
        "I need the time.\nThen I answer.",
        [("get_time", {"city": "Tokyo"})],
    ),
    (
        "several-inside-think",
        True,
        f"<think>Two cities.\n{TOKYO}\nAnd Paris.\n{PARIS}\n</think>",
        "",
        "Two cities.\nAnd Paris.\n",
        [("get_time", {"city": "Tokyo"}), ("get_time", {"city": "Paris"})],
    ),
    (
        "inside-and-after-think",
        True,
        f"<think>Tokyo first.\n{TOKYO}\n</think>Paris too.\n{PARIS}",
        "Paris too.\n",
        "Tokyo first.\n",
        [("get_time", {"city": "Tokyo"}), ("get_time", {"city": "Paris"})],
    ),
    (
        "several-after-think",
        True,
        f"<think>Both.</think>{TOKYO}\n{PARIS}",
        "",
        "Both.",
        [("get_time", {"city": "Tokyo"}), ("get_time", {"city": "Paris"})],
    ),
    ("thinking-off", False, TOKYO, "", "", [("get_time", {"city": "Tokyo"})]),
    (
        "thinking-off-text-first",
        False,
        f"Let me check.\n{TOKYO}",
        "Let me check.\n",
        "",
        [("get_time", {"city": "Tokyo"})],
    ),
    (
        "value-kept-exactly",
        False,
        call("run", command=MULTILINE, timeout=30),
        "",
        "",
        [("run", {"command": MULTILINE, "timeout": 30})],
    ),
    ("answer-without-call", True, "<think>Nothing to call.</think>It is late.", "It is late.", "Nothing to call.", []),
]
IDS = [c[0] for c in CASES]


@pytest.fixture(scope="module")
def mimo():
    return ChatTemplates(template=mimo_template(), eos_token="<|im_end|>")


def _plan(tmpl, thinking, **fields):
    request = {"messages": USER, "tools": [GET_TIME, RUN], "chat_template_kwargs": {"enable_thinking": thinking}}
    return tmpl.apply({**request, **fields})


def _check(got_content, got_reasoning, got_calls, content, reasoning, calls):
    assert got_content == content
    assert got_reasoning == reasoning
    assert [(c["name"], args(c)) for c in got_calls] == calls


@pytest.mark.parametrize(("case", "thinking", "output", "content", "reasoning", "calls"), CASES, ids=IDS)
def test_mimo_output_parses_into_tool_calls_content_and_reasoning(
    mimo, case, thinking, output, content, reasoning, calls
):
    msg = mimo.parse(_plan(mimo, thinking), output)
    _check(msg.content, msg.reasoning_content, message_calls(msg), content, reasoning, calls)
    assert all(c.id for c in msg.tool_calls), "every parsed call gets an id"


@pytest.mark.parametrize(("case", "thinking", "output", "content", "reasoning", "calls"), CASES, ids=IDS)
def test_mimo_output_streamed_byte_by_byte_gives_the_same_message(
    mimo, case, thinking, output, content, reasoning, calls
):
    stream = mimo.stream(_plan(mimo, thinking, stream=True))
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
    assert [c["arguments"] for c in merged["tool_calls"]] == [c.arguments for c in end.message.tool_calls]


def test_without_parallel_calls_one_call_inside_think_is_the_answer(mimo):
    plan = _plan(mimo, True, parallel_tool_calls=False)
    msg = mimo.parse(plan, f"<think>I need the time.\n{TOKYO}\n</think>")
    assert [(c.name, json.loads(c.arguments)) for c in msg.tool_calls] == [("get_time", {"city": "Tokyo"})]
    assert msg.reasoning_content == "I need the time.\n"


def _rules(gbnf: str) -> dict[str, str]:
    return dict(line.split(" ::= ", 1) for line in gbnf.splitlines() if " ::= " in line)


def test_the_call_grammar_writes_mimos_markup(mimo):
    """The value follows its tag directly and the string rule runs to "</parameter>\\n" (an automaton whose first
    state waits for "<"); Qwen3-Coder's grammar put a newline after the tag and ran to "\\n</parameter>\\n"."""
    for choice in ("auto", "required", {"type": "function", "function": {"name": "get_time"}}):
        rules = _rules(_plan(mimo, False, tool_choice=choice).grammar)
        assert rules["tool-get-time-arg-city"] == '("<parameter=" "city" ">") xml-arg-string', choice
        if choice in ("auto", "required"):  # an integer: a JSON value, then the same close
            assert rules["tool-run-arg-timeout"].startswith('("<parameter=" "timeout" ">") '), choice
        else:  # the named function's only
            assert "tool-run" not in rules
        ac = rules["xml-arg-string"]
        assert rules[ac].startswith("[<] "), rules[ac]
    plan = _plan(mimo, False, tool_choice="required")
    assert not plan.grammar_lazy and plan.tool_calls_strict, "required: no free text before the call (Python path)"
    assert _plan(mimo, False).grammar_lazy


def test_qwen3_coder_keeps_its_value_on_lines_of_its_own():
    """The probe that picks MiMo's markup leaves Qwen3-Coder's (<parameter=N>\\nVALUE\\n</parameter>) as it was."""
    qwen = ChatTemplates(template=template_text("Qwen3-Coder.jinja"), bos_token="<s>", eos_token="</s>")
    plan = qwen.apply({"messages": USER, "tools": [GET_TIME], "tool_choice": "required"})
    assert '"<parameter=" "city" ">\\n"' in plan.grammar
    out = "<tool_call>\n<function=get_time>\n<parameter=city>\nTokyo\n</parameter>\n</function>\n</tool_call>"
    assert [(c.name, json.loads(c.arguments)) for c in qwen.parse(plan, out).tool_calls] == [
        ("get_time", {"city": "Tokyo"})
    ]


def test_a_partial_call_inside_think_streams_its_reasoning_and_holds_the_markup(mimo):
    plan = _plan(mimo, True)
    msg = mimo.parse(plan, "<think>I need the time.\n<tool_call>\n<function=get_ti", partial=True)
    assert msg.reasoning_content == "I need the time.\n"
    assert msg.content == ""
    assert "<tool_call>" not in msg.reasoning_content
