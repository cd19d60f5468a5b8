#!/usr/bin/env python3
"""Decode attention's effective bandwidth from llama-bench's tg rows at depth: the time a decoded token gains from
the depth (1/tok/s at depth minus at depth 0), over the bytes of K and V the full-attention layers read at that depth.
The figure that carries from one GPU to another (benchmarks/RESULTS.md, "Decode attention's two forms and its
effective bandwidth, H100"); benchmarks/mi210.sh step 3 and benchmarks/gpu.sh decode-bandwidth print it.

    python3 benchmarks/decode_bandwidth.py ROWS.jsonl [--peak-tbs 1.6]

ROWS.jsonl: llama-bench -o jsonl rows, each with "model" (llama8b or mimo: the synthetic models' attention shapes)
and "config" added by the caller. Sliding-window layers read the same cells at every depth, so their share cancels.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable

# the synthetic models' full-attention layers (tools/synth_models.py): layers, KV heads, K and V head sizes
SHAPES = {
    "llama8b": (32, 8, 128, 128),
    "mimo": (8, 4, 192, 128),
}
# bytes per value of each cache type (ggml's blocks: 32 values per block)
BYTES = {"f16": 2.0, "q8_0": 34 / 32, "q4_1": 20 / 32, "q4_0": 18 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32}


def kv_bytes(model: str, type_k: str, type_v: str, depth: int) -> float:
    """Bytes of K and V the full-attention layers of `model` read to decode one token at `depth`."""
    layers, heads, dk, dv = SHAPES[model]
    return layers * heads * depth * (dk * BYTES[type_k] + dv * BYTES[type_v])


def bandwidth_rows(rows: Iterable[dict]) -> list[dict]:
    """Per (model, config, K/V, depth > 0) with a tg row at depth 0 too: the step time the depth adds (ms) and the
    effective bandwidth (TB/s)."""
    tg = [r for r in rows if r.get("n_gen") and r.get("model") in SHAPES]
    base = {(r["model"], r.get("config", ""), r["type_k"], r["type_v"]): r["avg_ts"] for r in tg if r["n_depth"] == 0}
    out = []
    for r in tg:
        key = (r["model"], r.get("config", ""), r["type_k"], r["type_v"])
        if r["n_depth"] == 0 or key not in base:
            continue
        added = 1.0 / r["avg_ts"] - 1.0 / base[key]
        nbytes = kv_bytes(r["model"], r["type_k"], r["type_v"], r["n_depth"])
        out.append(
            {
                "model": key[0],
                "config": key[1],
                "kv": f"{key[2]}/{key[3]}",
                "depth": r["n_depth"],
                "added_ms": added * 1e3,
                "tbs": nbytes / added / 1e12 if added > 0 else float("nan"),
            }
        )
    return out


def table(rows: Iterable[dict], peak_tbs: float | None = None) -> str:
    lines = [
        "| model | config | K/V | depth | step time added (ms) | effective bandwidth (TB/s) |"
        + (" of peak |" if peak_tbs else ""),
        "|---|---|---|---|---|---|" + ("---|" if peak_tbs else ""),
    ]
    for b in bandwidth_rows(rows):
        share = f" {b['tbs'] / peak_tbs:.0%} |" if peak_tbs else ""
        lines.append(
            f"| {b['model']} | {b['config']} | {b['kv']} | {b['depth']} | {b['added_ms']:.3f} | {b['tbs']:.2f} |{share}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rows", help="llama-bench jsonl rows with model and config added")
    ap.add_argument("--peak-tbs", type=float, default=None, help="the GPU's peak memory bandwidth, TB/s")
    a = ap.parse_args(argv)
    with open(a.rows) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    print(table(rows, a.peak_tbs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
