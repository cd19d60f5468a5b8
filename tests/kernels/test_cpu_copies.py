"""Quantized copies on the CPU backend (patch 0002-ggml-cpu-refuse-quantized-copies-it-cannot-do): it claims only
what its kernels do, and what it claims stays inside the destination.

Built by hand through ctypes on the built libggml (no model). CPU time: milliseconds.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from v_cache_support import GGML, GGML_TYPE_F16, GGML_TYPE_F32, QTYPES, cpu_supports_copy, random_blocks

GUARD = 0xA5


@pytest.fixture(scope="module")
def ggml(llama_vq) -> GGML:
    from llama_vq._cdll import LIB_DIR

    return GGML(LIB_DIR)


@pytest.mark.parametrize("name", list(QTYPES))
def test_cpu_backend_claims_only_the_quantized_copies_it_implements(ggml, name):
    # dequantizing rows to F32 is implemented (ggml_compute_forward_dup_from_q) ...
    assert cpu_supports_copy(ggml, name, GGML_TYPE_F32, transposed_src=False)
    # ... quantized to F16 and copies of a transposed quantized tensor are not: the backend must say so
    # instead of aborting (or reading out of bounds) at compute time
    assert not cpu_supports_copy(ggml, name, GGML_TYPE_F16, transposed_src=False)
    assert not cpu_supports_copy(ggml, name, GGML_TYPE_F32, transposed_src=True)
    assert not cpu_supports_copy(ggml, name, QTYPES[name][0], transposed_src=True)


@pytest.mark.parametrize("name", ["q4_0", "q8_0", "q5_1"])
def test_same_type_copy_of_a_permuted_quantized_view_into_another_shape_stays_in_the_destination(ggml, name):
    """q [128, 8, 4] permuted to [128, 4, 8] (not contiguous), copied into a contiguous q [128, 32].

    The destination is the first 32 rows of a larger tensor whose other rows, filled with a guard pattern, lie
    right after it: upstream's ggml_compute_forward_dup_bytes claims this copy and writes each row as 128 * block
    bytes (32x a row), far into the guard.
    """
    qtype, block = QTYPES[name]
    n_rows, row_bytes = 32, 128 // 32 * block
    guard_rows = 40 * n_rows  # more than the 32x overrun, so the old kernel wrote only into the guard
    rng = np.random.default_rng(2)
    src_raw = random_blocks(name, 128 // 32 * n_rows, rng)  # [4 * 32 blocks]: rows of 4 blocks
    ctx = ggml.context(16 << 20)
    backend = ggml.backend_cpu_init()
    try:
        src = ggml.new_tensor_3d(ctx, qtype, 128, 8, 4)
        ctypes.memmove(ggml.get_data(src), src_raw.ctypes.data, src_raw.nbytes)
        view = ggml.permute(ctx, src, 0, 2, 1, 3)  # [128, 4, 8]: element (i0, a, b) is src (i0, b, a)
        arena = ggml.new_tensor_2d(ctx, qtype, 128, n_rows + guard_rows)
        ctypes.memset(ggml.get_data(arena), GUARD, (n_rows + guard_rows) * row_bytes)
        dst = ggml.view_2d(ctx, arena, 128, n_rows, row_bytes, 0)
        op = ggml.cpy(ctx, view, dst)
        assert ggml.backend_supports_op(backend, op), "the CPU refuses a copy its kernel does exactly"
        gf = ggml.new_graph(ctx)
        ggml.build_forward_expand(gf, op)
        assert ggml.graph_compute_with_ctx(ctx, gf, 2) == 0
        out = (
            np.ctypeslib.as_array(
                (ctypes.c_uint8 * ((n_rows + guard_rows) * row_bytes)).from_address(ggml.get_data(arena))
            )
            .reshape(n_rows + guard_rows, row_bytes)
            .copy()
        )
    finally:
        ggml.backend_free(backend)
        ggml.free(ctx)
    overrun = int((out[n_rows:] != GUARD).any(axis=1).sum())
    assert overrun == 0, f"the copy wrote into {overrun} guard rows after the destination"
    # destination row a + 4 * b holds source row b + 8 * a (the permutation), byte for byte
    want = src_raw.reshape(4, 8, row_bytes).transpose(1, 0, 2).reshape(n_rows, row_bytes)
    np.testing.assert_array_equal(out[:n_rows], want)
