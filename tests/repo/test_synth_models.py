"""tools/synth_models.py: synthetic GGUF models that the pinned llama.cpp loads and runs.

CPU cost: six tiny models written (two with an MTP block), four loaded, a few short evaluations: ~16 s of CPU,
~18 s wall on an idle 2-core machine.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import synth_models  # noqa: E402

GQT = synth_models.GQT


def _header(path):
    kv, tensors = synth_models.read_gguf_header(path, keys=lambda k: not k.startswith("tokenizer."), tensors=True)
    return {k: v.value for k, v in kv.items()}, {t.name: t for t in tensors}


@pytest.fixture(scope="module")
def mimo_tiny(tmp_path_factory, smollm2_path) -> Path:
    return synth_models.write_mimo_like(
        tmp_path_factory.mktemp("synth") / "mimo.gguf",
        preset="tiny",
        tokenizer_from=smollm2_path,
        seed=0,
    )


@pytest.fixture(scope="module")
def mimo_mtp(tmp_path_factory, smollm2_path) -> Path:
    return synth_models.write_mimo_like(
        tmp_path_factory.mktemp("synth") / "mimo-mtp.gguf",
        preset="tiny-mtp",
        tokenizer_from=smollm2_path,
        seed=0,
    )


@pytest.fixture(scope="module")
def llama_tiny(tmp_path_factory, smollm2_path) -> Path:
    return synth_models.write_llama_like(
        tmp_path_factory.mktemp("synth") / "llama.gguf", "tiny", tokenizer_from=smollm2_path, seed=0
    )


def test_mimo_like_mixes_swa_and_full_layers_with_sinks_and_k192_v128_heads(mimo_tiny):
    kv, t = _header(mimo_tiny)
    assert kv["general.architecture"] == "mimo2"
    n_layer = kv["mimo2.block_count"]
    pattern = kv["mimo2.attention.sliding_window_pattern"]
    assert len(pattern) == n_layer and set(pattern) == {0, 1}
    assert kv["mimo2.attention.key_length"] == 192 and kv["mimo2.attention.value_length"] == 128
    kv_heads = kv["mimo2.attention.head_count_kv"]
    assert len(set(kv_heads)) == 2, "full and SWA layers have different KV head counts"
    n_head = kv["mimo2.attention.head_count"]
    for il in range(n_layer):
        sinks = t.get(f"blk.{il}.attn_sinks.weight")
        assert (sinks is not None) == bool(pattern[il]), f"layer {il}: sinks on SWA layers only"
        if sinks is not None:
            assert sinks.shape == (n_head,)
        qkv = t[f"blk.{il}.attn_qkv.weight"]
        assert qkv.shape == (
            kv["mimo2.embedding_length"],
            n_head * 192 + kv_heads[il] * (192 + 128),
        )
    assert "blk.0.ffn_gate.weight" in t and "blk.1.ffn_gate_exps.weight" in t, "dense first layer, then MoE"


def test_llama_like_follows_the_q4_k_m_recipe(tmp_path, smollm2_path):
    path = synth_models.write_llama_like(tmp_path / "l8.gguf", "tiny", n_layer=8, tokenizer_from=smollm2_path)
    kv, t = _header(path)
    assert kv["general.file_type"] == 15  # MOSTLY_Q4_K_M
    assert t["output.weight"].qtype == GQT.Q6_K and t["token_embd.weight"].qtype == GQT.Q4_K
    # llama.cpp's use_more_bits(i, 8): i < 1, i >= 7, (i - 1) % 3 == 2
    more = {0, 3, 6, 7}
    for il in range(8):
        want = GQT.Q6_K if il in more else GQT.Q4_K
        assert t[f"blk.{il}.attn_v.weight"].qtype == want and t[f"blk.{il}.ffn_down.weight"].qtype == want
        assert t[f"blk.{il}.attn_q.weight"].qtype == GQT.Q4_K


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_K", "Q6_K"])
@pytest.mark.parametrize("std", [1.0, 0.004])
def test_random_blocks_dequantize_to_the_requested_spread(qtype, std):
    # 65536 values: the sample std's own error is ~0.3%; the scales are rounded to f16 (and
    # subnormal at std 0.004 for the K-quants): 3% bounds both with room; a wrong formula is off
    # by more than 10%
    data, raw = synth_models._Rand(3).tensor((64, 1024), GQT[qtype], std)
    x = synth_models.gguf.quants.dequantize(data, raw)
    assert x.shape == (64, 1024)
    assert abs(x.std() / std - 1) < 0.03
    assert abs(x.mean()) < 0.02 * std


def _next_token_probs(llm, text: str) -> np.ndarray:
    toks = llm.tokenize(text.encode(), add_bos=True)
    llm.reset()
    llm.eval(toks)
    logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
    p = np.exp(logits - logits.max())
    return p / p.sum()


@pytest.mark.parametrize("which", ["mimo_tiny", "llama_tiny"])
def test_synthetic_model_loads_generates_and_has_a_non_degenerate_next_token_distribution(llama_vq, which, request):
    path = request.getfixturevalue(which)
    llm = llama_vq.Llama(str(path), n_ctx=256, n_batch=64, n_threads=2, verbose=False, seed=0, logits_all=True)
    n_vocab = llm.n_vocab()
    a = _next_token_probs(llm, "The quick brown fox jumps over the lazy dog. " * 3)
    b = _next_token_probs(llm, "Once upon a time, in a land far away, there lived")
    for p in (a, b):
        h = float(-(p * np.log(p + 1e-300)).sum())
        # not one-hot (entropy above 0.2 nats, top token below 0.99) and not uniform (entropy at
        # least 2 nats under ln V). Seen with these seeds: 2.5 to 5.5 nats of ~10.8, top token
        # 0.06 to 0.83 (a real model's spread); a scale bug gives ~0 or ~ln V
        assert 0.2 < h < math.log(n_vocab) - 2.0, h
        assert p.max() < 0.99
    # the context matters: two prompts give clearly different distributions
    kl = float((a * (np.log(a + 1e-300) - np.log(b + 1e-300))).sum())
    assert kl > 0.1, kl
    out = llm("Hello", max_tokens=8, temperature=0.0)
    assert out["usage"]["completion_tokens"] >= 1


def test_mimo_mtp_appends_nextn_blocks_laid_out_as_the_mimo_converter_writes_them(mimo_mtp):
    kv, t = _header(mimo_mtp)
    n_trunk = 4
    assert kv["mimo2.nextn_predict_layers"] == 1
    assert kv["mimo2.block_count"] == n_trunk + 1, "block_count counts trunk and MTP blocks"
    # the MTP block attends like an SWA layer: pattern and KV-head arrays cover it
    assert kv["mimo2.attention.sliding_window_pattern"] == [0, 1, 1, 0, 1]
    kv_heads = kv["mimo2.attention.head_count_kv"]
    assert len(kv_heads) == n_trunk + 1 and kv_heads[n_trunk] == kv_heads[1]
    n_embd = kv["mimo2.embedding_length"]
    b = f"blk.{n_trunk}."
    assert t[b + "nextn.eh_proj.weight"].shape == (2 * n_embd, n_embd)
    for name in ("nextn.enorm", "nextn.hnorm", "layer_output_norm", "attn_norm", "ffn_norm"):
        assert t[b + name + ".weight"].shape == (n_embd,), name
    assert b + "attn_qkv.weight" in t and b + "attn_sinks.weight" in t
    assert b + "ffn_gate.weight" in t and b + "ffn_gate_exps.weight" not in t, "dense MTP FFN"
    # the token embedding and LM head are the trunk's
    assert not any(".nextn.embed_tokens" in n or ".nextn.shared_head" in n for n in t)
    # the trunk is the tiny preset's, unchanged
    assert f"blk.{n_trunk - 1}.ffn_gate_exps.weight" in t and f"blk.{n_trunk + 1}.attn_norm.weight" not in t


def test_mimo_mtp_cli_flag_sets_the_number_of_nextn_blocks(tmp_path, smollm2_path):
    out = tmp_path / "m.gguf"
    rc = synth_models.main(
        ["mimo", str(out), "--preset", "tiny", "--n-layer", "2", "--mtp", "2", "--tokenizer-from", str(smollm2_path)]
    )
    assert rc == 0
    kv, t = _header(out)
    assert kv["mimo2.nextn_predict_layers"] == 2 and kv["mimo2.block_count"] == 4
    assert "blk.2.nextn.eh_proj.weight" in t and "blk.3.nextn.eh_proj.weight" in t
    # without --mtp the tiny preset has no nextn key at all (as a checkpoint converted --no-mtp)
    synth_models.main(["mimo", str(out), "--preset", "tiny", "--tokenizer-from", str(smollm2_path)])
    kv, t = _header(out)
    assert "mimo2.nextn_predict_layers" not in kv and not any(".nextn." in n for n in t)


def test_mimo_mtp_model_loads_reports_its_nextn_layer_and_keeps_the_trunk_of_the_model_without(
    llama_vq, mimo_mtp, mimo_tiny
):
    import llama_cpp

    text = "The quick brown fox jumps over the lazy dog."
    probs = []
    for path in (mimo_mtp, mimo_tiny):
        llm = llama_vq.Llama(str(path), n_ctx=256, n_batch=64, n_threads=2, verbose=False, seed=0, logits_all=True)
        assert llama_cpp.llama_model_n_layer_nextn(llm.model) == (1 if path == mimo_mtp else 0)
        probs.append(_next_token_probs(llm, text))
    # the MTP blocks' tensors come after the trunk's, so the same seed draws the same trunk; the main
    # graph runs the trunk only
    assert np.array_equal(probs[0], probs[1])


def test_mimo_mtp_echo_head_passes_the_token_embedding_to_a_copy_of_it(tmp_path, smollm2_path):
    path = synth_models.write_mimo_like(
        tmp_path / "echo.gguf", preset="tiny-mtp", mtp_head="echo", tokenizer_from=smollm2_path, seed=3
    )
    kv, t = _header(path)
    n_embd = kv["mimo2.embedding_length"]
    assert t["blk.4.nextn.eh_proj.weight"].qtype == GQT.F16
    assert t["blk.4.nextn.shared_head_head.weight"].shape == t["token_embd.weight"].shape

    def raw(name):
        return synth_models.read_tensor_bytes(path, t[name])

    eh = np.frombuffer(raw("blk.4.nextn.eh_proj.weight"), dtype=np.float16).reshape(n_embd, 2 * n_embd)
    assert np.array_equal(eh[:, :n_embd], np.eye(n_embd)) and not eh[:, n_embd:].any()
    assert raw("blk.4.nextn.shared_head_head.weight") == raw("token_embd.weight")
    for name in ("blk.4.attn_output.weight", "blk.4.ffn_down.weight"):
        assert not np.frombuffer(raw(name), dtype=np.uint8).any(), name


def test_mimo_mtp_tensors_load_with_their_expected_shapes_when_mtp_loading_is_asked_for(llama_vq, mimo_mtp):
    # llama.cpp skips the MTP tensors unless load_mtp is set (what --spec-type draft-mtp does);
    # with it, every nextn tensor must be found with the shape mimo2.cpp creates it with
    import llama_cpp

    params = llama_cpp.llama_model_default_params()
    params.load_mtp = True
    model = llama_cpp.llama_model_load_from_file(str(mimo_mtp).encode(), params)
    assert model, "llama.cpp refused the MTP tensors (see the log for the tensor)"
    try:
        assert llama_cpp.llama_model_n_layer_nextn(model) == 1
    finally:
        llama_cpp.llama_model_free(model)
