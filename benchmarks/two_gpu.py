#!/usr/bin/env python3
"""Two GPUs of one host: the MiMo-shaped model split by layers (-sm layer -ts 1,1) with a quantized V and
flash attention off, against one GPU (-sm none). Builds nothing: the tools and the model are given.

    BIN=<tools> MODEL=<synth-mimo.gguf> OUT=<dir> [PY=<python with the server's packages>] \\
        python3 benchmarks/two_gpu.py [--parts floor,main,server,cpumoe,hip] [--depth 65536] [--deadline 250]

BIN holds llama-bench and, when present, llama-server (else the runs go through llama-vq-server under PY) and
ggml-rpc-server (--rpc). PY runs llama-vq-server from this checkout (PYTHONPATH, llama_vq/lib built); default: /tmp/py
(the server's Python that `benchmarks/gpu.sh carry --python` packs, unpacked from PYPACK when missing), else this
interpreter.

Parts, in this order; a run not started within --deadline seconds is reported as not run:
  floor   the f16 cache with flash attention on and off, one device: the floor of greedy agreement (decision 8)
  main    K/V --ctk/--ctv (q8_0/q4_1) with flash attention off and in the default mode (-fa auto: prefill mode where a
          layer is on a GPU), each on one device and on two: greedy agreement one against two; through the server,
          pp/tg at depth 0 and at --depth (one fill per run: llama-bench fills the depth again for every test and
          repetition, which the time budget does not allow at 64K); llama-bench at depth 0, -sm none against -sm layer
          -ts 1/1 (--bench-parts: main; cpumoe and hip too with more time); each device's model, KV and compute
          buffers, the attention mode and pipeline parallelism from llama.cpp's log (-lv 4)
  server  llama-vq-server on the split: a chat, a streamed completion, slot save/restore with --state-dir across a
          restart, -sm row refused with its message, and what llama-server itself does with -sm row on these devices
  cpumoe  main's FA-off runs with the routed experts in CPU memory (-ot exps=CPU), as the deployment runs
  hip     main's FA-off runs with the HIP path's settings (the variables benchmarks/mi210.sh PROXY=cuda exports):
          NVIDIA GPUs configured as HIP runs them, not a gfx90a result
With fewer than two devices it says so and runs the one-device half of every part (the server part on one device).

Writes OUT/two_gpu.md (the tables), OUT/two_gpu.json (every figure and generated token), OUT/two_gpu.log (progress)
and OUT/logs.tar.xz (each process's log), all four brought up to date after every step, so that a call cut short still
brings back what ran. Exit status 0 when every check that ran passed. How greedy agreement is judged against the f16
floor: two_gpu_report.py.

--dry-run: sizes for a tiny model on a CPU (tests/benchmarks/test_two_gpu.py); --rpc N: N local ggml-rpc-server
processes are the devices, so that a machine without GPUs splits the layers over two devices too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
# beside this file: processes and HTTP, the server part, the judging and the tables
from two_gpu_proc import completion, free_port, post_json, start, stop, tail, wait_port  # noqa: E402
from two_gpu_report import (  # noqa: E402
    Agreement,
    Step,
    compare,
    markdown,
    parse_devices,
    parse_log,
    steps_from_completion,
    verdict,
)
from two_gpu_server import server_part  # noqa: E402

# the HIP path's settings on an NVIDIA GPU, as benchmarks/mi210.sh PROXY=cuda exports them: the fused decode attention
# for every chain it supports in its f32 V*P form, the F16 GEMM branch for prefill, no PDL
HIP_PROXY_ENV = {"LLAMA_VQ_CUDA_FUSED_ATTN": "1", "LLAMA_VQ_CUDA_FUSED_ATTN_MMA": "0",
                 "LLAMA_VQ_CUDA_FORCE_F16_GEMM": "1", "GGML_CUDA_PDL": "0"}
PARTS = ("floor", "main", "server", "cpumoe", "hip")
TEXT = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks" / "RESULTS.md"]
FLOOR = "floor: f16 FA off -> f16 FA on (1 device)"


@dataclass
class Run:
    name: str  # NAME-1 / NAME-2: one device / two
    group: str
    n_dev: int
    ctk: str
    ctv: str
    fa: str | None  # None: llama.cpp's default (auto)
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    speed: bool = False


class Runner:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.t0 = time.monotonic()
        # each process's log, outside OUT: OUT holds four files at any time (what a GPU call brings back is bounded)
        self.logs = Path(tempfile.mkdtemp(prefix="two-gpu-logs-"))
        self.progress = (a.out / "two_gpu.log").open("a")
        self.rpc: list[subprocess.Popen] = []
        self.rpc_addr = ""
        self.tokens: list[int] = []
        self.devices: list[str] = []
        self.two = False
        self.steps: dict[str, list[list[Step]]] = {}
        self.doc: dict[str, Any] = {"runs": {}, "agreement": {}, "bench": [], "server": [], "skipped": [],
                                    "failures": [], "notes": []}

    # ---------------------------------------------------------------- plumbing
    def log(self, msg: str) -> None:
        line = f"[two-gpu {time.monotonic() - self.t0:5.0f}s] {msg}"
        print(line, flush=True)
        self.progress.write(line + "\n")
        self.progress.flush()

    def late(self) -> bool:
        return bool(self.a.deadline) and time.monotonic() - self.t0 > self.a.deadline

    def fail(self, what: str) -> None:
        self.log(f"FAILED: {what}")
        self.doc["failures"].append(what)

    def skip(self, what: str) -> None:
        self.log(f"not run: {what}")
        self.doc["skipped"].append(what)

    def rpc_args(self, flag: str = "--rpc") -> list[str]:
        return [flag, self.rpc_addr] if self.rpc_addr else []

    def engine(self, kind: str) -> tuple[list[str], dict[str, str]]:
        """The command and environment of llama-server (BIN) or llama-vq-server (PY, this checkout)."""
        env = dict(os.environ)
        if kind == "llama-server":
            return [str(self.a.bin / "llama-server")], env
        lib = Path(self.a.py).resolve().parent.parent / "lib"
        if any(lib.glob("libpython*")):  # the packed interpreter's libpython
            env["LD_LIBRARY_PATH"] = os.pathsep.join(x for x in (str(lib), env.get("LD_LIBRARY_PATH")) if x)
        env["PYTHONPATH"] = os.pathsep.join(x for x in (str(REPO), env.get("PYTHONPATH")) if x)
        env.pop("LLAMA_CPP_LIB_PATH", None)  # another llama_vq's (a test process's): this checkout binds its own
        return [self.a.py, "-m", "llama_vq.server.cli"], env

    def start(self, name: str, kind: str, args: list[str], env: dict[str, str] | None = None,
              expect_exit: bool = False) -> tuple[subprocess.Popen, str]:
        """A server of ``kind`` with ``args``, its log in logs/NAME.log; ready, or exited with ``expect_exit``."""
        cmd, full = self.engine(kind)
        return start([*cmd, *args], {**full, **(env or {})}, self.logs / f"{name}.log", REPO, expect_exit)

    def floor(self) -> Agreement | None:
        """The f16 cache's flash attention off -> on (one device), once both runs have answered."""
        if "f16-fa-off-1" in self.steps and "f16-fa-on-1" in self.steps:
            return compare(self.steps["f16-fa-off-1"], self.steps["f16-fa-on-1"])
        return None

    # ---------------------------------------------------------------- set-up
    def setup(self) -> None:
        a = self.a
        if a.rpc:
            ports = [free_port() for _ in range(a.rpc)]
            for i, port in enumerate(ports):
                with (self.logs / f"rpc-{i}.log").open("ab") as f:
                    self.rpc.append(subprocess.Popen([str(a.bin / "ggml-rpc-server"), "-p", str(port), "-t", "1"],
                                                     stdout=f, stderr=subprocess.STDOUT))
                wait_port(port, self.rpc[-1])
            self.rpc_addr = ",".join(f"127.0.0.1:{p}" for p in ports)
            self.log(f"{a.rpc} ggml-rpc-server processes as the devices: {self.rpc_addr}")
        cmd, env = self.engine(a.engine)
        r = subprocess.run([*cmd, *self.rpc_args(), "--list-devices"], capture_output=True, text=True, env=env,
                           timeout=120)
        self.devices = parse_devices(r.stdout + r.stderr)
        self.two = len(self.devices) >= 2
        self.log(f"devices: {self.devices or 'none'}")
        if not self.two:
            note = (f"{len(self.devices)} device(s): the layer split needs two; only the one-device runs, and the "
                    "server part on one device")
            self.log(note)
            self.doc["notes"].append(note)
        for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
            if os.environ.get(var):
                self.doc["notes"].append(f"{var}={os.environ[var]}")

    def region(self, name: str) -> int:
        """Where each kind of prompt takes its token ids, apart, so that no request reuses another's cached prefix
        (llama-server's RAM prompt cache would): the depth's fill, the prompt on top of it, depth 0's prompts (one
        per repetition), the fidelity prompts."""
        a = self.a
        d0 = a.depth + a.pp + 16
        return {"fill": 0, "more": a.depth, "d0": d0, "fidelity": d0 + a.speed_reps * (a.pp + 16)}[name]

    def ensure_tokens(self, url: str) -> None:
        """Token ids of this repository's docs (the model's tokenizer), repeated to cover every region."""
        if self.tokens:
            return
        text = "\n\n".join(p.read_text(errors="replace") for p in TEXT if p.exists())
        toks = post_json(url + "/tokenize", {"content": text})["tokens"]
        need = self.region("fidelity") + sum(self.a.prompts) + 16
        self.tokens = (toks * (need // max(1, len(toks)) + 1))[:need]

    # ---------------------------------------------------------------- one server run
    def server_args(self, run: Run) -> list[str]:
        a = self.a
        args = ["-m", str(a.model), "-ngl", "99", "-np", "1", "-c", str(a.ctx), "-lv", "4", "-fit", "off",
                "-ctk", run.ctk, "-ctv", run.ctv, *self.rpc_args()]
        args += ["-fa", run.fa] if run.fa is not None else []
        args += ["-sm", "none", "-mg", "0"] if run.n_dev == 1 else ["-sm", "layer", "-ts", "1,1"]
        args += ["-t", str(a.threads)] if a.threads else []
        return args + run.args

    def do_run(self, run: Run) -> None:
        """Start, the fidelity prompts, the speed requests (depth 0, the depth), stop; the log's buffers and facts."""
        a = self.a
        rec: dict[str, Any] = {"group": run.group, "n_dev": run.n_dev, "ctk": run.ctk, "ctv": run.ctv,
                               "fa": run.fa or "default", "args": run.args, "env": run.env}
        self.doc["runs"][run.name] = rec
        t = time.monotonic()
        try:
            p, url = self.start(run.name, a.engine, self.server_args(run), {"LLAMA_VQ_CUDA_FUSION_STATS": "1",
                                                                            **run.env})
        except RuntimeError as e:
            rec["error"] = str(e)[-300:]
            self.fail(f"{run.name}: the server did not start ({str(e)[-200:]})")
            return
        rec["start_s"] = round(time.monotonic() - t, 1)
        try:
            self.ensure_tokens(url)
            steps, at = [], self.region("fidelity")
            for n in a.prompts:
                doc = completion(url, {"prompt": self.tokens[at:at + n], "n_predict": a.n_predict, "temperature": 0,
                                       "n_probs": 2, "cache_prompt": False})
                steps.append(steps_from_completion(doc))
                at += n
            self.steps[run.name] = steps
            rec["tokens"] = [[[s.id, s.top] for s in ss] for ss in steps]
            if run.speed:
                rec["speed"] = self.speed(url, run)
        except (RuntimeError, OSError, KeyError, ValueError) as e:
            rec["error"] = f"{type(e).__name__}: {e}"[-300:]
            self.fail(f"{run.name}: {rec['error']}")
        finally:
            stop(p)
            rec["log"] = parse_log((self.logs / f"{run.name}.log").read_text(errors="replace"))
        sp = {k: round(v, 1) for k, v in rec.get("speed", {}).items() if isinstance(v, float)}
        kv = {d: b for d, b in rec["log"].get("devices", {}).items() if "kv" in b}
        self.log(f"{run.name}: started in {rec['start_s']} s; tok/s {sp}; MiB {kv}; {rec['log'].get('mode', '')}")

    def speed(self, url: str, run: Run) -> dict[str, Any]:
        """pp and tg at depth 0 (means of --speed-reps), then one fill of --depth tokens and pp/tg on top of it, from
        llama-server's own timings of each request."""
        a = self.a
        pp, tg = [], []
        for r in range(a.speed_reps):
            at = self.region("d0") + r * (a.pp + 16)
            ids = self.tokens[at:at + a.pp]
            pp.append(completion(url, {"prompt": ids, "n_predict": 1, "cache_prompt": False})["timings"]
                      ["prompt_per_second"])
            tg.append(completion(url, {"prompt": ids[:16], "n_predict": a.tg, "ignore_eos": True, "temperature": 0,
                                       "cache_prompt": False})["timings"]["predicted_per_second"])
        s: dict[str, Any] = {"pp_d0": statistics.mean(pp), "tg_d0": statistics.mean(tg), "pp_d0_all": pp,
                             "tg_d0_all": tg}
        if not a.depth:
            return s
        if self.late():
            self.skip(f"{run.name}: depth {a.depth} (deadline)")
            return s
        fill = self.tokens[:a.depth]
        t = completion(url, {"prompt": fill, "n_predict": 1, "cache_prompt": True, "temperature": 0})["timings"]
        s.update(fill=t["prompt_per_second"], fill_n=t["prompt_n"], fill_s=round(t["prompt_ms"] / 1000, 2))
        more = self.tokens[self.region("more"):self.region("more") + a.pp]
        t = completion(url, {"prompt": fill + more, "n_predict": a.tg, "ignore_eos": True, "temperature": 0,
                             "cache_prompt": True})["timings"]
        reused = t["prompt_n"] <= a.pp + 1
        s.update(pp_depth=t["prompt_per_second"], tg_depth=t["predicted_per_second"], depth_prompt_n=t["prompt_n"],
                 reused="yes" if reused else f"no ({t['prompt_n']} tokens processed)")
        if not reused:
            self.fail(f"{run.name}: the depth's prompt was processed again ({t['prompt_n']} tokens): its pp/tg are not "
                      "at the depth")
        return s

    # ---------------------------------------------------------------- llama-bench at depth 0
    def bench(self, group: str) -> None:
        """-sm none against -sm layer -ts 1/1 (llama-bench's list separator is ',', a split's is '/') at depth 0."""
        a = self.a
        exe = a.bin / "llama-bench"
        if not exe.exists():
            self.skip(f"llama-bench {group} ({exe} missing)")
            return
        fas = "off,auto" if group == "main" else "off"
        cmd = [str(exe), "-m", str(a.model), "-ngl", "99", "-ctk", a.ctk, "-ctv", a.ctv, "-fa", fas,
               "-sm", "none,layer" if self.two else "none", "-ts", "1/1", "-p", str(a.pp), "-n", str(a.tg),
               "-r", str(a.reps), "-o", "jsonl", *self.rpc_args("-rpc")]
        cmd += ["-ot", "exps=CPU"] if group == "cpumoe" else []
        cmd += ["-t", str(a.threads)] if a.threads else []
        env = {**os.environ, **(HIP_PROXY_ENV if group == "hip" else {})}
        path = self.logs / f"bench-{group}.log"
        with path.open("ab") as f:
            f.write(f"$ {' '.join(cmd)}\n".encode())
            f.flush()
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=f, env=env, timeout=600)
        fa_name = {0: "off", 1: "on", -1: "default", 2: "prefill"}
        for line in r.stdout.decode().splitlines():
            if line.startswith("{"):
                j = json.loads(line)
                x = {"group": group, "fa": fa_name.get(j["flash_attn"], str(j["flash_attn"])),
                     **{k: j[k] for k in ("split_mode", "n_prompt", "n_gen", "n_depth", "avg_ts", "stddev_ts")}}
                self.doc["bench"].append(x)
                test = f"pp{x['n_prompt']}" if x["n_prompt"] else f"tg{x['n_gen']}"
                self.log(f"bench {group} {x['split_mode']:5s} fa {x['fa']:7s} {test}: {x['avg_ts']:.1f} tok/s")
        if r.returncode != 0:
            self.fail(f"llama-bench {group} failed (rc {r.returncode}): {tail(path)}")

    # ---------------------------------------------------------------- the plan
    def runs(self, group: str) -> list[Run]:
        a = self.a
        q = (a.ctk, a.ctv)
        devs = [1, 2] if self.two else [1]
        if group == "floor":
            return [Run(f"f16-fa-{fa}-1", group, 1, "f16", "f16", fa) for fa in ("on", "off")]
        if group == "main":
            return [Run(f"{m}-{n}", group, n, *q, fa, speed=True) for m, fa in (("off", "off"), ("default", None))
                    for n in devs]
        if group == "cpumoe":
            return [Run(f"cpumoe-off-{n}", group, n, *q, "off", ["-ot", "exps=CPU"], speed=True) for n in devs]
        if group == "hip":
            return [Run(f"hip-off-{n}", group, n, *q, "off", env=dict(HIP_PROXY_ENV), speed=True) for n in devs]
        return []

    def agreements(self, final: bool) -> None:
        """Each one-device run against its two-device run, judged against the floor; the floor itself, and the
        quantized cache against f16 on one device for context (not judged: decision 8). ``final``: failures recorded
        and logged (else a partial report's tables)."""
        pairs = [(FLOOR, "f16-fa-off-1", "f16-fa-on-1")]
        pairs += [(f"{m}: 1 device -> 2 devices", f"{m}-1", f"{m}-2") for m in ("off", "default", "cpumoe-off",
                                                                                 "hip-off")]
        pairs.append((f"context: f16 -> {self.a.ctk}/{self.a.ctv}, FA off (1 device)", "f16-fa-off-1", "off-1"))
        floor = self.floor()
        for label, ref, run in pairs:
            if ref not in self.steps or run not in self.steps:
                continue
            ag = compare(self.steps[ref], self.steps[run])
            rec = ag.as_dict()
            if not label.startswith(("floor", "context")):
                ok, why = verdict(ag, floor)
                rec.update(ok="yes" if ok else "NO", why=why)
                if not ok and final:
                    self.fail(f"{label}: {why}")
            self.doc["agreement"][label] = rec
            if final:
                    self.log(f"agreement {label}: identical {ag.identical}, same {ag.same}/{ag.tokens}, largest moves "
                         f"{ag.max_move:.4g} / {ag.max_move_chosen:.4g} {rec.get('why', '')}")

    def step(self, what: str, fn, *args) -> None:  # noqa: ANN001
        """One step (a run, a benchmark, the server part) unless past the deadline; what fails is reported, and the
        next step runs."""
        if self.late():
            self.skip(f"{what} (deadline)")
            return
        self.log(what)
        try:
            fn(*args)
        except (OSError, RuntimeError, ValueError, KeyError, IndexError, subprocess.SubprocessError) as e:
            self.fail(f"{what}: {type(e).__name__}: {str(e)[-300:]}")
        self.agreements(final=False)
        self.save()  # a call cut short still brings back what ran

    def main(self) -> int:
        try:
            self.setup()
            for part in self.a.parts:
                if part == "server":
                    self.step("part server: llama-vq-server on the split", server_part, self)
                for run in self.runs(part):
                    self.step(f"run {run.name}", self.do_run, run)
                if part in self.a.bench_parts:
                    self.step(f"llama-bench {part} at depth 0", self.bench, part)
            self.agreements(final=True)
        finally:
            for p in self.rpc:
                stop(p)
        return self.finish()

    def save(self) -> None:
        """OUT/two_gpu.json, .md and logs.tar.xz as they stand, each written whole (a temporary file renamed)."""
        a = self.a
        self.doc.update(model=a.model.name, engine=a.engine, devices=self.devices,
                        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), machine=os.uname().nodename,
                        elapsed_s=round(time.monotonic() - self.t0, 1),
                        params={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()})
        for name, text in (("two_gpu.json", json.dumps(self.doc, indent=1, default=str)),
                           ("two_gpu.md", markdown(self.doc))):
            (a.out / f".{name}").write_text(text)
            (a.out / f".{name}").replace(a.out / name)
        with tarfile.open(a.out / ".logs.tar.xz", "w:xz", preset=1) as t:
            t.add(self.logs, arcname="logs")
        (a.out / ".logs.tar.xz").replace(a.out / "logs.tar.xz")

    def finish(self) -> int:
        a = self.a
        self.save()
        shutil.rmtree(self.logs, ignore_errors=True)
        failures = self.doc["failures"]
        self.log(f"done in {time.monotonic() - self.t0:.0f} s: {a.out}/two_gpu.md"
                 + (f"; FAILED: {'; '.join(failures)}" if failures else "; every check passed"))
        self.progress.close()
        return 1 if failures else 0


