"""A sequence's state is read in grouped copies (patch 0011-llama-kv-state-grouped-device-reads), byte for byte
what the per-range reads give.

In a unified cache, sequences decoded in the same batches interleave their cells, so one sequence's state is
many one-cell ranges. On a GPU upstream makes one device->host copy per range, layer and K/V (per V row when V is
transposed); the patch reads groups of ranges as one copy of their span. On the CPU the grouping runs only with
LLAMA_VQ_STATE_COALESCE=1, which these tests set in one process and compare with =0 (upstream's per-range
reads) in another: row-major quantized V, transposed f16 V, and the iSWA cache of the MiMo-shaped model (full
state and the SWA-only partial state the server's checkpoints use). Then the grouped state is loaded into
another sequence and decodes the next token as the sequence it came from: the same greedy token, and logits
within 1% of the distance to a different sequence's logits measured in the same batch. Not exactly equal: the
loaded sequence's cells sit elsewhere in the cache, which regroups the attention's float sums (0.005 apart on
the MiMo-shaped model with the AVX2 kernels, 0 with AVX-512). Equal bytes alone would also hold if the grouping
never ran, so each process prints its grouped copies at exit (LLAMA_VQ_STATE_STATS=1): some with grouping on, each
holding more than one range on average, none with it off.
CPU cost: a few small decodes per case, ~10 s on 2 cores.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from script_support import run_counter, run_script_with_log

SCRIPT = r"""
import ctypes, hashlib, json, sys
import numpy as np
import llama_vq
import llama_cpp

model, type_v = sys.argv[1], sys.argv[2]
llm = llama_vq.Llama(model, n_ctx=512, n_batch=64, n_ubatch=64, n_seq_max=4, kv_unified=True, swa_full=False,
                     type_k="q8_0", type_v=type_v, flash_attn=False, n_threads=2, verbose=False)
ctx = llm.ctx
vocab = llama_cpp.llama_model_get_vocab(llm.model)
n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
batch = llama_cpp.llama_batch_init(64, 0, 1)
rng = np.random.default_rng(0)

def decode(items):  # [(token, pos, seq, logits)]
    batch.n_tokens = len(items)
    for i, (t, p, s, l) in enumerate(items):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, p, 1, l
        batch.seq_id[i][0] = s
    assert llama_cpp.llama_decode(ctx, batch) == 0

# three sequences, one token each per batch: every sequence's cells interleave with the others'
toks = rng.integers(100, 2000, size=(3, 40))
for p in range(40):
    decode([(int(toks[s, p]), p, s, False) for s in range(3)])

def state(seq, flags):
    n = llama_cpp.llama_state_seq_get_size_ext(ctx, seq, flags)
    buf = (ctypes.c_uint8 * n)()
    got = llama_cpp.llama_state_seq_get_data_ext(ctx, buf, n, seq, flags)
    return bytes(memoryview(buf)[:got])

full = state(1, 0)
out = {"full": hashlib.sha256(full).hexdigest(), "n": len(full)}
if llama_cpp.llama_model_n_swa(llm.model) > 0:
    part = state(1, llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
    out["partial"] = hashlib.sha256(part).hexdigest()

# the state loaded into an empty sequence continues as the original does
buf = (ctypes.c_uint8 * len(full)).from_buffer_copy(full)
assert llama_cpp.llama_state_seq_set_data_ext(ctx, buf, len(full), 3, 0) == len(full)
decode([(7, 40, 1, True), (7, 40, 3, True), (7, 40, 0, True)])
a, b, c = (np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).copy() for i in range(3))
out["max_logit_diff"] = float(np.abs(a - b).max())
out["same_argmax"] = bool(np.argmax(a) == np.argmax(b))
out["other_seq_diff"] = float(np.abs(a - c).max())  # how far a different sequence's logits are
print(json.dumps(out))
"""


def _run(model: Path, type_v: str, coalesce: str) -> dict:
    env = {"LLAMA_VQ_STATE_COALESCE": coalesce, "LLAMA_VQ_STATE_STATS": "1"}
    out, log = run_script_with_log(SCRIPT, [str(model), type_v], env, model.parent)
    r = json.loads(out)
    r["copies"] = run_counter(log, "state reads grouped", "copies")
    r["ranges"] = run_counter(log, "state reads grouped", "ranges")
    return r


def _assert_grouping_ran(grouped: dict, per_range: dict) -> None:
    assert per_range["copies"] == per_range["ranges"] == 0
    assert grouped["copies"] > 0
    assert grouped["ranges"] > grouped["copies"], grouped  # a group holds two ranges or more


def _assert_restored_decodes_alike(r: dict) -> None:
    assert r["same_argmax"]
    assert r["max_logit_diff"] <= 0.01 * r["other_seq_diff"], r


@pytest.mark.parametrize("type_v", ["q4_0", "f16"])
def test_grouped_reads_run_and_give_the_same_state_smollm2(smollm2_path, type_v):
    grouped, per_range = _run(smollm2_path, type_v, "1"), _run(smollm2_path, type_v, "0")
    _assert_grouping_ran(grouped, per_range)
    assert grouped["n"] == per_range["n"] > 0
    assert grouped["full"] == per_range["full"]
    _assert_restored_decodes_alike(grouped)


def test_grouped_reads_run_and_give_the_same_state_iswa(mimo_path):
    grouped, per_range = _run(mimo_path, "q4_0", "1"), _run(mimo_path, "q4_0", "0")
    _assert_grouping_ran(grouped, per_range)
    assert grouped["full"] == per_range["full"]
    assert grouped["partial"] == per_range["partial"]
    _assert_restored_decodes_alike(grouped)
