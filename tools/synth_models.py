#!/usr/bin/env python3
"""Synthetic GGUF models from random weights, for tests and benchmarks.

Two families, written with the gguf package that matches the pinned llama.cpp
(``vendor/llama.cpp/gguf-py``):

* ``write_mimo_like``: arch ``mimo2`` as the pinned llama.cpp loads it
  (src/models/mimo2.cpp): sliding-window and full-attention layers mixed by a
  per-layer pattern, attention sinks, K/Q head size 192 and V head size 128,
  per-layer KV head counts (full and SWA layers differ), partial RoPE, a dense
  first layer and (tiny) sigmoid-routed MoE layers after it; optionally (``n_mtp``, CLI
  ``--mtp N``, preset ``tiny-mtp``) MiMo's multi-token-prediction (NextN) blocks after the trunk,
  for ``--spec-type draft-mtp``.
* ``write_llama_like``: arch ``llama`` (Llama-3.1-8B shape by default) with
  Q4_K_M-like weights: Q4_K everywhere, Q6_K for the output matrix and for
  attn_v / ffn_down on the layers llama.cpp's Q4_K_M recipe gives more bits.

Weights are random. Quantized tensors are synthesized block by block (random
quants, scales chosen so each tensor has the requested standard deviation),
which is as fast as writing the bytes, so an 8B-shaped file takes seconds.
Float tensors are Gaussian. Scales are chosen so that attention scores, the
residual stream and the logits are all O(1): the next-token distribution is
neither one-hot nor uniform (``tests/repo/test_synth_models.py`` checks entropy).

Tokenizer metadata (``tokenizer.*``) is copied from a real GGUF (SmolLM2), or
from a vocab-only GGUF made with ``vocab-only`` (small enough to carry).
The vocabulary can be padded with unused tokens to a model's real size
(e.g. 128256 for Llama 3.1) so the output matrix has the real shape.

CLI::

    python tools/synth_models.py mimo OUT.gguf --preset tiny|tiny-mtp|attn|cpu-moe [--mtp N] [--mtp-head random|echo]
        [--tokenizer-from GGUF] [--chat-template tests/data/mimo-v2-flash.jinja]
    python tools/synth_models.py llama OUT.gguf --preset tiny|llama-3.1-8b [--tokenizer-from GGUF]
    python tools/synth_models.py vocab-only SRC.gguf OUT.gguf
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synth_gguf import (  # noqa: E402
    _ATTN_SCORE_STD,
    GQT,
    _add_tokenizer,
    _Maker,
    _ones,
    _Rand,
    _rnd,
    _Scales,
    _Streamer,
    _w_std,
    default_tokenizer_source,
    gguf,
    read_gguf_header,
    read_tensor_bytes,
    read_tokenizer_kv,
)
from synth_llama import LLAMA_PRESETS, write_llama_like  # noqa: E402

# what tests and benchmarks use through this module (the GGUF plumbing lives in synth_gguf, the llama family in
# synth_llama)
__all__ = [
    "GQT",
    "LLAMA_PRESETS",
    "MIMO_CHAT_TOKENS",
    "MIMO_PRESETS",
    "_Rand",
    "default_tokenizer_source",
    "gguf",
    "main",
    "read_gguf_header",
    "read_tensor_bytes",
    "read_tokenizer_kv",
    "write_llama_like",
    "write_mimo_like",
    "write_vocab_only",
]

# ----------------------------------------------------------------------------
# MiMo-like (arch mimo2)

# loads and runs on CPU in well under a second per token; the sliding window (32) wraps with prompts longer than
# 32 tokens
_MIMO_TINY = dict(
    n_layer=4,
    n_embd=256,
    n_head=8,
    n_head_kv_full=2,
    n_head_kv_swa=4,
    head_k=192,
    head_v=128,
    n_rot=64,
    n_swa=32,
    swa_pattern=[0, 1, 1, 0],
    n_ff=512,
    n_expert=4,
    n_expert_used=2,
    n_ff_exp=64,
    weight_type="f16",
    n_ctx_train=4096,
    n_vocab=None,
    n_mtp=0,
)

MIMO_PRESETS: dict[str, dict] = {
    "tiny": _MIMO_TINY,
    # "tiny" with one MTP (nextn) block after the trunk, for draft-mtp speculation on CPU
    "tiny-mtp": {**_MIMO_TINY, "n_mtp": 1},
    # MiMo-V2-Flash's attention (hidden 4096, 64 heads, K 192 / V 128, full layers 4 KV heads,
    # SWA layers 8 KV heads, window 128, 1 full layer in 6, sinks on SWA layers) with a tiny MoE:
    # attention dominates, as it does for the KV-cache question
    "attn": dict(
        n_layer=48,
        n_embd=4096,
        n_head=64,
        n_head_kv_full=4,
        n_head_kv_swa=8,
        head_k=192,
        head_v=128,
        n_rot=64,
        n_swa=128,
        swa_pattern=None,
        n_ff=1024,
        n_expert=8,
        n_expert_used=2,
        n_ff_exp=256,
        weight_type="q8_0",
        n_ctx_train=262144,
        n_vocab=None,
        n_mtp=0,
    ),
}
# the attention shape with routed experts big enough that, kept in CPU memory (-ot exps=CPU), they are most of a
# decoded token's time, as in the MiMo-V2-Flash deployment (256 experts of 2048, 8 used): 64 experts of 512, 8
# used, Q8_0, in the 47 MoE layers: 20.1 GB of experts (53.5 MB read per layer and token at one client), 25.3 GB
# in all (benchmarks/cpu_experts.sh)
MIMO_PRESETS["cpu-moe"] = {**MIMO_PRESETS["attn"], "n_expert": 64, "n_expert_used": 8, "n_ff_exp": 512}


# MiMo-V2's chat markup that its tokenizer holds as single (added, non-special) tokens, as Qwen2's vocabulary
# does: the tool-call and tool-response wrappers and the thinking tags (tests/data/mimo-v2-flash.jinja cites the
# sources); <|im_start|> and <|im_end|> come with the tokenizer source (SmolLM2 has them)
MIMO_CHAT_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")


def mimo_swa_pattern(n_layer: int, full_every: int = 6) -> list[int]:
    """1 = sliding-window layer, 0 = full: layer 0 full, then a full layer every ``full_every``."""
    return [0 if (il % full_every) == 0 else 1 for il in range(n_layer)]


def _qtype(name: str):
    return {
        "f32": GQT.F32,
        "f16": GQT.F16,
        "q8_0": GQT.Q8_0,
        "q4_0": GQT.Q4_0,
        "q4_k": GQT.Q4_K,
        "q6_k": GQT.Q6_K,
    }[name.lower()]


def _tensor_name(t, il: int) -> str:
    """gguf-py's name of per-block tensor ``t`` (the names the pinned llama.cpp looks up)."""
    return gguf.TENSOR_NAMES[t].format(bid=il) + ".weight"


