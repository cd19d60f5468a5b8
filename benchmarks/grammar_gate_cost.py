#!/usr/bin/env python3
"""What gating a lazy grammar on the reasoning block saves: the trigger scan's cost per token.

    PYTHONPATH=. python benchmarks/grammar_gate_cost.py [N]     # N generated tokens (default 800)

One engine on the default model (SmolLM2), a lazy tool-call grammar whose trigger never appears, N greedy
tokens (ignore_eos) twice: ungated (every token fed to the grammar, whose trigger regex rescans all text
so far) and gated as inside an open reasoning block. Prints wall time and the time spent in
llama_sampler_sample (which feeds the grammar).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from engine_support import run_one, start_engine  # noqa: E402

import llama_vq  # noqa: E402
import server.engine.scheduler as sch  # noqa: E402
from server.engine import GenerationRequest, Grammar, Reasoning, Sampling  # noqa: E402

spent: list[float] = []
_sample = sch.llama_cpp.llama_sampler_sample  # llama_cpp as llama_vq bound it


def _timed(*a):
    t0 = time.perf_counter()
    r = _sample(*a)
    spent.append(time.perf_counter() - t0)
    return r


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 800
    sch.llama_cpp.llama_sampler_sample = _timed
    e = start_engine(llama_vq.default_model_path(), "-c", str(n + 256), "-np", "1", "-t", "1")
    g = Grammar('root ::= "<tool_call>" [a-z]+', lazy=True, trigger_patterns=(r"[\s\S]*?(<tool_call>)[\s\S]*",))
    p = tuple(e.tokenize("Write a very long essay about the history of the sea."))
    for name, r in (("ungated", None), ("gated", Reasoning("<think>", ("</think>",), open_at_start=True))):
        spent.clear()
        t0 = time.monotonic()
        req = GenerationRequest(p, Sampling(temperature=0), g, max_tokens=n, ignore_eos=True, reasoning=r)
        ids, text, _ = run_one(e, req)
        print(
            f"{name}: {len(ids)} tokens, {len(text)} chars, wall {time.monotonic() - t0:.1f} s, "
            f"sampling {sum(spent):.2f} s (last 100 tokens {1e3 * sum(spent[-100:]) / 100:.2f} ms/token)",
            flush=True,
        )
    e.shutdown()


if __name__ == "__main__":
    main()
