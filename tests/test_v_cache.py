"""The V patch: a quantized V cache with flash attention off, on the CPU.

What is checked, against what:
* every quantized V type (and K in those plus f16) loads and generates with flash_attn=False;
* fidelity: the next-token distributions of FA off + quantized V against FA on + the same quantized V
  (same quantizer, same cache contents: only the attention arithmetic differs), compared with the
  existing noise floor, FA off against FA on with f16 V; on SmolLM2 and on a MiMo-shaped synthetic
  model (SWA + full layers, sinks, K 192 / V 128) with a prompt long enough that the SWA cache wraps;
* KV state save/load with the new row-major quantized V, across FA on/off, and refusals;
* the CPU kernels of the new path against a float64 numpy reference;
* llama.cpp's own test-save-load-state with -fa off -ctk q8_0 -ctv q8_0 when the tool was built.

CPU time: the whole module took 4.3 min wall (2.1 min of CPU) with LLAMA_VQ_TEST_THREADS=1 on a 2-core machine
shared with other builds; most of it is the fidelity and state runs on SmolLM2.
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from v_cache_support import (
    GGML,
    GGML_TYPE_F16,
    GGML_TYPE_F32,
    QTYPES,
    compare,
    cpu_supports_copy,
    eval_logits,
    greedy,
    long_text,
    run_v_path,
)

ROOT = Path(__file__).resolve().parent.parent
V_TYPES = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl"]
K_TYPES = ["f16", *V_TYPES]
# CI has 2 cores; on a machine shared with other jobs, 1 thread avoids ggml's spinning threads stalling
N_THREADS = int(os.environ.get("LLAMA_VQ_TEST_THREADS", "2"))


def make(llama_vq, path, *, type_k="f16", type_v="f16", flash_attn=False, **kw):
    kw.setdefault("n_ctx", 1024)
    kw.setdefault("n_threads", N_THREADS)
    kw.setdefault("n_threads_batch", N_THREADS)
    kw.setdefault("seed", 1234)
    return llama_vq.Llama(str(path), type_k=type_k, type_v=type_v, flash_attn=flash_attn, verbose=False, **kw)


@pytest.fixture(scope="module")
def mimo_path(tmp_path_factory, smollm2_path) -> Path:
    """A MiMo-shaped model (arch mimo2, tiny preset: SWA window 32 + full layers, sinks on SWA layers,
    K/Q head 192, V head 128, 2 KV heads on full layers and 4 on SWA layers), random weights."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import synth_models
    finally:
        sys.path.remove(str(ROOT / "tools"))
    path = tmp_path_factory.mktemp("mimo") / "mimo-tiny.gguf"
    return synth_models.write_mimo_like(path, preset="tiny", tokenizer_from=smollm2_path, seed=7)


@pytest.fixture(scope="module")
def ggml(llama_vq) -> GGML:
    from llama_vq._binding import LIB_DIR

    return GGML(LIB_DIR)


# ----------------------------------------------------------------------------
# loads and generates


@pytest.mark.parametrize("type_v", V_TYPES)
@pytest.mark.parametrize("type_k", K_TYPES)
def test_quantized_v_without_flash_attn_loads_and_generates(llama_vq, smollm2_path, type_k, type_v):
    llm = make(llama_vq, smollm2_path, type_k=type_k, type_v=type_v, n_ctx=256)
    assert llm.flash_attn is False
    info = llm.kv_cache_info()
    assert (info.type_k, info.type_v) == (type_k, type_v)
    prompt = llm.tokenize(b"The capital of France is")
    out = greedy(llm, prompt, 4)
    assert len(out) == 4 and all(0 <= t < llm.n_vocab() for t in out)


