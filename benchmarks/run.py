#!/usr/bin/env python3
"""Benchmark the KV-cache types side by side with llama-bench, on one machine, in one run.

    python benchmarks/run.py --backend cpu            # SmolLM2, 2 threads, depths 0 and 4096
    python benchmarks/run.py --backend cuda           # synthetic 8B-shaped and MiMo-shaped models
    python benchmarks/run.py --backend hip            # the same on AMD (GPU_TARGETS, default gfx90a: MI210)

One command: builds llama-bench (+ llama-perplexity, test-backend-ops) from the patched tree
(tools/patches.py export, then CMake), generates the synthetic models where it runs
(tools/synth_models.py; never committed), runs the matrix (flash attention off/on x cache-type
pairs x depths; on the CPU, FA on with f16/f16 and q4_0/q4_0 unless --configs names the others, so that
it ends within 15 minutes on 2 cores), and writes into --out:

    results.json   every llama-bench record, plus per-config status (ok / unsupported / failed /
                   timeout / skipped, with the reason), KV and compute-buffer sizes from llama.cpp's
                   log, machine, llama.cpp commit and patch series
    results.md     tok/s and ratios vs FA-off f16/f16 (same run), memory, bytes moved per token
    tok_s_vs_depth.png
    logs/          llama-bench's stderr per config (verbose: buffer sizes)

A config the current patches cannot run (e.g. a quantized V with flash attention off before the V
patch) is reported as "unsupported", never stops the run. Use --bin to reuse built tools.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import report  # noqa: E402
from run_bench import Config, run_config  # noqa: E402
from run_setup import BUILT_FROM, CUDA_FA_QUANTS, TARGETS, build_tools, start_models, wait_models  # noqa: E402

# (type_k, type_v) pairs, in table order
PAIRS = [("f16", "f16"), ("q4_0", "q4_0"), ("q8_0", "q8_0"), ("q8_0", "q4_0"), ("q4_0", "f16")]


# FA-on pairs the CPU matrix runs by default: on 2 cores FA on with a quantized cache prefills at depth 4096 at
# ~25 t/s (3x slower than FA off), and the other three would take the run past 15 minutes; --configs runs them
CPU_FA_ON_DEFAULT = {("f16", "f16"), ("q4_0", "q4_0")}


def default_configs(backend: str, cuda_fa: bool, everything: bool = False) -> tuple[list[Config], list[dict]]:
    """The matrix, and the configs skipped with a reason.

    A CUDA build with GGML_CUDA_FA=OFF (much shorter to compile) has no flash-attention kernels:
    llama.cpp would run the attention on the CPU, which measures nothing useful, so FA-on configs
    are skipped there. On the CPU, FA on runs f16/f16 and q4_0/q4_0 unless `everything`.
    """
    configs, skipped = [], []
    for fa in ("off", "on"):
        for k, v in PAIRS:
            c = Config(fa, k, v)
            if backend == "cpu" and fa == "on" and (k, v) not in CPU_FA_ON_DEFAULT and not everything:
                reason = "not in the CPU default matrix (time on 2 cores); --configs " + c.key + " runs it"
                skipped.append(
                    dict(config=c.key, fa=fa, type_k=k, type_v=v, status="skipped", reason=reason)
                )
                continue
            if backend in ("cuda", "hip") and fa == "on" and not cuda_fa:
                reason = f"this {backend.upper()} build has no FA kernels (--cuda-fa off, GGML_CUDA_FA=OFF)"
                skipped.append(
                    dict(config=c.key, fa=fa, type_k=k, type_v=v, status="skipped", reason=reason)
                )
                continue
            configs.append(c)
    return configs, skipped


# ----------------------------------------------------------------------------
# machine / provenance


def machine_info(backend: str) -> dict:
    info = {"platform": platform.platform(), "cpu_cores": os.cpu_count()}
    try:
        info["loadavg_at_start"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    if backend == "cuda" and shutil.which("nvidia-smi"):
        q = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
        )
        info["gpus"] = [s.strip() for s in q.stdout.strip().splitlines()]
    if backend == "hip" and shutil.which("rocm-smi"):
        q = subprocess.run(["rocm-smi", "--showproductname", "--showmeminfo", "vram", "--csv"],
                           capture_output=True, text=True)
        info["gpus"] = [s.strip() for s in q.stdout.strip().splitlines() if s.strip()]
    return info


def provenance() -> dict:
    out: dict = {}
    try:
        sys.path.insert(0, str(REPO / "tools"))
        from _pin import read_pin, read_series  # noqa: PLC0415

        pin = read_pin()
        out["llama_cpp_commit"] = pin.llama_cpp_commit
        out["llama_cpp_python"] = pin.llama_cpp_python
        out["patch_series"] = read_series()
    except Exception as e:  # noqa: BLE001 - provenance is best effort, recorded as such
        out["provenance_error"] = repr(e)
    try:
        out["repo_commit"] = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--", "patches", "native/ggml"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        out["patches_dirty"] = bool(dirty)
    except OSError:
        pass
    return out


# ----------------------------------------------------------------------------
# build


def _series_digest() -> str:
    sys.path.insert(0, str(REPO / "tools"))
    import _patches as patches  # noqa: PLC0415

    return patches.series_digest()


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--backend", choices=["cpu", "cuda", "hip"], required=True)
    ap.add_argument(
        "--out", type=Path, help="output folder (default: benchmarks/out/<backend>-<time>)"
    )
    ap.add_argument("--bin", type=Path, help="folder with a built llama-bench (skips the build)")
    ap.add_argument(
        "--src",
        type=Path,
        help="an exported patched llama.cpp tree (default: tools/patches.py export)",
    )
    ap.add_argument("--build-dir", type=Path, help="build folder (default: build/bench-<backend>[-avx512])")
    ap.add_argument(
        "--cpu-simd",
        choices=["avx2", "avx512"],
        default="avx2",
        help="x86 SIMD level of a cpu build: avx2 (default: portable, what both CI classes run) or avx512 "
        "(AVX-512 + VNNI kernels, for an AVX-512 machine)",
    )
    ap.add_argument("--jobs", type=int, help="build jobs (default: 2 on cpu, all cores on cuda)")
    ap.add_argument("--targets", default=",".join(TARGETS), help="tools to build")
    ap.add_argument(
        "--cuda-fa",
        choices=["on", "off"],
        default="on",
        help="CUDA: compile the flash-attention kernels (off: much shorter build, FA-on configs "
        "skipped); on builds FA for " + CUDA_FA_QUANTS.replace(",", ", ") + " and f16",
    )
    ap.add_argument(
        "--models",
        help="comma list: smollm2, llama8b, mimo, llama-tiny, mimo-tiny "
        "(default: smollm2 on cpu; llama8b,mimo on cuda)",
    )
    ap.add_argument(
        "--model-dir", type=Path, help="where synthetic models are written (default: <out>/models)"
    )
    ap.add_argument(
        "--tokenizer-from", help="GGUF to copy tokenizer metadata from (synthetic models)"
    )
    ap.add_argument("--depths", help="comma list (default: 0,4096 on cpu; 0,8192,32768 on cuda)")
    ap.add_argument(
        "-p", type=int, help="prompt tokens (pp test; default 512 cpu, 2048 cuda; 0: none)"
    )
    ap.add_argument("-n", type=int, help="generated tokens (tg test; default 128; 0: none)")
    ap.add_argument("-r", "--reps", type=int, help="repetitions (default 2)")
    ap.add_argument("-t", "--threads", type=int, help="threads (default 2 on cpu)")
    ap.add_argument(
        "--configs", help="comma list of config keys to run (e.g. fa-off_f16-f16,fa-off_q4_0-q4_0)"
    )
    ap.add_argument(
        "--model-configs",
        action="append",
        default=[],
        metavar="MODEL=KEYS",
        help="restrict one model to these config keys (comma list); repeatable",
    )
    ap.add_argument(
        "--deadline",
        type=float,
        help="seconds from start after which remaining configs are "
        "skipped (reported as such); results are written after "
        "every config either way",
    )
    ap.add_argument(
        "--pack-logs", action="store_true", help="tar.xz the logs folder into logs.tar.xz"
    )
    ap.add_argument("--build-only", action="store_true", help="build the tools, then stop")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per llama-bench invocation")
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the whole matrix this many times (interleaved), report the mean: evens out "
        "background load on a shared machine",
    )
    ap.add_argument("--extra", default="", help="extra llama-bench arguments (quoted)")
    return ap


def _defaults(a: argparse.Namespace) -> list[str]:
    """Fill in the backend's defaults (depths, sizes, reps, threads); the models to run."""
    cpu = a.backend == "cpu"
    a.depths = [int(x) for x in (a.depths or ("0,4096" if cpu else "0,8192,32768")).split(",")]
    a.p = a.p if a.p is not None else (512 if cpu else 2048)
    a.n = a.n if a.n is not None else 128
    a.reps = a.reps or 2
    a.threads = a.threads or (2 if cpu else None)
    a.extra = shlex.split(a.extra)
    models = (a.models or ("smollm2" if cpu else "llama8b,mimo")).split(",")
    return models


