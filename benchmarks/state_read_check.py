#!/usr/bin/env python3
"""Sequence-state reads of a unified KV cache, grouped (patches 0021 and 0026) against range by range: the same
bytes, and the time each takes. The engine runs rounds of concurrent greedy requests (interleaving the sequences'
cells), then, idle, every slot's full state and SWA part are read both ways in this process
(``LLAMA_VQ_STATE_COALESCE=0`` is range by range; the library reads it at every call).

    python benchmarks/state_read_check.py MODEL [--flags "-c 4096 -np 8 -ctk q8_0 -ctv q4_0 -fa off -ngl 999"]
        [--clients 4,8] [--max-tokens 128]

Exit 1 when any state differs.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

from serve_prompts import PROMPTS, engine_arg_parser  # noqa: E402


def read(ctx, sid: int, flags: int, mode: str | None):
    from server.engine.prompt_cache import get_state

    if mode is None:
        os.environ.pop("LLAMA_VQ_STATE_COALESCE", None)
    else:
        os.environ["LLAMA_VQ_STATE_COALESCE"] = mode
    t0 = time.perf_counter()
    data = get_state(ctx, sid, flags)
    return time.perf_counter() - t0, bytes(data)


def compare(engine, label: str) -> bool:
    from server.engine.prompt_cache import PARTIAL

    ctx, ok = engine._core.ctx, True
    for flags, part in ((0, "full"), (PARTIAL, "swa")):
        t = {"ranges": 0.0, "grouped": 0.0}
        nbytes = 0
        for s in engine._sched.slots:
            if s.n_past <= 0:
                continue
            for _ in range(2):  # the second pass is timed: the first one allocates the staging
                tr, a = read(ctx, s.id, flags, "0")
                tg, b = read(ctx, s.id, flags, None)
            t["ranges"] += tr
            t["grouped"] += tg
            nbytes += len(a)
            if a != b:
                ok = False
                print(f"  {label} {part} slot {s.id}: DIFFERENT ({len(a)} / {len(b)} bytes)", flush=True)
        print(f"{label} {part}: {nbytes / 2**20:.1f} MiB; range by range {t['ranges'] * 1e3:.1f} ms, grouped "
              f"{t['grouped'] * 1e3:.1f} ms", flush=True)
    os.environ.pop("LLAMA_VQ_STATE_COALESCE", None)
    return ok


async def round_(engine, k: int, max_tokens: int) -> None:
    from engine_support import collect, greedy

    jobs = [engine.submit(greedy(engine.tokenize(PROMPTS[c % len(PROMPTS)] + f" ({k}.{c})"), max_tokens,
                                 ignore_eos=True)) for c in range(k)]
    await asyncio.gather(*(collect(j) for j in jobs))


def main() -> int:
    ap = engine_arg_parser(__doc__, clients="4,8", requests=False)
    a = ap.parse_args()

    import llama_vq  # noqa: F401  (binds llama_cpp to our library before anything imports it)

    # isort: split
    from engine_support import start_engine

    engine = start_engine(a.model, *shlex.split(a.flags))
    ok = True
    for k in (int(x) for x in a.clients.split(",")):
        asyncio.run(round_(engine, k, a.max_tokens))
        ok = compare(engine, f"after {k} clients") and ok
    engine.shutdown()
    print("same bytes" if ok else "STATES DIFFER", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