def test_q4_0_v_cache_takes_4_5_16ths_of_f16(llama_vq, smollm2_path):
    # q4_0 stores 32 values in 18 bytes (4.5 bits each) against f16's 64 bytes: ratio 4.5/16 exactly
    f16 = make(llama_vq, smollm2_path, type_v="f16", n_ctx=512).kv_cache_info()
    q40 = make(llama_vq, smollm2_path, type_v="q4_0", n_ctx=512).kv_cache_info()
    assert q40.n_cells == f16.n_cells
    assert q40.k_bytes == f16.k_bytes
    assert q40.v_bytes * 16 == f16.v_bytes * 4.5


# ----------------------------------------------------------------------------
# fidelity: FA off vs FA on on the same quantized cache, against the f16 noise floor
#
# "The same quantized cache" literally: the prompt is evaluated once (FA on), its KV state is loaded into a
# FA-on and a FA-off context of the same cache types, and both then decode the same probe tokens one at a
# time (each probe truncates the cache to its position and decodes that token), so every probe attends to
# identical quantized K/V cells; only the attention arithmetic differs (and the probe token's own K/V).
# Two independent full runs would not share a cache: their upper-layer K/V differ by FA on/off rounding,
# and 4-bit quantization turns some of those tiny differences into whole quantization steps.
#
# The floor is the existing one: FA off against FA on with f16 K/V, two full runs of the prompt.
# Tolerances. Both comparisons are rounding noise of the same attention: the non-FA path rounds the softmax
# probabilities and the dequantized V to f16; the CPU FA kernel uses f16 Q for an f16 K and accumulates an f16
# V in f16. SmolLM2 is very sensitive to this: even f32 K/V give KL ~4e-3 between FA off and on. Measured here
# (32 probes, CPU): SmolLM2 KL 2.6e-3..3.9e-3 (floor 3.9e-3); MiMo-shaped with f16 K 4e-6..2e-5 except q5_0
# 5e-4 (one probe at 1.6e-2), with q4_0 / q8_0 K 2.5e-4 / 1.7e-4 (floor 1.3e-4); top-1 >= 0.875. A wrong V
# layout or head mapping scrambles the attention output, which we expect at KL of order 0.1-1 nats. So:
# * every case: mean KL <= 0.01 nats and top-1 agreement >= 0.85 (one flip among 32 probes is 3 points);
# * q8_0 V with f16 K (the criterion, met with margin): mean KL within the f16 floor (+1e-6 nats).
#   Coarser types can exceed the floor when the probe token's own K/V, computed from FA-on vs FA-off hidden
#   states that differ by rounding, land on different quantization steps.
# Perplexity over 32 probes is too noisy for the 0.3%; llama-perplexity's KL mode measures it over
# thousands of tokens (see the report); here it is only printed.

FIDELITY_CASES = (
    [("smollm2", "f16", t) for t in ("q4_0", "q8_0", "iq4_nl")] + [("smollm2", "q8_0", "q8_0")]
    + [("mimo", "f16", t) for t in V_TYPES] + [("mimo", "q4_0", "q4_0"), ("mimo", "q8_0", "q8_0")]
)
_floors: dict[str, object] = {}


def _model_setup(name, request):
    if name == "smollm2":
        return request.getfixturevalue("smollm2_path"), {"n_batch": 128, "n_ubatch": 128}
    # n_ubatch 64: the SWA cache holds GGML_PAD(32 + 64, 256) = 256 cells, fewer than the prompt
    return request.getfixturevalue("mimo_path"), {"n_batch": 64, "n_ubatch": 64, "swa_full": False}


def _tokens(llama_vq, path) -> list[int]:
    llm = make(llama_vq, path, n_ctx=1024, vocab_only=True)
    toks = llm.tokenize(long_text().encode())
    assert 300 < len(toks) < 1000, len(toks)  # more than the 256-cell SWA cache of the mimo setup
    return toks


def _floor(llama_vq, name, path, kw, tokens):
    if name not in _floors:
        off = eval_logits(make(llama_vq, path, flash_attn=False, logits_all=True, **kw), tokens)
        on = eval_logits(make(llama_vq, path, flash_attn=True, logits_all=True, **kw), tokens)
        _floors[name] = compare(off, on, tokens)
        print(f"\n[{name}] floor f16 K/V, FA off vs on (full runs): {_floors[name]}")
    return _floors[name]


