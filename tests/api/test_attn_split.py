"""The attention without flash attention under a scratch budget (patch
0017-llama-attn-split-scratch-budget, native/llama/src/llama-vq-attn.h): a
batch whose scores (n_kv x n_tokens x n_head floats) exceed the budget is computed in chunks of its tokens, each
chunk's K*Q -> softmax -> V*P before the next. Every row of scores is the unsplit graph's, so the logits are the
same bit for bit on the CPU; and the compute buffer does not grow with the scores.
"""

from __future__ import annotations

import numpy as np
import pytest
from v_cache_support import N_THREADS, QTYPES, eval_logits, long_text, make

# Budgets that split the test batches into chunks of at least 32 query columns (tokens x heads of a KV head): the
# CPU's V*P on a quantized V takes its sgemm path from 32 columns, as for the whole batch, so the split is bit for
# bit the unsplit graph. (Below 32 columns it accumulates in another order: rounding, not error; see the
# one-token test below.) SmolLM2: 512 cells x 9 heads x 4 B = 18 KiB a token, 14 tokens x 3 heads a chunk;
# MiMo-tiny: 512 cells x 8 heads x 4 B = 16 KiB a token, >= 32 tokens x 2 (SWA) or 4 (full) heads a chunk.
SCRATCH = {"smollm2": 256 << 10, "mimo": 640 << 10}


@pytest.fixture()
def scratch(llama_vq):
    """Set the process-wide budget (bytes) for the contexts made next; the default is restored after the test."""
    from llama_vq import _llama_cpp

    yield _llama_cpp.set_attn_scratch
    _llama_cpp.set_attn_scratch(0)


def _counts() -> tuple[int, int, int]:
    """(flash attention ops, ops without it, of those split) built into graphs so far, process-wide."""
    import ctypes

    import llama_cpp  # after llama_vq (the fixtures import it first): bound to llama-vq's libraries

    fn = llama_cpp.llama_cpp._lib.llama_vq_attn_counts
    fn.argtypes = [ctypes.POINTER(ctypes.c_uint64)] * 3
    fn.restype = None
    a, b, c = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
    fn(ctypes.byref(a), ctypes.byref(b), ctypes.byref(c))
    return a.value, b.value, c.value


def _model(request, name):
    if name == "smollm2":
        return request.getfixturevalue("smollm2_path"), {}
    # MiMo-shaped: SWA layers with sinks and full layers, K head 192 / V head 128, two GQA ratios
    return request.getfixturevalue("mimo_path"), {"n_batch": 256, "n_ubatch": 256, "swa_full": False}


@pytest.mark.parametrize(
    "model,type_k,type_v",
    [
        ("smollm2", "q8_0", "q4_0"),  # a quantized V: OUT_PROD on its rows
        ("smollm2", "f16", "f16"),  # a transposed f16 V: MUL_MAT
        ("mimo", "q8_0", "q4_1"),  # the deployment's types
        ("mimo", "f16", "f16"),
    ],
)
def test_split_attention_gives_the_unsplit_graphs_logits_bit_for_bit(llama_vq, request, scratch, model, type_k, type_v):
    path, kw = _model(request, model)
    small = SCRATCH[model]
    logits, splits = {}, {}
    for budget in (0, small):  # 0: the default 256 MiB, under which these batches are not split
        scratch(budget)
        llm = make(llama_vq, path, type_k=type_k, type_v=type_v, flash_attn=False, logits_all=True, **kw)
        tokens = llm.tokenize(long_text().encode())
        before = _counts()[2]
        logits[budget] = eval_logits(llm, tokens)
        splits[budget] = _counts()[2] - before
        del llm
    print(
        f"\n[{model} {type_k}/{type_v}] {len(tokens)} tokens: split ops built {splits}, "
        f"max |diff| {np.abs(logits[0] - logits[small]).max()}"
    )
    assert splits[0] == 0, "the default budget split a small batch"
    assert splits[small] > 0, "the small budget did not split the batch: nothing was tested"
    # the same rows of scores, the same sums in the same order: equal, not close
    assert np.array_equal(logits[0], logits[small])


