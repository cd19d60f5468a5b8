"""Attention modes over one quantized cache (patch 0018-llama-flash-attn-prefill-mode): "prefill" runs flash attention
for prompt batches and llama-vq's attention without it for decode batches (up to LLAMA_VQ_DECODE_TOKENS, default 8,
tokens per sequence); "auto" with a quantized V picks prefill on an accelerator and the non-FA path on the CPU alone.

Fidelity as decision 8 has it: each mode held against the f16 cache, within the floor (f16, flash attention on vs
off), never one quantized run against another.
"""

from __future__ import annotations

import numpy as np
import pytest
from v_cache_support import compare, eval_logits, long_text, make

N_PROBES = 24  # decode steps after the prompt, each one token


def _counts() -> tuple[int, int]:
    """(flash attention ops, ops without it) built into graphs so far, process-wide."""
    import ctypes

    import llama_cpp  # after llama_vq (the fixtures import it first): bound to llama-vq's libraries

    fn = llama_cpp.llama_cpp._lib.llama_vq_attn_counts
    fn.argtypes = [ctypes.POINTER(ctypes.c_uint64)] * 3
    fn.restype = None
    a, b, c = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
    fn(ctypes.byref(a), ctypes.byref(b), ctypes.byref(c))
    return a.value, b.value


def _model(request, name):
    if name == "smollm2":
        return request.getfixturevalue("smollm2_path"), {"n_batch": 128, "n_ubatch": 128}, 30
    return request.getfixturevalue("mimo_path"), {"n_batch": 64, "n_ubatch": 64, "swa_full": False}, 4


@pytest.mark.parametrize(
    "fa,type_v,expect",
    [
        ("auto", "q4_0", "off"),  # quantized V on the CPU alone: llama-vq's attention (CPU FA reads it slowly)
        ("auto", "f16", "on"),  # as upstream: flash attention where the device runs it
        ("prefill", "q4_0", "prefill"),
        ("prefill", "f16", "on"),  # prefill mode needs a quantized V to differ from flash attention
        ("off", "q4_0", "off"),
        ("on", "q4_0", "on"),
    ],
)
def test_attention_mode_resolves_as_documented_on_the_cpu(llama_vq, smollm2_path, fa, type_v, expect):
    llm = make(llama_vq, smollm2_path, type_k="q8_0", type_v=type_v, flash_attn=fa)
    assert llm.flash_attn_mode == expect
    assert llm.flash_attn is (expect != "off")


def test_prefill_mode_runs_flash_attention_for_prompts_and_llama_vq_attention_for_decode(llama_vq, smollm2_path):
    llm = make(llama_vq, smollm2_path, type_k="q8_0", type_v="q4_0", flash_attn="prefill")
    tokens = llm.tokenize(long_text(2).encode())
    steps = {}
    for name, batch in (
        ("prompt", tokens[:100]),
        ("decode 1", tokens[100:101]),
        ("draft 8", tokens[101:109]),
        ("batch 9", tokens[109:118]),
    ):
        before = _counts()
        llm.eval(batch)
        after = _counts()
        steps[name] = (after[0] - before[0], after[1] - before[1])
    print(f"\nattention ops built (flash, without): {steps}")
    n_layer = 30
    assert steps["prompt"] == (n_layer, 0)
    assert steps["decode 1"] == (0, n_layer)
    assert steps["draft 8"] == (0, n_layer)  # an MTP-sized batch: at most 8 tokens per sequence decode
    assert steps["batch 9"] == (n_layer, 0)


def _probe_logits(llm, tokens: list[int], positions: list[int]) -> np.ndarray:
    """Decode-step logits at each position (descending): the cache cut back to the position, then its token decoded
    alone. Every probe reads the same cached prompt: only the step's own attention (and the token's own K/V)
    differs between modes, not rounding accumulated over a different history."""
    import llama_cpp

    rows = []
    for q in positions:
        llm.n_tokens = q
        llm.eval([tokens[q]])
        row = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        rows.append(np.ctypeslib.as_array(row, shape=(llm.n_vocab(),)).astype(np.float64))
    return np.array(rows)


@pytest.mark.parametrize(
    "model,type_k,type_v",
    [
        ("smollm2", "q8_0", "q4_0"),
        ("smollm2", "q8_0", "q8_0"),
        ("mimo", "q8_0", "q4_1"),
        ("mimo", "q4_0", "q4_0"),
    ],
)
def test_prefill_mode_is_as_close_to_f16_as_flash_attention(llama_vq, request, model, type_k, type_v):
    """Prefill mode's decode steps on a prompt that flash attention prefilled (as prefill mode prefills it) have a
    KL from the f16 cache no larger than flash attention's decode steps on that cache, plus the floor (f16, flash
    attention on vs off, full runs)."""
    path, kw, _ = _model(request, model)
    if "swa_full" in kw:
        kw = dict(kw, swa_full=True)  # cutting the cache back to a probe needs the probe's window in it
    tokens = make(llama_vq, path, vocab_only=True).tokenize(long_text().encode())
    positions = list(range(len(tokens) - 2, len(tokens) - 2 - 6 * N_PROBES, -6))
    ref_full = eval_logits(make(llama_vq, path, flash_attn=False, logits_all=True, **kw), tokens)
    on_full = eval_logits(make(llama_vq, path, flash_attn=True, logits_all=True, **kw), tokens)
    ref, nxt = ref_full[positions], [0, *(tokens[q + 1] for q in positions)]
    floor = compare(ref, on_full[positions], nxt)
    src = make(llama_vq, path, type_k=type_k, type_v=type_v, flash_attn="prefill", **kw)
    src.eval(tokens)  # prompt batches: flash attention
    state = src.save_state()
    got = {}
    for fa in ("prefill", "on"):
        llm = make(llama_vq, path, type_k=type_k, type_v=type_v, flash_attn=fa, **kw)
        llm.load_state(state)
        before = _counts()
        got[fa] = compare(ref, _probe_logits(llm, tokens, positions), nxt)
        n_flash, n_plain = (x - y for x, y in zip(_counts(), before, strict=True))
        assert (n_flash > 0, n_plain > 0) == ((False, True) if fa == "prefill" else (True, False))
    print(
        f"\n[{model}] K {type_k} V {type_v} decode steps vs f16: prefill {got['prefill']}\n  on {got['on']}"
        f"\n  floor {floor}"
    )
    assert got["prefill"].kl_mean <= got["on"].kl_mean + floor.kl_mean
    # top-1 agreement with f16 over 24 probes moves in steps of 4 points: a few near-ties flip either way (as in
    # test_v_cache's fidelity test, TOP1_FLIPS)
    assert got["prefill"].top1 >= got["on"].top1 - 4 / len(positions)


