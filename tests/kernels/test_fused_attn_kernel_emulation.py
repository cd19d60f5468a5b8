"""The fused decode attention's CUDA kernels (attn-decode-fused.cu: k_attn_decode, k_attn_decode_combine; staged
tiles, int8 K*Q, two tile buffers and a parallel combine, the permuted and rotated output, host-planned staging, V*P
on tensor cores) run on the CPU, verbatim.

tests/fused_attn_emu/harness.cpp gives the kernels' source (attn-decode-fused.cu and the part files it includes,
attn-decode-vmma.cuh, attn-decode-stage.cuh, attn-decode-combine.cuh and dequantize-x8.cuh: the files the build
compiles, tests/support/kernel_sources.py), a CUDA surface made of fibers (tests/fused_attn_emu/fibers.h): a block's
128 threads each a fiber of its own, __syncthreads() a barrier, a warp shuffle an exchange between two barriers of
the warp's threads (so a shuffle that some lane of a warp does not reach is a deadlock, reported), shared memory a
buffer of exactly the launch's size filled with NaN
(AddressSanitizer catches any access past it, and any read of a slot nothing wrote reaches the output as NaN); on the
CUDA surface the tiles are staged by the kernels' cp.async code (NVIDIA's pipeline, one or two tile buffers) on an
emulation of cp.async whose copies land only when a wait covers their group (a tile read before its wait reads NaN,
or races under ThreadSanitizer), on the HIP surface by the plain-load path into one buffer. The tensor-core V*P's two
warp-wide matrix instructions (mma.sync m16n8k16 and ldmatrix .trans) are exchanges between two barriers of the
warp's 32 threads too, each lane's fragments laid out as the PTX ISA gives them, and its f16 arithmetic rounds each
result once (to nearest even). Each case (8B
shape, MiMo's K 192 at GQA 8/16, d 32 to 256, 1-64 columns, 1 to 16 tiles per split, several splits, 2 streams,
f16/f32 mask, sinks, rotated queries, 2- to 16-byte staging units, one or two buffers, the output as OUT_PROD leaves
it or permuted and contiguous, with V's inverse rotation of 64 or 128 or without; f32 or tensor-core V*P) is
compared with a float64 reference on the same quantized blocks, decoded independently of the kernel's dequantizer,
with the queries int8 per 32 values as the kernel's K*Q takes them (quantized in float32 the same way); NMSE below
1e-9 (f32 V*P) or 1e-6 (V and P in f16). The same cases run on the HIP surface too (gfx90a as ggml's HIP build
compiles it: 64-lane wavefronts, one tile buffer, the f32 V*P, 64 KiB of LDS: the one case past it is skipped as the
host refuses it). Not covered: anything that differs between this emulation and a GPU (cp.async landing sooner than
its wait, the tensor cores' own accumulation order, memory model beyond barriers), and the graph matching in
ggml-cuda.cu. CPU: one g++ compile
per surface (~40-60 s) and ~11 s (CUDA) / ~5 s (HIP) of runs; both compiles at once, then both runs at once.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from kernel_emu_support import (
    Build,
    build_all,
    cut,
    dequantize_x8_part,
    for_emulation,
    kernel_source,
    require_sources,
    run_all,
    write_part,
)


def kernel_part(tmp: Path, mutate: tuple[str, str, str] | None = None) -> dict[str, Path]:
    """The kernels' part of attn-decode-fused.cu (and the planning helpers the host code shares with the harness),
    shared memory pointed at the harness's; its #include of the part files resolves next to it. `mutate`: (file, a
    text of it, the text that replaces it, once)."""

    def source(name: str) -> str:
        text = kernel_source(name)
        if mutate and mutate[0] == name:
            assert text.count(mutate[1]) == 1, mutate[1]
            text = text.replace(mutate[1], mutate[2])
        return text

    kern = for_emulation(cut(source("attn-decode-fused.cu"), "#define AD_NT", "static bool attn_decode_type_supported"))
    combine = for_emulation(source("attn-decode-combine.cuh"))
    assert kern.count("g_smem") + combine.count("g_smem") == 2, "the kernels' two extern __shared__ declarations"
    write_part(tmp, "attn-decode-vmma.cuh", source("attn-decode-vmma.cuh"))
    write_part(tmp, "attn-decode-stage.cuh", source("attn-decode-stage.cuh"))
    write_part(tmp, "attn-decode-combine.cuh", combine)
    write_part(tmp, "attn-decode-tc.cuh", for_emulation(source("attn-decode-tc.cuh")))
    return {
        "KERNEL_INC": write_part(tmp, "kernel.inc", kern),
        "DEQ_INC": write_part(tmp, "deq.inc", dequantize_x8_part()),
    }


SURFACES = ("cuda", "hip")


def harness_builds(tmp: Path, sanitize: str) -> list[Build]:
    incs = kernel_part(tmp)
    return [Build(tmp, "harness.cpp", s, incs, sanitize=sanitize) for s in SURFACES]


# the two-buffer pipeline's wait one group short: a tile read while its copies are still in flight
EARLY_READ = ("attn-decode-stage.cuh", "    ad_cp_wait<1>();\n", "    ad_cp_wait<2>();\n")


def early_read_build(tmp: Path) -> Build:
    return Build(tmp, "harness.cpp", "cuda", kernel_part(tmp, EARLY_READ))


# k_attn_decode_tc without the warp barrier after its wait: each lane waits only for its own copies, so a lane reads
# rows its neighbours copied while theirs are still in flight
NO_WARP_WAIT = (
    "attn-decode-tc.cuh",
    "        __syncwarp(); // every lane's copies of the warp's rows have landed\n",
    "",
)


def no_warp_wait_build(tmp: Path) -> Build:
    return Build(tmp, "harness.cpp", "cuda", kernel_part(tmp, NO_WARP_WAIT))


def emulation_builds(mktemp) -> list[Build]:
    """This file's builds, for the background prebuild (tests/support/kernel_emu_support.py)."""
    return (
        harness_builds(mktemp("attn"), "address,undefined")
        + harness_builds(mktemp("attn-tsan"), "thread")
        + [early_read_build(mktemp("attn-early-read")), no_warp_wait_build(mktemp("attn-no-warp-wait"))]
    )


