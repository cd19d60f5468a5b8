"""Prompt cache of the engine on real models, in process: SWA checkpoints on the MiMo-shaped synthetic
model (4 layers, sliding window 32, K 192 / V 128), the RAM cache, and refusal of damaged states.

Windowed SWA cache: with -np 1 -ub 32 it holds 256 cells (llama.cpp pads n_swa * slots + n_ubatch
to 256) and overwrites a sequence's cells older than the window only when it needs room, so a
sequence must grow past ~256 tokens before an older prefix is lost and a checkpoint is needed.
CPU cost: two small engines, ~700 generated tokens of the 4-layer model; about 10-20 s on 2 cores.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from engine_support import greedy, run_one, start_engine

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import synth_models  # noqa: E402

pytestmark = pytest.mark.slow

TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined movable metal type, oil-based ink and a wooden screw press. Within fifty years "
    "printing shops had opened in more than two hundred European cities, and the price of books fell "
    "sharply. Scholars could compare identical copies of a text for the first time, which changed how "
    "knowledge was checked, argued over and passed on. "
)


@pytest.fixture(scope="module")
def mimo(tmp_path_factory, smollm2_path) -> Path:
    return synth_models.write_mimo_like(
        tmp_path_factory.mktemp("synth") / "mimo.gguf", preset="tiny", tokenizer_from=smollm2_path, seed=0
    )


@pytest.fixture(scope="module")
def swa_engine(mimo):
    e = start_engine(mimo, "-c", "2048", "-np", "1", "-b", "64", "-ub", "32", "--cache-ram", "64")
    yield e
    e.shutdown()


def test_windowed_swa_cache_is_the_default_and_reports_its_real_bytes(mimo, swa_engine):
    full = start_engine(mimo, "-c", "2048", "-np", "1", "-b", "64", "-ub", "32", "--swa-full")
    try:
        win, big = swa_engine.info, full.info
        assert win.n_swa == 32 and not win.swa_full and big.swa_full
        # the 2 full-attention layers are the same size; the 2 SWA layers shrink from 2048 to 256 cells
        assert win.kv_k_bytes + win.kv_v_bytes < big.kv_k_bytes + big.kv_v_bytes
        assert swa_engine.llama.kv_cache_info().total_bytes == win.kv_k_bytes + win.kv_v_bytes
        assert not swa_engine.llama.swa_full and full.llama.swa_full
    finally:
        full.shutdown()


def test_divergence_inside_the_window_restores_a_checkpoint_and_gives_the_recomputed_tokens(swa_engine):
    e = swa_engine
    a = e.tokenize(TEXT)
    assert 64 < len(a) < 200
    # an agent turn: a long answer (past the 256 SWA cells), then the next prompt re-renders it differently
    _, _, first = run_one(e, greedy(a, 300, ignore_eos=True))
    assert first.completion_tokens == 300
    b = a + e.tokenize(" A different continuation follows here.", add_special=False)
    ids, _, done = run_one(e, greedy(b, 16, ignore_eos=True))
    assert e.slots()[0]["n_checkpoints"] >= 1
    # restored from the checkpoint taken 4 tokens before the end of prompt a (not the live sequence,
    # whose window moved on, and not zero)
    assert done.cached_tokens == len(a) - 4, (done.cached_tokens, len(a))
    ref_ids, _, ref = run_one(e, greedy(b, 16, ignore_eos=True, cache_prompt=False))
    assert ref.cached_tokens == 0
    assert ids == ref_ids


def test_ram_cache_serves_a_prefix_after_its_slot_was_reused(swa_engine):
    e = swa_engine
    a = e.tokenize(TEXT * 2)
    run_one(e, greedy(a, 4))
    run_one(e, greedy(e.tokenize("Something unrelated entirely, to take the slot."), 4))
    assert len(e.ram) >= 1  # the slot's sequence went to the RAM cache before it was overwritten
    ids, _, done = run_one(e, greedy(a, 8, ignore_eos=True))
    assert done.cached_tokens >= len(a) - 4
    ref_ids, _, _ = run_one(e, greedy(a, 8, ignore_eos=True, cache_prompt=False))
    assert ids == ref_ids


def test_damaged_ram_cache_entry_is_refused_and_recomputed(swa_engine):
    e = swa_engine
    a = e.tokenize("Refuse damaged states. " + TEXT * 2)  # over --state-min-tokens (128)
    run_one(e, greedy(a, 4))
    run_one(e, greedy(e.tokenize("Another unrelated prompt takes the only slot."), 4))
    entry = next(st for st in e.ram.entries() if [int(t) for t in st.tokens[: len(a)]] == a)
    raw = bytearray(entry.data)
    raw[len(raw) // 2] ^= 0x55
    entry.data = bytes(raw)
    before = e.ram.rejected
    ids, _, done = run_one(e, greedy(a, 8, ignore_eos=True))
    assert e.ram.rejected == before + 1
    assert done.cached_tokens == 0
    ref_ids, _, _ = run_one(e, greedy(a, 8, ignore_eos=True, cache_prompt=False))
    assert ids == ref_ids


def test_ram_cache_entry_of_another_configuration_is_refused(swa_engine):
    e = swa_engine
    a = e.tokenize("Foreign states are never loaded. " + TEXT * 2)
    run_one(e, greedy(a, 4))
    run_one(e, greedy(e.tokenize("Yet another unrelated prompt."), 4))
    entry = next(st for st in e.ram.entries() if [int(t) for t in st.tokens[: len(a)]] == a)
    entry.identity = "another model or cache type"
    entry.digest = entry.compute_digest()  # intact bytes, foreign identity
    before = e.ram.rejected
    _, _, done = run_one(e, greedy(a, 4))
    assert e.ram.rejected == before + 1 and done.cached_tokens == 0


def test_state_file_checkpoints_serve_a_diverging_prompt_after_a_restart(mimo, tmp_path):
    """The state file holds the sequence and its SWA checkpoints: after a restart, a prompt diverging
    where the last answer began restores the checkpoint, and gives the recomputed tokens."""
    flags = ("-c", "2048", "-np", "1", "-b", "64", "-ub", "32", "--state-dir", str(tmp_path), "--state-min-tokens", "8")
    e = start_engine(mimo, *flags)
    try:
        a = e.tokenize(TEXT)
        run_one(e, greedy(a, 300, ignore_eos=True))  # past the window: the file alone cannot be cut back
    finally:
        e.shutdown()
    e = start_engine(mimo, *flags)
    try:
        b = a + e.tokenize(" Then the story changes.", add_special=False)
        ids, _, done = run_one(e, greedy(b, 12, ignore_eos=True))
        assert done.cached_tokens == len(a) - 4, (done.cached_tokens, len(a))
        assert e.metrics.state_restored_tokens.value() >= len(a)
        ref_ids, _, _ = run_one(e, greedy(b, 12, ignore_eos=True, cache_prompt=False))
        assert ids == ref_ids
    finally:
        e.shutdown()


def test_idle_slot_whose_window_cells_another_sequence_reused_is_not_cut_back_without_them(mimo):
    """In the windowed SWA cache a decode may take the cells of another sequence that have left its
    window (llama.cpp's find_slot), which moves that sequence's oldest position. An idle slot's prefix
    is usable only if its window is still there: the slot must judge by llama.cpp's position, not by the
    one it noted when its request ended (that prefix was reused without its window: other tokens)."""
    import llama_cpp

    # -np 2 -ub 32: 32 * 2 + 32 cells, padded to 256; the second request wraps around them
    e = start_engine(mimo, "-c", "2048", "-np", "2", "-b", "64", "-ub", "32", "--cache-ram", "64")
    try:
        mem = llama_cpp.llama_get_memory(e._core.ctx)
        a = e.tokenize(TEXT.split(". ")[0] + ".")
        _, _, first = run_one(e, greedy(a, 40, ignore_eos=True))  # slot 0: positions 0 .. len(a) + 38
        slot = next(s for s in e._sched.slots if s.n_past > 0)
        assert llama_cpp.llama_memory_seq_pos_min(mem, slot.id) == 0
        b = e.tokenize("Something unrelated entirely: a list of rivers, mountains and lakes of the world.")
        run_one(e, greedy(b, 200, ignore_eos=True, cache_prompt=False))  # the other slot, 200+ cells
        k = 12
        pos_min = llama_cpp.llama_memory_seq_pos_min(mem, slot.id)
        assert pos_min >= k, pos_min  # the first k positions of slot 0's window cells were taken
        c = a[:k] + e.tokenize(" and nothing else happened in that year at all.", add_special=False)
        ids, _, done = run_one(e, greedy(c, 16, ignore_eos=True))
        # no checkpoint at or before k tokens (slot 0's is at len(a) - 4): recomputed from the start
        assert done.cached_tokens == 0
        ref_ids, _, ref = run_one(e, greedy(c, 16, ignore_eos=True, cache_prompt=False))
        assert ref.cached_tokens == 0
        assert ids == ref_ids
    finally:
        e.shutdown()