def write_mimo_like(
    path: str | os.PathLike,
    *,
    preset: str = "tiny",
    n_layer: int | None = None,
    tokenizer_from: str | os.PathLike | None = None,
    seed: int = 0,
    sinks: str = "swa",
    fused_qkv: bool = True,
    mtp_head: str = "random",
    chat_template: str | None = None,
    **overrides,
) -> Path:
    """Write a random-weight GGUF of arch ``mimo2`` and return its path.

    ``preset`` is "tiny" (CPU tests), "tiny-mtp" (tiny with one MTP block), "attn"
    (MiMo-V2-Flash attention shape, for GPU benchmarks) or "cpu-moe" (attn with experts big enough to
    dominate a token when they stay in CPU memory); any preset field can be overridden by
    keyword (n_embd, n_head, n_head_kv_full, n_head_kv_swa, head_k, head_v, n_rot, n_swa,
    swa_pattern, n_ff, n_expert, n_expert_used, n_ff_exp, weight_type, n_ctx_train, n_vocab,
    n_mtp). ``sinks`` is "swa", "all" or "none" (which layers carry an attention-sink tensor;
    MiMo-V2 has them on SWA layers). ``fused_qkv`` writes one attn_qkv matrix (MiMo-V2.5
    checkpoints) instead of attn_q/attn_k/attn_v.

    ``n_mtp`` > 0 appends that many multi-token-prediction (NextN) blocks after the trunk, laid
    out as the pinned llama.cpp's converter (conversion/mimo.py) writes MiMo's ``model.mtp.layers``
    and as src/models/mimo2.cpp loads them: ``block_count`` counts trunk + MTP blocks,
    ``mimo2.nextn_predict_layers`` = n_mtp, the MTP blocks are SWA blocks (pattern and KV head
    arrays extended with SWA entries), each with a fused attn_qkv, attn_output, sinks, a dense FFN,
    ``nextn.eh_proj`` / ``nextn.enorm`` / ``nextn.hnorm`` and ``layer_output_norm`` (the MTP
    head's own output norm); token embedding and LM head are the trunk's (no nextn.embed_tokens /
    shared_head). MTP blocks always use a fused attn_qkv: the MTP graph requires it.

    ``mtp_head="echo"`` makes each MTP block predict its input token instead (a test construct, so
    that drafts get accepted): eh_proj passes the normed token embedding through (identity on that
    half, zero on the hidden-state half), attn_output and ffn_down are zero (the block adds nothing),
    and ``nextn.shared_head_head`` is a copy of token_embd, whose row of the input token then scores
    highest. Drafts repeat the last token; the trunk accepts them wherever it repeats a token.

    ``chat_template`` (Jinja source) becomes the file's ``tokenizer.chat_template``, and the markup tokens of
    MiMo's chat format (``MIMO_CHAT_TOKENS``) join the vocabulary as single tokens, as in MiMo's own tokenizer.
    """
    if mtp_head not in ("random", "echo"):
        raise ValueError(f"mtp_head must be 'random' or 'echo', not {mtp_head!r}")
    if preset not in MIMO_PRESETS:
        raise ValueError(f"unknown mimo preset {preset!r}; known: {sorted(MIMO_PRESETS)}")
    p = dict(MIMO_PRESETS[preset])
    if n_layer is not None:
        p["n_layer"] = n_layer
        if "swa_pattern" not in overrides:
            p["swa_pattern"] = None
    unknown = set(overrides) - set(p)
    if unknown:
        raise TypeError(f"unknown parameters: {sorted(unknown)}")
    p.update(overrides)
    nl = p["n_layer"]
    n_mtp = int(p.get("n_mtp") or 0)
    if n_mtp < 0:
        raise ValueError(f"n_mtp must be >= 0, not {n_mtp}")
    pattern = list(p["swa_pattern"]) if p["swa_pattern"] is not None else mimo_swa_pattern(nl)
    if len(pattern) != nl:
        raise ValueError(f"swa_pattern has {len(pattern)} entries for {nl} layers")
    if sinks not in ("swa", "all", "none"):
        raise ValueError(f"sinks must be 'swa', 'all' or 'none', not {sinks!r}")
    # the MTP blocks attend like SWA layers (conversion/mimo.py extends the pattern with 1s)
    pattern_all = pattern + [1] * n_mtp
    nl_all = nl + n_mtp

    n_embd, n_head, hk, hv = p["n_embd"], p["n_head"], p["head_k"], p["head_v"]
    kv_heads = [p["n_head_kv_swa"] if s else p["n_head_kv_full"] for s in pattern_all]
    wt = _qtype(p["weight_type"])
    expert_t = GQT.F16 if wt == GQT.F16 else GQT.Q8_0
    sc = _Scales()

    tok = read_tokenizer_kv(tokenizer_from or default_tokenizer_source())
    out = _Streamer(Path(path), "mimo2", seed)
    w = out.writer
    w.add_name(f"llama-vq synthetic mimo2 ({preset})")
    w.add_context_length(p["n_ctx_train"])
    w.add_embedding_length(n_embd)
    w.add_block_count(nl_all)
    w.add_feed_forward_length(p["n_ff"])
    w.add_head_count(n_head)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(hk)
    w.add_value_length(hv)
    w.add_rope_dimension_count(p["n_rot"])
    w.add_rope_freq_base(5_000_000.0)
    w.add_rope_freq_base_swa(10_000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_sliding_window(p["n_swa"])
    w.add_sliding_window_pattern(pattern_all)
    w.add_expert_count(p["n_expert"])
    w.add_expert_used_count(p["n_expert_used"])
    w.add_expert_feed_forward_length(p["n_ff_exp"])
    if n_mtp:
        w.add_nextn_predict_layers(n_mtp)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if wt == GQT.F16 else gguf.LlamaFileType.MOSTLY_Q8_0)
    added = MIMO_CHAT_TOKENS if chat_template is not None else ()
    n_vocab = _add_tokenizer(w, tok, p["n_vocab"], added_tokens=added, chat_template=chat_template)
    w.add_vocab_size(n_vocab)

    ones, rnd = _ones, _rnd

    qk_std = _w_std(n_embd, _ATTN_SCORE_STD)

    def zeros(shape_ggml: Sequence[int]) -> _Maker:
        return lambda r: (np.zeros(tuple(reversed(shape_ggml)), dtype=np.float16), None)

    def add_attention(il: int, fused: bool, zero_out: bool = False) -> None:
        nkv = kv_heads[il]
        b = f"blk.{il}."
        out.add(b + "attn_norm.weight", (n_embd,), GQT.F32, ones(n_embd))
        if fused:
            # rows: [Q (n_head*hk) | K (nkv*hk) | V (nkv*hv)]; one std for all three
            n_qkv = n_head * hk + nkv * hk + nkv * hv
            out.add(b + "attn_qkv.weight", (n_embd, n_qkv), wt, rnd((n_embd, n_qkv), wt, qk_std))
        else:
            out.add(
                b + "attn_q.weight",
                (n_embd, n_head * hk),
                wt,
                rnd((n_embd, n_head * hk), wt, qk_std),
            )
            out.add(b + "attn_k.weight", (n_embd, nkv * hk), wt, rnd((n_embd, nkv * hk), wt, qk_std))
            out.add(
                b + "attn_v.weight",
                (n_embd, nkv * hv),
                wt,
                rnd((n_embd, nkv * hv), wt, _w_std(n_embd)),
            )
        if zero_out:
            out.add(b + "attn_output.weight", (n_head * hv, n_embd), GQT.F16, zeros((n_head * hv, n_embd)))
        else:
            out.add(
                b + "attn_output.weight",
                (n_head * hv, n_embd),
                wt,
                rnd((n_head * hv, n_embd), wt, _w_std(n_head * hv, sc.attn_out_gain * 2.0)),
            )
        if sinks == "all" or (sinks == "swa" and pattern_all[il]):
            out.add(
                b + "attn_sinks.weight",
                (n_head,),
                GQT.F32,
                lambda r: ((r.rng.standard_normal(n_head) * 0.5 + 1.0).astype(np.float32), None),
            )
        out.add(b + "ffn_norm.weight", (n_embd,), GQT.F32, ones(n_embd))

    def add_dense_ffn(il: int, zero_out: bool = False) -> None:
        b = f"blk.{il}."
        nf = p["n_ff"]
        out.add(b + "ffn_gate.weight", (n_embd, nf), wt, rnd((n_embd, nf), wt, _w_std(n_embd)))
        out.add(b + "ffn_up.weight", (n_embd, nf), wt, rnd((n_embd, nf), wt, _w_std(n_embd)))
        if zero_out:
            out.add(b + "ffn_down.weight", (nf, n_embd), GQT.F16, zeros((nf, n_embd)))
        else:
            out.add(
                b + "ffn_down.weight",
                (nf, n_embd),
                wt,
                rnd((nf, n_embd), wt, _w_std(nf, sc.ffn_out_gain)),
            )

    tok_embd = rnd((n_embd, n_vocab), wt, sc.embd_std)
    i_tok_embd = len(out.plan)  # its generator's seed index: an echo head redraws the same tensor
    out.add("token_embd.weight", (n_embd, n_vocab), wt, tok_embd)
    for il in range(nl):
        b = f"blk.{il}."
        add_attention(il, fused_qkv)
        if il == 0 or p["n_expert"] == 0:
            add_dense_ffn(il)
        else:
            ne, nfe = p["n_expert"], p["n_ff_exp"]
            out.add(
                b + "ffn_gate_inp.weight",
                (n_embd, ne),
                GQT.F32,
                rnd((n_embd, ne), GQT.F32, _w_std(n_embd)),
            )
            out.add(
                b + "exp_probs_b.bias",
                (ne,),
                GQT.F32,
                lambda r, ne=ne: (np.zeros(ne, dtype=np.float32), None),
            )
            out.add(
                b + "ffn_gate_exps.weight",
                (n_embd, nfe, ne),
                expert_t,
                rnd((n_embd, nfe, ne), expert_t, _w_std(n_embd)),
            )
            out.add(
                b + "ffn_up_exps.weight",
                (n_embd, nfe, ne),
                expert_t,
                rnd((n_embd, nfe, ne), expert_t, _w_std(n_embd)),
            )
            out.add(
                b + "ffn_down_exps.weight",
                (nfe, n_embd, ne),
                expert_t,
                rnd((nfe, n_embd, ne), expert_t, _w_std(nfe, sc.ffn_out_gain)),
            )
    out.add("output_norm.weight", (n_embd,), GQT.F32, ones(n_embd))
    out.add(
        "output.weight",
        (n_embd, n_vocab),
        wt,
        rnd((n_embd, n_vocab), wt, sc.logit_std / math.sqrt(n_embd)),
    )
    for il in range(nl, nl_all):
        # MTP block (after the trunk's tensors, so that its random draws stay those of the model
        # without MTP blocks): eh_proj([enorm(embd(t+1)) | hnorm(h_t)]) -> decoder block -> layer_output_norm
        # -> the trunk's LM head
        echo = mtp_head == "echo"
        add_attention(il, True, zero_out=echo)
        add_dense_ffn(il, zero_out=echo)
        eh_proj = _tensor_name(gguf.MODEL_TENSOR.NEXTN_EH_PROJ, il)
        if echo:
            # rows are outputs; columns [0, n_embd) read enorm(embd), [n_embd, 2 n_embd) hnorm(h)
            eye = np.hstack([np.eye(n_embd), np.zeros((n_embd, n_embd))]).astype(np.float16)
            out.add(eh_proj, (2 * n_embd, n_embd), GQT.F16, lambda r, eye=eye: (eye, None))
            out.add(
                _tensor_name(gguf.MODEL_TENSOR.NEXTN_SHARED_HEAD_HEAD, il),
                (n_embd, n_vocab),
                wt,
                lambda r: tok_embd(_Rand([seed, i_tok_embd])),
            )
        else:
            out.add(eh_proj, (2 * n_embd, n_embd), wt, rnd((2 * n_embd, n_embd), wt, _w_std(2 * n_embd)))
        for t in (
            gguf.MODEL_TENSOR.NEXTN_ENORM,
            gguf.MODEL_TENSOR.NEXTN_HNORM,
            gguf.MODEL_TENSOR.LAYER_OUT_NORM,
        ):
            out.add(_tensor_name(t, il), (n_embd,), GQT.F32, ones(n_embd))
    out.write()
    return Path(path)