@pytest.fixture(scope="module")
def harness_runs(tmp_path_factory):
    """harness.cpp for both surfaces, compiled at once, then run at once: each surface's output."""
    require_sources()
    exes = build_all(harness_builds(tmp_path_factory.mktemp("attn"), "address,undefined"))
    return dict(zip(SURFACES, run_all(exes, timeout=3600, stall=600), strict=True))


@pytest.fixture(scope="module")
def thread_sanitizer_runs(tmp_path_factory):
    """harness.cpp for both surfaces under ThreadSanitizer, compiled at once, then run at once (the CUDA surface's
    run is the longer: ~60 s alone on this 2-core VM, the HIP one's ~30). A run with no new case line for 10 minutes
    is a hang."""
    require_sources()
    exes = build_all(harness_builds(tmp_path_factory.mktemp("attn-tsan"), "thread"))
    return dict(zip(SURFACES, run_all(exes, timeout=3600, stall=600), strict=True))


@pytest.fixture(scope="module")
def early_read_run(tmp_path_factory):
    """The CUDA surface's harness with EARLY_READ put into the kernels' source."""
    require_sources()
    exes = build_all([early_read_build(tmp_path_factory.mktemp("attn-early-read"))])
    return run_all(exes, timeout=1800, stall=600)[0]


@pytest.fixture(scope="module")
def no_warp_wait_run(tmp_path_factory):
    """The CUDA surface's harness with NO_WARP_WAIT put into the kernels' source."""
    require_sources()
    exes = build_all([no_warp_wait_build(tmp_path_factory.mktemp("attn-no-warp-wait"))])
    return run_all(exes, timeout=1800, stall=600)[0]