def test_split_attention_keeps_each_stream_to_its_own_cells(llama_vq, smollm2_path, scratch):
    """Two sequences in one batch, each in its own KV stream (kv_unified off): split per stream and chunk, each
    sequence gets exactly the logits the unsplit graph gives it."""
    import llama_cpp

    llm = make(llama_vq, smollm2_path, vocab_only=True)
    seqs = [llm.tokenize(long_text(1).encode())[:60], llm.tokenize(long_text(3).encode())[-45:]]
    model = make(llama_vq, smollm2_path, type_k="q8_0", type_v="q4_0", n_ctx=256)
    n_vocab = model.n_vocab()

    def run() -> tuple[list[np.ndarray], int]:
        p = llama_cpp.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max, p.kv_unified = 512, 256, 256, 2, False
        p.type_k, p.type_v = QTYPES["q8_0"][0], QTYPES["q4_0"][0]
        p.flash_attn_type = 0
        p.n_threads = p.n_threads_batch = N_THREADS
        ctx = llama_cpp.llama_init_from_model(model._model.model, p)
        assert ctx, "context creation failed"
        try:
            n = sum(len(s) for s in seqs)
            batch = llama_cpp.llama_batch_init(n, 0, 2)
            i = 0
            for sid, seq in enumerate(seqs):
                for pos, tok in enumerate(seq):
                    batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
                    batch.seq_id[i][0], batch.logits[i] = sid, True
                    i += 1
            batch.n_tokens = n
            before = _counts()[2]
            assert llama_cpp.llama_decode(ctx, batch) == 0
            n_split = _counts()[2] - before
            rows = np.array(
                [
                    np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, j), shape=(n_vocab,)).copy()
                    for j in range(n)
                ]
            )
            llama_cpp.llama_batch_free(batch)
            return [rows[: len(seqs[0])], rows[len(seqs[0]) :]], n_split
        finally:
            llama_cpp.llama_free(ctx)

    scratch(0)
    unsplit, n0 = run()
    # 256 cells per stream x 9 heads x 4 B = 9 KiB a token: 15 tokens a chunk. The batch decodes as 45 + 45 tokens
    # (split per stream into 3 chunks of 15 x 3 heads: >= 32 columns, see SCRATCH), then 15 tokens of one sequence
    # (they fit: not split)
    scratch(15 * 256 * 9 * 4 + 1024)
    split, n1 = run()
    assert n0 == 0 and n1 > 0, (n0, n1)
    for a, b in zip(unsplit, split, strict=True):
        assert np.array_equal(a, b)


def test_compute_buffer_without_flash_attn_stays_within_the_budget_at_long_context(llama_vq, smollm2_path, scratch):
    """At 16K cells and 512-token batches SmolLM2's scores would take 16384 x 512 x 9 x 4 B = 288 MiB: split under a
    16 MiB budget, the compute buffer is flash attention's (its logits dominate) plus at most the budget."""
    budget = 16 << 20
    kw = dict(n_ctx=16384, n_batch=512, n_ubatch=512, type_k="q8_0", type_v="q4_0")
    sizes = {}
    for name, fa, b in (("flash attention", True, 0), ("unsplit", False, 4096 << 20), ("split", False, budget)):
        scratch(b)
        llm = make(llama_vq, smollm2_path, flash_attn=fa, **kw)
        sizes[name] = llm.compute_buffer_bytes()
        del llm
    mib = {k: round(v / 2**20, 1) for k, v in sizes.items()}
    print(f"\ncompute buffers (MiB): {mib}")
    scores = 16384 * 512 * 9 * 4
    assert sizes["unsplit"] >= sizes["flash attention"] + scores // 2, "the unsplit graph should hold the scores"
    assert sizes["split"] <= sizes["flash attention"] + budget
    assert sizes["split"] <= 1.5 * sizes["flash attention"]


