#!/usr/bin/env python3
"""What per-layer cache types buy on an iSWA model: KL divergence from an all-f16 cache for all-quantized caches
and for f16 sliding-window layers with quantized full-attention layers (patch 0019), on the CPU.

    python benchmarks/swa_types_quality.py [--tokens 1024] [--threads 2] [--out DIR]

Model: a MiMo-shaped synthetic model (tools/synth_models.py, arch mimo2: 12 layers, 2 full-attention layers at
GQA 16 and 10 sliding-window layers (window 128) at GQA 8 with sinks, K head 192 / V head 128, hidden 512, f16
weights), written once into a temporary folder. Text: the pinned llama.cpp's README and build guide (fixed bytes).
Every configuration evaluates the same tokens in one context (llama_vq.Llama, logits of every position), flash
attention off unless the row says on; KL(f16 || config) and top-1 agreement over all positions. The sizes are the
bytes each context allocated for K and V (llama_vq.Llama.kv_cache_info) at that context size.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tests"))

CONFIGS = [  # label, type_k, type_v, type_k_swa, type_v_swa, flash_attn
    ("all q4_0", "q4_0", "q4_0", None, None, False),
    ("SWA f16 + full q4_0", "q4_0", "q4_0", "f16", "f16", False),
    ("all q8_0", "q8_0", "q8_0", None, None, False),
    ("SWA f16 + full q8_0", "q8_0", "q8_0", "f16", "f16", False),
    ("q8_0 K / q4_1 V", "q8_0", "q4_1", None, None, False),
    ("SWA f16 + full q8_0 K / q4_1 V", "q8_0", "q4_1", "f16", "f16", False),
    ("all q4_0, FA on", "q4_0", "q4_0", None, None, True),
    ("SWA f16 + full q4_0, FA on", "q4_0", "q4_0", "f16", "f16", True),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)

    import synth_models
    from v_cache_support import compare

    import llama_vq

    tmp = Path(tempfile.mkdtemp(prefix="swa-quality-"))
    model = synth_models.write_mimo_like(
        tmp / "mimo-12l.gguf", preset="tiny", n_layer=12, n_embd=512, n_head=16, n_head_kv_full=1,
        n_head_kv_swa=2, n_swa=128, n_ff=1024, tokenizer_from=llama_vq.default_model_path(), seed=11)
    text = "\n\n".join((ROOT / "vendor" / "llama.cpp" / f).read_text() for f in ("README.md", "docs/build.md"))

    def make(**kw):
        return llama_vq.Llama(str(model), n_ctx=a.tokens, n_batch=256, n_ubatch=256, n_threads=a.threads,
                              n_threads_batch=a.threads, logits_all=True, verbose=False, **kw)

    tokens = make(vocab_only=True).tokenize(text.encode())[: a.tokens]

    def run(**kw):
        llm = make(**kw)
        llm.eval(tokens)
        return np.array(llm.scores[: len(tokens)], dtype=np.float64), llm.kv_cache_info()

    t0 = time.time()
    ref, ref_info = run(flash_attn=False)
    rows = [("all f16", ref_info.total_bytes, 0.0, 1.0, 0.0)]
    for label, tk, tv, tks, tvs, fa in CONFIGS:
        got, info = run(type_k=tk, type_v=tv, type_k_swa=tks, type_v_swa=tvs, flash_attn=fa)
        ag = compare(ref, got, tokens)
        rows.append((label, info.total_bytes, ag.kl_mean, ag.top1, ag.kl_max))
        print(f"{label}: {ag} ({time.time() - t0:.0f} s)", flush=True)

    lines = [
        f"MiMo-shaped 12-layer model, {len(tokens)} tokens, CPU {a.threads} threads, flash attention off unless noted",
        "",
        "| K / V cache | KV MiB | KV / f16 | mean KL from f16 | max KL | same top token |",
        "|---|---|---|---|---|---|",
    ]
    for label, size, kl, top1, klmax in rows:
        lines.append(f"| {label} | {size / 2**20:.2f} | {size / ref_info.total_bytes:.3f} | {kl:.5f} | "
                     f"{klmax:.4f} | {100 * top1:.2f}% |")
    table = "\n".join(lines)
    print("\n" + table)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "swa_types_quality.md").write_text(table + "\n")
        keys = ("config", "kv_bytes", "kl_mean", "top1", "kl_max")
        data = [dict(zip(keys, r, strict=True)) for r in rows]
        (a.out / "swa_types_quality.json").write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