@pytest.mark.slow
def test_fused_attn_kernels_on_cpu_threads_match_float64(harness_runs):
    proc = harness_runs["cuda"]
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "all passed" in proc.stdout
    # the three forms ran: the f32 V*P (every shape), the tensor-core V*P (d_v 128), and both products on tensor
    # cores (k_attn_decode_tc: tiles of 16 columns, d 64/128/192, every K and V type)
    assert proc.stdout.count(" vmma=0 tc=0:") >= 20 and proc.stdout.count(" vmma=1 tc=0:") >= 10, proc.stdout
    assert proc.stdout.count(" tc=1:") >= 10, proc.stdout
    # the combine folded into the last block (few splits: attn_decode_fold_fits) in both forms, and the separate
    # combine where the splits are many; rows staged as 16-byte windows (K rows of 204 bytes) and in plain units
    assert proc.stdout.count(" tc=0: nsplit=") > proc.stdout.count(" tc=0: nsplit=1 "), proc.stdout
    assert len(re.findall(r" tc=0: nsplit=\d+ fold=1", proc.stdout)) >= 10, proc.stdout
    assert len(re.findall(r" tc=1: nsplit=\d+ fold=1", proc.stdout)) >= 5, proc.stdout
    assert len(re.findall(r" nsplit=(?!1 )\d+ fold=0", proc.stdout)) >= 3, proc.stdout
    assert proc.stdout.count(" windows=1/") >= 20 and proc.stdout.count(" windows=0/0") >= 2, proc.stdout


@pytest.mark.slow
def test_fused_attn_f32_vp_is_correct_at_wavefront_64(harness_runs):
    """The form LLAMA_VQ_CUDA_FUSED_ATTN=1 gives a gfx90a build: f32 V*P, one tile buffer, 64-lane wavefronts (the
    kernels' shuffles of width 4 and 32 run inside halves of a wavefront), every shape that fits 64 KiB of LDS."""
    proc = harness_runs["hip"]
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "all passed" in proc.stdout
    assert proc.stdout.count(" vmma=0 tc=0:") >= 20, proc.stdout
    assert " vmma=1" not in proc.stdout and " tc=1:" not in proc.stdout, "NVIDIA's tensor-core forms only"
    assert proc.stdout.count(" nbuf=1 ") == proc.stdout.count(" vmma=0 tc=0:"), "HIP has one tile buffer"
    assert proc.stdout.count(" fold=1 ") >= 10 and proc.stdout.count(" windows=1/") >= 10, proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("surface", ["hip", "cuda"])
def test_fused_attn_kernels_are_race_free_under_thread_sanitizer(thread_sanitizer_runs, surface):
    """Every case under ThreadSanitizer, at wavefront 64 (HIP) and warp 32 (CUDA, both V*P forms): no two threads
    touch a shared-memory cell without a barrier or a shuffle between them. The softmax phase once had the threads
    past the last column read the cells column nc-1's owners were rewriting (values discarded, a race all the same);
    they now read nothing."""
    proc = thread_sanitizer_runs[surface]
    print(proc.stdout[-2000:])
    assert "ThreadSanitizer" not in proc.stderr, proc.stderr[-6000:]
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "all passed" in proc.stdout


@pytest.mark.slow
def test_a_tile_read_before_its_cp_async_wait_fails(early_read_run):
    """The emulation of cp.async can fail: with the two-buffer pipeline's wait one group short, a tile is read while
    its copies are still queued, so the shared memory it reads holds NaN or the tile before, and the last tile's copies
    are never waited for: the cases of two tile buffers fail; those of one (cp.async.wait_all) still pass."""
    proc = early_read_run
    assert proc.returncode == 1 and "FAILED" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    fails = [line for line in lines if line.startswith("FAIL ")]
    oks = [line for line in lines if line.startswith("OK ")]
    assert len(fails) >= 10 and all(" nbuf=2 " in line for line in fails), proc.stdout
    assert oks and all(" nbuf=1 " in line for line in oks), proc.stdout
    # read early, not only left unwaited: the outputs are wrong (NaN: the shared memory's start), not just counted
    assert sum(1 for line in fails if line.endswith("nmse=nan")) >= len(fails) // 2, proc.stdout


@pytest.mark.slow
def test_a_warps_rows_read_before_every_lane_waited_fail(no_warp_wait_run):
    """k_attn_decode_tc stages each warp's cells by the warp's own lanes, with no block barrier between the tiles: the
    __syncwarp after the wait is all that makes the other lanes' copies visible. Without it the emulation fails the
    cases of that form (their reads find NaN or the tile before), and only them."""
    proc = no_warp_wait_run
    assert proc.returncode == 1 and "FAILED" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    fails = [line for line in lines if line.startswith("FAIL ")]
    assert len(fails) >= 10 and all(" tc=1:" in line for line in fails), proc.stdout
    assert not [line for line in lines if line.startswith("OK ") and " tc=1:" in line], proc.stdout
