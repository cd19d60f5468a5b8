#!/usr/bin/env python3
"""The attention modes side by side in one binary: prefill and decode speed, and compute buffers.

    python benchmarks/attn_modes.py --bin BIN --model M.gguf --out DIR [--label NAME] [--ctk q8_0 --ctv q4_1]
        [--depths 0,65536] [--modes off,prefill,on,unbounded] [--reps 2] [--buffers 131072 --buffer-ubatches 512,2048]
        [--env KEY=VALUE ...] [--ngl 99] [--threads N]

Modes (llama-bench's -fa; the same cache types for all):
    off        llama-vq's attention without flash attention for every batch, its scores split under the scratch
               budget (patch 0017, default 256 MiB)
    prefill    flash attention for prompt batches, the attention without it for decode (patch 0018)
    on         flash attention for every batch
    unbounded  "off" with an unlimited scratch budget: the non-FA attention as it was before the budget
For each depth: pp (prompt of --pp tokens after the depth) for every mode, tg (--tg tokens) for off and on (a
decode batch of prefill mode is off's graph, so one prefill tg at the deepest depth shows it). With --buffers N:
the compute buffer of each mode at N cells, per --buffer-ubatches, from llama-server's log (-v) at start-up.
Prints a table with ratios to "on" and "off", and which mode to choose: prefill when flash attention prefills
faster than the split non-FA path and llama-vq's decode is at least as fast as flash attention's.

Writes DIR/attn-modes-LABEL.json (every llama-bench record, the buffers, the environment) and .md (the table).
BIN holds llama-bench and, for --buffers, llama-server (same build).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

FA = {"off": "off", "prefill": "prefill", "on": "on", "unbounded": "off"}
UNBOUNDED_SCRATCH_MIB = "1048576"  # 1 TiB: never split


def _env(extra: list[str], mode: str) -> dict[str, str]:
    env = dict(os.environ)
    for kv in extra:
        k, _, v = kv.partition("=")
        env[k] = v
    if mode == "unbounded":
        env["LLAMA_VQ_ATTN_SCRATCH_MIB"] = UNBOUNDED_SCRATCH_MIB
    return env


def _model_args(a: argparse.Namespace, tool: str, mode: str) -> list[str]:
    """TOOL's command line up to what both tools share: the model, its layers, the mode and the cache types."""
    return [str(a.bin / tool), "-m", str(a.model), "-ngl", str(a.ngl), "-fa", FA[mode], "-ctk", a.ctk, "-ctv", a.ctv]


