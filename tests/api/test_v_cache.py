"""The V patch: a quantized V cache with flash attention off, on the CPU.

What is checked, against what:
* every quantized V type (and K in those plus f16) loads and generates with flash_attn=False;
* fidelity: the next-token distributions of FA off + quantized V against FA on + the same quantized V
  (same quantizer, same cache contents: only the attention arithmetic differs), compared with the
  existing noise floor, FA off against FA on with f16 V; on SmolLM2 and on a MiMo-shaped synthetic
  model (SWA + full layers, sinks, K 192 / V 128) with a prompt long enough that the SWA cache wraps;
* KV state save/load with the new row-major quantized V, across FA on/off, and refusals;
* the graph that ships: V*softmax(KQ) as one OUT_PROD straight from the quantized cache (its CPU kernels
  against float64: tests/kernels/test_out_prod_reference.py);
* llama.cpp's own test-save-load-state with -fa off -ctk q8_0 -ctv q8_0 when the tool was built.

CPU time: the whole module took 4.3 min wall (2.1 min of CPU) with LLAMA_VQ_TEST_THREADS=1 on a 2-core machine
shared with other builds; most of it is the fidelity and state runs on SmolLM2.
"""

from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest
from v_cache_support import (
    N_THREADS,
    QTYPES,
    compare,
    eval_logits,
    greedy,
    long_text,
    make,
)

V_TYPES = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl"]
K_TYPES = ["f16", *V_TYPES]
# ----------------------------------------------------------------------------
# loads and generates


PAIR_PROMPT = "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is"


@pytest.fixture(scope="module")
def pair_reference(llama_vq, smollm2_path):
    """f16 K/V: FA off (the reference) and the FA on/off floor over PAIR_PROMPT."""
    ref_llm = make(llama_vq, smollm2_path, n_ctx=256, logits_all=True)
    tokens = ref_llm.tokenize(PAIR_PROMPT.encode())
    ref = eval_logits(ref_llm, tokens)
    on = eval_logits(make(llama_vq, smollm2_path, n_ctx=256, logits_all=True, flash_attn=True), tokens)
    return tokens, ref, compare(ref, on, tokens)


@pytest.mark.parametrize("type_v", V_TYPES)
@pytest.mark.parametrize("type_k", K_TYPES)
def test_quantized_v_without_flash_attn_loads_and_generates(llama_vq, smollm2_path, pair_reference, type_k, type_v):
    """Every K/V pair loads, generates, and its logits are finite and as close to f16 as the same cache types'
    FA-on path (upstream's reference) gets. Bound (DESIGN decision 8, docs/architecture.md): KL from f16 of FA
    off <= 2 x that of FA on + 2 x the f16 FA on/off floor; two independent runs, so the floor counts twice
    and the factor 2 absorbs chaotic divergence between them. A scrambled V costs 0.1-1 nats, far above."""
    tokens, ref, floor = pair_reference
    llm = make(llama_vq, smollm2_path, type_k=type_k, type_v=type_v, n_ctx=256, logits_all=True)
    assert llm.flash_attn is False
    info = llm.kv_cache_info()
    assert (info.type_k, info.type_v) == (type_k, type_v)
    logits = eval_logits(llm, tokens)
    assert np.isfinite(logits).all(), "NaN or inf logits"
    on = eval_logits(
        make(llama_vq, smollm2_path, type_k=type_k, type_v=type_v, flash_attn=True, n_ctx=256, logits_all=True), tokens
    )
    off_kl, on_kl = compare(ref, logits, tokens).kl_mean, compare(ref, on, tokens).kl_mean
    print(f"\nK {type_k} V {type_v}: KL from f16 FA off {off_kl:.3e}, FA on {on_kl:.3e}, floor {floor.kl_mean:.3e}")
    assert off_kl <= 2 * on_kl + 2 * floor.kl_mean
    out = greedy(llm, llm.tokenize(b" The capital of Germany is"), 4)
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
# 5e-4 (one probe at 1.6e-2), with q4_0 / q8_0 K 2.5e-4 / 1.7e-4 (floor 1.3e-4); top-1 >= 0.875 (2-core AVX2
# EPYC). On a 2-core AVX-512 EPYC: SmolLM2 5.1e-4..1.4e-3 (floor 3.7e-3, top-1 0.964), MiMo 1.6e-6..7.7e-5 (floor
# 1.3e-4, top-1 0.992), every case top-1 >= 0.969. A wrong V layout or head mapping scrambles the attention
# output, which we expect at KL of order 0.1-1 nats (25x SmolLM2's floor, 1000x MiMo's). So, with the floor
# measured in the same run (it moves with the CPU's SIMD level and summation order):
# * every case: mean KL <= KL_FLOOR_FACTOR x the floor's, and top-1 agreement at most TOP1_FLIPS probes below
#   the floor's (one flip among 32 probes is 3 points);
# * q8_0 V with f16 K (the criterion, met with margin): mean KL within the f16 floor (+1e-6 nats).
#   Coarser types can exceed the floor when the probe token's own K/V, computed from FA-on vs FA-off hidden
#   states that differ by rounding, land on different quantization steps.
# Perplexity over 32 probes is too noisy for the 0.3%; llama-perplexity's KL mode measures it over
# thousands of tokens (see the report); here it is only printed.

