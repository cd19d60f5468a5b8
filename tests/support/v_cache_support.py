"""Helpers for the V-cache tests: contexts, logits comparisons, greedy decoding, and a few ggml functions through
ctypes on libggml (graphs built by hand, what the CPU backend claims to support).

Nothing here is a fixture; the test modules own theirs.
"""

from __future__ import annotations

import ctypes
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# CI has 2 cores; on a machine shared with other jobs, 1 thread avoids ggml's spinning threads stalling
N_THREADS = int(os.environ.get("LLAMA_VQ_TEST_THREADS", "2"))


def make(llama_vq, path, *, type_k="f16", type_v="f16", flash_attn=False, **kw):
    """A llama_vq.Llama on ``path`` with the tests' defaults (1024 cells, N_THREADS, a fixed seed)."""
    kw.setdefault("n_ctx", 1024)
    kw.setdefault("n_threads", N_THREADS)
    kw.setdefault("n_threads_batch", N_THREADS)
    kw.setdefault("seed", 1234)
    return llama_vq.Llama(str(path), type_k=type_k, type_v=type_v, flash_attn=flash_attn, verbose=False, **kw)


# ----------------------------------------------------------------------------
# prompts: plain prose, several hundred tokens (SmolLM2's tokenizer gives ~1 token per 4 characters)

PARAGRAPHS = [
    "The river town woke slowly. Before the bakery opened, the ferryman checked the ropes, counted the "
    "planks on the landing, and wrote the water level on a slate by the door. Nobody remembered who had "
    "started the habit, but the slates went back forty years, stacked in the shed behind the customs house.",
    "A cache is only useful if reading it is cheaper than recomputing what it holds. Attention layers keep "
    "the keys and values of every token they have seen, and for long conversations that memory grows larger "
    "than the model weights themselves. Storing it with fewer bits trades a little precision for a lot of room.",
    "In the spring the orchard needed twelve people for three weeks. They pruned the old trees first, then "
    "grafted the young ones, and finally walked the rows with baskets of straw to protect the roots from the "
    "late frost that arrived, as it always did, a few days after everyone had decided winter was over.",
    "The committee met on Thursdays in a room that was too small for it. Minutes were taken by whoever "
    "arrived last, which meant that the minutes were often incomplete, sometimes illegible, and once, "
    "memorably, written entirely in verse. The treasurer objected; the chair framed them and hung them up.",
    "To measure a coastline you must first choose the length of your ruler. A shorter ruler follows more of "
    "the inlets and rocks, and the total keeps growing as the ruler shrinks. Surveyors learned to state the "
    "ruler with the result, the same way a careful engineer states the tolerance with every number.",
    "Her grandfather repaired clocks in a workshop that smelled of oil and brass. He never hurried. When a "
    "customer asked how long a repair would take, he would answer that the clock would tell him, and then go "
    "back to listening to the escapement with his eyes closed, as if it were a piece of music.",
]


def long_text(n_paragraphs: int = len(PARAGRAPHS)) -> str:
    return "\n\n".join(PARAGRAPHS[:n_paragraphs])


# ----------------------------------------------------------------------------
# logits


def eval_logits(llm, tokens: list[int]) -> np.ndarray:
    """Next-token logits after every prefix of ``tokens`` (llm made with logits_all=True), float64."""
    llm.reset()
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)], dtype=np.float64)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


@dataclass(frozen=True)
class Agreement:
    """How closely two runs' next-token distributions agree, over the same positions."""

    kl_mean: float  # mean over positions of KL(P || Q), nats
    kl_max: float
    top1: float  # fraction of positions where argmax P == argmax Q
    ppl_p: float  # perplexity of the evaluated text under P and under Q
    ppl_q: float

    @property
    def ppl_rel(self) -> float:
        return abs(self.ppl_q / self.ppl_p - 1.0)

    def __str__(self) -> str:
        return (
            f"KL mean {self.kl_mean:.3e} max {self.kl_max:.3e}, top-1 {self.top1:.4f}, "
            f"ppl {self.ppl_p:.4f} vs {self.ppl_q:.4f} ({100 * self.ppl_rel:.4f}%)"
        )


def compare(p_logits: np.ndarray, q_logits: np.ndarray, tokens: list[int], skip: int = 0) -> Agreement:
    """Compare two [n_tokens, n_vocab] logit arrays of one token sequence (positions >= skip)."""
    lp = log_softmax(p_logits[skip:])
    lq = log_softmax(q_logits[skip:])
    kl = (np.exp(lp) * (lp - lq)).sum(axis=-1)
    top1 = float((lp.argmax(axis=-1) == lq.argmax(axis=-1)).mean())
    nxt = np.asarray(tokens[skip + 1 :])
    n = len(nxt)
    nll_p = -lp[np.arange(n), nxt].mean()
    nll_q = -lq[np.arange(n), nxt].mean()
    return Agreement(float(kl.mean()), float(kl.max()), top1, math.exp(nll_p), math.exp(nll_q))


def greedy(llm, tokens: list[int], n: int) -> list[int]:
    """Evaluate ``tokens`` after what llm already holds, then pick ``n`` tokens by argmax."""
    import llama_cpp

    n_vocab = llm.n_vocab()
    out: list[int] = []
    llm.eval(tokens)
    for _ in range(n):
        row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(n_vocab,))
        tok = int(row.argmax())
        out.append(tok)
        llm.eval([tok])
    return out


