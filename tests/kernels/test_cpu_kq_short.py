"""The CPU's K*Q for decode-sized batches with a quantized K (patch 0012-cpu-kq-quantized-k-gqa-shared-rows,
native/ggml/ggml-cpu/llama-vq-kq-short.c: each K row unpacked once and dotted with every query column of its GQA
group) runs, and gives bit-identical logits to upstream's per-row vec_dot path.

Each case decodes the same tokens in two processes, one with the kernel (default) and one with
LLAMA_VQ_CPU_KQ_SHORT=0, and compares the logits of every step byte for byte: q4_0 and q8_0 K, 1 and 3
tokens per step (3 query columns x 1-3 tokens on SmolLM2's GQA 3), and the MiMo-shaped model (K head 192 =
6 blocks, GQA 2 and 4, sliding-window layers). The prompt runs as one 200-token batch (upstream's path:
more than 16 query columns per K head), so the cache the kernel reads is the same in both processes. Equal logits
alone would also hold if the kernel never ran (a build without AVX2 compiles a stub), so each process logs the
kernel's first run (LLAMA_VQ_CPU_OP_LOG=1): the line must be there with the kernel on, for the K cache's type, and
absent with it off.
CPU cost: ~10 s on 2 cores.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from script_support import run_script_with_log

STEPS = 6  # decode calls after the prompt, each a batch of n_tok tokens

SCRIPT = r"""
import hashlib, sys
import numpy as np
import llama_vq, llama_cpp

model, type_k, n_tok, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
llm = llama_vq.Llama(model, n_ctx=1024, n_batch=512, n_ubatch=512, type_k=type_k, type_v="q4_0",
                     flash_attn=False, n_threads=2, verbose=False)
nv = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(llm.model))
def last():
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(nv,)).copy()
text = b"The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
llm.eval(llm.tokenize(text * 8)[:200])
h = hashlib.sha256()
for _ in range(steps):
    h.update(last().tobytes())
    llm.eval([int(np.argmax(last()))] * n_tok)
h.update(last().tobytes())
print(h.hexdigest())
"""


def _logits_digest(model: Path, type_k: str, n_tok: int, enabled: bool) -> tuple[str, bool]:
    """(sha256 of every step's logits, whether the short-row K*Q kernel ran on this K type)."""
    env = {"LLAMA_VQ_CPU_KQ_SHORT": "1" if enabled else "0", "LLAMA_VQ_CPU_OP_LOG": "1"}
    digest, log = run_script_with_log(SCRIPT, [str(model), type_k, str(n_tok), str(STEPS)], env, model.parent)
    return digest, f"llama-vq: CPU kernel ran: kq_short {type_k}" in log


def _assert_kernel_ran_and_matches(model: Path, type_k: str, n_tok: int) -> None:
    (on, ran_on), (off, ran_off) = (_logits_digest(model, type_k, n_tok, e) for e in (True, False))
    assert ran_on and not ran_off, (ran_on, ran_off)
    assert on == off


@pytest.mark.parametrize("type_k", ["q4_0", "q8_0"])
@pytest.mark.parametrize("n_tok", [1, 3])
def test_kq_short_runs_and_is_bit_identical_smollm2(smollm2_path, type_k, n_tok):
    _assert_kernel_ran_and_matches(smollm2_path, type_k, n_tok)


def test_kq_short_runs_and_is_bit_identical_mimo(mimo_path):
    _assert_kernel_ran_and_matches(mimo_path, "q8_0", 1)


def test_digests_differ_between_cache_types(smollm2_path):
    # the comparison above would pass vacuously if the logits did not depend on the K cache at all
    assert _logits_digest(smollm2_path, "q4_0", 1, True)[0] != _logits_digest(smollm2_path, "q8_0", 1, True)[0]
