"""Sampler chains and the text stream of the engine (SmolLM2, in process).

CPU cost: one engine, ~12 generations of <= 16 tokens; a few seconds on 2 cores.
"""

from __future__ import annotations

import collections

import pytest
from engine_support import greedy, run_one, start_engine

from server.engine import GenerationRequest, Grammar, InvalidGrammar, Sampling
from server.engine.text import TextStream

PROMPT = "The three primary colours are"


@pytest.fixture(scope="module")
def engine(smollm2_path):
    e = start_engine(smollm2_path, "-c", "1024", "-np", "2")
    yield e
    e.shutdown()


def _run(engine, **kw):
    return run_one(engine, GenerationRequest(tuple(engine.tokenize(PROMPT)), **kw))


def test_text_stream_holds_back_a_partial_stop_and_splits_utf8_safely():
    ts = TextStream(("STOP",))
    assert ts.push(1, b"ab") == ("ab", (1,), None)
    assert ts.push(2, b"cST") == ("c", (2,), None)  # "ST" may start "STOP": held back
    assert ts.push(3, b"O") == ("", (), None)  # "STO" still may
    assert ts.push(4, b"X") == ("STOX", (3, 4), None)  # no longer a stop prefix: released
    euro = "€".encode()
    assert ts.push(5, euro[:2]) == ("", (), None)  # half a character is never emitted
    assert ts.push(6, euro[2:] + b"STOP!") == ("€", (5, 6), "STOP")
    ts2 = TextStream(("</end>",))
    ts2.push(7, b"x</e")
    assert ts2.flush() == ("</e", ())


def test_same_seed_repeats_and_another_seed_differs_at_temperature_one(engine):
    s = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    a = _run(engine, sampling=Sampling(seed=7, **s), max_tokens=16)[0]
    b = _run(engine, sampling=Sampling(seed=7, **s), max_tokens=16)[0]
    others = {_run(engine, sampling=Sampling(seed=k, **s), max_tokens=16)[0] for k in (8, 9, 10)}
    assert a == b
    assert others - {a}, "three other seeds all gave the seed-7 sample"


def test_logit_bias_bans_the_greedy_token(engine):
    ids = _run(engine, sampling=Sampling(temperature=0), max_tokens=4)[0]
    banned = _run(engine, sampling=Sampling(temperature=0, logit_bias=((ids[0], float("-inf")),)), max_tokens=4)[0]
    assert banned[0] != ids[0]


def test_penalties_change_a_repetitive_greedy_continuation(engine):
    prompt = tuple(engine.tokenize("na na na na na na na na na na"))
    plain = run_one(engine, greedy(prompt, 12))[0]
    penalised = run_one(
        engine,
        GenerationRequest(prompt, Sampling(temperature=0, repeat_penalty=1.5, presence_penalty=1.0), max_tokens=12),
    )[0]
    assert plain != penalised
    top = lambda ids: max(collections.Counter(ids).values())  # noqa: E731
    assert top(penalised) < top(plain)


def test_grammar_constrains_the_output_and_a_bad_grammar_is_refused_at_submit(engine):
    _, text, _ = _run(engine, sampling=Sampling(temperature=0), grammar=Grammar('root ::= [0-9]+ "."'), max_tokens=8)
    assert text and text.rstrip(".").isdigit(), text
    with pytest.raises(InvalidGrammar):
        engine.submit(GenerationRequest(tuple(engine.tokenize(PROMPT)), grammar=Grammar("root ::= (")))


def test_lazy_grammar_waits_for_its_trigger(engine):
    free = _run(engine, sampling=Sampling(temperature=0), max_tokens=8)[1]
    never = Grammar('root ::= "<x>" [0-9]+', lazy=True, trigger_patterns=("<x>",))
    assert _run(engine, sampling=Sampling(temperature=0), grammar=never, max_tokens=8)[1] == free


def test_the_batch_loops_short_calls_keep_the_gil_and_are_the_librarys_own():
    """server/engine/held.py: the sampler, EOG, piece and position calls go through a PyDLL view of the loaded
    libllama (the GIL is kept across them), at the bindings' addresses and with their signatures."""
    import ctypes

    import llama_cpp

    from server.engine import held

    pairs = [
        (held.sampler_sample, llama_cpp.llama_sampler_sample),
        (held.sampler_accept, llama_cpp.llama_sampler_accept),
        (held.vocab_is_eog, llama_cpp.llama_vocab_is_eog),
        (held.token_to_piece, llama_cpp.llama_token_to_piece),
        (held.memory_seq_pos_min, llama_cpp.llama_memory_seq_pos_min),
        (held.memory_seq_pos_max, llama_cpp.llama_memory_seq_pos_max),
        (held.get_memory, llama_cpp.llama_get_memory),
    ]
    for fast, orig in pairs:
        assert fast._flags_ & ctypes._FUNCFLAG_PYTHONAPI, fast  # no GIL release around the call
        assert not orig._flags_ & ctypes._FUNCFLAG_PYTHONAPI
        assert ctypes.cast(fast, ctypes.c_void_p).value == ctypes.cast(orig, ctypes.c_void_p).value
        assert (fast.argtypes, fast.restype) == (orig.argtypes, orig.restype)

