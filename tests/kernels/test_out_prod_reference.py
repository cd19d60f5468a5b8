"""The CPU OUT_PROD kernel with a quantized src0 against a float64 reference.

This is the op the non-flash-attention path uses for a quantized V cache:
``kqv = ggml_out_prod(v, ggml_transpose(kq))`` with ``v`` a permuted view of a row-major cache
(``[d_v, n_kv, n_head_kv, n_stream]``) and ``kq`` the softmax output (``[n_kv, n_tokens, n_head, n_stream]``),
broadcast over the GQA groups. The graph is built through ctypes against the built libggml; the
reference decodes the quantized blocks with numpy (an independent reading of the block formats) and
sums in float64.

Tolerance: the kernel dequantizes to float32 and accumulates at most a few hundred float32 products
per output, so its normwise error against float64 is ~1e-7; 2e-5 leaves room for accumulation order
and catches any indexing, broadcast or tiling error (those are O(1)). CPU time: well under a second.
"""

from __future__ import annotations

import ctypes
import os
import sys
import zlib
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")

_SUFFIX = ".dylib" if sys.platform == "darwin" else ".so"

# ggml_type values (ggml.h)
TYPES = {"f32": 0, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20}
BLOCK_BYTES = {"q4_0": 18, "q4_1": 20, "q5_0": 22, "q5_1": 24, "q8_0": 34, "iq4_nl": 18}
KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float64)

REL_TOL = 2e-5


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def _lib_dir() -> Path:
    override = os.environ.get("LLAMA_VQ_GGML_LIB_DIR")
    if override:
        return Path(override)
    from llama_vq._cdll import LIB_DIR

    return LIB_DIR


