"""Patch 0023's CUDA kernels (k_attn_decode, k_attn_decode_combine; 0032's staged tiles, 0034's int8 K*Q, 0036's two
tile buffers and parallel combine, 0037's permuted and rotated output, 0038's host-planned staging, 0040's V*P on
tensor cores) run on the CPU, verbatim.

tests/fused_attn_emu/harness.cpp gives the kernels' source (attn-decode-fused.cu as the series leaves it: 0023
creates it, later patches change it; cut out of those patches' diffs with `git apply`; with it the part file it
includes, attn-decode-vmma.cuh, 0042), a CUDA surface made of
std::threads: a block's 128 threads run concurrently, __syncthreads() is a barrier, a warp shuffle an exchange between
two barriers of the warp's 32 threads (so a shuffle that some lane of a warp does not reach deadlocks: the timeout
catches it), shared memory a buffer of exactly the launch's size filled with NaN (AddressSanitizer catches any access
past it, and any read of a slot nothing wrote reaches the output as NaN); without cp.async, the tiles are staged by the
kernels' plain-load path (HIP's), into one tile buffer or, with AD_TWO_BUFFERS (the code NVIDIA's cp.async pipeline
runs), into two. 0040's two warp-wide matrix instructions (mma.sync m16n8k16 and ldmatrix .trans) are exchanges between
two barriers of the warp's 32 threads too, each lane's fragments laid out as the PTX ISA gives them, and its f16
arithmetic rounds each result once (to nearest even). Each case (8B shape, MiMo's K 192 at GQA 8/16, d 32 to 256,
1-64 columns, 1 to 16 tiles per split, several splits, 2 streams, f16/f32 mask, sinks, rotated queries, 2- to 16-byte
staging units, one or two buffers, the output as OUT_PROD leaves it or permuted and contiguous, with V's inverse
rotation of 64 or 128 or without; f32 or tensor-core V*P) is compared with a float64 reference on the same quantized
blocks, decoded independently of the kernel's dequantizer, with the queries int8 per 32 values as the kernel's K*Q
takes them (quantized in float32 the same way); NMSE below 1e-9 (f32 V*P) or 1e-6 (V and P in f16). Not covered:
anything that differs between this emulation and a GPU (cp.async, the tensor cores' own accumulation order, memory
model beyond barriers, 64-wide wavefronts, the real dequantize_x8 header), and the graph matching in ggml-cuda.cu.
CPU: one g++ compile (~60 s) and ~3 min of runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATCHES = ROOT / "patches"
HARNESS = ROOT / "tests" / "fused_attn_emu" / "harness.cpp"
FILE = "ggml/src/ggml-cuda/attn-decode-fused.cu"
# the tensor-core V*P's part of it (0040), which FILE includes inside the kernels' part
PART = "ggml/src/ggml-cuda/attn-decode-vmma.cuh"


def patched_file(tmp: Path, file: str = FILE, first: str = "0023-") -> str:
    """`file` as the series leaves it: every patch's hunks for that file, applied in series order (the first such
    patch is `first`)."""
    tree = tmp / ("tree-" + Path(file).name)
    tree.mkdir()
    names = [n.strip() for n in (PATCHES / "series").read_text().splitlines() if n.strip() and not n.startswith("#")]
    used = []
    for name in names:
        if f"+++ b/{file}" not in (PATCHES / name).read_text():
            continue
        # GIT_DIR points nowhere so that git apply never looks at an enclosing repository
        env = dict(os.environ, GIT_DIR=str(tree / ".no-git"), GIT_CEILING_DIRECTORIES=str(tmp))
        proc = subprocess.run(["git", "apply", "-p1", f"--include={file}", str(PATCHES / name)], cwd=tree, env=env,
                              capture_output=True, text=True)
        assert proc.returncode == 0, f"{name}: {proc.stderr}"
        used.append(name)
    assert used and used[0].startswith(first), used
    return (tree / file).read_text()


def kernel_source(tmp: Path) -> str:
    """The kernels' part of attn-decode-fused.cu (and the planning helpers the host code shares with the harness),
    shared memory pointed at the harness's."""
    text = patched_file(tmp)
    begin = text.index("#define AD_NT")
    end = text.index("static bool attn_decode_type_supported")
    kern = text[begin:end]
    for decl, repl in (("extern __shared__ int64_t ad_smem[];", "int64_t * ad_smem = g_smem;"),
                       ("extern __shared__ float w_sh[];", "float * w_sh = (float *) g_smem;")):
        assert kern.count(decl) == 1, decl
        kern = kern.replace(decl, repl)
    return kern


def test_fused_attn_kernels_on_cpu_threads_match_float64(tmp_path):
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    if shutil.which("git") is None:
        pytest.skip("no git (the series' hunks are applied with git apply)")
    inc = tmp_path / "kernel.inc"
    inc.write_text(kernel_source(tmp_path))
    # kernel.inc's #include of the part resolves next to it
    (tmp_path / Path(PART).name).write_text(patched_file(tmp_path, PART, "0042-"))
    exe = tmp_path / "harness"
    cmd = [cxx, "-std=c++20", "-O1", "-g", "-pthread", "-fsanitize=address,undefined",
           "-fno-sanitize-recover=undefined", f'-DKERNEL_INC="{inc}"', str(HARNESS), "-o", str(exe)]
    proc = subprocess.run(["nice", "-n", "5", *cmd], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")
    run = subprocess.run(["nice", "-n", "5", str(exe)], capture_output=True, text=True, timeout=600, env=env)
    print(run.stdout)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "all passed" in run.stdout
    # both V*P forms ran: the f32 one (every shape) and 0040's tensor-core one (d_v 128)
    assert run.stdout.count(" vmma=0:") >= 20 and run.stdout.count(" vmma=1:") >= 10, run.stdout