def _python(a: argparse.Namespace) -> str:
    """The interpreter for llama-vq-server: PY, else /tmp/py (unpacked from PYPACK if needed), else this one."""
    if a.py:
        return a.py
    packed = Path("/tmp/py/bin/python3")
    pack = Path(os.environ.get("PYPACK", REPO / ".gpu-carry" / "py.tar.xz"))
    if not packed.exists() and pack.exists():
        with tarfile.open(pack) as t:
            t.extractall("/tmp")
    return str(packed) if packed.exists() else sys.executable


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ.get
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", type=Path, default=env("BIN"), help="tools folder (env BIN)")
    ap.add_argument("--model", type=Path, default=env("MODEL"), help="GGUF (env MODEL)")
    ap.add_argument("--out", type=Path, default=env("OUT"), help="results folder (env OUT)")
    ap.add_argument("--py", default=env("PY"), help="python for llama-vq-server (env PY)")
    ap.add_argument("--engine", choices=["auto", "llama-server", "vq"], default=env("ENGINE", "auto"),
                    help="what serves the runs: llama-server from BIN, or llama-vq-server (the same engine)")
    ap.add_argument("--parts", default=env("PARTS", ",".join(PARTS)))
    ap.add_argument("--ctk", default=env("CTK", "q8_0"))
    ap.add_argument("--ctv", default=env("CTV", "q4_1"))
    ap.add_argument("--depth", type=int, default=int(env("DEPTH", "65536")))
    ap.add_argument("--pp", type=int, default=int(env("PP", "2048")))
    ap.add_argument("--tg", type=int, default=int(env("TG", "64")))
    ap.add_argument("--reps", type=int, default=int(env("REPS", "2")), help="llama-bench repetitions")
    ap.add_argument("--speed-reps", type=int, default=int(env("SPEED_REPS", "1")), help="server requests at depth 0")
    ap.add_argument("--bench-parts", default=env("BENCH_PARTS", "main"),
                    help="parts whose llama-bench runs at depth 0 (main, cpumoe, hip; ~10-16 s each on H200s)")
    ap.add_argument("--prompts", default=env("PROMPTS", "24,200,1200,3000"), help="fidelity prompts (tokens)")
    ap.add_argument("--n-predict", type=int, default=int(env("N_PREDICT", "48")), help="greedy tokens per prompt")
    ap.add_argument("--slot-prompt", type=int, default=int(env("SLOT_PROMPT", "1500")), help="server part (tokens)")
    ap.add_argument("--deadline", type=float, default=float(env("DEADLINE", "250")),
                    help="seconds after which no further run starts (0: none)")
    ap.add_argument("--threads", type=int, default=int(env("THREADS", "0")))
    ap.add_argument("--rpc", type=int, default=int(env("RPC", "0")),
                    help="N local ggml-rpc-server processes (from BIN) as the devices")
    ap.add_argument("--dry-run", action="store_true", help="sizes for a tiny model on a CPU")
    a = ap.parse_args(argv)
    for name in ("bin", "model", "out"):
        if getattr(a, name) is None:
            ap.error(f"--{name} (or {name.upper()}) is required")
    if a.dry_run:
        a.depth, a.pp, a.tg, a.reps, a.speed_reps = min(a.depth, 256), min(a.pp, 64), min(a.tg, 8), 1, 1
        a.prompts, a.n_predict, a.slot_prompt, a.threads, a.deadline = "16,80", min(a.n_predict, 8), 150, 1, 0
    a.prompts = [int(x) for x in str(a.prompts).split(",") if x]
    a.parts = [x for x in a.parts.split(",") if x]
    a.bench_parts = [x for x in a.bench_parts.split(",") if x in ("main", "cpumoe", "hip")]
    if set(a.parts) - set(PARTS):
        ap.error(f"--parts: {sorted(set(a.parts) - set(PARTS))} not among {PARTS}")
    a.ctx = (max(max(a.prompts) + a.n_predict, a.depth + a.pp + a.tg + 1) + 64 + 255) // 256 * 256
    if a.engine == "auto":
        a.engine = "llama-server" if (a.bin / "llama-server").exists() else "vq"
    a.py = _python(a)
    a.out.mkdir(parents=True, exist_ok=True)
    return a


if __name__ == "__main__":
    sys.exit(Runner(parse_args()).main())