def _probe_logits(llm, tokens, positions) -> np.ndarray:
    import llama_cpp

    rows = []
    for q in positions:  # descending: each probe drops the cells at and after q, then decodes token q
        llm.n_tokens = q
        llm.eval([tokens[q]])
        row = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        rows.append(np.ctypeslib.as_array(row, shape=(llm.n_vocab(),)).astype(np.float64))
    return np.array(rows)


@pytest.mark.parametrize("model,type_k,type_v", FIDELITY_CASES)
def test_quantized_v_without_flash_attn_matches_flash_attn_logits(llama_vq, request, model, type_k, type_v):
    path, kw = _model_setup(model, request)
    tokens = _tokens(llama_vq, path)
    floor = _floor(llama_vq, model, path, kw, tokens)

    # truncating the cache to a probe position needs the probe's whole window in the cache: keep the SWA cache
    # full-size here (the window is still applied by the mask; the ring-buffer wrap is covered by the floor
    # runs and the KV state tests)
    kw = dict(kw, swa_full=True) if "swa_full" in kw else kw
    src = make(llama_vq, path, type_k=type_k, type_v=type_v, flash_attn=True, **kw)
    src.eval(tokens)
    state = src.save_state()
    del src

    positions = list(range(len(tokens) - 2, len(tokens) - 2 - 6 * 32, -6))  # 32 probes, newest first
    logits = {}
    for fa in (True, False):
        llm = make(llama_vq, path, type_k=type_k, type_v=type_v, flash_attn=fa, **kw)
        assert llm.flash_attn is fa
        llm.load_state(state)
        logits[fa] = _probe_logits(llm, tokens, positions)
    nxt = [tokens[q + 1] for q in positions]
    got = compare(logits[False], logits[True], [0, *nxt])  # compare() scores row i against tokens[i + 1]
    print(f"\n[{model}] K {type_k} V {type_v}, FA off vs on, shared cache: {got}   (floor: {floor})")

    assert got.kl_mean <= 0.01
    assert got.top1 >= 0.85
    if (type_k, type_v) == ("f16", "q8_0"):
        assert got.kl_mean <= floor.kl_mean + 1e-6


# ----------------------------------------------------------------------------
# KV state


def _split(llama_vq, path):
    tokens = _tokens(llama_vq, path)[:200]
    return tokens[:-1], tokens[-1:]


@pytest.mark.parametrize("model", ["smollm2", "mimo"])
@pytest.mark.parametrize("type_kv", ["q8_0", "q4_0"])
def test_state_saved_with_quantized_v_without_flash_attn_continues_identically(llama_vq, request, model, type_kv):
    path, kw = _model_setup(model, request)
    head, last = _split(llama_vq, path)
    n_gen = 12

    # uninterrupted: the same two evaluations (head, then last), so the arithmetic is the same
    ref = make(llama_vq, path, type_k=type_kv, type_v=type_kv, **kw)
    ref.eval(head)
    expected = greedy(ref, last, n_gen)

    src = make(llama_vq, path, type_k=type_kv, type_v=type_kv, **kw)
    src.eval(head)
    state = src.save_state()
    del src

    dst = make(llama_vq, path, type_k=type_kv, type_v=type_kv, **kw)
    dst.load_state(state)
    assert greedy(dst, last, n_gen) == expected