def bench(a: argparse.Namespace, mode: str, depth: int, pp: int, tg: int, log) -> list[dict]:
    """llama-bench records (jsonl) of one mode at one depth; [] when it failed (the reason is logged)."""
    cmd = [
        *_model_args(a, "llama-bench", mode),
        "-d",
        str(depth),
        "-p",
        str(pp),
        "-n",
        str(tg),
        "-ub",
        str(a.ubatch),
        "-b",
        str(a.ubatch),
        "-r",
        str(a.reps),
        "-o",
        "jsonl",
        *a.bench_args,
    ]
    if a.threads:
        cmd += ["-t", str(a.threads)]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env=_env(a.env, mode), timeout=a.timeout)
    log.write(f"$ {' '.join(cmd)}  ({time.monotonic() - t0:.0f} s, rc {p.returncode})\n{p.stderr[-3000:]}\n")
    if p.returncode != 0:
        print(f"[attn-modes] {mode} d={depth}: llama-bench failed (rc {p.returncode})", flush=True)
        return []
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    for r in rows:
        r["mode"] = mode
    return rows


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def buffers(a: argparse.Namespace, mode: str, n_ctx: int, ubatch: int, log) -> dict[str, float]:
    """MiB of each device's compute buffer (and KV cache) as llama-server logs them at start-up with -v."""
    cmd = [
        *_model_args(a, "llama-server", mode),
        "-c",
        str(n_ctx),
        "-ub",
        str(ubatch),
        "-b",
        str(ubatch),
        "-np",
        "1",
        "-v",
        "--no-webui",
        "--host",
        "127.0.0.1",
        "--port",
        str(_free_port()),
        "-fit",
        "off",
        *a.server_args,
    ]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(a.env, mode))
    out: dict[str, float] = {}
    lines: list[str] = []
    deadline = time.monotonic() + a.timeout
    try:
        for line in p.stdout:  # type: ignore[union-attr]
            lines.append(line)
            m = re.search(r"(\S+) compute buffer size = +([0-9.]+) MiB", line)
            if m:
                out[f"compute {m.group(1)}"] = float(m.group(2))
            m = re.search(r"llama_kv_cache: +(\S+) KV buffer size = +([0-9.]+) MiB", line)
            if m:
                out[f"kv {m.group(1)}"] = out.get(f"kv {m.group(1)}", 0.0) + float(m.group(2))
            m = re.search(
                r"(attention mode \S+ \(|prefill mode|for every batch|Flash Attention (enabled|not supported))", line
            )
            if m:
                out.setdefault("mode_log", line.strip())  # type: ignore[arg-type]
            if "reserve took" in line or "server is listening" in line or time.monotonic() > deadline:
                break
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
    log.write(f"$ {' '.join(cmd)}\n{''.join(lines[-60:])}\n")
    return out


def _avg(rows: list[dict], mode: str, depth: int, kind: str) -> float | None:
    for r in rows:
        if r["mode"] == mode and r["n_depth"] == depth and (r["n_prompt"] > 0) == (kind == "pp"):
            return r["avg_ts"]
    return None


