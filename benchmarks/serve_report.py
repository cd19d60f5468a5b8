"""serve_bench.py's tables: one run's markdown (throughput rows and the side-by-side ratios, agent turns, latency),
and the summary of several runs or rounds (--rounds, or several runs): medians per entry, the k-client /
1-client ratio per run, entries' ratios runs paired."""

from __future__ import annotations

import math
import statistics
from typing import Any


def _f(x: Any, fmt: str) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def markdown(res: dict[str, Any]) -> str:
    lines = []
    if res.get("rows"):
        lines += [
            "| server | round | clients | tok/s | TTFT p50 ms | TTFT p99 ms | requests | failed | RSS MiB (peak) | "
            "switches / token / compute thread | compute threads busy | idle server CPU s | other processes CPU s |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['server']} | {r.get('round', 0)} | {r['clients']} | {r['tok_s']:.1f} | "
            f"{r['ttft_p50_s'] * 1e3:.0f} | {r['ttft_p99_s'] * 1e3:.0f} | {r['requests']} | {r.get('failed', 0)} | "
            f"{r.get('vmrss_mib', float('nan')):.0f} ({r.get('vmhwm_mib', float('nan')):.0f}) | "
            f"{_f(r.get('vcsw_per_token'), '.2f')} | {_f(r.get('busy'), '.0%')} | "
            f"{_f(r.get('idle_servers_cpu_s'), '.2f')} | {_f(r.get('others_cpu_s'), '.1f')} |"
            for r in res["rows"]
        ]
        lines += side_by_side(res["rows"], res.get("cpus") or 0)
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


def _median(xs: list[float]) -> float:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return statistics.median(xs) if xs else float("nan")


# a row during which the machine's other processes used more than this share of all its CPUs is disturbed (another
# build on a shared machine): its round's pair is left out of the ratio table
DISTURBED = 0.03


def disturbed(r: dict[str, Any], n_cpus: int) -> bool:
    return r.get("others_cpu_s", 0.0) > DISTURBED * n_cpus * r["wall_s"]


def side_by_side(rows: list[dict[str, Any]], n_cpus: int = 0) -> list[str]:
    """llama-vq-server against llama-server at each client count: the medians over rounds of each one's tok/s, the
    per-round ratios (the two rows of a round ran back to back) and their median, TTFT p50 difference, and each
    one's compute threads (voluntary switches per generated token each, busy share). Rows of a failed request are
    left out, and with n_cpus the rounds where either row was disturbed (other processes over DISTURBED of the
    machine), counted in the table."""
    by = {(r["server"], r["clients"], r.get("round", 0)): r for r in rows if not r.get("failed")}
    counts = sorted({n for s, n, _ in by if s == "ours"})
    out = []
    for n in counts:
        paired = sorted(k for s, m, k in by if s == "ours" and m == n and ("llama-server", n, k) in by)
        rounds = [k for k in paired if not n_cpus
                  or not any(disturbed(by[s, n, k], n_cpus) for s in ("ours", "llama-server"))]
        if not rounds:
            out.append(f"| {n} | 0 ({len(paired)} disturbed left out) | | | | | | | |")
            continue
        ours = [by["ours", n, k] for k in rounds]
        theirs = [by["llama-server", n, k] for k in rounds]
        ratios = [a["tok_s"] / b["tok_s"] for a, b in zip(ours, theirs, strict=True)]
        left_out = f" ({len(paired) - len(rounds)} disturbed left out)" if len(paired) > len(rounds) else ""
        out.append(
            f"| {n} | {len(rounds)}{left_out} | {_median([r['tok_s'] for r in ours]):.1f} | "
            f"{_median([r['tok_s'] for r in theirs]):.1f} | {', '.join(f'{x:.3f}' for x in ratios)} | "
            f"**{_median(ratios):.3f}** | "
            f"{_median([(a['ttft_p50_s'] - b['ttft_p50_s']) * 1e3 for a, b in zip(ours, theirs, strict=True)]):+.1f} | "
            f"{_f(_median([r.get('vcsw_per_token', math.nan) for r in ours]), '.2f')} / "
            f"{_f(_median([r.get('vcsw_per_token', math.nan) for r in theirs]), '.2f')} | "
            f"{_f(_median([r.get('busy', math.nan) for r in ours]), '.0%')} / "
            f"{_f(_median([r.get('busy', math.nan) for r in theirs]), '.0%')} |"
        )
    if not out:
        return []
    return [
        "",
        "| clients | rounds | llama-vq-server tok/s (median) | llama-server tok/s (median) | ratio per round | "
        "ratio (median) | TTFT p50 diff ms (median) | switches / token / compute thread, ours / theirs | "
        "compute threads busy, ours / theirs |",
        "|---|---|---|---|---|---|---|---|---|",
        *out,
    ]


def split_rounds(res: dict[str, Any]) -> list[dict[str, Any]]:
    """A run of --rounds N as N runs of one round each (a run without rounds is one)."""
    rounds = sorted({r.get("round", 0) for r in res["rows"]})
    return [{**res, "rows": [r for r in res["rows"] if r.get("round", 0) == k]} for k in rounds]


def summary(runs: list[dict[str, Any]], k: int) -> str:
    """Per label: tok/s at each client count in every run (each round of a run counts as a run) and their median,
    with the median switches per token and busy share of its compute threads; the k-client / 1-client ratio of each
    run and its median; and per other label, the median of (this label / that label) at each client count, runs
    paired in order (the rounds of a run interleave them, so pairs ran close)."""
    runs = [one for res in runs for one in split_rounds(res)]
    by: dict[str, list[dict[int, dict[str, Any]]]] = {}
    for res in runs:
        per: dict[str, dict[int, dict[str, Any]]] = {}
        for r in res["rows"]:
            if not r.get("failed"):
                per.setdefault(r.get("label") or r["server"], {})[r["clients"]] = r
        for label, rows in per.items():
            by.setdefault(label, []).append(rows)
    lines = [
        f"| label | clients | tok/s per run | median | switches / token / compute thread | compute threads busy | "
        f"{k} / 1 per run | median |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, rs in by.items():
        ratios = [r[k]["tok_s"] / r[1]["tok_s"] for r in rs if k in r and 1 in r]
        for n in sorted({n for r in rs for n in r}):
            v = [r[n] for r in rs if n in r]
            extra = (
                f" {', '.join(f'{x:.2f}' for x in ratios)} | {statistics.median(ratios):.2f}x |"
                if n == k and ratios
                else " | |"
            )
            lines.append(
                f"| {label} | {n} | {', '.join(format(x['tok_s'], '.1f') for x in v)} | "
                f"{statistics.median(x['tok_s'] for x in v):.1f} | "
                f"{_f(_median([x.get('vcsw_per_token', math.nan) for x in v]), '.2f')} | "
                f"{_f(_median([x.get('busy', math.nan) for x in v]), '.0%')} |{extra}"
            )
    labels = list(by)
    for i, a in enumerate(labels):
        for b in labels[i + 1 :]:
            for n in sorted({n for r in by[a] for n in r}):
                pairs = [x[n]["tok_s"] / y[n]["tok_s"] for x, y in zip(by[a], by[b], strict=False) if n in x and n in y]
                if pairs:
                    lines.append(
                        f"{a} / {b} at {n} clients, runs paired: {', '.join(f'{x:.3f}' for x in pairs)}; "
                        f"median {statistics.median(pairs):.3f}x"
                    )
    return "\n".join(lines)
