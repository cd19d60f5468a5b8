"""Parallel slots with continuous batching on a real engine (SmolLM2, in process, CPU).

CPU cost: one engine, ~8 short greedy generations and one aborted prefill; about 10-20 s on 2 cores.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from engine_support import collect, greedy, run_one, run_together, start_engine

pytestmark = pytest.mark.slow

PROMPTS = [
    "The history of the printing press begins in the fifteenth century, when",
    "def fibonacci(n):\n    ",
    "Water boils at one hundred degrees Celsius at sea level because",
    "Once upon a time, in a small village by the sea, there lived",
]
N_BATCH, N_UBATCH = 512, 32


@pytest.fixture(scope="module")
def engine(smollm2_path):
    e = start_engine(smollm2_path, "-c", "4096", "-np", "4", "-b", str(N_BATCH), "-ub", str(N_UBATCH))
    yield e
    e.shutdown()


def _tok(engine, text):
    return engine.tokenize(text)


def test_parallel_greedy_requests_give_the_tokens_each_gives_alone(engine):
    reqs = [greedy(_tok(engine, p), 24, cache_prompt=False) for p in PROMPTS]
    alone = [run_one(engine, r)[0] for r in reqs]
    together = run_together(engine, reqs)
    assert all(len(a) > 0 for a in alone)
    assert [t[0] for t in together] == alone
    assert all(d.cached_tokens == 0 for _, _, d in together)


def test_more_requests_than_slots_wait_and_all_finish(engine):
    reqs = [greedy(_tok(engine, p + " " + str(i)), 8) for i in range(2) for p in PROMPTS]
    outs = run_together(engine, reqs)
    assert len(outs) == 8 and all(d.finish_reason in ("length", "stop") for _, _, d in outs)


def test_a_request_sharing_a_prefix_goes_to_the_slot_that_holds_it(engine):
    base = _tok(engine, PROMPTS[0] + " printing spread across Europe within fifty years, and")
    run_one(engine, greedy(base, 4))
    _, _, done = run_one(engine, greedy(base + _tok(engine, " then")[1:], 4))
    assert done.cached_tokens >= len(base) - 1
    assert done.timings["cache_n"] == done.cached_tokens


def test_stop_string_is_never_emitted_and_ends_the_request(engine):
    prompt = _tok(engine, "Count: one, two, three, four, five, six,")
    ids, text, _ = run_one(engine, greedy(prompt, 24))
    assert "," in text, text  # the model continues the list: a stop string that will occur
    cut = text.index(",")
    _, stopped, done = run_one(engine, greedy(prompt, 24, stop=(",",)))
    assert done.finish_reason == "stop" and done.stop_word == ","
    assert stopped == text[:cut]


def test_cancelled_long_prefill_stops_within_one_ubatch_and_frees_its_slot(engine):
    """-b 512 -ub 32: one llama_decode runs 16 ubatches. Cancelled mid-decode, the abort callback stops
    it within the running ubatch, so fewer than 512 tokens of that decode are kept; without it the
    whole decode would finish first."""
    from server.engine import ProgressEvent

    words = " ".join(f"item{i}" for i in range(1400))
    prompt = _tok(engine, words)[:3000]
    assert len(prompt) > 3 * N_BATCH

    async def go():
        job = engine.submit(greedy(prompt, 4, cache_prompt=False))
        while True:
            ev = await job.next_event(600)  # one 512-token decode; minutes only on a very busy machine
            assert ev is not None
            if isinstance(ev, ProgressEvent) and ev.processed > 0:
                break
        job.cancel()
        t0 = time.monotonic()
        at_cancel = engine.slots()[job.slot_id]["n_past"]
        _, _, done = await collect(job)
        return done, at_cancel, time.monotonic() - t0, job.slot_id

    done, at_cancel, waited, slot = asyncio.run(go())
    assert done.finish_reason == "cancelled"
    kept = done.timings["prompt_n"]
    assert at_cancel <= kept < at_cancel + N_BATCH, (at_cancel, kept)
    assert (kept - at_cancel) % N_UBATCH == 0
    assert engine.slots()[slot]["state"] == "idle"
    assert run_one(engine, greedy(_tok(engine, "Hi"), 2))[2].finish_reason in ("length", "stop")
    print(f"\ncancel -> done {waited * 1e3:.0f} ms; kept {kept} prompt tokens (cancelled at {at_cancel})")


def test_timeout_ends_a_request_with_finish_reason_timeout(engine):
    prompt = _tok(engine, PROMPTS[2])
    _, _, done = run_one(engine, greedy(prompt, 100000, ignore_eos=True, timeout_s=3.0))
    assert done.finish_reason == "timeout"
    assert 0 < done.completion_tokens < 4000


def test_split_kv_streams_give_the_same_tokens_and_bound_a_slot(smollm2_path):
    """--no-kv-unified (a KV stream per slot, llama-server's layout with an explicit -np): a slot holds
    ctx-size / slots tokens, and parallel greedy requests still give the tokens each gives alone."""
    from server.engine import errors as engine_errors

    e = start_engine(smollm2_path, "-c", "2048", "-np", "2", "--no-kv-unified", "-b", "256", "-ub", "32")
    try:
        assert e.info.n_ctx == 1024
        reqs = [greedy(_tok(e, p), 16, cache_prompt=False) for p in PROMPTS[:2]]
        alone = [run_one(e, r)[0] for r in reqs]
        assert [t[0] for t in run_together(e, reqs)] == alone
        with pytest.raises(engine_errors.PromptTooLong):
            e.submit(greedy([1] * 1100, 4))
    finally:
        e.shutdown()