def test_state_saved_with_flash_attn_loads_into_context_without_it(llama_vq, smollm2_path):
    """FA on and FA off now store a quantized V the same way (row-major), so the state carries over; the
    continuation is then computed without FA. It must agree with a FA-off run from scratch to within the
    FA on/off noise (bounds as in the fidelity test)."""
    kw = {"n_batch": 128, "n_ubatch": 128}
    tokens = _tokens(llama_vq, smollm2_path)
    head, tail = tokens[:300], tokens[300:360]
    floor = _floor(llama_vq, "smollm2", smollm2_path, kw, tokens)

    src = make(llama_vq, smollm2_path, type_k="q8_0", type_v="q8_0", flash_attn=True, logits_all=True, **kw)
    src.eval(head)
    state = src.save_state()
    del src

    dst = make(llama_vq, smollm2_path, type_k="q8_0", type_v="q8_0", flash_attn=False, logits_all=True, **kw)
    dst.load_state(state)
    dst.eval(tail)
    got = np.array(dst.scores[len(head):len(head) + len(tail)], dtype=np.float64)

    ref = make(llama_vq, smollm2_path, type_k="q8_0", type_v="q8_0", flash_attn=False, logits_all=True, **kw)
    want = eval_logits(ref, head + tail)[len(head):]

    agree = compare(want, got, tail)
    print(f"\nFA-on state continued without FA vs FA off from scratch: {agree}   (floor: {floor})")
    assert agree.kl_mean <= 2 * floor.kl_mean + 1e-6
    assert agree.top1 >= floor.top1 - 0.02  # 60 positions: one flip is 1.7 points


@pytest.mark.parametrize("saved,loaded,reason", [
    # f16 V without FA is stored transposed, q8_0 V row-major: a layout mismatch
    (dict(type_v="f16", flash_attn=False), dict(type_v="q8_0", flash_attn=False), "V cache layout"),
    # both row-major (f16 with FA, q8_0 without): the element type differs
    (dict(type_v="f16", flash_attn=True), dict(type_v="q8_0", flash_attn=False), "mismatched value type"),
    # K type differs
    (dict(type_k="q8_0", type_v="q8_0"), dict(type_k="q4_0", type_v="q8_0"), "mismatched key type"),
])
def test_state_with_other_layout_or_cache_type_is_refused_with_clear_error(llama_vq, smollm2_path, saved, loaded,
                                                                           reason):
    from llama_vq import _logs

    tokens = _tokens(llama_vq, smollm2_path)[:40]
    src = make(llama_vq, smollm2_path, n_ctx=256, **saved)
    src.eval(tokens)
    state = src.save_state()
    dst = make(llama_vq, smollm2_path, n_ctx=256, **loaded)
    with _logs.Capture() as cap, pytest.raises(RuntimeError, match="Failed to set llama state data"):
        dst.load_state(state)
    assert reason in cap.text(), cap.text()


# ----------------------------------------------------------------------------
# multiple sequences in separate streams (llama_context_params.n_seq_max = 2, kv_unified = false)


def test_two_streams_match_one_stream_with_quantized_v_without_flash_attn(llama_vq, smollm2_path):
    """Two prompts decoded in one batch, each in its own KV stream (dim 3 of the V views), give the
    logits each prompt gets alone: the dequantized V of one stream never leaks into the other."""
    import llama_cpp

    llm = make(llama_vq, smollm2_path, type_k="q4_0", type_v="q4_0", n_ctx=256)
    model = llm._model.model
    n_vocab = llm.n_vocab()
    prompts = [llm.tokenize(long_text(1).encode())[:60], llm.tokenize(long_text(3).encode())[-45:]]

    def run(seqs: list[list[int]], n_seq_max: int) -> list[np.ndarray]:
        p = llama_cpp.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = 256 * n_seq_max, 256, 256, n_seq_max
        p.kv_unified = False
        p.type_k = p.type_v = QTYPES["q4_0"][0]
        p.flash_attn_type = 0
        p.n_threads = p.n_threads_batch = N_THREADS
        ctx = llama_cpp.llama_init_from_model(model, p)
        assert ctx, "context creation failed"
        try:
            n = sum(len(s) for s in seqs)
            batch = llama_cpp.llama_batch_init(n, 0, n_seq_max)
            i = 0
            for sid, seq in enumerate(seqs):
                for pos, tok in enumerate(seq):
                    batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
                    batch.seq_id[i][0], batch.logits[i] = sid, True
                    i += 1
            batch.n_tokens = n
            assert llama_cpp.llama_decode(ctx, batch) == 0
            out, i = [], 0
            for seq in seqs:
                rows = [np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i + j), shape=(n_vocab,)).copy()
                        for j in range(len(seq))]
                out.append(np.array(rows, dtype=np.float64))
                i += len(seq)
            llama_cpp.llama_batch_free(batch)
            return out
        finally:
            llama_cpp.llama_free(ctx)

    both = run(prompts, 2)
    for k, seq in enumerate(prompts):
        alone = run([seq], 1)[0]
        agree = compare(alone, both[k], seq)
        # same cache contents and arithmetic, only the batch composition differs: rounding-level agreement
        assert agree.kl_max < 1e-4, agree
        assert agree.top1 == 1.0, agree


