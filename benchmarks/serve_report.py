"""serve_bench.py's tables: one run's markdown (throughput rows, agent turns), and the summary of several runs
(serve_device.sh MATRIX): medians per entry, the k-client / 1-client ratio per run, entries' ratios runs paired."""

from __future__ import annotations

import statistics
from typing import Any


def markdown(res: dict[str, Any]) -> str:
    lines = []
    if res.get("rows"):
        lines += [
            "| server | clients | tok/s | TTFT p50 ms | TTFT p99 ms | requests | failed | RSS MiB (peak) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['server']} | {r['clients']} | {r['tok_s']:.1f} | {r['ttft_p50_s'] * 1e3:.0f} | "
            f"{r['ttft_p99_s'] * 1e3:.0f} | {r['requests']} | {r.get('failed', 0)} | "
            f"{r.get('vmrss_mib', float('nan')):.0f} ({r.get('vmhwm_mib', float('nan')):.0f}) |"
            for r in res["rows"]
        ]
        lines += ratios(res["rows"])
    if res.get("latency"):
        lines += ["", "| round | server | /health p50 ms | TTFT p50 ms |", "|---|---|---|---|"]
        lines += [f"| {r['round']} | {r['server']} | {r['health_p50_ms']:.2f} | {r['ttft_p50_ms']:.1f} |"
                  for r in res["latency"]]
    if res.get("turns"):
        lines += ["", "| server | turn | prompt | cached | ratio | after restart |", "|---|---|---|---|---|---|"]
        lines += [
            f"| {t['server']} | {t['turn']} | {t['prompt_tokens']} | {t['cached_tokens']} | "
            f"{t['ratio']:.3f} | {'yes' if t['after_restart'] else ''} |"
            for t in res["turns"]
        ]
    return "\n".join(lines) + "\n"


def ratios(rows: list[dict[str, Any]]) -> list[str]:
    """llama-vq-server against llama-server at each client count of one run: tok/s ratio, TTFT differences."""
    by = {(r["server"], r["clients"]): r for r in rows}
    out = []
    for (server, n), r in sorted(by.items(), key=lambda kv: kv[0][1]):
        o = by.get(("llama-server", n))
        if server != "ours" or o is None:
            continue
        out.append(
            f"- {n} clients: llama-vq-server / llama-server tok/s = {r['tok_s'] / o['tok_s']:.3f}; TTFT "
            f"p50 {(r['ttft_p50_s'] - o['ttft_p50_s']) * 1e3:+.1f} ms, "
            f"p99 {(r['ttft_p99_s'] - o['ttft_p99_s']) * 1e3:+.1f} ms"
        )
    return [""] + out if out else []


def summary(runs: list[dict[str, Any]], k: int) -> str:
    """Per label: tok/s at each client count in every run and their median; the k-client / 1-client ratio of each
    run and its median; and per other label, the median of (this label / that label) at k clients, runs paired in
    order (the MATRIX interleaves them, so pairs ran minutes apart)."""
    by: dict[str, list[dict[int, float]]] = {}
    for res in runs:
        per: dict[str, dict[int, float]] = {}
        for r in res["rows"]:
            if not r.get("failed"):
                per.setdefault(r.get("label") or r["server"], {})[r["clients"]] = r["tok_s"]
        for label, rates in per.items():
            by.setdefault(label, []).append(rates)
    lines = [f"| label | clients | tok/s per run | median | {k} / 1 per run | median |", "|---|---|---|---|---|---|"]
    for label, rs in by.items():
        ratios = [r[k] / r[1] for r in rs if k in r and 1 in r]
        for n in sorted({n for r in rs for n in r}):
            v = [r[n] for r in rs if n in r]
            extra = (
                f" {', '.join(f'{x:.2f}' for x in ratios)} | {statistics.median(ratios):.2f}x |"
                if n == k and ratios
                else " | |"
            )
            lines.append(f"| {label} | {n} | {', '.join(f'{x:.1f}' for x in v)} | {statistics.median(v):.1f} |{extra}")
    labels = list(by)
    for a in labels:
        for b in labels:
            pairs = [x[k] / y[k] for x, y in zip(by[a], by[b], strict=False) if k in x and k in y]
            if a != b and pairs:
                lines.append(
                    f"{a} / {b} at {k} clients, runs paired: {', '.join(f'{x:.2f}' for x in pairs)}; "
                    f"median {statistics.median(pairs):.2f}x"
                )
    return "\n".join(lines)