def test_one_token_chunks_are_as_close_to_f16_as_the_unsplit_graph(llama_vq, smollm2_path, scratch):
    """The smallest chunks (one query token: 3 columns, where the CPU's V*P on a quantized V sums in another order
    than for the whole batch) are not bit-identical to the unsplit graph, so, as decision 8 has it, both are held
    against the f16 cache: the split's KL from f16 is the unsplit one's within the floor (f16 FA on vs off, measured
    here). With an f16 cache the one-token chunks are bit-identical. A chunk reading another chunk's rows, a wrong
    mask row or head would add KL of order 0.1-1 nats."""
    from v_cache_support import compare

    kw = dict(logits_all=True)
    tokens = make(llama_vq, smollm2_path, vocab_only=True).tokenize(long_text().encode())
    ref = eval_logits(make(llama_vq, smollm2_path, flash_attn=False, **kw), tokens)
    floor = compare(ref, eval_logits(make(llama_vq, smollm2_path, flash_attn=True, **kw), tokens), tokens)
    got = {}
    for tk, tv in (("f16", "f16"), ("q8_0", "q4_0")):
        for budget in (0, 512 * 9 * 4):  # the default (not split), one token's scores at 512 cells
            scratch(budget)
            llm = make(llama_vq, smollm2_path, type_k=tk, type_v=tv, **kw)
            before = _counts()[2]
            got[tk, budget] = eval_logits(llm, tokens)
            assert _counts()[2] - before == (30 if budget else 0)  # every layer of the one batch split, or none
    assert np.array_equal(got["f16", 0], got["f16", 512 * 9 * 4])
    unsplit = compare(ref, got["q8_0", 0], tokens)
    split = compare(ref, got["q8_0", 512 * 9 * 4], tokens)
    print(f"\nq8_0/q4_0 vs f16: unsplit {unsplit}\n  one-token chunks {split}\n  floor (f16 FA off vs on) {floor}")
    assert split.kl_mean <= unsplit.kl_mean + floor.kl_mean
    assert split.top1 >= unsplit.top1 - (1 - floor.top1)


# one context on an rpc-server device in a process of its own (an RPC device, once registered, stays in the
# process's device list: a later model load in the test process would reach for it after its server has gone);
# prints the compute buffers' MiB per device as JSON
_DEVICE_BUFFERS = """
import json, re, sys
import llama_vq
from llama_vq import _llama_cpp, _logs
model, endpoint, flash_attn, budget = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
_llama_cpp.set_attn_scratch(budget)
with _logs.Capture() as cap:
    llm = llama_vq.Llama(model, rpc_servers=endpoint, n_gpu_layers=999, n_ctx=16384, n_batch=512, n_ubatch=512,
                         type_k="q8_0", type_v="q4_0", flash_attn=flash_attn, n_threads=1, verbose=False)
line = re.compile(r"sched_reserve:\\s+(\\S+?)(?:\\[[^\\]]*\\])? compute buffer size =\\s+([\\d.]+) MiB")
print(json.dumps({dev: float(mib) for dev, mib in line.findall(cap.text())}))
"""