# ----------------------------------------------------------------------------
# CPU kernels of the new path against float64


@pytest.mark.parametrize("name", list(QTYPES))
@pytest.mark.parametrize("hsv,nh_kv,nr2,kv,kv_size,nb,n_stream", [
    (64, 2, 1, 113, 256, 1, 1),
    (128, 2, 4, 113, 256, 3, 2),
    (128, 1, 16, 96, 128, 5, 1),   # MQA, 16 query heads per KV head
    (128, 4, 2, 64, 64, 7, 2),     # MiMo-like V head 128, cache full
])
def test_cpu_kernels_of_quantized_v_path_match_float64_reference(ggml, name, hsv, nh_kv, nr2, kv, kv_size, nb,
                                                                  n_stream):
    r = run_v_path(ggml, name, hsv, nh_kv, nr2, kv, kv_size, nb, n_stream)
    ref_v = r.ref_v.transpose(0, 2, 1, 3)  # [n_stream, nh_kv, kv, hsv]

    # dequantization (CPY q -> F32 from a permuted view of the cache): d*q (+m) in float32, so within one
    # float32 rounding of the float64 value
    np.testing.assert_allclose(r.v_f32, ref_v, rtol=2 ** -23, atol=1e-12)
    # transposed copy into F16: exactly numpy's round-to-nearest-even of the F32 values
    np.testing.assert_array_equal(r.v_f16, r.v_f32.transpose(0, 1, 3, 2).astype(np.float16))

    # kq*v with GQA broadcast (query head h reads KV head h // nr2): the CPU rounds kq to f16 (the F16
    # matrix's vec_dot type) and sums in float32. Against float64 on the same f16 inputs the error is
    # float32 summation only: bound it by 1e-5 of sum |kq||v| (kv <= 113 terms, 2^-24 each, plus margin).
    v16 = r.v_f16.astype(np.float64)  # [n_stream, nh_kv, hsv, kv]
    kq16 = r.kq.astype(np.float16).astype(np.float64)  # [n_stream, nh, nb, kv]
    heads = np.arange(nh_kv * nr2) // nr2
    want = np.einsum("shtk,shdk->shtd", kq16, v16[:, heads])
    scale = np.einsum("shtk,shdk->shtd", np.abs(kq16), np.abs(v16[:, heads]))
    assert np.all(np.abs(r.out - want) <= 1e-5 * scale + 1e-30)
    # and against the exact float64 product (V and kq unrounded): within the two f16 roundings (2^-11 each)
    exact = np.einsum("shtk,shkd->shtd", r.kq.astype(np.float64), ref_v[:, heads])
    assert np.all(np.abs(r.out - exact) <= 2 * 2 ** -11 * scale * (1 + 1e-3) + 1e-30)


