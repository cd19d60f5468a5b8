#!/usr/bin/env python3
"""What llama.cpp's Hadamard rotation of quantized K/V buys in quality: KL divergence and perplexity against an
f16/f16 cache, with the rotation on (llama.cpp's default) and off (LLAMA_ATTN_ROT_DISABLE=1), flash attention off.

    python benchmarks/rotation_quality.py                    # SmolLM2 (the embedded model), 2 threads
    python benchmarks/rotation_quality.py --model m.gguf --types q4_0/q4_0,q8_0/q8_0,f16/q4_0

Runs the llama-perplexity that llama-vq ships when built with LLAMA_VQ_BUILD_TOOLS=ON (scripts/run.sh test builds
it), on text from the pinned llama.cpp tree (its README and build guide: fixed bytes, ~16K tokens for SmolLM2),
n_ctx 512. Prints a markdown table; --out writes the table and the numbers as JSON. The rotation costs a few small
ops per layer (benchmarks/RESULTS.md); this measures the other side of that trade.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEXTS = ("README.md", "docs/build.md")

STATS = {
    "kld_mean": r"Mean\s+KLD:\s+([-\d.]+)",
    "kld_99": r"99\.0%\s+KLD:\s+([-\d.]+)",
    "ppl_ratio": r"Mean PPL\(Q\)/PPL\(base\)\s+:\s+([\d.]+)",
    "ppl_q": r"Mean PPL\(Q\)\s+:\s+([\d.]+)",
    "same_top": r"Same top p:\s+([\d.]+)",
}


def _perplexity_bin() -> Path:
    import llama_vq

    exe = Path(llama_vq.__file__).parent / "bin" / "llama-perplexity"
    if not exe.exists():
        sys.exit(f"{exe} is missing: build llama-vq with LLAMA_VQ_BUILD_TOOLS=ON (scripts/run.sh test does)")
    return exe


def _run(exe: Path, model: Path, text: Path, args: list[str], env: dict[str, str], log: Path) -> str:
    cmd = [str(exe), "-m", str(model), "-f", str(text), *args]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env})
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        sys.exit(f"`{' '.join(cmd)}` failed ({proc.returncode}); log: {log}")
    print(f"  {' '.join(f'{k}={v}' for k, v in env.items())} {' '.join(args)}: {time.monotonic() - t0:.0f} s",
          file=sys.stderr)
    return proc.stdout + proc.stderr


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="GGUF (default: the embedded SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument("--types", default="q4_0/q4_0,q8_0/q8_0", help="comma list of K/V cache type pairs")
    ap.add_argument("-c", "--ctx", type=int, default=512)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, help="folder for rotation_quality.{md,json} and the logs")
    a = ap.parse_args(argv)

    if a.model is None:
        from llama_vq import models

        a.model = models.default_model_path()
    exe = _perplexity_bin()
    out = a.out or Path(tempfile.mkdtemp(prefix="rotation-quality-"))
    out.mkdir(parents=True, exist_ok=True)
    text = out / "text.txt"
    text.write_bytes(b"\n\n".join((ROOT / "vendor" / "llama.cpp" / t).read_bytes() for t in TEXTS))
    base = out / "base.kld"
    common = ["-c", str(a.ctx), "-t", str(a.threads), "-fa", "off"]
    env_on = {"LLAMA_ATTN_ROT_DISABLE": "0"}

    print(f"base: f16/f16, FA off ({a.model.name}, {a.threads} threads)", file=sys.stderr)
    _run(exe, a.model, text, [*common, "--kl-divergence-base", str(base)], env_on, out / "base.log")

    rows = []
    for pair in a.types.split(","):
        k, v = pair.split("/")
        for rot, env in (("on", env_on), ("off", {"LLAMA_ATTN_ROT_DISABLE": "1"})):
            log = out / f"{k}-{v}-rot-{rot}.log"
            text_out = _run(exe, a.model, text, [*common, "-ctk", k, "-ctv", v, "--kl-divergence-base", str(base),
                                                 "--kl-divergence"], env, log)
            row = {"type_k": k, "type_v": v, "rotation": rot}
            for key, rx in STATS.items():
                m = re.search(rx, text_out)
                row[key] = float(m.group(1)) if m else None
            rows.append(row)

    lines = [
        f"`python benchmarks/rotation_quality.py` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{platform.machine()}, {a.threads} threads): {a.model.name}, n_ctx {a.ctx}, FA off, text = the pinned "
        f"llama.cpp's {' + '.join(TEXTS)}; KL and perplexity against f16/f16.",
        "",
        "| K / V | rotation | mean KLD | 99% KLD | PPL(Q)/PPL(f16) | same top token |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['type_k']} / {r['type_v']} | {r['rotation']} | {r['kld_mean']:.5f} | {r['kld_99']:.4f} | "
                     f"{r['ppl_ratio']:.4f} | {r['same_top']:.2f}% |")
    table = "\n".join(lines)
    print(table)
    (out / "rotation_quality.md").write_text(table + "\n")
    (out / "rotation_quality.json").write_text(json.dumps({"model": a.model.name, "ctx": a.ctx, "threads": a.threads,
                                                            "texts": TEXTS, "rows": rows}, indent=1) + "\n")
    print(f"written to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