def table(a: argparse.Namespace, rows: list[dict], bufs: list[dict]) -> tuple[str, str]:
    out = [
        f"### {a.label}: {a.model.name}, K {a.ctk} / V {a.ctv}, ubatch {a.ubatch}",
        "",
        "| test | depth | " + " | ".join(a.modes) + " | prefill / on | prefill / off | off / unbounded |",
        "|---|---|" + "---|" * (len(a.modes) + 3),
    ]
    verdicts = []
    for kind, n in (("pp", a.pp), ("tg", a.tg)):
        for d in a.depths:
            v = {m: _avg(rows, m, d, kind) for m in a.modes}
            if all(x is None for x in v.values()):
                continue

            def ratio(x: str, y: str, v: dict = v) -> str:
                return f"{v[x] / v[y]:.2f}" if v.get(x) and v.get(y) else ""

            cells = " | ".join(f"{v[m]:.1f}" if v[m] else "" for m in a.modes)
            out.append(
                f"| {kind}{n} | {d} | {cells} | {ratio('prefill', 'on')} | {ratio('prefill', 'off')} | "
                f"{ratio('off', 'unbounded')} |"
            )
            if kind == "pp" and v.get("on") and v.get("off"):
                verdicts.append(("pp", d, v["on"] / v["off"]))
            if kind == "tg" and v.get("on") and v.get("off"):
                verdicts.append(("tg", d, v["off"] / v["on"]))
    if bufs:
        out += [
            "",
            "| mode | n_ctx | ubatch | " + " | ".join(sorted({k for b in bufs for k in b["mib"]})) + " |",
            "|---|---|---|" + "---|" * len({k for b in bufs for k in b["mib"]}),
        ]
        keys = sorted({k for b in bufs for k in b["mib"]})
        for b in bufs:
            out.append(
                f"| {b['mode']} | {b['n_ctx']} | {b['ubatch']} | "
                + " | ".join(f"{b['mib'].get(k, 0):.1f}" for k in keys)
                + " |"
            )
    # the deepest depth decides: long contexts are what the modes are for (at depth 0 the non-FA path's prefill is
    # often the faster; the table shows it)
    deepest = max((d for _, d, _ in verdicts), default=None)
    pp = [r for k, d, r in verdicts if k == "pp" and d == deepest]
    tg = [r for k, d, r in verdicts if k == "tg" and d == deepest]
    if pp and tg:
        pp_gain, tg_gain = pp[0], tg[0]
        if pp_gain > 1.02 and tg_gain >= 0.98:
            choice = "prefill"
        elif tg_gain >= 0.98:
            choice = "off"
        else:
            choice = "on"
        verdict = (
            f"choose -fa {choice}: at depth {deepest} flash attention prefills at {pp_gain:.2f}x of the split "
            f"non-FA path and llama-vq's decode runs at {tg_gain:.2f}x of flash attention's"
        )
    else:
        verdict = "no verdict: the run lacks pp or tg figures of both off and on at its deepest depth"
    out += ["", verdict]
    return "\n".join(out), verdict


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", type=Path, required=True)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--label", default="")
    ap.add_argument("--ctk", default="q8_0")
    ap.add_argument("--ctv", default="q4_1")
    ap.add_argument("--depths", default="0")
    ap.add_argument("--modes", default="off,prefill,on,unbounded")
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=64)
    ap.add_argument("--ubatch", type=int, default=512)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--ngl", type=int, default=99)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--buffers", type=int, default=0, help="n_ctx at which to read compute buffers (0: skip)")
    ap.add_argument("--buffer-ubatches", default="512,2048")
    ap.add_argument("--buffer-modes", default="off,prefill,on,unbounded")
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for every run (e.g. the HIP proxy's)")
    ap.add_argument("--bench-args", default="", help="more llama-bench arguments")
    ap.add_argument("--server-args", default="", help="more llama-server arguments (--buffers)")
    ap.add_argument("--timeout", type=int, default=600)
    a = ap.parse_args(argv)
    a.depths = [int(x) for x in a.depths.split(",")]
    a.modes = [m for m in a.modes.split(",") if m]
    a.bench_args = a.bench_args.split()
    a.server_args = a.server_args.split()
    a.label = a.label or a.model.stem
    a.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    bufs: list[dict] = []
    with open(a.out / f"attn-modes-{a.label}.log", "w") as log:
        for d in a.depths:
            for m in a.modes:
                tg = a.tg if m in ("off", "on") or (m == "prefill" and d == max(a.depths)) else 0
                got = bench(a, m, d, a.pp, 0, log)
                if tg:
                    got += bench(a, m, d, 0, tg, log)
                rows += got
                for r in got:
                    kind = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
                    print(
                        f"[attn-modes] {a.label} {m:9s} {kind:6s} d={d:6d}: {r['avg_ts']:9.1f} tok/s "
                        f"(+-{r['stddev_ts']:.1f})",
                        flush=True,
                    )
        if a.buffers:
            for ub in (int(x) for x in a.buffer_ubatches.split(",")):
                for m in (x for x in a.buffer_modes.split(",") if x):
                    mib = buffers(a, m, a.buffers, ub, log)
                    bufs.append(
                        {
                            "mode": m,
                            "n_ctx": a.buffers,
                            "ubatch": ub,
                            "mib": {k: v for k, v in mib.items() if isinstance(v, float)},
                            "log": mib.get("mode_log", ""),
                        }
                    )
                    print(
                        f"[attn-modes] {a.label} buffers {m:9s} ctx {a.buffers} ub {ub}: {bufs[-1]['mib']}", flush=True
                    )
    md, verdict = table(a, rows, bufs)
    (a.out / f"attn-modes-{a.label}.md").write_text(md + "\n")
    (a.out / f"attn-modes-{a.label}.json").write_text(
        json.dumps(
            {
                "label": a.label,
                "model": str(a.model),
                "env": a.env,
                "rows": rows,
                "buffers": bufs,
                "verdict": verdict,
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "machine": os.uname().nodename,
            },
            indent=1,
        )
    )
    print(md, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