KL_FLOOR_FACTOR = 10
TOP1_FLIPS = 4
FIDELITY_CASES = (
    [("smollm2", "f16", t) for t in ("q4_0", "q8_0", "iq4_nl")]
    + [("smollm2", "q8_0", "q8_0")]
    + [("mimo", "f16", t) for t in V_TYPES]
    + [("mimo", "q4_0", "q4_0"), ("mimo", "q8_0", "q8_0")]
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

    assert got.kl_mean <= KL_FLOOR_FACTOR * floor.kl_mean
    assert got.top1 >= floor.top1 - TOP1_FLIPS / len(positions)
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
    got = np.array(dst.scores[len(head) : len(head) + len(tail)], dtype=np.float64)

    ref = make(llama_vq, smollm2_path, type_k="q8_0", type_v="q8_0", flash_attn=False, logits_all=True, **kw)
    want = eval_logits(ref, head + tail)[len(head) :]

    agree = compare(want, got, tail)
    print(f"\nFA-on state continued without FA vs FA off from scratch: {agree}   (floor: {floor})")
    assert agree.kl_mean <= 2 * floor.kl_mean + 1e-6
    assert agree.top1 >= floor.top1 - 0.02  # 60 positions: one flip is 1.7 points


@pytest.mark.parametrize(
    "saved,loaded,reason",
    [
        # f16 V without FA is stored transposed, q8_0 V row-major: a layout mismatch
        (dict(type_v="f16", flash_attn=False), dict(type_v="q8_0", flash_attn=False), "V cache layout"),
        # both row-major (f16 with FA, q8_0 without): the element type differs
        (dict(type_v="f16", flash_attn=True), dict(type_v="q8_0", flash_attn=False), "mismatched value type"),
        # K type differs
        (dict(type_k="q8_0", type_v="q8_0"), dict(type_k="q4_0", type_v="q8_0"), "mismatched key type"),
    ],
)
def test_state_with_other_layout_or_cache_type_is_refused_with_clear_error(
    llama_vq, smollm2_path, saved, loaded, reason
):
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
                rows = [
                    np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i + j), shape=(n_vocab,)).copy()
                    for j in range(len(seq))
                ]
                out.append(np.array(rows, dtype=np.float64))
                i += len(seq)
            llama_cpp.llama_batch_free(batch)
            return out
        finally:
            llama_cpp.llama_free(ctx)

    both = run(prompts, 2)
    # reference: the f16 FA on/off floor (mean KL of two attention arithmetics); here the cache contents and the
    # arithmetic are the same and only the batch composition (so the kernels' tiling) differs, so every position
    # must agree more closely than the floor's average; a stream leak scrambles positions (KL 0.1-1 nats)
    floor = _floor(
        llama_vq, "smollm2", smollm2_path, {"n_batch": 128, "n_ubatch": 128}, _tokens(llama_vq, smollm2_path)
    )
    for k, seq in enumerate(prompts):
        alone = run([seq], 1)[0]
        agree = compare(alone, both[k], seq)
        print(f"\nstream {k}: two streams vs alone: {agree}   (floor: {floor})")
        assert agree.kl_max < floor.kl_mean, agree
        assert agree.top1 >= floor.top1, agree


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
    from llama_vq._cdll import BIN_DIR

    tool = BIN_DIR / "test-save-load-state"
    if not tool.exists():
        pytest.skip(f"{tool} was not built (build with LLAMA_VQ_BUILD_TOOLS=ON)")
    proc = subprocess.run(
        [
            str(tool),
            "-m",
            str(smollm2_path),
            "-fa",
            "off",
            "-ctk",
            "q8_0",
            "-ctv",
            "q8_0",
            "-t",
            str(N_THREADS),
            "-c",
            "512",
            "-p",
            "The quick brown fox",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
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
