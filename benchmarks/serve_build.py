"""Build llama.cpp's llama-server from the same patched tree as llama-vq, for benchmarks/serve_bench.py's
side-by-side runs (``serve_bench.py build``): through our CMake project beside the pip build (``--llama-vq``:
its compilers and flags, so ccache hits) or standalone from an exported patched tree.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def _pip_build_cache() -> dict[str, str]:
    """CMakeCache entries of this checkout's pip build dir (build/<wheel tag>), {} when there is none."""
    for cache in sorted((REPO / "build").glob("py3-*/CMakeCache.txt")):
        return dict(
            (k.split(":", 1)[0], v)
            for k, _, v in (ln.partition("=") for ln in cache.read_text().splitlines())
            if ":" in k
        )
    return {}


def cmd_build_llama_vq(args: argparse.Namespace) -> dict[str, Any]:
    """llama-server from our top-level CMake project: the same patched tree, flags and ccache base dir as
    the pip build, and a build dir at the same depth (build/server-bench), so its compiles hit ccache."""
    pip = _pip_build_cache()
    d = REPO / "build" / "server-bench"
    env = dict(os.environ)
    for var, key in (("CC", "CMAKE_C_COMPILER"), ("CXX", "CMAKE_CXX_COMPILER")):
        if pip.get(key):
            env[var] = pip[key]  # ccache keys on the compiler path: /usr/bin/cc is not /usr/bin/gcc
    cfg = ["cmake", "-S", str(REPO), "-B", str(d), "-DCMAKE_BUILD_TYPE=Release"]
    cfg += ["-DLLAMA_VQ_BUILD_TOOLS=ON"]  # llama.cpp adds tools/server only with its tools
    keys = ("LLAMA_VQ_BACKEND", "LLAMA_VQ_CPU_FEATURES", "SKBUILD_PROJECT_VERSION")
    cfg += [f"-D{k}={pip[k]}" for k in keys if pip.get(k)]
    cfg += [f"-DPython3_EXECUTABLE={sys.executable}", *shlex.split(args.cmake_args)]
    if shutil.which("ninja"):
        cfg += ["-G", "Ninja"]
    t0 = time.time()
    nice = ["nice", "-n", "5"] if shutil.which("nice") else []
    subprocess.run(cfg, check=True, env=env)
    subprocess.run([*nice, "cmake", "--build", str(d), "-j", str(args.jobs), "--target", "llama-server"], check=True)
    binary = d / "bin" / "llama-server"
    print(f"[build] {binary} in {time.time() - t0:.0f} s")
    return {"llama_server": str(binary), "build_s": time.time() - t0}


def cmd_build(args: argparse.Namespace) -> dict[str, Any]:
    if args.llama_vq:
        return cmd_build_llama_vq(args)
    d = args.dir.resolve()
    src = args.src.resolve() if args.src else d / "llama.cpp-patched"
    if not src.exists():
        subprocess.run([sys.executable, str(REPO / "tools" / "patches.py"), "export", str(src)], check=True)
    cfg = [
        "cmake",
        "-S",
        str(src),
        "-B",
        str(d / "build"),
        "-DCMAKE_BUILD_TYPE=Release",
        "-DGGML_NATIVE=OFF",
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_OPENSSL=OFF",
        "-DLLAMA_BUILD_SERVER=ON",
        "-DLLAMA_BUILD_UI=OFF",
        "-DLLAMA_USE_PREBUILT_UI=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        f"-DGGML_CCACHE={'ON' if shutil.which('ccache') else 'OFF'}",
        *shlex.split(args.cmake_args),
    ]
    if shutil.which("ninja"):
        cfg += ["-G", "Ninja"]
    if "LLAMA_BUILD_APP" in (src / "CMakeLists.txt").read_text(errors="replace"):
        cfg.append("-DLLAMA_BUILD_APP=OFF")  # its sources are not in the release tree we vendor
    if args.backend == "cpu":
        cfg += ["-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON"]
    else:
        cfg += ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90"]
    t0 = time.time()
    nice = ["nice", "-n", "10"] if shutil.which("nice") else []
    subprocess.run(cfg, check=True)
    subprocess.run(
        [*nice, "cmake", "--build", str(d / "build"), "-j", str(args.jobs), "--target", "llama-server"], check=True
    )
    binary = d / "build" / "bin" / "llama-server"
    print(f"[build] {binary} in {time.time() - t0:.0f} s")
    return {"llama_server": str(binary), "build_s": time.time() - t0}