@pytest.mark.parametrize("model", ["smollm2", "mimo"])
def test_greedy_text_prefilled_by_flash_attention_matches_all_off_where_the_top2_gap_exceeds_the_floor(
    llama_vq, request, model
):
    """Greedy decoding after a prompt prefilled by flash attention picks the token an all-FA-off run picks at every
    step where the FA-off run's top-2 gap exceeds the floor: the largest change of a top-2 gap that flash
    attention on vs off causes with an f16 cache (measured here over the same steps)."""
    path, kw, _ = _model(request, model)
    tokens = make(llama_vq, path, vocab_only=True).tokenize(long_text().encode())
    n_prompt = len(tokens) - N_PROBES - 1
    off = make(llama_vq, path, type_k="q8_0", type_v="q4_1", flash_attn="off", **kw)
    # the all-off run's greedy continuation, then every run teacher-forced on it
    import llama_cpp

    off.reset()
    off.eval(tokens[:n_prompt])
    greedy = []
    for _ in range(N_PROBES):
        row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(off._ctx.ctx, -1), shape=(off.n_vocab(),))
        greedy.append(int(row.argmax()))
        off.eval([greedy[-1]])
    seq = tokens[:n_prompt] + greedy

    def probes(llm) -> np.ndarray:  # logits before each greedy token: the prompt's last row, then each step's
        llm.reset()
        llm.eval(seq[:n_prompt])
        rows = [
            np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(llm.n_vocab(),)).astype(
                np.float64
            )
        ]
        for t in greedy[:-1]:
            llm.eval([t])
            rows.append(
                np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(llm.n_vocab(),)).astype(
                    np.float64
                )
            )
        return np.array(rows)

    def gap(rows: np.ndarray) -> np.ndarray:
        top = np.sort(rows, axis=-1)[:, -2:]
        return top[:, 1] - top[:, 0]

    f16_on = probes(make(llama_vq, path, flash_attn=True, **kw))
    f16_off = probes(make(llama_vq, path, flash_attn=False, **kw))
    floor = float(np.abs(gap(f16_on) - gap(f16_off)).max())
    all_off = probes(off)
    mixed = probes(make(llama_vq, path, type_k="q8_0", type_v="q4_1", flash_attn="prefill", **kw))
    assert [int(r.argmax()) for r in all_off] == greedy  # the teacher-forced replay is the greedy run
    clear = gap(all_off) > floor
    agree = mixed.argmax(axis=-1) == all_off.argmax(axis=-1)
    print(
        f"\n[{model}] floor (top-2 gap change, f16 FA on vs off) {floor:.3f}; steps above it {int(clear.sum())} of "
        f"{N_PROBES}; prefill-mode picks the all-off token at {int(agree.sum())} of {N_PROBES}"
    )
    assert clear.sum() >= N_PROBES // 2, "too few steps above the floor: the test would prove little"
    assert agree[clear].all()


def test_state_saved_in_one_mode_loads_in_the_others(llama_vq, mimo_path):
    """One cache for every mode with a quantized V: a state saved in prefill mode loads in off, on and prefill mode;
    decode batches in off and prefill mode are the same graph on the same cells, so they continue bit for bit
    alike, and every mode continues as the saving context does (the same next token). Saved in off mode, a state
    continues in prefill mode bit for bit as in off mode."""
    import llama_cpp

    kw = {"n_batch": 64, "n_ubatch": 64, "swa_full": True}
    tokens = make(llama_vq, mimo_path, vocab_only=True).tokenize(long_text(3).encode())[:200]

    def next_logits(llm) -> np.ndarray:
        llm.eval(tokens[-3:])  # 3 tokens: a decode batch in prefill mode
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(llm.n_vocab(),)).copy()

    def loaded(fa: str, state) -> np.ndarray:
        llm = make(llama_vq, mimo_path, type_k="q8_0", type_v="q4_1", flash_attn=fa, **kw)
        llm.load_state(state)
        return next_logits(llm)

    for saved_in in ("prefill", "off"):
        src = make(llama_vq, mimo_path, type_k="q8_0", type_v="q4_1", flash_attn=saved_in, **kw)
        src.eval(tokens[:-3])
        state = src.save_state()
        want = next_logits(src)
        got = {fa: loaded(fa, state) for fa in ("off", "prefill", "on")}
        print(
            f"\nsaved in {saved_in}: next token {int(want.argmax())}; loaded: "
            f"{ {fa: int(v.argmax()) for fa, v in got.items()} }"
        )
        assert np.array_equal(got["off"], got["prefill"])
        for fa, v in got.items():
            assert int(v.argmax()) == int(want.argmax()), fa
