#!/usr/bin/env python3
"""Fidelity of the attention modes (decision 8), on the CPU or a GPU: a prompt evaluated as one batch, then decode
steps one token each (teacher-forced), each mode's next-token distributions against the f16 cache's (FA off), beside
the floor (f16, flash attention on vs off). "prefill" prefills with flash attention and decodes with llama-vq's
attention without it; "on" and "off" run one path for every batch. tests/api/test_attn_modes.py asserts the same on
the CPU; this prints the table for a machine.

    python benchmarks/attn_fidelity.py [--gpu] [--model NAME=GGUF ...] [--types q8_0/q4_1,q4_0/q4_0] [--probes 24]

Default models: SmolLM2 (the embedded default model) when found; --model adds others (e.g. the MiMo-shaped ones).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", action="store_true", help="every layer on the GPU (n_gpu_layers=-1)")
    ap.add_argument("--model", action="append", default=[], help="NAME=GGUF")
    ap.add_argument("--types", default="q8_0/q4_1,q4_0/q4_0,q8_0/q8_0")
    ap.add_argument("--probes", type=int, default=24)
    a = ap.parse_args(argv)

    import llama_vq  # noqa: I001  (first: it binds llama_cpp to llama-vq's libraries)
    import llama_cpp
    import numpy as np
    from v_cache_support import compare, eval_logits, long_text, make

    models = {}
    try:
        models["smollm2"] = (llama_vq.default_model_path(), {"n_batch": 128, "n_ubatch": 128})
    except Exception as e:  # noqa: BLE001 (a machine without the package index: the synthetic models only)
        print(f"SmolLM2 not available here ({type(e).__name__}); synthetic models only")
    for spec in a.model:
        name, _, path = spec.partition("=")
        models[name] = (Path(path), {"n_batch": 64, "n_ubatch": 64, "swa_full": False})
    gpu = {"n_gpu_layers": -1} if a.gpu else {}

    def probes(llm, tokens: list[int], n_prompt: int) -> np.ndarray:
        llm.reset()
        llm.eval(tokens[:n_prompt])
        rows = []
        for q in range(n_prompt, n_prompt + a.probes):
            llm.eval([tokens[q]])
            rows.append(
                np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(llm.n_vocab(),)).astype(
                    np.float64
                )
            )
        return np.array(rows)

    print(f"{'model':10s} {'K/V':11s} {'mode':8s} {'KL mean':>10s} {'KL max':>10s} {'top-1':>6s}   floor KL mean")
    for name, (path, kw) in models.items():
        kw = {**kw, **gpu}
        tokens = make(llama_vq, path, vocab_only=True).tokenize(long_text().encode())
        n_prompt = len(tokens) - a.probes - 1
        nxt = [0, *tokens[n_prompt + 1 : n_prompt + a.probes + 1]]
        sl = slice(n_prompt, n_prompt + a.probes)
        ref = eval_logits(make(llama_vq, path, flash_attn=False, logits_all=True, **kw), tokens)[sl]
        floor = compare(ref, eval_logits(make(llama_vq, path, flash_attn=True, logits_all=True, **kw), tokens)[sl], nxt)
        for types in a.types.split(","):
            tk, tv = types.split("/")
            for fa in ("prefill", "on", "off"):
                llm = make(llama_vq, path, type_k=tk, type_v=tv, flash_attn=fa, **kw)
                got = compare(ref, probes(llm, tokens, n_prompt), nxt)
                print(
                    f"{name:10s} {types:11s} {llm.flash_attn_mode:8s} {got.kl_mean:10.3e} {got.kl_max:10.3e} "
                    f"{got.top1:6.3f}   {floor.kl_mean:.3e}",
                    flush=True,
                )
                del llm
    return 0


if __name__ == "__main__":
    sys.exit(main())