@pytest.mark.parametrize("name", list(QTYPES))
def test_cpu_backend_claims_only_the_quantized_copies_it_implements(ggml, name):
    # dequantizing rows to F32 is implemented (ggml_compute_forward_dup_from_q) ...
    assert cpu_supports_copy(ggml, name, GGML_TYPE_F32, transposed_src=False)
    # ... quantized to F16 and copies of a transposed quantized tensor are not: the backend must say so
    # instead of aborting (or reading out of bounds) at compute time
    assert not cpu_supports_copy(ggml, name, GGML_TYPE_F16, transposed_src=False)
    assert not cpu_supports_copy(ggml, name, GGML_TYPE_F32, transposed_src=True)
    assert not cpu_supports_copy(ggml, name, QTYPES[name][0], transposed_src=True)


# ----------------------------------------------------------------------------
# llama.cpp's own state test


def _tool_results(out: str) -> dict[int, str]:
    """test-save-load-state's per-test outcome: '=== Test N: name ===' then PASS or an error line."""
    res: dict[int, str] = {}
    cur = None
    for line in out.splitlines():
        m = re.search(r"=== Test (\d+): ", line)
        if m:
            cur = int(m.group(1))
            res[cur] = "ran"
        elif cur is not None and "PASS" in line:
            res[cur] = "PASS"
        elif cur is not None and (" error" in line or "FAIL" in line) and res.get(cur) != "PASS":
            res[cur] = "FAIL"
    return res


