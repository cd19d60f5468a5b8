"""Build llama.cpp's llama-server from the same patched tree as llama-vq, for benchmarks/serve_bench.py's
side-by-side runs (``serve_bench.py build``): through our CMake project beside the pip build (``--llama-vq``:
tools/llama_server.py, its compilers and flags, so ccache hits) or standalone from an exported patched tree.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def cmd_build(args: argparse.Namespace) -> dict[str, Any]:
    if args.llama_vq:
        sys.path.insert(0, str(REPO / "tools"))
        import llama_server  # noqa: PLC0415  (tools/llama_server.py: also the tests' llama-server)

        return llama_server.build(args.jobs, args.cmake_args)
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
