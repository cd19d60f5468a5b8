#!/usr/bin/env python3
"""Where the server engine's time goes at 1/2/4/8 concurrent clients: the engine in-process, driven through
serve_bench's client rounds (engine_stall.py's), with its llama.cpp calls and batch-loop phases timed.

    python benchmarks/engine_profile.py MODEL [--flags "-c 4096 -np 8 -ctk q8_0 -ctv q4_0 -fa off -ngl 999"]
        [--clients 1,2,4,8] [--requests 4] [--max-tokens 128]

Per round it prints tok/s, TTFT p50/max as the engine's clients see them, and the worker thread's time split:
decode calls of pure decode steps and of steps holding prompt tokens, the wait for their results (``sync``; on a GPU
the decode runs meanwhile), the sampler calls, admissions (``_start``: slot choice, the RAM cache's stash, the
cut), checkpoints, state reads and writes (count, MiB), and the rest (the batch loop's own Python). Written for
issue 10's 4-client target on the GPU (RESULTS.md, engine section): which of these grows from 1 to 4 clients.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shlex
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

from serve_prompts import engine_arg_parser, round_prompts  # noqa: E402

PHASES = ("step", "decode", "decode+prompt", "sync", "sample", "admit", "checkpoint", "state_read", "state_write")


class Clock:
    """Seconds, calls and bytes per phase, for the worker thread (one writer)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.t = collections.defaultdict(float)
        self.n = collections.defaultdict(int)
        self.bytes = collections.defaultdict(int)

    def add(self, name: str, dt: float, nbytes: int = 0) -> None:
        self.t[name] += dt
        self.n[name] += 1
        self.bytes[name] += nbytes


def timed(clock: Clock, name, fn, size=None):
    """``fn`` wrapped: its time added to ``name`` (a str, or a function of the call's arguments)."""

    def wrapper(*args, **kw):
        t0 = time.perf_counter()
        out = fn(*args, **kw)
        label = name(*args) if callable(name) else name
        clock.add(label, time.perf_counter() - t0, size(args, out) if size else 0)
        return out

    return wrapper


def instrument(engine, clock: Clock) -> None:
    import llama_cpp

    from server.engine import cache_policy, held, prompt_cache, scheduler

    sched = engine._sched

    def decode_kind(ctx, b):  # a decode step has one token per sequence; a second one is a prompt's
        seqs = {int(b.seq_id[i][0]) for i in range(b.n_tokens)}
        return "decode" if len(seqs) == b.n_tokens else "decode+prompt"

    llama_cpp.llama_decode = timed(clock, decode_kind, llama_cpp.llama_decode)
    llama_cpp.llama_synchronize = timed(clock, "sync", llama_cpp.llama_synchronize)
    held.sampler_sample = timed(clock, "sample", held.sampler_sample)
    read = timed(clock, "state_read", prompt_cache.get_state, size=lambda a, out: len(out))
    write = timed(clock, "state_write", prompt_cache.set_state, size=lambda a, out: len(a[2]))
    for mod in (scheduler, cache_policy):
        mod.get_state = read
        mod.set_state = write
    sched._start = timed(clock, "admit", sched._start)
    sched._maybe_checkpoint = timed(clock, "checkpoint", sched._maybe_checkpoint)
    sched._step = timed(clock, "step", sched._step)


def report(k: int, n: int, wall: float, ttft: list[float], clock: Clock) -> None:
    t, c, nb = clock.t, clock.n, clock.bytes
    print(f"clients {k}: {n / wall:.1f} tok/s ({n} tokens, {wall:.2f} s); TTFT p50 {statistics.median(ttft) * 1e3:.0f}"
          f" ms, max {max(ttft) * 1e3:.0f} ms; {c['step']} steps", flush=True)
    parts = []
    for name in PHASES[1:]:
        if c[name]:
            mib = f", {nb[name] / 2**20:.1f} MiB" if nb[name] else ""
            parts.append(f"{name} {t[name] * 1e3:.0f} ms/{c[name]}{mib}")
    inside = t["decode"] + t["decode+prompt"] + t["sync"] + t["sample"] + t["checkpoint"]
    rest = wall - t["step"] - t["admit"]
    parts.append(f"step Python {max(0.0, t['step'] - inside) * 1e3:.0f} ms")
    parts.append(f"outside steps and admissions {rest * 1e3:.0f} ms")
    print("  " + "; ".join(parts), flush=True)


async def rounds(engine, a: argparse.Namespace, clock: Clock) -> None:
    from engine_support import greedy

    async def client(prompts: list[list[int]], ttft: list[float]) -> int:
        n = 0
        for p in prompts:
            t0, first = time.monotonic(), True
            async for ev in engine.submit(greedy(p, a.max_tokens, ignore_eos=True)).events():
                kind = type(ev).__name__
                if kind == "TokenEvent" and first:
                    ttft.append(time.monotonic() - t0)
                    first = False
                if kind == "DoneEvent":
                    n += ev.completion_tokens
                    break
        return n

    for k in (int(x) for x in a.clients.split(",")):
        prompts = round_prompts(engine.tokenize, k, a.requests)
        ttft: list[float] = []
        clock.reset()
        t0 = time.monotonic()
        n = sum(await asyncio.gather(*(client(prompts[c], ttft) for c in range(k))))
        report(k, n, time.monotonic() - t0, ttft, clock)


def main() -> int:
    ap = engine_arg_parser(__doc__)
    a = ap.parse_args()

    import llama_vq  # noqa: F401  (binds llama_cpp to our library before anything imports it)

    # isort: split
    from engine_support import start_engine

    engine = start_engine(a.model, *shlex.split(a.flags))
    clock = Clock()
    instrument(engine, clock)
    asyncio.run(rounds(engine, a, clock))
    engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
