"""The wavefront-64 emulation can fail: two bugs of the kind a 64-wide wavefront exposes, put back into the kernels'
source by a textual mutation, must fail on the HIP surface and pass on the CUDA one (so the failure is the width's).

1. A lane exchange in k_fwht_set_rows (fwht-fused.cu) ordered by a warp barrier instead of the block barrier: lanes
   quantize 32-value blocks that other lanes staged in shared memory, ordered only by ggml_cuda_syncwarp(), a no-op on
   HIP. Built with
   ThreadSanitizer: the unordered exchange is a data race between the wavefront's lanes whatever the threads' timing,
   so the report is deterministic. The unmutated kernel is race-free on the same surface (no false report from the
   emulation's own barriers), and the mutated one on the CUDA surface, where __syncwarp() orders the exchange.
2. A 32-bit ballot mask in mul_mat_vec_q_short (mmvq-short.cu): the lanes that write a row chosen by a ballot kept in
   an `unsigned`, as CUDA code ported to HIP unchanged would keep it. HIP's __ballot is 64 bits: the rows of the row
   groups in the wavefront's upper half are never written (their NaN reaches the NMSE check).
"""

from __future__ import annotations

import pytest
from kernel_emu_support import Build, build_all, kernels_parts, require_sources, run

pytestmark = pytest.mark.slow

FWHT_ONLY = ("-DEMU_JOBS=8",)
MMVQ_ONLY = ("-DEMU_JOBS=2",)

# the block barrier turned into a warp barrier (the early return of whole warps stays after it)
OLD_LANE_EXCHANGE = {
    "FWHT_INC": (
        "    __syncthreads();\n    if (g >= nseg) {\n        return;\n    }\n",
        "    ggml_cuda_syncwarp();\n    if (g >= nseg) {\n        return;\n    }\n",
    )
}

WRITE_BACK = "                if (lane == 0 && valid[c] && k < k1) {\n"


def ballot_32(surface: str) -> dict[str, tuple[str, str]]:
    pred = "lane == 0 && valid[c] && k < k1"
    call = f"__ballot({pred})" if surface == "hip" else f"__ballot_sync(0xffffffff, {pred})"
    new = (
        f"                const unsigned writers = {call};\n"
        "                if (((uint64_t) writers >> (threadIdx.x % ggml_cuda_get_physical_warp_size())) & 1) {\n"
    )
    return {"MMVQ_INC": (WRITE_BACK, new)}


VARIANTS = {  # name: (surface, mutation, jobs, sanitizer)
    "old-exchange-hip": ("hip", OLD_LANE_EXCHANGE, FWHT_ONLY, "thread"),
    "exchange-hip": ("hip", None, FWHT_ONLY, "thread"),
    "old-exchange-cuda": ("cuda", OLD_LANE_EXCHANGE, FWHT_ONLY, "thread"),
    "ballot-hip": ("hip", ballot_32("hip"), MMVQ_ONLY, "address,undefined"),
    "ballot-cuda": ("cuda", ballot_32("cuda"), MMVQ_ONLY, "address,undefined"),
}


def emulation_builds(mktemp) -> list[Build]:
    """Every variant's harness, in VARIANTS' order (tests/support/kernel_emu_support.py's background prebuild too)"""
    builds = []
    for name, (surface, mutate, jobs, sanitize) in VARIANTS.items():
        tmp = mktemp(name)
        builds.append(Build(tmp, "kernels_harness.cpp", surface, kernels_parts(tmp, mutate), jobs, sanitize))
    return builds


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    """Every variant's harness, compiled at once (one job each)."""
    require_sources()
    return dict(zip(VARIANTS, build_all(emulation_builds(tmp_path_factory.mktemp)), strict=True))


def test_syncwarp_only_lane_exchange_races_at_wavefront_64(variants):
    proc = run(variants["old-exchange-hip"], "fwht_fused")
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert "ThreadSanitizer: data race" in proc.stderr, proc.stderr[-3000:]
    assert "k_fwht_set_rows" in proc.stderr, proc.stderr[-3000:]


def test_block_barrier_lane_exchange_is_race_free_at_wavefront_64(variants):
    proc = run(variants["exchange-hip"], "fwht_fused")
    assert proc.returncode == 0 and "ThreadSanitizer" not in proc.stderr, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "all passed" in proc.stdout


def test_syncwarp_only_lane_exchange_is_race_free_at_warp_32(variants):
    proc = run(variants["old-exchange-cuda"], "fwht_fused")
    assert proc.returncode == 0 and "ThreadSanitizer" not in proc.stderr, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "all passed" in proc.stdout


@pytest.mark.parametrize("surface", ["cuda", "hip"])
def test_32_bit_ballot_mask_fails_only_at_wavefront_64(variants, surface):
    # 4 of the job's cases: 16, 8, 32 and 4 threads per row
    proc = run(variants[f"ballot-{surface}"], "mmvq_short", "1,4,9,12")
    print(proc.stdout)
    if surface == "cuda":
        assert proc.returncode == 0 and "all passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    else:
        assert proc.returncode == 1 and "FAILED" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
        # each has rows in the row groups of a wavefront's upper half
        assert proc.stdout.count("FAIL mmvq_short") == 4, proc.stdout
    assert proc.stdout.count(" mmvq_short ") == 4, proc.stdout
