"""server/chat_layer.py: OpenAI bodies -> ChatPlan, and ChatStream deltas -> the final message."""

from __future__ import annotations

import pytest
from chat_support import GET_TIME, GET_WEATHER, SPECIAL_FUNCTION, args, merge_deltas, template_text

from llama_vq import ChatTemplateError, ChatTemplates
from server.chat_layer import ChatLayer, ChatPlan, ChatRequestError, Thinking
from server.engine.request import Grammar

USER = [{"role": "user", "content": "Weather in Paris?"}]
TWO_CALLS = ('I will check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
             '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"city": "Paris"}}\n</tool_call>')


def _templates(name):
    return ChatTemplates(template=template_text(name), bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="module")
def qwen25():
    return ChatLayer(_templates("Qwen-Qwen2.5-7B-Instruct.jinja"))


@pytest.fixture(scope="module")
def qwen3_templates():
    return _templates("Qwen-Qwen3-0.6B.jinja")


def _run(plan: ChatPlan, output: str, pieces: int = 7, finish_reason: str = "stop"):
    stream = plan.new_stream()
    deltas = []
    step = max(1, len(output) // pieces)
    for i in range(0, len(output), step):
        deltas += stream.feed(output[i:i + step])
    message, last, reason = stream.finish(finish_reason)
    return merge_deltas(deltas + last), message, reason


def test_auto_tools_give_a_lazy_grammar_with_triggers_and_the_templates_stops(qwen25):
    plan = qwen25.plan({"messages": USER, "tools": [GET_WEATHER], "stop": "END"})
    assert isinstance(plan.grammar, Grammar)
    assert plan.grammar.lazy and plan.grammar.trigger_patterns
    assert plan.stop[0] == "END"
    assert plan.render_special and plan.add_special and plan.parse_special
    assert plan.prompt.endswith("<|im_start|>assistant\n")


def test_streamed_tool_calls_concatenate_to_the_message_and_finish_as_tool_calls(qwen25):
    plan = qwen25.plan({"messages": USER, "tools": [GET_WEATHER, GET_TIME], "parallel_tool_calls": True})
    merged, message, reason = _run(plan, TWO_CALLS)
    assert reason == "tool_calls"
    assert message["content"] == merged["content"] == "I will check."
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather", "get_time"]
    assert [c["name"] for c in merged["tool_calls"]] == ["get_weather", "get_time"]
    for streamed, final in zip(merged["tool_calls"], message["tool_calls"], strict=True):
        assert streamed["id"] == final["id"] and streamed["id"]
        assert streamed["arguments"] == final["function"]["arguments"]
    assert args(merged["tool_calls"][0]) == {"city": "Paris", "unit": "celsius"}


def test_length_stays_length_even_with_a_parsed_tool_call(qwen25):
    plan = qwen25.plan({"messages": USER, "tools": [GET_WEATHER]})
    cut = TWO_CALLS[:TWO_CALLS.index('\n<tool_call>\n{"name": "get_time"')]
    _, message, reason = _run(plan, cut, finish_reason="length")
    assert message["tool_calls"][0]["function"]["name"] == "get_weather"
    assert reason == "length"


def test_text_without_tool_calls_finishes_as_stop_with_content(qwen25):
    plan = qwen25.plan({"messages": USER, "tools": [GET_WEATHER]})
    merged, message, reason = _run(plan, "It is sunny in Paris.")
    assert reason == "stop"
    assert message == {"role": "assistant", "content": "It is sunny in Paris."}
    assert merged["content"] == "It is sunny in Paris."


def test_output_that_does_not_match_the_format_comes_back_as_content(qwen25):
    plan = qwen25.plan({"messages": USER, "tools": [GET_WEATHER], "tool_choice": "required"})
    assert plan.grammar is not None and not plan.grammar.lazy
    text = "I refuse to call tools."
    merged, message, reason = _run(plan, text)
    assert reason == "stop"
    assert message["content"] == text and "tool_calls" not in message
    assert merged["content"] == text


def test_tool_choice_none_leaves_tool_markup_in_content(qwen25):
    plan = qwen25.plan({"messages": USER, "tools": [GET_WEATHER], "tool_choice": "none"})
    assert plan.grammar is None
    _, message, reason = _run(plan, TWO_CALLS)
    assert reason == "stop" and message["content"] == TWO_CALLS


def test_named_tool_choice_constrains_to_that_tool(qwen25):
    plan = qwen25.plan({"messages": USER, "tools": [GET_WEATHER, GET_TIME],
                        "tool_choice": {"type": "function", "function": {"name": "get_time"}}})
    assert plan.grammar is not None and not plan.grammar.lazy
    assert "get_time" in plan.grammar.gbnf and "get_weather" not in plan.grammar.gbnf


def test_reasoning_format_deepseek_streams_reasoning_content_and_none_keeps_it_in_content(qwen3_templates):
    output = "<think>\nThe user greets.\n</think>\n\nHello!"
    split = ChatLayer(qwen3_templates, reasoning_format="deepseek").plan({"messages": USER})
    merged, message, _ = _run(split, output)
    assert message["reasoning_content"] == merged["reasoning_content"] == "The user greets.\n"
    assert message["content"] == merged["content"] == "Hello!"
    kept = ChatLayer(qwen3_templates, reasoning_format="none").plan({"messages": USER})
    merged, message, _ = _run(kept, output)
    assert message["content"] == merged["content"] == output and "reasoning_content" not in message


def test_server_chat_template_kwargs_are_defaults_a_request_overrides(qwen3_templates):
    layer = ChatLayer(qwen3_templates, chat_template_kwargs={"enable_thinking": False})
    off = layer.apply_template({"messages": USER})
    on = layer.apply_template({"messages": USER, "chat_template_kwargs": {"enable_thinking": True}})
    assert off.endswith("<think>\n\n</think>\n\n") and not on.endswith("</think>\n\n")
    assert layer.plan({"messages": USER}).thinking is None
    assert layer.plan({"messages": USER, "chat_template_kwargs": {"enable_thinking": True}}).thinking == Thinking(
        "<think>", ("</think>",), False)


def test_a_reasoning_block_the_template_opened_is_reported_open_at_start():
    layer = ChatLayer(_templates("Qwen3.5-4B.jinja"))
    plan = layer.plan({"messages": USER, "tools": [GET_WEATHER], "chat_template_kwargs": {"enable_thinking": True}})
    assert plan.prompt.endswith("<think>\n")
    assert plan.thinking.start == "<think>" and "</think>" in plan.thinking.ends and plan.thinking.open_at_start
    assert plan.grammar is not None and plan.grammar.lazy


def test_developer_role_becomes_system(qwen25):
    dev = qwen25.apply_template({"messages": [{"role": "developer", "content": "Be terse."}, *USER]})
    assert "<|im_start|>system\nBe terse.<|im_end|>" in dev


def test_tool_history_round_trips_into_the_prompt(qwen25):
    history = [*USER,
               {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
                   "name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "21 C, sunny"}]
    prompt = qwen25.apply_template({"messages": history, "tools": [GET_WEATHER]})
    assert "21 C, sunny" in prompt and '"city": "Paris"' in prompt


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": [*USER, {"role": "tool", "content": "x"}]}, "messages[1].tool_call_id"),
    ({"messages": USER, "tools": [{"type": "function", "function": {"name": "f", "parameters": "nope"}}]},
     "tools[0].function.parameters"),
    ({"messages": USER, "tool_choice": "sometimes"}, "tool_choice"),
    ({"messages": USER, "reasoning_format": "verbose"}, "reasoning_format"),
    ({"messages": USER, "tools": [SPECIAL_FUNCTION], "grammar": "root ::= \"x\""}, "grammar"),
    ({"messages": USER, "response_format": {"type": "xml"}}, "response_format.type"),
])
def test_requests_the_template_cannot_take_raise_chat_request_error_naming_the_field(qwen25, body, param):
    with pytest.raises(ChatRequestError) as e:
        qwen25.plan(body)
    assert e.value.param == param


def test_template_render_failure_is_a_chat_request_error():
    strict = ChatLayer(ChatTemplates(template="{{ raise_exception('only user turns') if messages[0].role != 'user' }}"
                                              "{% for m in messages %}{{ m.content }}{% endfor %}"))
    assert strict.apply_template({"messages": USER}) == "Weather in Paris?"
    with pytest.raises(ChatRequestError) as e:
        strict.plan({"messages": [{"role": "assistant", "content": "hi"}, *USER]})
    assert e.value.param == "messages" and "only user turns" in e.value.message


def test_response_format_json_schema_gives_a_grammar_from_the_first_token(qwen25):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    plan = qwen25.plan({"messages": USER, "response_format": {"type": "json_schema",
                                                              "json_schema": {"name": "x", "schema": schema}}})
    assert plan.grammar is not None and not plan.grammar.lazy
    _, message, _ = _run(plan, '{"n": 3}')
    assert message["content"] == '{"n": 3}'


def test_props_report_the_template_and_its_caps(qwen25):
    props = qwen25.props()
    assert props["chat_template"].strip() == template_text("Qwen-Qwen2.5-7B-Instruct.jinja").strip()
    assert props["chat_template_caps"]["supports_tools"] is True


def test_for_model_reads_a_template_file_and_refuses_a_broken_one(tmp_path):
    good = tmp_path / "t.jinja"
    good.write_text(template_text("MiMo-VL.jinja"), encoding="utf-8")
    layer = ChatLayer.for_model(None, chat_template_file=good, reasoning_format="none")
    assert layer.templates.info.source.strip() == template_text("MiMo-VL.jinja").strip()
    assert layer.plan({"messages": USER, "stop": ["a", "b"]}).stop[:2] == ("a", "b")
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% if %}", encoding="utf-8")
    with pytest.raises(ChatTemplateError) as e:
        ChatLayer.for_model(None, chat_template_file=bad)
    assert e.value.param == "template"
    with pytest.raises(ValueError, match="reasoning_format"):
        ChatLayer(layer.templates, reasoning_format="loud")
