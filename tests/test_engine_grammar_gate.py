"""Grammar prefill and reasoning gating of a lazy grammar (SmolLM2, in process).

The reasoning tests are driven by the model's own greedy text, measured first in the same test: words
of it stand in for the reasoning tags and the tool-call trigger, so that where the grammar starts (or
must not) is known exactly. The grammar forces " ZQX" after its trigger, then the end of generation.

CPU cost: one engine, ~10 greedy generations of <= 48 tokens; a few seconds on 2 cores.
"""

from __future__ import annotations

import re

import pytest
from engine_support import greedy, run_one, start_engine

from server.engine import GenerationRequest, Grammar, InvalidGrammar, Reasoning, Sampling
from server.engine.reasoning import ReasoningWatch

PROMPT = "Once upon a time, in a small village by the sea, there lived"
N = 48


@pytest.fixture(scope="module")
def engine(smollm2_path):
    e = start_engine(smollm2_path, "-c", "1024", "-np", "1")
    yield e
    e.shutdown()


@pytest.fixture(scope="module")
def reference(engine):
    """The greedy text and its fresh words: (word, end offset in the text) of tokens that are one word
    which does not occur earlier in the text (so a trigger pattern for it first matches there)."""
    ids, text, _ = run_one(engine, greedy(engine.tokenize(PROMPT), N, cache_prompt=False))
    pieces = [engine.detokenize([t]) for t in ids]
    assert "".join(pieces) == text
    fresh, at = [], 0
    for p in pieces:
        at += len(p)
        m = re.fullmatch(r" ?([A-Za-z]{4,})", p)
        if m and m.group(1) not in text[: at - len(m.group(1))] and all(m.group(1) not in w for w, _ in fresh):
            fresh.append((m.group(1), at))
    assert len(fresh) >= 4, text
    return text, fresh


def _lazy(*words: str) -> Grammar:
    alts = " | ".join(f'"{w}"' for w in words)
    pattern = r"[\s\S]*?(" + "|".join(words) + r")[\s\S]*"
    return Grammar(f'root ::= ({alts}) " ZQX"', lazy=True, trigger_patterns=(pattern,))


def _run(engine, grammar: Grammar, reasoning: Reasoning | None = None) -> str:
    req = greedy(engine.tokenize(PROMPT), N, grammar=grammar, reasoning=reasoning, cache_prompt=False)
    return run_one(engine, req)[1]


def test_a_trigger_inside_an_open_reasoning_block_does_not_start_the_grammar(engine, reference):
    text, fresh = reference
    (trig, trig_end), (end_tag, end_at) = fresh[0], fresh[1]
    assert _run(engine, _lazy(trig)) == text[:trig_end] + " ZQX"  # ungated, the trigger fires
    gated = _run(engine, _lazy(trig), Reasoning("<think>", (end_tag,), open_at_start=True))
    assert gated.startswith(text[:end_at]), (gated, end_tag)  # past the trigger and the end tag, unconstrained


def test_the_grammar_is_fed_before_a_start_tag_and_after_the_end_tag_only(engine, reference):
    text, fresh = reference
    (start, _), (inside, _), (end_tag, _), (after, after_end) = fresh[:4]
    r = Reasoning(start, (end_tag,), open_at_start=False)
    assert _run(engine, _lazy(inside, after), r) == text[:after_end] + " ZQX"
    # the block never opens (its start tag is not generated): the first trigger fires
    r_never = Reasoning("<never>", (end_tag,), open_at_start=False)
    assert _run(engine, _lazy(inside, after), r_never) == text[: fresh[1][1]] + " ZQX"


def test_prefill_tokens_start_a_non_lazy_grammar_inside_the_generation_prompt(engine):
    tail = "<think>\n\n</think>\n\n"  # what Qwen3's template leaves open with thinking off
    gbnf = r'root ::= "<think>\n\n</think>\n\n" "{\"n\": " [0-9] [0-9] "}"'
    prompt = tuple(engine.tokenize(PROMPT + tail))
    pre = tuple(engine.tokenize(tail, False, True))
    s = Sampling(temperature=0)
    text = run_one(engine, GenerationRequest(prompt, s, Grammar(gbnf, prefill_tokens=pre), max_tokens=16))[1]
    assert re.fullmatch(r'\{"n": [0-9]{2}\}', text), text
    unfilled = run_one(engine, GenerationRequest(prompt, s, Grammar(gbnf), max_tokens=16))[1]
    assert unfilled.startswith("<think>"), unfilled  # without it the model must repeat the prompt's tail
    with pytest.raises(InvalidGrammar):
        engine.submit(
            GenerationRequest(prompt, grammar=Grammar(gbnf, prefill_tokens=tuple(engine.tokenize("no", False))))
        )


def test_reasoning_watch_spans_tokens_and_replays_the_end_tag_tokens():
    w = ReasoningWatch(Reasoning("<think>", ("</think>",), open_at_start=False))
    assert w.push(1, b"hi <th") == () and not w.inside
    assert w.push(2, b"ink>plan") == () and w.inside
    assert w.push(3, b" more" * 200) == () and w.inside  # a long block is trimmed, still inside
    assert w.push(4, b" </th") == () and w.inside
    assert w.push(5, b"ink>\n") == (4, 5) and not w.inside
    assert w.push(6, b"<tool_call>") == () and not w.inside
    opened = ReasoningWatch(Reasoning("<think>", ("</think>", "[END]"), open_at_start=True))
    assert opened.inside and opened.push(7, b"x[END]y") == (7,) and not opened.inside


def test_render_special_renders_only_the_preserved_special_tokens(engine):
    im_start = engine.tokenize("<|im_start|>", False, True)
    assert len(im_start) == 1
    tok = im_start[0]
    prompt = tuple(engine.tokenize(PROMPT))
    s = Sampling(temperature=0, logit_bias=((tok, 100.0),))

    def text(**kw):
        return run_one(engine, GenerationRequest(prompt, s, max_tokens=2, render_special=True, **kw))[1]

    assert text() == "<|im_start|>" * 2  # no list: every special token, as before
    assert text(preserved_token_ids=(tok,)) == "<|im_start|>" * 2
    assert text(preserved_token_ids=(tok + 1,)) == ""  # special, not preserved: not rendered
