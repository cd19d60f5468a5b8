"""Per-layer cache types for iSWA models (patch 0010-llama-swa-layer-cache-types): the sliding-window layers' own K/V
types.

Checked on the CPU with a MiMo-shaped synthetic model (arch mimo2, tiny preset: 4 layers, full / SWA / SWA / full,
window 32, K head 192 / V head 128, sinks on the SWA layers), flash attention off:
* the two sub-caches are allocated with their own types, and their bytes are exactly those of the same sub-cache in
  a context whose every layer has that type (references measured in the same test);
* the types set for one context do not leak into the next one created on the thread;
* SWA layers in f16 with quantized full layers generate finite logits closer to all-f16 than all-quantized;
* a state saved with per-layer types loads into the same configuration and continues identically, and is refused
  by a context whose SWA layers hold another type;
* validation names type_k_swa / type_v_swa; non-iSWA models ignore the SWA types.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
from v_cache_support import compare, eval_logits, greedy, long_text

ROOT = Path(__file__).resolve().parents[2]
N_THREADS = int(os.environ.get("LLAMA_VQ_TEST_THREADS", "2"))
# n_ubatch 64: the SWA cache holds GGML_PAD(32 + 64, 256) = 256 cells, fewer than the prompt below
KW = {"n_ctx": 1024, "n_batch": 64, "n_ubatch": 64, "swa_full": False}


@pytest.fixture(scope="module")
def mimo_path(tmp_path_factory, smollm2_path) -> Path:
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import synth_models
    finally:
        sys.path.remove(str(ROOT / "tools"))
    path = tmp_path_factory.mktemp("mimo-swa") / "mimo-tiny.gguf"
    return synth_models.write_mimo_like(path, preset="tiny", tokenizer_from=smollm2_path, seed=7)


def make(llama_vq, path, **kw):
    args = dict(KW, n_threads=N_THREADS, n_threads_batch=N_THREADS, seed=1234, flash_attn=False, verbose=False)
    args.update(kw)
    return llama_vq.Llama(str(path), **args)


def full_bytes(info) -> tuple[int, int]:
    return info.k_bytes - info.swa_k_bytes, info.v_bytes - info.swa_v_bytes


@pytest.mark.parametrize("full,swa", [("q4_0", "f16"), ("f16", "q8_0"), ("q8_0", "q4_1")])
def test_swa_layers_are_allocated_with_their_own_cache_types(llama_vq, mimo_path, full, swa):
    mixed = make(llama_vq, mimo_path, type_k=full, type_v=full, type_k_swa=swa, type_v_swa=swa).kv_cache_info()
    all_full = make(llama_vq, mimo_path, type_k=full, type_v=full).kv_cache_info()
    all_swa = make(llama_vq, mimo_path, type_k=swa, type_v=swa).kv_cache_info()

    assert (mixed.type_k, mixed.type_v, mixed.type_k_swa, mixed.type_v_swa) == (full, full, swa, swa)
    assert (all_full.type_k_swa, all_full.type_v_swa) == (full, full)  # default: as the full layers
    assert mixed.swa_k_bytes > 0 and mixed.swa_v_bytes > 0
    # each sub-cache is exactly the one of a context that uses its type everywhere
    assert (mixed.swa_k_bytes, mixed.swa_v_bytes) == (all_swa.swa_k_bytes, all_swa.swa_v_bytes)
    assert full_bytes(mixed) == full_bytes(all_full)
    assert full_bytes(all_full) != full_bytes(all_swa)  # the types really differ in size
    assert mixed.n_cells == all_full.n_cells


def test_swa_types_apply_to_the_next_context_only(llama_vq, mimo_path):
    make(llama_vq, mimo_path, type_k="q4_0", type_v="q4_0", type_k_swa="f16", type_v_swa="f16")
    after = make(llama_vq, mimo_path, type_k="q4_0", type_v="q4_0").kv_cache_info()
    assert (after.type_k_swa, after.type_v_swa) == ("q4_0", "q4_0")


def test_f16_swa_layers_with_q4_0_full_layers_generate_closer_to_f16(llama_vq, mimo_path):
    """Mean KL from the all-f16 run over a prompt longer than the SWA cache (the ring wraps): f16 SWA layers
    quantize only the 2 full layers of 4, so they must land at least as close to f16 as all-q4_0 does."""
    tokens = make(llama_vq, mimo_path, vocab_only=True).tokenize(long_text().encode())[:600]
    assert len(tokens) > 256 + 64

    def logits(**kw) -> np.ndarray:
        return eval_logits(make(llama_vq, mimo_path, logits_all=True, **kw), tokens)

    ref = logits()
    q4 = compare(ref, logits(type_k="q4_0", type_v="q4_0"), tokens)
    mixed_logits = logits(type_k="q4_0", type_v="q4_0", type_k_swa="f16", type_v_swa="f16")
    mixed = compare(ref, mixed_logits, tokens)
    print(f"\nKL from f16: all q4_0 {q4}\n             SWA f16 + full q4_0 {mixed}")
    assert np.isfinite(mixed_logits).all()
    assert 0 < mixed.kl_mean <= q4.kl_mean
    assert mixed.top1 >= q4.top1 - 1 / len(tokens)


def test_state_with_per_layer_types_continues_identically_and_is_refused_by_other_types(llama_vq, mimo_path):
    from llama_vq import _logs

    types = dict(type_k="q4_0", type_v="q4_0", type_k_swa="f16", type_v_swa="f16")
    tokens = make(llama_vq, mimo_path, vocab_only=True).tokenize(long_text(2).encode())[:120]
    head, last = tokens[:-1], tokens[-1:]

    ref = make(llama_vq, mimo_path, **types)
    ref.eval(head)
    expected = greedy(ref, last, 8)

    src = make(llama_vq, mimo_path, **types)
    src.eval(head)
    state = src.save_state()
    dst = make(llama_vq, mimo_path, **types)
    dst.load_state(state)
    assert greedy(dst, last, 8) == expected

    other = make(llama_vq, mimo_path, type_k="q4_0", type_v="q4_0")
    with _logs.Capture() as cap, pytest.raises(RuntimeError, match="Failed to set llama state data"):
        other.load_state(state)
    # the SWA sub-cache differs: f16 V stored transposed (FA off) against row-major q4_0, and the K type
    assert "V cache layout" in cap.text() or "mismatched key type" in cap.text(), cap.text()


def test_swa_type_errors_name_the_parameter(llama_vq, mimo_path):
    with pytest.raises(llama_vq.CacheConfigError, match="type_v_swa"):
        make(llama_vq, mimo_path, type_v_swa="q3_k")
    with pytest.raises(llama_vq.CacheConfigError, match="type_k_swa"):
        llama_vq.check_config(mimo_path, type_k_swa="nope")
    llama_vq.check_config(mimo_path, type_k="q4_0", type_v="q4_0", type_k_swa="f16", type_v_swa="f16")


def test_models_without_sliding_window_layers_ignore_swa_types(llama_vq, smollm2_path):
    llm = make(
        llama_vq,
        smollm2_path,
        n_ctx=256,
        swa_full=True,
        type_k="q8_0",
        type_v="q8_0",
        type_k_swa="f16",
        type_v_swa="f16",
    )
    info = llm.kv_cache_info()
    assert (info.type_k, info.type_v, info.type_k_swa, info.swa_k_bytes) == ("q8_0", "q8_0", None, 0)
    assert len(greedy(llm, llm.tokenize(b"The capital of France is"), 3)) == 3
