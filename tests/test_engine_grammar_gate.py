"""Grammar prefill (SmolLM2, in process). CPU cost: one engine, 2 short generations."""

from __future__ import annotations

import re

import pytest
from engine_support import run_one, start_engine

from server.engine import GenerationRequest, Grammar, InvalidGrammar, Sampling

PROMPT = "Once upon a time, in a small village by the sea, there lived"
N = 48


@pytest.fixture(scope="module")
def engine(smollm2_path):
    e = start_engine(smollm2_path, "-c", "1024", "-np", "1")
    yield e
    e.shutdown()


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
