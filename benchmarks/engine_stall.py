#!/usr/bin/env python3
"""Drive the server's engine in-process through rounds of concurrent greedy requests (as `serve_bench.py
throughput` does over HTTP) and catch a stall: when no token arrives for --stall-s seconds, print the last
batches the engine decoded (each sequence's positions in the batch and its cached range before the decode),
every thread's Python stack, and exit 3. Each phase's tokens/s otherwise; exit 0.

    python benchmarks/engine_stall.py MODEL [--flags "-c 4096 -np 8 -ctk q8_0 -ctv q4_0 -fa off -ngl 999"]
        [--clients 1,2,4,8] [--requests 4] [--max-tokens 128] [--stall-s 15]

Written for the GPU-only stall at 8 clients (benchmarks/RESULTS.md, engine section): one process per variant
(environment switches, server flags), so that one call can bisect it.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import faulthandler
import os
import shlex
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

from serve_prompts import engine_arg_parser, round_prompts  # noqa: E402  (serve_bench's prompts: the same cache layout)


def record_decodes(engine, keep: int) -> collections.deque:
    """Wrap llama_decode so that the engine's last ``keep`` batches are recorded before they run: each
    sequence's (first position, token count) in the batch, every slot's cached range, the call's result."""
    import llama_cpp

    batches: collections.deque = collections.deque(maxlen=keep)
    n_slots = engine._core.n_slots
    mem = llama_cpp.llama_get_memory(engine._core.ctx)
    real_decode = llama_cpp.llama_decode

    def decode(ctx, b):
        seqs: dict[int, list[int]] = {}
        for i in range(b.n_tokens):
            seqs.setdefault(int(b.seq_id[i][0]), []).append(int(b.pos[i]))
        ranges = {
            s: (int(llama_cpp.llama_memory_seq_pos_min(mem, s)), int(llama_cpp.llama_memory_seq_pos_max(mem, s)))
            for s in range(n_slots)
        }
        rec = {"t": time.monotonic(), "n_tokens": b.n_tokens,
               "batch": {s: (p[0], len(p)) for s, p in seqs.items()}, "cached": ranges}
        batches.append(rec)
        t0 = time.monotonic()
        ret = real_decode(ctx, b)
        rec["ret"], rec["call_ms"] = ret, (time.monotonic() - t0) * 1e3
        return ret

    llama_cpp.llama_decode = decode
    return batches


def watch(progress: list, batches: collections.deque, stall_s: float) -> None:
    """Watchdog thread: no token for ``stall_s`` seconds -> the last batches and every stack, then exit 3."""
    while True:
        time.sleep(0.5)
        if time.monotonic() - progress[0] <= stall_s:
            continue
        print(f"STALL: no token for {stall_s:.0f} s after {progress[1]} tokens; last batches (batch: "
              "seq -> (first pos, n); cached: seq -> (pos_min, pos_max) before the decode):", flush=True)
        now = time.monotonic()
        for r in batches:
            print(f"  {now - r['t']:6.1f} s ago: n_tokens {r['n_tokens']} ret {r.get('ret', 'RUNNING')} "
                  f"call {r.get('call_ms', float('nan')):.1f} ms batch {r['batch']} cached {r['cached']}", flush=True)
        faulthandler.dump_traceback(all_threads=True)
        sys.stdout.flush()
        os._exit(3)


async def run_phases(engine, a: argparse.Namespace, progress: list) -> None:
    """serve_bench's client rounds: per round, ``k`` clients each sending ``a.requests`` requests in turn."""
    from engine_support import greedy

    async def client(prompts: list[list[int]]) -> int:
        n = 0
        for p in prompts:
            async for ev in engine.submit(greedy(p, a.max_tokens, ignore_eos=True)).events():
                progress[0] = time.monotonic()
                progress[1] += 1
                if type(ev).__name__ == "DoneEvent":
                    n += ev.completion_tokens
                    break
        return n

    for k in (int(x) for x in a.clients.split(",")):
        prompts = round_prompts(engine.tokenize, k, a.requests)
        t0 = progress[0] = time.monotonic()
        n = sum(await asyncio.gather(*(client(prompts[c]) for c in range(k))))
        print(f"clients {k}: {n / (time.monotonic() - t0):.1f} tok/s ({n} tokens)", flush=True)


def main() -> int:
    ap = engine_arg_parser(__doc__)
    ap.add_argument("--stall-s", type=float, default=15.0)
    ap.add_argument("--keep", type=int, default=4, help="batches to print at a stall")
    a = ap.parse_args()

    import llama_vq  # noqa: F401  (binds llama_cpp to our library before anything imports it)

    # isort: split
    from engine_support import start_engine

    engine = start_engine(a.model, *shlex.split(a.flags))
    batches = record_decodes(engine, a.keep)
    progress = [time.monotonic(), 0]  # last token's time, tokens so far
    threading.Thread(target=watch, args=(progress, batches, a.stall_s), daemon=True).start()
    asyncio.run(run_phases(engine, a, progress))
    engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
