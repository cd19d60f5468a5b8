"""The Llama-like family of tools/synth_models.py: arch ``llama`` (Llama-3.1-8B shape by default) with Q4_K_M-like
weights (Q4_K everywhere, Q6_K for the output matrix and for attn_v / ffn_down on the layers llama.cpp's Q4_K_M
recipe gives more bits), random, with O(1) activations (synth_gguf's scale choices)."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synth_gguf import (  # noqa: E402
    _ATTN_SCORE_STD,
    GQT,
    _add_tokenizer,
    _ones,
    _rnd,
    _Scales,
    _Streamer,
    _w_std,
    default_tokenizer_source,
    gguf,
    read_tokenizer_kv,
)

# ----------------------------------------------------------------------------
# Llama-like (arch llama), Q4_K_M-like

LLAMA_PRESETS: dict[str, dict] = {
    "llama-3.1-8b": dict(
        n_layer=32,
        n_embd=4096,
        n_head=32,
        n_head_kv=8,
        n_ff=14336,
        n_vocab=128256,
        rope_base=500000.0,
        n_ctx_train=131072,
        recipe="q4_k_m",
    ),
    # CPU tests: Q4_K needs rows that are multiples of 256
    "tiny": dict(
        n_layer=2,
        n_embd=256,
        n_head=4,
        n_head_kv=2,
        n_ff=512,
        n_vocab=None,
        rope_base=10000.0,
        n_ctx_train=4096,
        recipe="q4_k_m",
    ),
}


def _q4_k_m_more_bits(il: int, n_layer: int) -> bool:
    # llama.cpp's use_more_bits() for Q4_K_M's attn_v / ffn_down
    return il < n_layer // 8 or il >= 7 * n_layer // 8 or (il - n_layer // 8) % 3 == 2


def write_llama_like(
    path: str | os.PathLike,
    preset: str = "llama-3.1-8b",
    *,
    tokenizer_from: str | os.PathLike | None = None,
    seed: int = 0,
    **overrides,
) -> Path:
    """Write a random-weight GGUF of arch ``llama`` and return its path.

    Presets: "llama-3.1-8b" (32 layers, 32 heads, 8 KV heads, head 128, n_ff 14336, vocab
    128256 padded from the tokenizer source) and "tiny". Weights follow llama.cpp's Q4_K_M
    recipe: Q4_K, with Q6_K for output.weight and for attn_v / ffn_down on the layers
    use_more_bits() selects. ``recipe="f16"`` writes F16 weights instead.
    """
    if preset not in LLAMA_PRESETS:
        raise ValueError(f"unknown llama preset {preset!r}; known: {sorted(LLAMA_PRESETS)}")
    p = dict(LLAMA_PRESETS[preset])
    unknown = set(overrides) - set(p)
    if unknown:
        raise TypeError(f"unknown parameters: {sorted(unknown)}")
    p.update(overrides)
    nl, n_embd, n_head, n_kv, n_ff = (
        p["n_layer"],
        p["n_embd"],
        p["n_head"],
        p["n_head_kv"],
        p["n_ff"],
    )
    hd = n_embd // n_head
    if p["recipe"] == "q4_k_m":
        base_t, more_t, out_t, ftype = (
            GQT.Q4_K,
            GQT.Q6_K,
            GQT.Q6_K,
            gguf.LlamaFileType.MOSTLY_Q4_K_M,
        )
    elif p["recipe"] == "f16":
        base_t = more_t = out_t = GQT.F16
        ftype = gguf.LlamaFileType.MOSTLY_F16
    else:
        raise ValueError(f"recipe must be 'q4_k_m' or 'f16', not {p['recipe']!r}")
    sc = _Scales()

    tok = read_tokenizer_kv(tokenizer_from or default_tokenizer_source())
    out = _Streamer(Path(path), "llama", seed)
    w = out.writer
    w.add_name(f"llama-vq synthetic llama ({preset})")
    w.add_context_length(p["n_ctx_train"])
    w.add_embedding_length(n_embd)
    w.add_block_count(nl)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(p["rope_base"])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(ftype)
    n_vocab = _add_tokenizer(w, tok, p["n_vocab"])
    w.add_vocab_size(n_vocab)

    ones, rnd = _ones, _rnd
    qk_std = _w_std(n_embd, _ATTN_SCORE_STD)
    out.add("token_embd.weight", (n_embd, n_vocab), base_t, rnd((n_embd, n_vocab), base_t, sc.embd_std))
    for il in range(nl):
        b = f"blk.{il}."
        more = more_t if _q4_k_m_more_bits(il, nl) else base_t
        out.add(b + "attn_norm.weight", (n_embd,), GQT.F32, ones(n_embd))
        out.add(b + "attn_q.weight", (n_embd, n_embd), base_t, rnd((n_embd, n_embd), base_t, qk_std))
        out.add(
            b + "attn_k.weight",
            (n_embd, n_kv * hd),
            base_t,
            rnd((n_embd, n_kv * hd), base_t, qk_std),
        )
        out.add(
            b + "attn_v.weight",
            (n_embd, n_kv * hd),
            more,
            rnd((n_embd, n_kv * hd), more, _w_std(n_embd)),
        )
        out.add(
            b + "attn_output.weight",
            (n_embd, n_embd),
            base_t,
            rnd((n_embd, n_embd), base_t, _w_std(n_embd, sc.attn_out_gain * 2.0)),
        )
        out.add(b + "ffn_norm.weight", (n_embd,), GQT.F32, ones(n_embd))
        out.add(
            b + "ffn_gate.weight",
            (n_embd, n_ff),
            base_t,
            rnd((n_embd, n_ff), base_t, _w_std(n_embd)),
        )
        out.add(b + "ffn_up.weight", (n_embd, n_ff), base_t, rnd((n_embd, n_ff), base_t, _w_std(n_embd)))
        out.add(
            b + "ffn_down.weight",
            (n_ff, n_embd),
            more,
            rnd((n_ff, n_embd), more, _w_std(n_ff, sc.ffn_out_gain)),
        )
    out.add("output_norm.weight", (n_embd,), GQT.F32, ones(n_embd))
    out.add(
        "output.weight",
        (n_embd, n_vocab),
        out_t,
        rnd((n_embd, n_vocab), out_t, sc.logit_std / math.sqrt(n_embd)),
    )
    out.write()
    return Path(path)