# ----------------------------------------------------------------------------
# vocab-only GGUF (small tokenizer source to carry to another machine)


def write_vocab_only(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """Write a GGUF holding only the ``tokenizer.*`` metadata of ``src`` (a few MB)."""
    tok = read_tokenizer_kv(src)
    w = gguf.GGUFWriter(str(dst), "llama")
    _add_tokenizer(w, tok, None)
    w.write_header_to_file(Path(dst))
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return Path(dst)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("mimo", help="write a mimo2 model")
    m.add_argument("out")
    m.add_argument("--preset", default="tiny", choices=sorted(MIMO_PRESETS))
    m.add_argument("--n-layer", type=int)
    m.add_argument("--sinks", default="swa", choices=["swa", "all", "none"])
    m.add_argument("--split-qkv", action="store_true", help="attn_q/k/v instead of a fused attn_qkv")
    m.add_argument("--weight-type", choices=["f16", "q8_0", "q4_0"])
    m.add_argument("--n-vocab", type=int, help="pad the vocabulary to this many tokens")
    m.add_argument(
        "--mtp-head",
        default="random",
        choices=["random", "echo"],
        help="echo: MTP blocks predict their input token (drafts that get accepted; a test construct)",
    )
    m.add_argument(
        "--mtp",
        type=int,
        metavar="N",
        help="append N multi-token-prediction (nextn) blocks (MiMo-V2-Flash has 3); overrides the preset's n_mtp",
    )
    m.add_argument(
        "--chat-template",
        metavar="FILE",
        help="Jinja file to carry as tokenizer.chat_template (adds MiMo's chat markup tokens to the vocabulary)",
    )
    ll = sub.add_parser("llama", help="write a llama model")
    ll.add_argument("out")
    ll.add_argument("--preset", default="llama-3.1-8b", choices=sorted(LLAMA_PRESETS))
    ll.add_argument("--n-layer", type=int)
    ll.add_argument("--recipe", choices=["q4_k_m", "f16"])
    for sp in (m, ll):
        sp.add_argument("--tokenizer-from", help="GGUF to copy tokenizer.* from (default: SmolLM2)")
        sp.add_argument("--seed", type=int, default=0)
    v = sub.add_parser("vocab-only", help="copy tokenizer.* metadata into a tensor-less GGUF")
    v.add_argument("src")
    v.add_argument("out")
    a = ap.parse_args(argv)

    if a.cmd == "vocab-only":
        write_vocab_only(a.src, a.out)
    elif a.cmd == "mimo":
        kw = {}
        if a.weight_type:
            kw["weight_type"] = a.weight_type
        if a.n_vocab:
            kw["n_vocab"] = a.n_vocab
        if a.mtp is not None:
            kw["n_mtp"] = a.mtp
        write_mimo_like(
            a.out,
            preset=a.preset,
            n_layer=a.n_layer,
            tokenizer_from=a.tokenizer_from,
            seed=a.seed,
            sinks=a.sinks,
            fused_qkv=not a.split_qkv,
            mtp_head=a.mtp_head,
            chat_template=Path(a.chat_template).read_text(encoding="utf-8") if a.chat_template else None,
            **kw,
        )
    else:
        kw = {}
        if a.n_layer:
            kw["n_layer"] = a.n_layer
        if a.recipe:
            kw["recipe"] = a.recipe
        write_llama_like(a.out, a.preset, tokenizer_from=a.tokenizer_from, seed=a.seed, **kw)
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