def test_llama_cpp_save_load_state_tool_with_quantized_v_without_flash_attn(llama_vq, smollm2_path, tmp_path):
    from llama_vq._binding import BIN_DIR

    tool = BIN_DIR / "test-save-load-state"
    if not tool.exists():
        pytest.skip(f"{tool} was not built (build with LLAMA_VQ_BUILD_TOOLS=ON)")
    proc = subprocess.run(
        [str(tool), "-m", str(smollm2_path), "-fa", "off", "-ctk", "q8_0", "-ctv", "q8_0", "-t", str(N_THREADS),
         "-c", "512", "-p", "The quick brown fox"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600,
    )
    out = proc.stdout
    res = _tool_results(out)
    # it creates its context (upstream refused this combination) and the state tests that concern the V layout
    # pass: sequence removal, state load, sequence copy on the host (plain and scattered)
    for t in (2, 3, 4, 6):
        assert res.get(t) == "PASS", (t, res, out[-3000:])
    if proc.returncode != 0:
        # Known upstream bug, not the V patch: "seq copy (device)" (test 5) fails and test 7 crashes for ANY
        # quantized K or V cache, with flash attention ON as well (pinned llama.cpp, q8_0 K/V + FA on: NMSE 0.87
        # at step 1, then SIGSEGV in test 7; q8_0 K + f16 V + FA off: the same), while f16 K/V pass all tests.
        assert res.get(5) == "FAIL", (res, out[-3000:])
        pytest.xfail(f"upstream seq-copy (device) bug for quantized caches: tool exit {proc.returncode}, {res}")


# ----------------------------------------------------------------------------
# graph structure: with a quantized cache, llama.cpp rotates q/k/v by a Hadamard matrix (attn_rot_k/v). Patch 0016
# builds each rotation right next to its consumer, which is what lets a backend fuse them (0017, CUDA): the K and V
# rotations just before their cache stores, the queries' just before K*Q, the output's just after the CONT that
# un-permutes it. This reads the graph llama.cpp really computes (the scheduler's eval callback, node by node).


class _GgmlTensor(ctypes.Structure):  # struct ggml_tensor (ggml.h) of the pinned llama.cpp
    _fields_ = [
        ("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4), ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16), ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p), ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64), ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


GGML_TYPES = {"f16": 1, "q4_0": 2, "q8_0": 8}
VIEW_OPS = {"RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE"}


def _graph_nodes(llama_vq, ggml, path, type_k, type_v, n_tokens=4, **kw) -> list[dict]:
    """The nodes of one decode of n_tokens, FA off, in the order the backend computes them."""
    import llama_cpp

    nodes: list[dict] = []

    @llama_cpp.ggml_backend_sched_eval_callback
    def record(t, ask, user_data):  # noqa: ARG001
        if ask:
            x = ctypes.cast(t, ctypes.POINTER(_GgmlTensor)).contents
            nodes.append({"addr": t, "op": ggml.op_name(x.op).decode(), "hint": x.op_params[1],
                          "src": list(x.src), "view_src": x.view_src, "name": x.name.decode()})
        return False  # never stop to look at data: the graph runs as one piece

    llm = make(llama_vq, path, n_ctx=256, **kw)  # the weights; its own context is not used
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch = 256, 32, 32
    params.n_threads = params.n_threads_batch = N_THREADS
    params.type_k, params.type_v = GGML_TYPES[type_k], GGML_TYPES[type_v]
    params.flash_attn_type = 0  # LLAMA_FLASH_ATTN_TYPE_DISABLED
    params.cb_eval, params.cb_eval_user_data = record, None
    ctx = llama_cpp.llama_init_from_model(llm._model.model, params)
    assert ctx
    try:
        toks = llm.tokenize(b"The quick brown fox jumps")[:n_tokens]
        assert llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one((llama_cpp.llama_token * len(toks))(*toks),
                                                                          len(toks))) == 0
    finally:
        llama_cpp.llama_free(ctx)
    assert any(n["name"].startswith("kq") for n in nodes), "node names unreadable: struct layout changed?"
    return nodes


def _rotations_by_neighbour(nodes: list[dict]) -> dict[str, int]:
    at = {n["addr"]: n for n in nodes}

    def root(addr):  # the tensor a view (chain) looks at
        n = at.get(addr)
        return n["view_src"] if n and n["view_src"] else addr

    found = {"store": 0, "kq": 0, "output": 0, "apart": 0}
    for i, n in enumerate(nodes):
        if n["op"] != "MUL_MAT" or n["hint"] != 1:  # GGML_HINT_SRC0_IS_HADAMARD
            continue
        prev2 = nodes[i - 2:i]
        if (len(prev2) == 2 and prev2[0]["op"] == "CONT" and prev2[1]["op"] == "RESHAPE"
                and prev2[1]["src"][0] == prev2[0]["addr"] and n["src"][1] == prev2[1]["addr"]):
            found["output"] += 1
            continue
        j = i + 1
        while j < len(nodes) and nodes[j]["op"] in VIEW_OPS:
            j += 1
        c = nodes[j] if j < len(nodes) else {"op": None}
        if c["op"] == "SET_ROWS" and root(c["src"][0]) == n["addr"]:
            found["store"] += 1
        elif c["op"] == "MUL_MAT" and root(c["src"][1]) == n["addr"]:
            found["kq"] += 1
        else:
            found["apart"] += 1
    return found


@pytest.mark.parametrize("model,type_k,type_v,expect", [
    ("smollm2", "q4_0", "q4_0", {"store": 2, "kq": 1, "output": 1}),
    ("smollm2", "f16", "q8_0", {"store": 1, "kq": 0, "output": 1}),
    ("smollm2", "q8_0", "f16", {"store": 1, "kq": 1, "output": 0}),
    ("mimo", "q4_0", "q4_0", {"store": 2, "kq": 1, "output": 1}),  # iSWA: full and sliding-window layers
])
def test_attention_rotations_sit_next_to_their_consumers(llama_vq, ggml, request, model, type_k, type_v, expect):
    path = request.getfixturevalue("smollm2_path" if model == "smollm2" else "mimo_path")
    nodes = _graph_nodes(llama_vq, ggml, path, type_k, type_v)
    n_layer = sum(1 for n in nodes if n["name"].startswith("kq-") and n["op"] == "MUL_MAT")
    assert n_layer > 0
    found = _rotations_by_neighbour(nodes)
    assert found == {**{k: v * n_layer for k, v in expect.items()}, "apart": 0}, found