def _tools(a: argparse.Namespace, out: Path) -> Path:
    """The folder with llama-bench: --bin as given (its provenance noted), or built from the patched tree."""
    cpu = a.backend == "cpu"
    if a.bin:
        bin_dir = a.bin
        cfg = bin_dir.parent / "_build_config.json"
        BUILT_FROM["prebuilt"] = str(bin_dir)
        if cfg.exists():
            BUILT_FROM["build_config"] = json.loads(cfg.read_text())
        # a tree exported by an earlier run.py build: does it match the current series?
        series_stamp = bin_dir.parent.parent / "llama.cpp-patched" / ".llama-vq-series"
        if series_stamp.exists():
            current = _series_digest()
            BUILT_FROM["series_matches_current"] = series_stamp.read_text().strip() == current
    else:
        suffix = "-avx512" if cpu and a.cpu_simd == "avx512" else ""
        build_dir = a.build_dir or (REPO / "build" / f"bench-{a.backend}{suffix}")
        jobs = a.jobs or (2 if cpu else (os.cpu_count() or 4))
        bin_dir = build_tools(
            a.backend,
            a.src,
            build_dir,
            jobs,
            a.cuda_fa == "on",
            a.targets.split(","),
            out / "build.log",
            a.cpu_simd,
        )
    return bin_dir