@pytest.fixture(scope="module")
def ggml():
    lib_dir = _lib_dir()
    base_path = lib_dir / f"libggml-base{_SUFFIX}"
    cpu_path = lib_dir / f"libggml-cpu{_SUFFIX}"
    if not os.environ.get("LLAMA_VQ_GGML_LIB_DIR"):
        import llama_vq

        info = llama_vq.build_info()
        if info.cpu_variant:  # backends as modules (scripts/run.sh's set-up on a CPU): the CPU module it loaded
            cpu_path = lib_dir / f"libggml-cpu-{info.cpu_variant}{_SUFFIX}"
    if not base_path.exists() or not cpu_path.exists():
        pytest.skip(f"libggml-base/libggml-cpu not built in {lib_dir}")
    base = ctypes.CDLL(str(base_path), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(str(cpu_path), mode=ctypes.RTLD_GLOBAL)
    maps = Path("/proc/self/maps")
    if os.environ.get("LLAMA_VQ_GGML_LIB_DIR") and maps.exists():
        # with another libggml-cpu loaded, calls inside ggml-cpu could bind to its symbols instead
        loaded = {line.split()[-1] for line in maps.read_text().splitlines() if "libggml" in line}
        others = {p for p in loaded if Path(p).parent.resolve() != lib_dir.resolve()}
        assert not others, f"libggml from another build is loaded too: {sorted(others)}"

    p, i64, sz = ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t
    sigs = {
        "ggml_init": ([_InitParams], p),
        "ggml_free": ([p], None),
        "ggml_new_tensor_4d": ([p, ctypes.c_int, i64, i64, i64, i64], p),
        "ggml_view_4d": ([p, p, i64, i64, i64, i64, sz, sz, sz, sz], p),
        "ggml_permute": ([p, p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int], p),
        "ggml_transpose": ([p, p], p),
        "ggml_out_prod": ([p, p, p], p),
        "ggml_get_data": ([p], p),
        "ggml_nbytes": ([p], sz),
        "ggml_row_size": ([ctypes.c_int, i64], sz),
        "ggml_new_graph": ([p], p),
        "ggml_build_forward_expand": ([p, p], None),
        "ggml_quantize_chunk": ([ctypes.c_int, p, p, i64, i64, i64, p], sz),
    }
    for name, (args, res) in sigs.items():
        fn = getattr(base, name)
        fn.argtypes, fn.restype = args, res
    cpu.ggml_graph_compute_with_ctx.argtypes = [p, p, ctypes.c_int]
    cpu.ggml_graph_compute_with_ctx.restype = ctypes.c_int
    base.compute = cpu.ggml_graph_compute_with_ctx
    return base


def _f16(raw: np.ndarray) -> np.ndarray:
    return raw.copy().view(np.float16).astype(np.float64)


def _dequantize(type_name: str, data: bytes, n: int) -> np.ndarray:
    """Decode n values of a ggml block-quantized buffer (blocks of 32) into float64."""
    blocks = np.frombuffer(data, dtype=np.uint8).reshape(-1, BLOCK_BYTES[type_name])[: n // 32]
    d = _f16(blocks[:, 0:2]).reshape(-1, 1)
    if type_name == "q8_0":
        return (blocks[:, 2:34].view(np.int8).astype(np.float64) * d).reshape(-1)
    if type_name in ("q4_1", "q5_1"):
        m = _f16(blocks[:, 2:4]).reshape(-1, 1)
        off = 4
    else:
        m = None
        off = 2
    qh = None
    if type_name in ("q5_0", "q5_1"):
        qh = blocks[:, off : off + 4].copy().view(np.uint32).reshape(-1, 1).astype(np.int64)
        off += 4
    qs = blocks[:, off : off + 16].astype(np.int64)
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1)  # values 0..15 then 16..31
    if qh is not None:
        q = q | (((qh >> np.arange(32)) & 1) << 4)
    if type_name == "iq4_nl":
        return (KVALUES_IQ4NL[q] * d).reshape(-1)
    if m is not None:
        return (q * d + m).reshape(-1)
    return ((q - (16 if type_name == "q5_0" else 8)) * d).reshape(-1)


def _run_out_prod(ggml, type_name, d_v, n_kv, n_head_kv, gqa, n_tokens, n_stream, n_threads, seed, kq_pad=0):
    rng = np.random.default_rng(seed)
    t = TYPES[type_name]
    n_head = n_head_kv * gqa
    kv_size = n_kv + 3  # the graph reads a view of the first n_kv cells, like a KV cache

    row = ggml.ggml_row_size(t, d_v * n_head_kv)
    cache_bytes = row * kv_size * n_stream
    kq_bytes = 4 * n_kv * (n_tokens + kq_pad) * n_head * n_stream
    out_bytes = 4 * d_v * n_tokens * n_head * n_stream
    ctx = ggml.ggml_init(_InitParams(cache_bytes + kq_bytes + out_bytes + (16 << 20), None, False))
    assert ctx
    try:
        cache = ggml.ggml_new_tensor_4d(ctx, t, d_v * n_head_kv, kv_size, n_stream, 1)
        values = rng.standard_normal(d_v * n_head_kv * kv_size * n_stream).astype(np.float32)
        written = ggml.ggml_quantize_chunk(
            t, values.ctypes.data, ggml.ggml_get_data(cache), 0, kv_size * n_stream, d_v * n_head_kv, None
        )
        assert written == cache_bytes
        raw = ctypes.string_at(ggml.ggml_get_data(cache), cache_bytes)

        v = ggml.ggml_view_4d(
            ctx, cache, d_v, n_head_kv, n_kv, n_stream, ggml.ggml_row_size(t, d_v), row, row * kv_size, 0
        )
        v = ggml.ggml_permute(ctx, v, 0, 2, 1, 3)  # [d_v, n_kv, n_head_kv, n_stream]

        # kq_pad > 0: kq is a view of the first n_tokens of n_tokens + kq_pad rows, so its heads are not one
        # uniformly strided run of rows
        kq_all = ggml.ggml_new_tensor_4d(ctx, TYPES["f32"], n_kv, n_tokens + kq_pad, n_head, n_stream)
        p_all = rng.random((n_stream, n_head, n_tokens + kq_pad, n_kv), dtype=np.float32)
        ctypes.memmove(ggml.ggml_get_data(kq_all), p_all.ctypes.data, p_all.nbytes)
        p = p_all[:, :, :n_tokens]
        kq = ggml.ggml_view_4d(
            ctx,
            kq_all,
            n_kv,
            n_tokens,
            n_head,
            n_stream,
            4 * n_kv,
            4 * n_kv * (n_tokens + kq_pad),
            4 * n_kv * (n_tokens + kq_pad) * n_head,
            0,
        )

        out = ggml.ggml_out_prod(ctx, v, ggml.ggml_transpose(ctx, kq))
        assert ggml.ggml_nbytes(out) == out_bytes
        ctypes.memset(ggml.ggml_get_data(out), 0xFF, out_bytes)  # NaN: every element must be written

        gf = ggml.ggml_new_graph(ctx)
        ggml.ggml_build_forward_expand(gf, out)
        assert ggml.compute(ctx, gf, n_threads) == 0

        got = np.frombuffer(ctypes.string_at(ggml.ggml_get_data(out), out_bytes), dtype=np.float32)
        got = got.reshape(n_stream, n_head, n_tokens, d_v).astype(np.float64)
    finally:
        ggml.ggml_free(ctx)

    # reference: cache [n_stream, kv_size, n_head_kv, d_v] decoded, first n_kv cells
    vals = _dequantize(type_name, raw, d_v * n_head_kv * kv_size * n_stream)
    vals = vals.reshape(n_stream, kv_size, n_head_kv, d_v)[:, :n_kv]
    ref = np.empty_like(got)
    for s in range(n_stream):
        for h in range(n_head):
            ref[s, h] = p[s, h].astype(np.float64) @ vals[s, :, h // gqa, :]
    return got, ref


CASES = [
    # type, d_v, n_kv, n_head_kv, gqa, n_tokens, n_stream, n_threads
    ("q4_0", 64, 37, 3, 3, 1, 1, 2),  # SmolLM2 decode: 9 heads / 3 KV heads, head 64
    ("q4_0", 64, 70, 3, 3, 1, 1, 4),  # more threads than src0 matrices
    ("q4_0", 128, 100, 2, 4, 17, 2, 3),  # prefill, 2 streams, tile tail (100 % 32)
    ("q8_0", 128, 96, 2, 4, 1, 1, 2),
    ("q8_0", 64, 33, 1, 16, 5, 2, 3),  # GQA 16, one KV head
    ("q4_1", 64, 40, 2, 2, 3, 1, 2),
    ("q5_0", 64, 40, 2, 2, 3, 1, 2),
    ("q5_1", 64, 40, 2, 2, 3, 2, 2),
    ("iq4_nl", 128, 45, 2, 1, 2, 1, 2),  # no GQA
    ("q4_0", 256, 5, 2, 2, 64, 1, 1),  # fewer rows than one tile, one thread
    # decode: <= 4 dst columns per V matrix, q4_0 / q8_0 / iq4_nl go through the register kernel
    ("q8_0", 64, 50, 3, 1, 1, 1, 2),  # one column per V matrix
    ("q4_0", 128, 77, 2, 4, 1, 2, 3),  # Llama-3 8B's GQA 4, 2 streams, 3 threads
    ("iq4_nl", 192, 30, 1, 3, 1, 1, 7),  # 6 block columns, more threads than work items
    ("q4_0", 64, 40, 2, 2, 3, 1, 2),  # 6 columns: the tile path
    ("q8_0", 64, 40, 2, 8, 1, 1, 2),  # MiMo's GQA 8 at decode: the tile path
    # prefill: enough dst columns per V matrix (n_tokens*gqa) for the dequantize-then-sgemm path
    ("q4_0", 64, 256, 3, 3, 64, 1, 2),  # SmolLM2 heads
    ("q8_0", 64, 264, 3, 3, 40, 2, 2),  # 2 streams, n_kv a multiple of 8 but not of 16 (the transpose tile)
    ("q4_1", 128, 96, 2, 4, 33, 1, 1),  # one thread
    ("q5_0", 64, 32, 1, 16, 2, 2, 3),  # GQA 16, 32 columns from 2 tokens, 3 threads
    ("iq4_nl", 128, 200, 2, 1, 32, 1, 2),  # no GQA
    ("q5_1", 64, 100, 2, 2, 50, 1, 2),  # n_kv not a multiple of 8: llamafile_sgemm refuses, the tile path runs
    ("q4_0", 64, 4103, 1, 3, 12, 1, 2),  # long context, n_kv odd
]

# kq as a strided view (heads not one uniform run of rows): one sgemm per head instead of per KV head
PADDED_KQ_CASES = [
    # type, d_v, n_kv, n_head_kv, gqa, n_tokens, n_stream, n_threads, kq_pad
    ("q4_0", 64, 128, 3, 3, 40, 2, 2, 3),
    ("q8_0", 128, 64, 2, 2, 3, 1, 2, 1),  # decode-sized: the tile path with a strided kq
    ("q4_0", 64, 64, 3, 3, 1, 1, 2, 2),  # decode: the register kernel with a strided kq
]


@pytest.mark.parametrize("type_name,d_v,n_kv,n_head_kv,gqa,n_tokens,n_stream,n_threads", CASES)
def test_cpu_out_prod_of_quantized_v_matches_float64_reference(
    ggml, type_name, d_v, n_kv, n_head_kv, gqa, n_tokens, n_stream, n_threads
):
    got, ref = _run_out_prod(
        ggml,
        type_name,
        d_v,
        n_kv,
        n_head_kv,
        gqa,
        n_tokens,
        n_stream,
        n_threads,
        seed=zlib.crc32(repr((type_name, d_v, n_kv, gqa, n_tokens)).encode()),
    )
    assert np.isfinite(got).all(), "some outputs were not written"
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert err < REL_TOL, f"normwise relative error {err:.3g} >= {REL_TOL}"


@pytest.mark.parametrize("type_name,d_v,n_kv,n_head_kv,gqa,n_tokens,n_stream,n_threads,kq_pad", PADDED_KQ_CASES)
def test_cpu_out_prod_of_quantized_v_with_strided_kq_matches_float64_reference(
    ggml, type_name, d_v, n_kv, n_head_kv, gqa, n_tokens, n_stream, n_threads, kq_pad
):
    got, ref = _run_out_prod(
        ggml,
        type_name,
        d_v,
        n_kv,
        n_head_kv,
        gqa,
        n_tokens,
        n_stream,
        n_threads,
        seed=zlib.crc32(repr((type_name, d_v, n_kv, gqa, n_tokens, kq_pad)).encode()),
        kq_pad=kq_pad,
    )
    assert np.isfinite(got).all(), "some outputs were not written"
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert err < REL_TOL, f"normwise relative error {err:.3g} >= {REL_TOL}"
