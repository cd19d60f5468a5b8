#!/usr/bin/env python3
"""Per-kernel GPU time of one decode step, from an ncu CSV of a llama-bench run.

ncu is run over `llama-bench -p 0 -n N -d D --no-warmup` with one metric (gpu__time_duration.sum, --csv, base
units): the depth's prefill comes first, then N one-token graphs. The decode steps are the rows after the last
prefill matrix kernel (mul_mat_q / cuBLAS gemm), split where the token embedding's get_rows starts a graph. The
first step is dropped (graph capture, first use); the others are averaged.

    python3 benchmarks/ncu_timeline.py CSV [CSV ...]   # a table per file; with several, the totals side by side
"""
import csv
import re
import sys
from collections import OrderedDict


def rows_of(path):
    """(kernel name, grid, ns) per profiled launch, in launch order."""
    out = []
    with open(path, errors="replace") as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        try:
            ns = float(r["Metric Value"].replace(",", ""))
        except (KeyError, ValueError):
            continue
        unit = r.get("Metric Unit", "")
        ns *= {"usecond": 1e3, "msecond": 1e6, "second": 1e9}.get(unit, 1.0)
        out.append((r["Kernel Name"], r.get("Grid Size", ""), ns))
    return out


def short(name):
    """a kernel's name without its return type and argument list (template arguments kept, shortened)"""
    if name.startswith("void "):
        name = name[5:]
    depth = 0
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            name = name[:i]
            break
    return re.sub(r"\s+", " ", name)[:110]


PREFILL = re.compile(r"mul_mat_q<|gemm|Kernel2|cutlass|sm90_xmma|ampere_", re.I)


def steps(rows):
    last = max((i for i, r in enumerate(rows) if PREFILL.search(r[0])), default=-1)
    tail = rows[last + 1:]
    # a graph starts with the token embedding's get_rows (the first of a run of get_rows launches)
    starts = [i for i, r in enumerate(tail) if "get_rows" in r[0] and (i == 0 or "get_rows" not in tail[i - 1][0])]
    segs = [tail[a:b] for a, b in zip(starts, starts[1:] + [len(tail)])]
    # the prefill's last kernels before the first start are dropped; so is a last graph that ncu's log cut short
    if len(segs) > 1 and len(segs[-1]) < len(segs[-2]) // 2:
        segs = segs[:-1]
    return segs


def table(path):
    segs = steps(rows_of(path))
    if len(segs) < 2:
        print(f"{path}: {len(segs)} decode step(s) found; need >= 2")
        return None
    use = segs[1:]
    per = OrderedDict()
    for seg in use:
        for name, grid, ns in seg:
            k = short(name)
            t, n = per.get(k, (0.0, 0))
            per[k] = (t + ns, n + 1)
    total = sum(t for t, _ in per.values()) / len(use)
    print(f"== {path}: {len(use)} decode steps averaged, {len(use[0])} kernels per step, GPU time {total / 1e3:.1f} us")
    print(f"{'us/step':>9} {'launches':>8} {'us/launch':>9}  kernel")
    for k, (t, n) in sorted(per.items(), key=lambda kv: -kv[1][0]):
        print(f"{t / len(use) / 1e3:9.1f} {n / len(use):8.1f} {t / n / 1e3:9.2f}  {k}")
    return total


def main():
    totals = [(p, table(p)) for p in sys.argv[1:]]
    if len(totals) > 1:
        print("== totals (GPU time per decode step, kernels only: launch gaps not counted)")
        for p, t in totals:
            print(f"{'-' if t is None else '%.1f' % (t / 1e3):>9} us  {p}")


if __name__ == "__main__":
    main()