def test_split_attention_on_another_device_holds_one_f16_mask(llama_vq, smollm2_path, free_port, tmp_path):
    """With the layers on another device (an rpc-server here, as a GPU is to the scheduler) the mask is a host input
    of which the device gets its own copies: the split must view one f16 copy per device, made once per graph, not
    a copy per chunk (SmolLM2 at 16K cells, 16 MiB budget: 993 MiB) or an f32 copy per layer (113 MiB). Measured:
    the device's compute buffer is flash attention's plus at most the budget, the host's is flash attention's."""
    import json
    import socket
    import subprocess
    import time

    from script_support import run_script

    from llama_vq._cdll import BIN_DIR

    budget = 16 << 20
    tool = BIN_DIR / "ggml-rpc-server"
    if not tool.exists():
        pytest.fail(f"{tool} is missing: the test suite builds llama-vq with LLAMA_VQ_BUILD_TOOLS=ON")
    log = tmp_path / "rpc-server.log"
    with log.open("wb") as f:
        rpc = subprocess.Popen(
            [str(tool), "-H", "127.0.0.1", "-p", str(free_port), "-t", "1"],
            stdout=f,
            stderr=subprocess.STDOUT,
        )
    try:
        end = time.monotonic() + 30
        while True:
            assert rpc.poll() is None, log.read_text(errors="replace")
            try:
                socket.create_connection(("127.0.0.1", free_port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < end, "rpc-server not listening after 30 s"
                time.sleep(0.05)
        sizes = {}
        for name, fa, b in (("flash attention", True, 0), ("unsplit", False, 4096 << 20), ("split", False, budget)):
            args = [str(smollm2_path), f"127.0.0.1:{free_port}", "1" if fa else "0", str(b)]
            sizes[name] = json.loads(run_script(_DEVICE_BUFFERS, args, {}, tmp_path))
            assert set(sizes[name]) == {"RPC0", "CPU"}, (name, sizes[name])
    finally:
        rpc.kill()
        rpc.wait()
    print(f"\ncompute buffers (MiB): {sizes}")
    scores = 16384 * 512 * 9 * 4 / 2**20
    fa, unsplit, split = sizes["flash attention"], sizes["unsplit"], sizes["split"]
    assert unsplit["RPC0"] >= fa["RPC0"] + scores / 2, "the unsplit graph should hold the scores on the device"
    assert split["RPC0"] <= fa["RPC0"] + budget / 2**20
    assert split["RPC0"] <= 1.5 * fa["RPC0"]
    # the host holds the input mask: f16 as flash attention's (an f32 mask would take 16 MiB more)
    assert split["CPU"] <= fa["CPU"]


@pytest.mark.parametrize("model,type_k,type_v", [("smollm2", "q8_0", "q4_0"), ("mimo", "q8_0", "q4_1")])
def test_v_dequantized_once_to_f16_is_as_close_to_f16_as_the_unsplit_graph(
    llama_vq, request, scratch, monkeypatch, model, type_k, type_v
):
    """LLAMA_VQ_ATTN_V_F16=1 (opt-in, off by default): the split dequantizes a quantized V once per
    stream to f16 and every chunk's V*P reads that copy. V rounded to f16 is not bit-identical to the quantized
    path (SmolLM2 turns such a rounding into KL ~1e-2 between the two runs, as flash attention on vs off does), so,
    as decision 8 has it, both are held against the f16 cache: the once-to-f16 split's KL from f16 is the unsplit
    graph's within the floor (f16, flash attention off vs on). Reading the wrong cells or head would add 0.1-1 nats."""
    from v_cache_support import compare

    path, kw = _model(request, model)
    kw = dict(kw, logits_all=True)
    tokens = make(llama_vq, path, vocab_only=True).tokenize(long_text().encode())
    ref = eval_logits(make(llama_vq, path, flash_attn=False, **kw), tokens)
    floor = compare(ref, eval_logits(make(llama_vq, path, flash_attn=True, **kw), tokens), tokens)
    unsplit = compare(ref, eval_logits(make(llama_vq, path, type_k=type_k, type_v=type_v, **kw), tokens), tokens)
    scratch(SCRATCH[model])
    monkeypatch.setenv("LLAMA_VQ_ATTN_V_F16", "1")
    llm = make(llama_vq, path, type_k=type_k, type_v=type_v, **kw)
    before = _counts()[2]
    once = compare(ref, eval_logits(llm, tokens), tokens)
    splits = _counts()[2] - before
    print(
        f"\n[{model} {type_k}/{type_v}] vs f16: unsplit {unsplit}\n  split, V once to f16 ({splits} split ops) {once}"
        f"\n  floor (f16 FA off vs on) {floor}"
    )
    assert splits > 0, "the small budget did not split the batch: nothing was tested"
    assert once.kl_mean <= unsplit.kl_mean + floor.kl_mean
    assert once.top1 >= unsplit.top1 - (1 - floor.top1)
