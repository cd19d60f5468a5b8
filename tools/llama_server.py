#!/usr/bin/env python3
"""Build llama.cpp's own llama-server from the same patched tree, compilers and flags as this checkout's pip build.

    python tools/llama_server.py [--jobs N] [--cmake-args ARGS]

Our top-level CMake project's llama-server target in build/server-bench, beside the pip build (build/<wheel tag>):
the same compilers (ccache keys on the compiler path), backend, CPU features and backends as modules or not (then
the one CPU module this machine loads, built beside it), and a build dir at the same depth, so that every object it
shares with the pip build is a ccache hit. Prints one JSON line,
{"llama_server": PATH, "build_s": SECONDS}. The tests that compare llama-vq-server with stock llama-server
(tests/conftest.py's llama_server_bin) and benchmarks/serve_bench.py's `build --llama-vq` run it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BUILD_DIR = REPO / "build" / "server-bench"


def _pip_build_cache() -> dict[str, str]:
    """CMakeCache entries of this checkout's pip build dir (build/<wheel tag>), {} when there is none."""
    for cache in sorted((REPO / "build").glob("py3-*/CMakeCache.txt")):
        return dict(
            (k.split(":", 1)[0], v)
            for k, _, v in (ln.partition("=") for ln in cache.read_text().splitlines())
            if ":" in k
        )
    return {}


def build(jobs: int, cmake_args: str = "") -> dict[str, Any]:
    """Configure and build llama-server in BUILD_DIR (nice'd); its path and the seconds it took."""
    pip = _pip_build_cache()
    env = dict(os.environ)
    for var, key in (("CC", "CMAKE_C_COMPILER"), ("CXX", "CMAKE_CXX_COMPILER")):
        if pip.get(key):
            env[var] = pip[key]  # ccache keys on the compiler path: /usr/bin/cc is not /usr/bin/gcc
    cfg = ["cmake", "-S", str(REPO), "-B", str(BUILD_DIR), "-DCMAKE_BUILD_TYPE=Release"]
    cfg += ["-DLLAMA_VQ_BUILD_TOOLS=ON"]  # llama.cpp adds tools/server only with its tools
    keys = ("LLAMA_VQ_BACKEND", "LLAMA_VQ_CPU_FEATURES", "LLAMA_VQ_BACKEND_DL", "SKBUILD_PROJECT_VERSION")
    cfg += [f"-D{k}={pip[k]}" for k in keys if pip.get(k)]
    cfg += ["-DLLAMA_VQ_CPU_VARIANTS=host"]  # backends as modules: the one CPU module this machine loads
    cfg += [f"-DPython3_EXECUTABLE={sys.executable}", *shlex.split(cmake_args)]
    if shutil.which("ninja"):
        cfg += ["-G", "Ninja"]
    t0 = time.time()
    nice = ["nice", "-n", "5"] if shutil.which("nice") else []
    subprocess.run(cfg, check=True, env=env)
    targets = ["llama-server"]
    built = json.loads((BUILD_DIR / "_build_config.json").read_text())
    if built.get("backend_dl"):  # ggml's loader looks beside the executable (bin/, where the modules are built)
        targets += [f"ggml-cpu-{v}" for v in built.get("cpu_variants", [])] or ["ggml-cpu"]
    subprocess.run([*nice, "cmake", "--build", str(BUILD_DIR), "-j", str(jobs), "--target", *targets], check=True)
    binary = BUILD_DIR / "bin" / "llama-server"
    print(f"[build] {binary} in {time.time() - t0:.0f} s", file=sys.stderr)
    return {"llama_server": str(binary), "build_s": time.time() - t0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=max(1, os.cpu_count() or 2))
    ap.add_argument("--cmake-args", default="", help="more CMake arguments, e.g. -DGGML_* flags")
    a = ap.parse_args(argv)
    print(json.dumps(build(a.jobs, a.cmake_args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
