"""The CPU kernels' float64 reference tests on the other x86 SIMD level too.

The build compiles one SIMD level, the one /proc/cpuinfo reports (cmake/llama_vq_detect.cmake): CI machines of
our class are AVX2-only or AVX-512. What the quantized OUT_PROD kernels (llama-vq-out-prod.cpp) compile, per level:
* the tile path: the AVX2 nibble unpack of q4_0/q4_1/iq4_nl under __AVX2__ (both levels), and the tile update
  through ggml's GGML_F32 macros: 8 floats x 4 registers per step (GGML_F32_STEP 32) with AVX2, 16 x 4 (64)
  with AVX-512, the rest of a row scalar; without AVX2 (generic) loops the compiler vectorizes.
* prefill: llamafile_sgemm's F32 tinyBLAS, __m256 tiles needing n_kv % 8 == 0 with AVX2, __m512 tiles
  needing n_kv % 16 == 0 with AVX-512, so other cases fall back to the tile path at each level.
* decode, in registers: __AVX2__ && __FMA__ intrinsics at both levels (EVEX-encoded with AVX-512 flags).
The suite's own run covers the build's level; this test builds only
libggml-base + libggml-cpu at the other level (LLAMA_VQ_CPU_FEATURES, into build/simd-LEVEL, through ccache) and
runs tests/kernels/test_out_prod_reference.py against it in a fresh interpreter, where no other libggml is loaded.
A level this CPU cannot run is skipped with the reason (an AVX2-only machine cannot run AVX-512 code).

CPU time: the first build compiles ggml-cpu at that level (about 3 min on 2 cores with a cold cache); later runs
hit ccache and take seconds, plus a few seconds of tests.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from skip_support import skip_platform_limit

ROOT = Path(__file__).resolve().parents[2]
# /proc/cpuinfo flags each level needs (ggml's AVX512 option also turns on BW/VL/DQ/CD)
LEVEL_FLAGS = {
    "avx2": ["avx", "avx2", "fma", "f16c", "bmi2"],
    "avx512": ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"],
}
PROBE = """
import ctypes, sys
d = sys.argv[1]
ctypes.CDLL(d + "/libggml-base.so", mode=ctypes.RTLD_GLOBAL)
cpu = ctypes.CDLL(d + "/libggml-cpu.so", mode=ctypes.RTLD_GLOBAL)
print(cpu.ggml_cpu_has_avx2(), cpu.ggml_cpu_has_avx512())
"""


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    m = re.search(r"^flags\s*:(.*)$", text, re.M)
    return set(m.group(1).split()) if m else set()


def _build_level(level: str) -> Path:
    """libggml-base + libggml-cpu at ``level``; returns the directory holding both."""
    bdir = ROOT / "build" / f"simd-{level}"
    gen = ["-G", "Ninja"] if shutil.which("ninja") and not (bdir / "Makefile").exists() else []
    env = dict(os.environ, LLAMA_VQ_CPU_FEATURES=level)
    configure = [
        "cmake",
        "-S",
        str(ROOT),
        "-B",
        str(bdir),
        *gen,
        "-DCMAKE_BUILD_TYPE=Release",
        "-DLLAMA_VQ_BACKEND=cpu",
        f"-DLLAMA_VQ_CPU_FEATURES={level}",
        "-DLLAMA_VQ_BUILD_TOOLS=OFF",
        "-DLLAMA_VQ_INSTALL_INPLACE=OFF",
        f"-DPython3_EXECUTABLE={sys.executable}",
    ]
    for cmd in (configure, ["cmake", "--build", str(bdir), "--target", "ggml-cpu", "-j", str(os.cpu_count() or 2)]):
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
        assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    libs = {p.name: p for p in bdir.rglob("libggml-*.so")}
    assert {"libggml-base.so", "libggml-cpu.so"} <= set(libs), sorted(libs)
    assert libs["libggml-base.so"].parent == libs["libggml-cpu.so"].parent, libs
    return libs["libggml-cpu.so"].parent


def _main_level(build) -> str:
    if build.backend_dl:  # backends as modules (scripts/run.sh's set-up on a CPU): the level of the module it loaded
        return {"icelake": "avx512", "skylakex": "avx512", "haswell": "avx2"}.get(build.cpu_variant or "", "generic")
    feats = set(build.cpu_features)
    return "avx512" if "AVX512" in feats else "avx2" if "AVX2" in feats else "generic"


@pytest.mark.slow
@pytest.mark.parametrize("level", list(LEVEL_FLAGS))
def test_cpu_out_prod_reference_tests_pass_at_every_simd_level_this_cpu_runs(build, level):
    if not sys.platform.startswith("linux") or os.uname().machine not in ("x86_64", "AMD64"):
        skip_platform_limit("x86-64 Linux only: the SIMD levels are x86's")
    if _main_level(build) == level:
        skip_platform_limit(
            f"the suite's build is {level}: tests/kernels/test_out_prod_reference.py ran against it above"
        )
    missing = [f for f in LEVEL_FLAGS[level] if f not in _cpu_flags()]
    if missing:
        skip_platform_limit(f"this CPU cannot run {level} code (no {', '.join(missing)}); CI machines with it cover it")
    if not shutil.which("cmake"):
        pytest.skip("cmake is not installed")
    lib_dir = _build_level(level)

    # the library really is that level (ggml-cpu reports what it was compiled with)
    probe = subprocess.run([sys.executable, "-c", PROBE, str(lib_dir)], capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == (["1", "0"] if level == "avx2" else ["1", "1"]), probe.stdout

    # a fresh interpreter without conftest.py (which imports llama_vq and so loads the suite's own libggml)
    env = dict(os.environ, LLAMA_VQ_GGML_LIB_DIR=str(lib_dir))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "--noconftest",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            str(ROOT / "tests" / "kernels" / "test_out_prod_reference.py"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    tail = r.stdout[-4000:] + r.stderr[-2000:]
    print(f"\n[{level}] {tail.strip().splitlines()[-1] if tail.strip() else ''}")
    assert r.returncode == 0, tail
    assert re.search(r"\b\d+ passed\b", r.stdout) and "skipped" not in r.stdout, tail