# ----------------------------------------------------------------------------
# quantized blocks in numpy (layouts from ggml-common.h), exact in float64

# name: (ggml_type, bytes per 32-element block)
QTYPES = {"q4_0": (2, 18), "q4_1": (3, 20), "q5_0": (6, 22), "q5_1": (7, 24), "q8_0": (8, 34), "iq4_nl": (20, 18)}
GGML_TYPE_F32, GGML_TYPE_F16 = 0, 1
QK = 32


def random_blocks(name: str, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """Random but valid blocks: finite f16 scales/mins, random quants. Returns uint8 [n_blocks, size]."""
    _, size = QTYPES[name]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    d = rng.uniform(0.002, 0.05, n_blocks).astype(np.float16)
    raw[:, 0:2] = d.view(np.uint8).reshape(n_blocks, 2)
    if name in ("q4_1", "q5_1"):
        m = rng.uniform(-0.5, 0.5, n_blocks).astype(np.float16)
        raw[:, 2:4] = m.view(np.uint8).reshape(n_blocks, 2)
    return raw


# ----------------------------------------------------------------------------
# ctypes on libggml: build the graph build_attn_mha() builds for a quantized V with FA off


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def cpu_library(lib_dir: Path) -> Path:
    """ggml's CPU backend in lib_dir: libggml-cpu.so of a linked-in build; of a build with backends as modules
    (scripts/run.sh's set-up on a CPU, the wheels), the CPU module that `import llama_vq` loaded."""
    import llama_vq

    info = llama_vq.build_info()
    return lib_dir / (f"libggml-cpu-{info.cpu_variant}.so" if info.cpu_variant else "libggml-cpu.so")


class GGML:
    """The few ggml functions the tests need, from libggml-base + libggml-cpu in lib_dir."""

    def __init__(self, lib_dir: Path) -> None:
        mode = getattr(ctypes, "RTLD_GLOBAL", 0)
        self.base = ctypes.CDLL(str(lib_dir / "libggml-base.so"), mode=mode)
        self.cpu = ctypes.CDLL(str(cpu_library(lib_dir)), mode=mode)
        P, I64, I32, SZ = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_size_t
        sig = {
            "ggml_init": (P, [_InitParams]),
            "ggml_free": (None, [P]),
            "ggml_new_tensor_2d": (P, [P, I32, I64, I64]),
            "ggml_new_tensor_3d": (P, [P, I32, I64, I64, I64]),
            "ggml_new_tensor_4d": (P, [P, I32, I64, I64, I64, I64]),
            "ggml_view_4d": (P, [P, P, I64, I64, I64, I64, SZ, SZ, SZ, SZ]),
            "ggml_permute": (P, [P, P, I32, I32, I32, I32]),
            "ggml_transpose": (P, [P, P]),
            "ggml_cast": (P, [P, P, I32]),
            "ggml_cont": (P, [P, P]),
            "ggml_cpy": (P, [P, P, P]),
            "ggml_view_2d": (P, [P, P, I64, I64, SZ, SZ]),
            "ggml_mul_mat": (P, [P, P, P]),
            "ggml_new_graph": (P, [P]),
            "ggml_build_forward_expand": (None, [P, P]),
            "ggml_get_data": (P, [P]),
            "ggml_nbytes": (SZ, [P]),
            "ggml_row_size": (SZ, [I32, I64]),
            "ggml_backend_supports_op": (ctypes.c_bool, [P, P]),
            "ggml_backend_free": (None, [P]),
            "ggml_op_name": (ctypes.c_char_p, [I32]),
        }
        for name, (res, args) in sig.items():
            f = getattr(self.base, name)
            f.restype, f.argtypes = res, args
            setattr(self, name[5:], f)
        self.graph_compute_with_ctx = self.cpu.ggml_graph_compute_with_ctx
        self.graph_compute_with_ctx.restype, self.graph_compute_with_ctx.argtypes = I32, [P, P, I32]
        self.backend_cpu_init = self.cpu.ggml_backend_cpu_init
        self.backend_cpu_init.restype, self.backend_cpu_init.argtypes = P, []

    def context(self, mem_size: int, no_alloc: bool = False):
        ctx = self.init(_InitParams(mem_size, None, no_alloc))
        if not ctx:
            raise MemoryError("ggml_init failed")
        return ctx

    def read(self, t, dtype, shape) -> np.ndarray:
        """A contiguous tensor's data as a numpy array of ggml shape ``shape`` (ne0 fastest)."""
        n = int(np.prod(shape))
        buf = (ctypes.c_char * (n * np.dtype(dtype).itemsize)).from_address(self.get_data(t))
        return np.frombuffer(buf, dtype=dtype).reshape(tuple(reversed(shape))).copy()


def cpu_supports_copy(g: GGML, name: str, dst_type: int, transposed_src: bool) -> bool:
    """Whether the CPU backend claims a copy of a quantized [64, 8] tensor (optionally transposed) to dst_type."""
    qtype, _ = QTYPES[name]
    ctx = g.context(1024 * 1024, no_alloc=True)
    backend = g.backend_cpu_init()
    try:
        src = g.new_tensor_3d(ctx, qtype, 64, 64, 1)
        if transposed_src:
            src = g.transpose(ctx, src)
        op = g.cast(ctx, src, dst_type) if dst_type != qtype else g.cont(ctx, src)
        return bool(g.backend_supports_op(backend, op))
    finally:
        g.backend_free(backend)
        g.free(ctx)
