"""The GPU time of one decoded token, kernel by kernel, side by side for several runs (ncu's CSV).

Each input is `LABEL=FILE` or `LABEL=LONG,SHORT`, each file the output of

    ncu --csv --print-units base --metrics gpu__time_duration.sum --cache-control none --clock-control none \\
        llama-bench ... -p 0 -n N -d DEPTH -r 1

for one configuration. One file: --tokens says how many decode steps the run made (llama-bench at depth 0: its
warm-up and the N tokens). Two: the runs differ only in N, and the second's kernels are taken from the first's,
so that what the depth's fill ran drops out and --tokens is the difference in N.

Kernels are grouped by name (the template and arguments dropped) and by family (attention, the combine, matrix
products, copies and quantization, the rest). ncu serializes kernels, so the sum is the kernels' own time:
no launch gaps, no overlap of programmatic dependent launches.

    python3 benchmarks/kernel_times.py --tokens 2 ours=ours.csv fa-f16=fa.csv
"""

from __future__ import annotations

import argparse
import csv
import io
import re
import sys
from collections import defaultdict
from pathlib import Path

FAMILIES = (
    ("attention (ours)", re.compile(r"^k_attn_decode(_tc)?$")),
    ("combine (ours)", re.compile(r"^k_attn_decode_combine$")),
    ("attention (FA)", re.compile(r"^flash_attn")),
    ("combine (FA)", re.compile(r"^(flash_attn_combine|flash_attn_stream_k_fixup)")),
    ("matrix products", re.compile(r"(mul_mat|gemm|gemv|mmq|mmvq|mmvf|cutlass|sm90_|ampere_|cublas)", re.I)),
    ("cache writes, copies, quantization", re.compile(r"(cpy|set_rows|quantize|convert|dequantize|k_get_rows)", re.I)),
)


def short_name(name: str) -> str:
    """A kernel's name without return type, namespace, template arguments or parameters."""
    name = name.strip()
    for sep in ("<", "("):
        name = name.split(sep, 1)[0]
    name = name.split()[-1] if name.split() else name
    return name.rsplit("::", 1)[-1]


def family(name: str) -> str:
    for fam, rx in FAMILIES:
        if rx.search(name):
            return fam
    return "the rest"


def read_ncu_csv(text: str) -> list[tuple[str, float]]:
    """(short kernel name, duration in microseconds) for each profiled kernel of ncu's --csv output."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ValueError('no ncu CSV header (a line starting with "ID")')
    out = []
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = (row.get("Metric Unit") or "ns").strip()
        value = float(row["Metric Value"].replace(",", ""))
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(unit)
        if scale is None:
            raise ValueError(f"unknown unit {unit!r}")
        out.append((short_name(row["Kernel Name"]), value * scale))
    return out


Totals = dict[str, tuple[float, float]]  # kernel name -> (launches, microseconds)


def totals(rows: list[tuple[str, float]]) -> Totals:
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for name, us in rows:
        by_name[name][0] += 1
        by_name[name][1] += us
    return {k: (v[0], v[1]) for k, v in by_name.items()}


def minus(long: Totals, short: Totals) -> Totals:
    """The kernels of the longer run less the shorter's (names with no launches left are dropped)."""
    out = {}
    for name in long.keys() | short.keys():
        n = long.get(name, (0.0, 0.0))[0] - short.get(name, (0.0, 0.0))[0]
        us = long.get(name, (0.0, 0.0))[1] - short.get(name, (0.0, 0.0))[1]
        if n > 0:
            out[name] = (n, us)
    return out


def per_token(t: Totals | list[tuple[str, float]], tokens: int) -> tuple[Totals, dict[str, float]]:
    """Per kernel name: (launches, microseconds) per token; per family: microseconds per token."""
    if isinstance(t, list):
        t = totals(t)
    by_fam: dict[str, float] = defaultdict(float)
    for name, (_, us) in t.items():
        by_fam[family(name)] += us / tokens
    return {k: (n / tokens, us / tokens) for k, (n, us) in t.items()}, dict(by_fam)


def report(runs: dict[str, Totals], tokens: int, top: int = 12) -> str:
    names = list(runs)
    stats = {label: per_token(rows, tokens) for label, rows in runs.items()}
    out = [f"GPU time per decoded token (us, kernels serialized by ncu; {tokens} tokens a run)"]
    fams = [f for f, _ in FAMILIES] + ["the rest"]
    out.append("| family | " + " | ".join(names) + " |")
    out.append("|---" * (len(names) + 1) + "|")
    for fam in fams:
        vals = [stats[n][1].get(fam, 0.0) for n in names]
        if any(vals):
            out.append(f"| {fam} | " + " | ".join(f"{v:.1f}" for v in vals) + " |")
    out.append("| **all** | " + " | ".join(f"{sum(stats[n][1].values()):.1f}" for n in names) + " |")
    for n in names:
        out.append(f"\n{n}: the {top} largest kernels (launches per token, us per token, us per launch)")
        ranked = sorted(stats[n][0].items(), key=lambda kv: -kv[1][1])[:top]
        for name, (launches, us) in ranked:
            out.append(f"  {name:48s} {launches:6.1f} {us:9.1f} {us / launches:8.2f}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="LABEL=FILE or LABEL=LONG,SHORT (ncu --csv output)")
    ap.add_argument("--tokens", type=int, default=2, help="decode steps each run made (default 2)")
    ap.add_argument("--top", type=int, default=12)
    a = ap.parse_args(argv)
    runs = {}
    for item in a.runs:
        label, _, path = item.partition("=")
        if not path:
            ap.error(f"{item!r}: expected LABEL=FILE")
        try:
            parts = [totals(read_ncu_csv(Path(f).read_text(errors="replace"))) for f in path.split(",")]
        except (OSError, ValueError) as e:
            print(f"kernel_times: {path}: {e}", file=sys.stderr)
            return 1
        runs[label] = minus(parts[0], parts[1]) if len(parts) == 2 else parts[0]
    print(report(runs, a.tokens, a.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
