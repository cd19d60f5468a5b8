#!/usr/bin/env python3
"""Summarize serve_bench.py's py-spy captures of our server (``--spy-clients N``): per thread, how many samples
it had in all (idle ones included: a thread inside a call into C or waiting for the GIL is sampled at the Python
line that made the call) and how many holding the GIL, and its lines with the most samples each way.

    python benchmarks/spy_summary.py OUT/spy-4-all.txt OUT/spy-4-gil.txt [--top 6]

Both captures ran at the same time and rate. When the threads' GIL shares add up to nearly all the GIL samples
and the worker ("llama-vq-engine") shows many samples at Python lines it does not hold the GIL for, outside its
llama_decode / llama_synchronize lines, it waits for the GIL.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path


def read(path: Path) -> tuple[collections.Counter, dict[str, collections.Counter]]:
    """(samples per thread, per thread: samples per innermost frame)."""
    threads: collections.Counter = collections.Counter()
    lines: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for row in path.read_text().splitlines():
        stack, _, n = row.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = stack.split(";")
        thread = frames[0].split(": ", 1)[-1]
        threads[thread] += int(n)
        lines[thread][frames[-1]] += int(n)
    return threads, lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("all", type=Path)
    ap.add_argument("gil", type=Path)
    ap.add_argument("--top", type=int, default=6)
    a = ap.parse_args()
    every, every_lines = read(a.all)
    gil, gil_lines = read(a.gil)
    total_gil = sum(gil.values())
    print(f"{a.all.name}: {sum(every.values())} samples; {a.gil.name}: {total_gil} samples holding the GIL")
    for thread, n in every.most_common():
        g = gil.get(thread, 0)
        print(f"{thread}: {n} samples, {g} holding the GIL ({g / max(1, total_gil):.0%} of the GIL samples)")
        for frame, m in every_lines[thread].most_common(a.top):
            print(f"    all {m:6d}  {frame[:150]}")
        for frame, m in gil_lines.get(thread, collections.Counter()).most_common(a.top):
            print(f"    gil {m:6d}  {frame[:150]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