def _gguf_py_env(a: argparse.Namespace) -> None:
    """The synthetic-model generator's gguf-py: the one beside an exported tree (gpu_carry.py's layout) when given."""
    if a.src and not os.environ.get("LLAMA_VQ_GGUF_PY") and (a.src / "gguf-py").is_dir():
        os.environ["LLAMA_VQ_GGUF_PY"] = str(a.src / "gguf-py")
    gguf_py = a.src.parent / "gguf-py" if a.src else None
    if gguf_py and gguf_py.is_dir() and not os.environ.get("LLAMA_VQ_GGUF_PY"):
        os.environ["LLAMA_VQ_GGUF_PY"] = str(gguf_py)


def _select_configs(a: argparse.Namespace) -> tuple[list, list[dict], dict[str, set[str]]]:
    """(configs to run, configs skipped with their reason, per-model restrictions) from --configs/--model-configs."""
    configs, skipped = default_configs(a.backend, a.cuda_fa == "on", everything=bool(a.configs))
    if a.configs:
        want = set(a.configs.split(","))
        configs = [c for c in configs if c.key in want]
        skipped = [s for s in skipped if s["config"] in want]
    per_model = {}
    for spec in a.model_configs:
        name, _, keys = spec.partition("=")
        per_model[name] = set(keys.split(","))
    return configs, skipped, per_model


