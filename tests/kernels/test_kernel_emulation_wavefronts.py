"""Our CUDA kernels other than the fused attention, run on the CPU at both warp widths, from the source the build
compiles: the short-row K*Q with and without the query rotation (mmvq-short.cu), the quantized OUT_PROD's vector
kernel and its combine, and its tensor-core kernel on the CUDA surface (out-prod-q.cu), the rotation fusions SET_ROWS
and CONT with K's rope folded in (fwht-fused.cu), and dequantize_x8_rows (dequantize-x8.cuh).

tests/fused_attn_emu/kernels_harness.cpp runs them on cuda_surface.h's threads: once on the CUDA surface (32-lane
warps) and once on gfx90a's as ggml's HIP build compiles it (-DGGML_USE_HIP: 64-lane wavefronts, the *_sync shuffles
mapped to HIP's, ggml_cuda_syncwarp() a no-op, 64 KiB of LDS). Shapes: 8B (head 128, GQA 4), SmolLM2 (head 64, GQA 3),
MiMo (K 192 / V 128 at GQA 8 and 16), d 32 to 1024, 1 to 64 columns, odd cache lengths, every quantized type the
kernel takes (q4_0, q4_1, q5_0, q5_1, q8_0, iq4_nl). Each case against float64 (tests/fused_attn_emu/job_*.h state
the references and the bounds: 1e-9 where the kernel's output is f32 of the same quantized data, the quantizer's own
error for the stores). AddressSanitizer and UBSan on. CPU: one g++ compile per surface (~70 s) and ~40 s of runs.
"""

from __future__ import annotations

import pytest
from kernel_emu_support import Build, build_all, kernels_parts, require_sources, run

pytestmark = pytest.mark.slow


SURFACES = ("cuda", "hip")


def emulation_builds(mktemp) -> list[Build]:
    """The harness for both surfaces (also for the background prebuild, tests/support/kernel_emu_support.py)."""
    tmp = mktemp("kernels")
    incs = kernels_parts(tmp)
    return [Build(tmp, "kernels_harness.cpp", s, incs) for s in SURFACES]


@pytest.fixture(scope="module")
def harnesses(tmp_path_factory):
    """The harness for both surfaces, compiled at once."""
    require_sources()
    return dict(zip(SURFACES, build_all(emulation_builds(tmp_path_factory.mktemp)), strict=True))


@pytest.fixture(params=["cuda", "hip"])
def harness(request, harnesses):
    return harnesses[request.param], request.param


def run_job(harness, job: str, min_cases: int) -> str:
    exe, surface = harness
    proc = run(exe, job)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert f"surface {surface}, warp {64 if surface == 'hip' else 32}: all passed" in proc.stdout
    assert proc.stdout.count("\nOK   ") + proc.stdout.startswith("OK   ") >= min_cases, proc.stdout
    return proc.stdout


def test_short_row_kq_with_and_without_query_rotation_matches_float64(harness):
    out = run_job(harness, "mmvq_short", 13)
    # 4 to 32 threads per row: groups inside a 32-lane warp, and both halves of a 64-lane wavefront
    assert all(f" tpr={n} " in out for n in (4, 8, 16, 32)), out


def test_quantized_out_prod_vector_kernel_and_combine_match_float64(harness):
    out = run_job(harness, "out_prod", 16)
    assert " chunks=1 " in out and " cols=64 " in out, out
    # the split's chunk softmax as the F16 GEMM path's f16 P (HIP's path; NVIDIA's with the F16 GEMM), both surfaces:
    # sinks on and off, no mask, a row masked whole
    assert out.count("OK   softmax_to_f16 ") == 4, out
    assert " mask=0 " in out and " sinks=1 " in out and " empty_row=1: zeros=1 " in out, out
    # the tensor-core kernel (k_out_prod_q_mma) on NVIDIA's surface only: one segment and several, partial column tiles
    # and its softmax form (the split's chunk: the raw scores, mask, scale and sinks taken in): sinks on and off,
    # several segments and one, a partial column tile, d_v 256 and two streams
    if harness[1] == "cuda":
        assert out.count("OK   out_prod_mma ") == 6, out
        assert " segments=1 " in out and " segments=3 " in out and " cols=144 " in out, out
        assert out.count("OK   out_prod_softmax ") == 4, out
        assert " sinks=0: " in out and " sinks=1: " in out, out
    else:
        assert "out_prod_mma" not in out and "out_prod_softmax" not in out, out


def test_rotation_fusions_and_rope_fold_match_float64(harness):
    out = run_job(harness, "fwht_fused", 15)
    assert out.count("fwht_set_rows") >= 9 and out.count("cont_fwht") >= 6, out
    assert " rope=1 neox" in out and " rope=1 n_dims" in out and " ext=1:" in out, out


def test_dequantize_x8_rows_match_the_block_layouts(harness):
    out = run_job(harness, "dequantize_x8", 12)
    assert " -> f16 " in out and " -> f32 " in out, out
