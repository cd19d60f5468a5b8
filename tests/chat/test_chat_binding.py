"""llama_vq.chat on the real SmolLM2 model: its own template, overrides, errors naming the field, and a
grammar-constrained generation whose output parses into tool calls that satisfy the tools' schemas."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from chat_support import GET_TIME, GET_WEATHER, SPECIAL_FUNCTION, template_text

from llama_vq import ChatTemplateError, ChatTemplates, builtin_templates

USER = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]


@pytest.fixture(scope="module")
def llm(llama_vq, smollm2_path):
    model = llama_vq.Llama(str(smollm2_path), n_ctx=1024, n_batch=256, verbose=False)
    yield model
    model.close()


@pytest.fixture(scope="module")
def own(llm):
    return ChatTemplates.from_llama(llm)


def test_chat_library_and_llama_common_ship_in_every_build(llama_vq):
    # built whether or not LLAMA_VQ_BUILD_TOOLS is on; test_build checks their rpath and soname
    lib = Path(llama_vq.__file__).parent / "lib"
    assert (lib / "libllama-vq-chat.so").is_file() and (lib / "libllama-common.so").is_file()
    assert llama_vq.chat._lib().llama_vq_chat_abi_version() == 1


def test_model_template_is_the_ggufs_and_renders_chatml(own, llm):
    info = own.info
    assert info.use_jinja and info.was_explicit
    assert info.source == llm.metadata["tokenizer.chat_template"]
    plan = own.apply({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]})
    assert (
        plan.prompt == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert plan.grammar == "" and not plan.grammar_lazy


def test_developer_role_renders_as_system(own):
    dev = own.apply({"messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}]})
    sys_ = own.apply({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]})
    assert dev.prompt == sys_.prompt


def test_builtin_template_name_renders_without_jinja(llm):
    assert "llama3" in builtin_templates()
    t = ChatTemplates(llm, "llama3")
    assert not t.info.use_jinja and t.info.builtin_name == "llama3"
    assert "<|start_header_id|>user<|end_header_id|>" in t.apply({"messages": USER}).prompt
    with pytest.raises(ChatTemplateError) as e:
        t.apply({"messages": USER, "tools": [GET_TIME]})
    assert e.value.param == "tools"


def test_jinja_override_that_does_not_parse_is_refused_naming_the_template(llm):
    with pytest.raises(ChatTemplateError) as e:
        ChatTemplates(llm, "{% for m in messages %}{{ m.content }")
    assert e.value.param == "template"


def test_chat_template_kwargs_change_the_prompt_through_the_model(llm):
    t = ChatTemplates(llm, template_text("Qwen-Qwen3-0.6B.jinja"))
    on = t.apply({"messages": USER, "chat_template_kwargs": {"enable_thinking": True}}).prompt
    off = t.apply({"messages": USER, "chat_template_kwargs": {"enable_thinking": False}}).prompt
    assert off == on + "<think>\n\n</think>\n\n"


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([{"role": "user", "content": "hi"}, {"role": "tool", "content": "42"}], "messages[1].tool_call_id"),
        (
            [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{not json"}}
                    ],
                },
            ],
            "messages[1].tool_calls[0].function.arguments",
        ),
        (
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "tool_calls": [{"id": "a", "type": "function", "function": {"arguments": "{}"}}]},
            ],
            "messages[1].tool_calls[0].function.name",
        ),
        ([{"role": "wizard", "content": "hi"}], "messages[0].role"),
        ([{"role": "user", "content": 7}], "messages[0].content"),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            "messages[0].content[0].type",
        ),
        ([], "messages"),
    ],
)
def test_malformed_messages_are_refused_naming_the_field(own, messages, param):
    with pytest.raises(ChatTemplateError) as e:
        own.apply({"messages": messages})
    assert e.value.param == param
    assert param in e.value.message


def test_tool_schema_that_cannot_become_a_grammar_is_refused_naming_the_tool(own):
    bad = {
        "type": "function",
        "function": {
            "name": "bad",
            "parameters": {"type": "object", "properties": {"x": {"$ref": "#/definitions/missing"}}},
        },
    }
    with pytest.raises(ChatTemplateError) as e:
        own.apply({"messages": USER, "tools": [GET_TIME, bad]})
    assert e.value.param == "tools[1].function.parameters"


def test_invalid_user_grammar_is_refused_naming_grammar(own):
    with pytest.raises(ChatTemplateError) as e:
        own.apply({"messages": USER, "grammar": "root ::= ( unclosed"})
    assert e.value.param == "grammar"


def test_required_tools_on_a_template_without_tool_calls_is_refused(own):
    with pytest.raises(ChatTemplateError) as e:
        own.apply({"messages": USER, "tools": [GET_TIME], "tool_choice": "required"})
    assert e.value.param == "tool_choice"


def _generate(llm, plan, max_tokens=96):
    """Greedy decoding under the plan's grammar, prefilled as llama.cpp's common sampler does."""
    import llama_cpp  # after llama_vq (imported by the fixtures) bound it to our library

    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    grammar = llama_cpp.llama_sampler_init_grammar(vocab, plan.grammar.encode(), b"root")
    assert grammar, "llama.cpp refused the grammar"
    for tok in plan.grammar_prefill_tokens:
        llama_cpp.llama_sampler_accept(grammar, tok)
    llama_cpp.llama_sampler_chain_add(chain, grammar)
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
    try:
        llm.reset()
        llm.eval(llm.tokenize(plan.prompt.encode(), add_bos=True, special=True))
        out = b""
        for _ in range(max_tokens):
            tok = llama_cpp.llama_sampler_sample(chain, llm.ctx, -1)
            if llama_cpp.llama_vocab_is_eog(vocab, tok):
                break
            out += llm.detokenize([tok], special=True)
            llm.eval([tok])
        return out.decode("utf-8", errors="replace")
    finally:
        llama_cpp.llama_sampler_free(chain)


@pytest.mark.slow  # ~30 s here: the grammar checks the whole vocabulary at every step
def test_required_tool_call_generated_under_the_grammar_satisfies_the_schema(llm):
    t = ChatTemplates(llm, template_text("Qwen-Qwen2.5-7B-Instruct.jinja"))
    plan = t.apply({"messages": USER, "tools": [GET_TIME, GET_WEATHER], "tool_choice": "required"})
    assert plan.grammar and not plan.grammar_lazy
    assert plan.tool_calls_strict, "required: the grammar must not allow free text before the calls"
    # the generation prompt is cut from the grammar's root: nothing to prefill
    assert plan.grammar_prefill_tokens == () and plan.grammar_prefill_text == ""
    assert not plan.grammar.split("root ::= ")[1].startswith('"<|im_start|>')
    text = _generate(llm, plan)
    msg = t.parse(plan, text)
    print(f"generated: {text!r}")
    assert msg.tool_calls, f"no tool call parsed from {text!r}"
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in (GET_TIME, GET_WEATHER)}
    for call in msg.tool_calls:
        schema = schemas[call.name]
        arguments = json.loads(call.arguments)
        assert set(schema["required"]) <= set(arguments), (call.name, arguments)
        for key, value in arguments.items():
            prop = schema["properties"][key]
            assert isinstance(value, str) and (value in prop.get("enum", [value])), (key, value)


def test_a_prefill_left_by_the_cut_is_tokenized_with_the_models_vocab(llm):
    t = ChatTemplates(llm, template_text("Qwen-Qwen3-0.6B.jinja"))
    plan = t.apply(
        {
            "messages": USER,
            "tools": [GET_TIME],
            "tool_choice": "required",
            "chat_template_kwargs": {"enable_thinking": False},
        }
    )
    assert plan.grammar_prefill_text == "<think>\n\n</think>\n\n"
    assert plan.generation_prompt.endswith(plan.grammar_prefill_text)
    assert plan.grammar_prefill_tokens == tuple(
        llm.tokenize(plan.grammar_prefill_text.encode(), add_bos=False, special=True)
    )


def test_named_tool_choice_keeps_only_that_tool(llm):
    t = ChatTemplates(llm, template_text("Qwen-Qwen2.5-7B-Instruct.jinja"))
    plan = t.apply(
        {
            "messages": USER,
            "tools": [GET_TIME, GET_WEATHER, SPECIAL_FUNCTION],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        }
    )
    assert not plan.grammar_lazy and "get_weather" in plan.grammar
    assert "get_time" not in plan.grammar and "special_function" not in plan.grammar
    with pytest.raises(ChatTemplateError) as e:
        t.apply(
            {"messages": USER, "tools": [GET_TIME], "tool_choice": {"type": "function", "function": {"name": "nope"}}}
        )
    assert e.value.param == "tool_choice.function.name"