class _Results:
    """results.json, rewritten after every config: the run's parameters, machine, provenance and records."""

    def __init__(self, a: argparse.Namespace, argv: list[str] | None, stamp: str, out: Path, model_paths: dict) -> None:
        self.a, self.out, self.t_start = a, out, time.time()
        self.records: list[dict] = []
        self.statuses: list[dict] = []
        self.data: dict = {}
        self.fixed = dict(
            backend=a.backend,
            date_utc=stamp,
            command=shlex.join([sys.executable, *sys.argv]) if argv is None else shlex.join(argv),
            machine=machine_info(a.backend),
            provenance=provenance(),
            built_from=BUILT_FROM,
            params=dict(depths=a.depths, n_prompt=a.p, n_gen=a.n, reps=a.reps, threads=a.threads, rounds=a.rounds),
            models={k: dict(path=str(v), **report.model_bytes(v)) for k, v in model_paths.items()},
        )

    def late(self) -> bool:
        return bool(self.a.deadline) and time.time() - self.t_start > self.a.deadline

    def save(self) -> None:
        self.data.update(self.fixed, statuses=self.statuses, records=self.records,
                         wall_s=round(time.time() - self.t_start, 1))
        try:
            self.data["machine"]["loadavg_now"] = [round(x, 2) for x in os.getloadavg()]
        except OSError:
            pass
        (self.out / "results.json").write_text(json.dumps(self.data, indent=1, default=str))


def _run_matrix(a, bench: Path, model_paths: dict, configs: list, per_model: dict, log_dir: Path,
                res: _Results) -> None:
    """Every config on every model, a.rounds times; configs outer, models inner: under a time budget every model
    gets the first configs, the rest are recorded as skipped."""
    for rnd in range(a.rounds):
        for cfg in configs:
            for name, path in model_paths.items():
                if name in per_model and cfg.key not in per_model[name]:
                    continue
                if res.late():
                    res.statuses.append(dict(model=name, config=cfg.key, fa=cfg.fa, type_k=cfg.type_k,
                                             type_v=cfg.type_v, status="skipped", round=rnd,
                                             reason=f"time budget ({a.deadline:.0f} s) spent"))
                    continue
                recs, st = run_config(bench, path, name, cfg, a, log_dir)
                for r in recs:
                    r["_round"] = rnd
                st["round"] = rnd
                res.records += recs
                res.statuses.append(st)
                res.save()


def _pack_logs(out: Path, log_dir: Path) -> None:
    for flag, name in (("-cJf", "logs.tar.xz"), ("-czf", "logs.tar.gz")):
        tar = ["tar", flag, str(out / name), "-C", str(out), "logs"]
        if subprocess.run(tar, check=False).returncode == 0:
            shutil.rmtree(log_dir, ignore_errors=True)
            break


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    models = _defaults(a)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = a.out or (HERE / "out" / f"{a.backend}-{stamp}")
    out.mkdir(parents=True, exist_ok=True)
    log_dir = out / "logs"
    log_dir.mkdir(exist_ok=True)
    t_start = time.time()

    _gguf_py_env(a)
    model_paths, procs = (
        ({}, [])
        if a.build_only
        else start_models(models, a.model_dir or (out / "models"), a.tokenizer_from)
    )
    bin_dir = _tools(a, out)
    bench = bin_dir / "llama-bench"
    if not bench.exists():
        raise SystemExit(f"{bench} not found")
    if a.build_only:
        print(f"[bench] tools in {bin_dir}", flush=True)
        return 0
    wait_models(model_paths, procs)

    configs, skipped, per_model = _select_configs(a)
    res = _Results(a, argv, stamp, out, model_paths)
    res.t_start = t_start  # the run's wall time and deadline count from its start, build included
    _run_matrix(a, bench, model_paths, configs, per_model, log_dir, res)
    for name in model_paths:
        for sk in skipped:
            if name not in per_model or sk["config"] in per_model[name]:
                res.statuses.append(dict(sk, model=name))
    res.save()
    report.write_all(res.data, out)
    if a.pack_logs:
        _pack_logs(out, log_dir)
    print(f"[bench] done in {res.data['wall_s']} s: {out}", flush=True)
    return 0

if __name__ == "__main__":
    sys.exit(main())
