#!/usr/bin/env python3
"""Synthetic GGUF models from random weights, for tests and benchmarks.

Two families, written with the gguf package that matches the pinned llama.cpp
(``vendor/llama.cpp/gguf-py``):

* ``write_mimo_like``: arch ``mimo2`` as the pinned llama.cpp loads it
  (src/models/mimo2.cpp): sliding-window and full-attention layers mixed by a
  per-layer pattern, attention sinks, K/Q head size 192 and V head size 128,
  per-layer KV head counts (full and SWA layers differ), partial RoPE, a dense
  first layer and (tiny) sigmoid-routed MoE layers after it; optionally (``n_mtp``, CLI
  ``--mtp N``, preset ``tiny-mtp``) MiMo's multi-token-prediction (NextN) blocks after the trunk,
  for ``--spec-type draft-mtp``.
* ``write_llama_like``: arch ``llama`` (Llama-3.1-8B shape by default) with
  Q4_K_M-like weights: Q4_K everywhere, Q6_K for the output matrix and for
  attn_v / ffn_down on the layers llama.cpp's Q4_K_M recipe gives more bits.

Weights are random. Quantized tensors are synthesized block by block (random
quants, scales chosen so each tensor has the requested standard deviation),
which is as fast as writing the bytes, so an 8B-shaped file takes seconds.
Float tensors are Gaussian. Scales are chosen so that attention scores, the
residual stream and the logits are all O(1): the next-token distribution is
neither one-hot nor uniform (``tests/test_synth_models.py`` checks entropy).

Tokenizer metadata (``tokenizer.*``) is copied from a real GGUF (SmolLM2), or
from a vocab-only GGUF made with ``vocab-only`` (small enough to carry).
The vocabulary can be padded with unused tokens to a model's real size
(e.g. 128256 for Llama 3.1) so the output matrix has the real shape.

CLI::

    python tools/synth_models.py mimo OUT.gguf --preset tiny|tiny-mtp|attn [--mtp N] [--mtp-head random|echo]
        [--tokenizer-from GGUF]
    python tools/synth_models.py llama OUT.gguf --preset tiny|llama-3.1-8b [--tokenizer-from GGUF]
    python tools/synth_models.py vocab-only SRC.gguf OUT.gguf
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_REPO = Path(__file__).resolve().parent.parent


def _import_gguf():
    """Import the gguf package, preferring the copy vendored with the pinned llama.cpp."""
    candidates = []
    if os.environ.get("LLAMA_VQ_GGUF_PY"):
        candidates.append(Path(os.environ["LLAMA_VQ_GGUF_PY"]))
    candidates.append(_REPO / "vendor" / "llama.cpp" / "gguf-py")
    for cand in candidates:
        if (cand / "gguf" / "__init__.py").is_file():
            if str(cand) not in sys.path:
                sys.path.insert(0, str(cand))
            break
    import gguf  # noqa: PLC0415

    return gguf


gguf = _import_gguf()
GQT = gguf.GGMLQuantizationType

# ----------------------------------------------------------------------------
# tokenizer metadata


def default_tokenizer_source() -> Path:
    """A GGUF to copy tokenizer metadata from.

    Order: $LLAMA_VQ_TOKENIZER_GGUF, then the SmolLM2 test model through
    ``python -m llama_vq.models path``. Raises FileNotFoundError otherwise.
    """
    env = os.environ.get("LLAMA_VQ_TOKENIZER_GGUF")
    if env:
        return Path(env)
    try:
        out = (
            subprocess.run(
                [sys.executable, "-m", "llama_vq.models", "path"],
                check=True,
                capture_output=True,
                text=True,
                cwd=_REPO,
                timeout=600,
            )
            .stdout.strip()
            .splitlines()
        )
        if out and Path(out[-1]).is_file():
            return Path(out[-1])
    except (subprocess.SubprocessError, OSError):
        pass
    raise FileNotFoundError(
        "no tokenizer source: pass tokenizer_from=<a GGUF with tokenizer.* metadata> "
        "or set LLAMA_VQ_TOKENIZER_GGUF"
    )


@dataclass
class _KV:
    value: object
    vtype: object
    sub_type: object | None = None


_SCALAR_FMT = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}


@dataclass
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order (ne0 first)
    qtype: int
    nbytes: int
    offset: int = 0  # of its data in the file


def read_gguf_header(
    path: str | os.PathLike, keys: Callable[[str], bool] = lambda k: True, tensors: bool = False
) -> tuple[dict[str, _KV], list[TensorInfo]]:
    """Parse a GGUF header: metadata whose key passes ``keys``; with ``tensors``, the tensor infos.

    A small parser: gguf.GGUFReader takes ~10 s on a 49k-token vocabulary.
    """
    import mmap  # noqa: PLC0415
    import struct  # noqa: PLC0415

    with open(path, "rb") as fh:
        data = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    pos = 0

    def take(fmt: str):
        nonlocal pos
        (v,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v

    def take_str() -> str:
        nonlocal pos
        n = take("<Q")
        v = bytes(data[pos : pos + n]).decode("utf-8")
        pos += n
        return v

    if data[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    pos = 4
    version = take("<I")
    if version < 2:
        raise ValueError(f"{path}: GGUF version {version} is not supported")
    n_tensors = take("<Q")
    n_kv = take("<Q")
    kv: dict[str, _KV] = {}
    alignment = 32
    for _ in range(n_kv):
        key = take_str()
        vtype = take("<I")
        sub_type = None
        if vtype == 9:
            sub_type = take("<I")
            n = take("<Q")
            if sub_type == 9:
                raise ValueError(f"{path}: nested arrays ({key}) are not supported")
            if sub_type == 8:
                value = [take_str() for _ in range(n)]
            else:
                fmt = _SCALAR_FMT[sub_type]
                size = struct.calcsize(fmt)
                value = [x[0] for x in struct.iter_unpack(fmt, data[pos : pos + n * size])]
                pos += n * size
        else:
            value = take_str() if vtype == 8 else take(_SCALAR_FMT[vtype])
        if key == "general.alignment":
            alignment = int(value)
        if keys(key):
            kv[key] = _KV(
                value,
                gguf.GGUFValueType(vtype),
                gguf.GGUFValueType(sub_type) if sub_type is not None else None,
            )
    infos: list[TensorInfo] = []
    if tensors:
        for _ in range(n_tensors):
            name = take_str()
            nd = take("<I")
            shape = tuple(take("<Q") for _ in range(nd))
            qtype = take("<I")
            offset = take("<Q")
            block, type_size = gguf.GGML_QUANT_SIZES[GQT(qtype)]
            infos.append(TensorInfo(name, shape, qtype, int(np.prod(shape)) // block * type_size, offset))
        data_start = (pos + alignment - 1) // alignment * alignment
        for info in infos:
            info.offset += data_start
    data.close()
    return kv, infos


def read_tensor_bytes(path: str | os.PathLike, info: TensorInfo) -> bytes:
    """The raw data of one tensor (``info`` from ``read_gguf_header(..., tensors=True)``)."""
    with open(path, "rb") as fh:
        fh.seek(info.offset)
        return fh.read(info.nbytes)


def read_tokenizer_kv(src: str | os.PathLike) -> dict[str, _KV]:
    """Read every ``tokenizer.*`` key of a GGUF file, with its GGUF value type."""
    kv, _ = read_gguf_header(src, keys=lambda k: k.startswith("tokenizer."))
    if "tokenizer.ggml.tokens" not in kv:
        raise ValueError(f"{src}: no tokenizer.ggml.tokens")
    return kv


def _add_tokenizer(writer, tok: dict[str, _KV], n_vocab: int | None) -> int:
    """Add tokenizer metadata to ``writer``, vocabulary padded to ``n_vocab``; return its size."""
    tokens = list(tok["tokenizer.ggml.tokens"].value)
    types = (
        list(tok["tokenizer.ggml.token_type"].value) if "tokenizer.ggml.token_type" in tok else None
    )
    if n_vocab is not None and n_vocab > len(tokens):
        extra = n_vocab - len(tokens)
        tokens += [f"<|llama_vq_pad_{i}|>" for i in range(extra)]
        if types is not None:
            types += [int(gguf.TokenType.UNUSED)] * extra
    elif n_vocab is not None and n_vocab < len(tokens):
        raise ValueError(f"n_vocab={n_vocab} is smaller than the tokenizer's {len(tokens)} tokens")
    for key, kv in tok.items():
        value = kv.value
        if key == "tokenizer.ggml.tokens":
            value = tokens
        elif key == "tokenizer.ggml.token_type":
            value = types
        writer.add_key_value(key, value, kv.vtype, sub_type=kv.sub_type)
    return len(tokens)


# ----------------------------------------------------------------------------
# random tensors


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16)


class _Rand:
    """Random tensor synthesizer. Shapes are numpy order: (rows, row_length)."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def _bytes(self, n: int) -> np.ndarray:
        # Generator.integers on uint64 is ~8x faster than Generator.bytes
        words = self.rng.integers(
            0, np.iinfo(np.uint64).max, size=(n + 7) // 8, dtype=np.uint64, endpoint=True
        )
        return words.view(np.uint8)[:n]

    def _signs(self, n: int) -> np.ndarray:
        return np.where(self.rng.integers(0, 2, size=n, dtype=np.uint8) == 1, 1.0, -1.0)

    def tensor(self, shape: Sequence[int], qtype, std: float) -> tuple[np.ndarray, object]:
        """A random tensor of ``qtype`` whose values have standard deviation ``std`` (mean 0).

        Returns (data, raw_dtype) for GGUFWriter: float arrays for F32/F16,
        uint8 block bytes of shape (rows, bytes_per_row) otherwise.
        """
        shape = tuple(int(s) for s in shape)
        if qtype == GQT.F32:
            return (self.rng.standard_normal(shape, dtype=np.float32) * std).astype(
                np.float32
            ), None
        if qtype == GQT.F16:
            return _f16(self.rng.standard_normal(shape, dtype=np.float32) * std), None
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        n_per_row = shape[-1]
        if n_per_row % block:
            raise ValueError(
                f"row length {n_per_row} is not a multiple of {qtype.name}'s block {block}"
            )
        n_rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        n_blocks = n_rows * n_per_row // block
        raw = self._bytes(n_blocks * type_size).reshape(n_blocks, type_size)
        fill = _BLOCK_FILL.get(qtype)
        if fill is None:
            raise ValueError(f"no random block synthesizer for {qtype.name}")
        fill(self, raw, std)
        return raw.reshape(*shape[:-1], n_per_row // block * type_size), qtype


# Each filler overwrites the scale fields of random block bytes so that the
# dequantized values have standard deviation ``std`` and mean ~0. The quant
# bits stay uniformly random. Signs of the (signed) block scales are random,
# which cancels the small offset of the unsigned quant codes.

_UNIF_STD_4BIT = math.sqrt((16 * 16 - 1) / 12.0)  # std of (q - 7.5), q uniform in 0..15
_UNIF_STD_6BIT = math.sqrt((64 * 64 - 1) / 12.0)


def _fill_q8_0(r: _Rand, raw: np.ndarray, std: float) -> None:
    # block: d (f16), qs[32] (int8, uniform in -128..127: E[q^2] = (256^2 - 1)/12 + 1/4)
    q_std = math.sqrt((256 * 256 - 1) / 12.0 + 0.25)
    d = _f16(r._signs(len(raw)) * (std / q_std))
    raw[:, 0:2] = d.view(np.uint8).reshape(-1, 2)


def _fill_q4_0(r: _Rand, raw: np.ndarray, std: float) -> None:
    # block: d (f16), qs[16] nibbles; value = d * (q - 8)
    q_std = math.sqrt(_UNIF_STD_4BIT**2 + 0.25)  # E[(q-8)^2]
    d = _f16(r._signs(len(raw)) * (std / q_std))
    raw[:, 0:2] = d.view(np.uint8).reshape(-1, 2)


def _fill_q4_k(r: _Rand, raw: np.ndarray, std: float) -> None:
    # block (256 values): d, dmin (f16), scales[12] (8 x 6-bit scale + 8 x 6-bit min), qs[128].
    # value = d * sc * q - dmin * m. Using m = sc and dmin = 7.5 d gives d * sc * (q - 7.5).
    n = len(raw)
    sc = r.rng.integers(32, 64, size=(n, 8), dtype=np.uint8)
    m = sc
    sc_rms = math.sqrt(float(np.mean(np.arange(32, 64, dtype=np.float64) ** 2)))
    d = r._signs(n) * (std / (sc_rms * _UNIF_STD_4BIT))
    raw[:, 0:2] = _f16(d).view(np.uint8).reshape(-1, 2)
    raw[:, 2:4] = _f16(7.5 * d).view(np.uint8).reshape(-1, 2)
    s = np.zeros((n, 12), dtype=np.uint8)
    for j in range(4):
        s[:, j] = (sc[:, j] & 63) | ((sc[:, j + 4] >> 4) << 6)
        s[:, j + 4] = (m[:, j] & 63) | ((m[:, j + 4] >> 4) << 6)
        s[:, j + 8] = (sc[:, j + 4] & 0xF) | ((m[:, j + 4] & 0xF) << 4)
    raw[:, 4:16] = s


def _fill_q6_k(r: _Rand, raw: np.ndarray, std: float) -> None:
    # block (256 values): ql[128], qh[64], scales[16] (int8), d (f16); value = d * sc * (q - 32)
    n = len(raw)
    sc = r.rng.integers(64, 128, size=(n, 16), dtype=np.int8)
    sc[:, 1::2] *= -1  # half the sub-block scales negative: cancels the -0.5 mean of (q - 32)
    raw[:, 192:208] = sc.view(np.uint8)
    sc_rms = math.sqrt(float(np.mean(np.arange(64, 128, dtype=np.float64) ** 2)))
    q_std = math.sqrt(_UNIF_STD_6BIT**2 + 0.25)
    d = _f16(np.full(n, std / (sc_rms * q_std)))
    raw[:, 208:210] = d.view(np.uint8).reshape(-1, 2)


_BLOCK_FILL: dict[object, Callable[[_Rand, np.ndarray, float], None]] = {
    GQT.Q8_0: _fill_q8_0,
    GQT.Q4_0: _fill_q4_0,
    GQT.Q4_K: _fill_q4_k,
    GQT.Q6_K: _fill_q6_k,
}


_Maker = Callable[[_Rand], tuple[np.ndarray, object]]


def _rnd(shape_ggml: Sequence[int], qtype, std: float) -> _Maker:
    return lambda r: r.tensor(tuple(reversed(shape_ggml)), qtype, std)


def _ones(n: int) -> _Maker:
    return lambda r: (np.ones(n, dtype=np.float32), None)


class _Streamer:
    """Writes a GGUF whose tensors are produced one at a time (no whole model in memory).

    Tensor i is drawn from its own generator seeded with (seed, i), so the file does not depend
    on how many threads produce the tensors.
    """

    def __init__(self, path: Path, arch: str, seed: int):
        self.path = Path(path)
        self.seed = seed
        self.writer = gguf.GGUFWriter(str(self.path), arch)
        self.plan: list[tuple[str, _Maker]] = []

    def add(self, name: str, shape_ggml: Sequence[int], qtype, make: _Maker) -> None:
        """Register tensor ``name`` of ggml shape ``shape_ggml`` (ne0 first)."""
        np_shape = tuple(reversed([int(s) for s in shape_ggml]))
        if qtype in (GQT.F32, GQT.F16):
            nbytes = int(np.prod(np_shape)) * (4 if qtype == GQT.F32 else 2)
            dtype = np.float32 if qtype == GQT.F32 else np.float16
            self.writer.add_tensor_info(name, np_shape, np.dtype(dtype), nbytes, raw_dtype=None)
        else:
            block, type_size = gguf.GGML_QUANT_SIZES[qtype]
            nbytes = int(np.prod(np_shape)) // block * type_size
            self.writer.add_tensor_info(
                name, np_shape, np.dtype(np.float32), nbytes, raw_dtype=qtype
            )
        self.plan.append((name, make))

    def write(self, threads: int | None = None) -> None:
        from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

        w = self.writer
        w.write_header_to_file(self.path)
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        threads = threads or min(8, os.cpu_count() or 1)

        def produce(i: int) -> np.ndarray:
            return self.plan[i][1](_Rand([self.seed, i]))[0]

        # numpy releases the GIL in bulk random generation and arithmetic: produce ahead in threads
        with ThreadPoolExecutor(max_workers=threads) as pool:
            pending = {}
            ahead = 2 * threads
            for i in range(min(ahead, len(self.plan))):
                pending[i] = pool.submit(produce, i)
            for i in range(len(self.plan)):
                data = pending.pop(i).result()
                if i + ahead < len(self.plan):
                    pending[i + ahead] = pool.submit(produce, i + ahead)
                w.write_tensor_data(data)
        w.close()


# ----------------------------------------------------------------------------
# scale choices (see module docstring)

_ATTN_SCORE_STD = 1.5  # std of q and k elements after projection: scores q.k/sqrt(d) ~ N(0, 1.5^2)


@dataclass
class _Scales:
    logit_std: float = 4.0  # std of logits across the vocabulary for an RMS-normed hidden state
    embd_std: float = 1.0
    attn_out_gain: float = 1.0
    ffn_out_gain: float = 0.5


def _w_std(n_in: int, gain: float = 1.0) -> float:
    return gain / math.sqrt(n_in)


# ----------------------------------------------------------------------------
# MiMo-like (arch mimo2)

MIMO_PRESETS: dict[str, dict] = {
    # loads and runs on CPU in well under a second per token; the sliding window (32) wraps
    # with prompts longer than 32 tokens
    "tiny": dict(
        n_layer=4,
        n_embd=256,
        n_head=8,
        n_head_kv_full=2,
        n_head_kv_swa=4,
        head_k=192,
        head_v=128,
        n_rot=64,
        n_swa=32,
        swa_pattern=[0, 1, 1, 0],
        n_ff=512,
        n_expert=4,
        n_expert_used=2,
        n_ff_exp=64,
        weight_type="f16",
        n_ctx_train=4096,
        n_vocab=None,
        n_mtp=0,
    ),
    # "tiny" with one MTP (nextn) block after the trunk, for draft-mtp speculation on CPU
    "tiny-mtp": dict(
        n_layer=4,
        n_embd=256,
        n_head=8,
        n_head_kv_full=2,
        n_head_kv_swa=4,
        head_k=192,
        head_v=128,
        n_rot=64,
        n_swa=32,
        swa_pattern=[0, 1, 1, 0],
        n_ff=512,
        n_expert=4,
        n_expert_used=2,
        n_ff_exp=64,
        weight_type="f16",
        n_ctx_train=4096,
        n_vocab=None,
        n_mtp=1,
    ),
    # MiMo-V2-Flash's attention (hidden 4096, 64 heads, K 192 / V 128, full layers 4 KV heads,
    # SWA layers 8 KV heads, window 128, 1 full layer in 6, sinks on SWA layers) with a tiny MoE:
    # attention dominates, as it does for the KV-cache question
    "attn": dict(
        n_layer=48,
        n_embd=4096,
        n_head=64,
        n_head_kv_full=4,
        n_head_kv_swa=8,
        head_k=192,
        head_v=128,
        n_rot=64,
        n_swa=128,
        swa_pattern=None,
        n_ff=1024,
        n_expert=8,
        n_expert_used=2,
        n_ff_exp=256,
        weight_type="q8_0",
        n_ctx_train=262144,
        n_vocab=None,
        n_mtp=0,
    ),
}


def mimo_swa_pattern(n_layer: int, full_every: int = 6) -> list[int]:
    """1 = sliding-window layer, 0 = full: layer 0 full, then a full layer every ``full_every``."""
    return [0 if (il % full_every) == 0 else 1 for il in range(n_layer)]


def _qtype(name: str):
    return {
        "f32": GQT.F32,
        "f16": GQT.F16,
        "q8_0": GQT.Q8_0,
        "q4_0": GQT.Q4_0,
        "q4_k": GQT.Q4_K,
        "q6_k": GQT.Q6_K,
    }[name.lower()]


def _tensor_name(t, il: int) -> str:
    """gguf-py's name of per-block tensor ``t`` (the names the pinned llama.cpp looks up)."""
    return gguf.TENSOR_NAMES[t].format(bid=il) + ".weight"


def write_mimo_like(
    path: str | os.PathLike,
    *,
    preset: str = "tiny",
    n_layer: int | None = None,
    tokenizer_from: str | os.PathLike | None = None,
    seed: int = 0,
    sinks: str = "swa",
    fused_qkv: bool = True,
    mtp_head: str = "random",
    **overrides,
) -> Path:
    """Write a random-weight GGUF of arch ``mimo2`` and return its path.

    ``preset`` is "tiny" (CPU tests), "tiny-mtp" (tiny with one MTP block) or "attn"
    (MiMo-V2-Flash attention shape, for GPU benchmarks); any preset field can be overridden by
    keyword (n_embd, n_head, n_head_kv_full, n_head_kv_swa, head_k, head_v, n_rot, n_swa,
    swa_pattern, n_ff, n_expert, n_expert_used, n_ff_exp, weight_type, n_ctx_train, n_vocab,
    n_mtp). ``sinks`` is "swa", "all" or "none" (which layers carry an attention-sink tensor;
    MiMo-V2 has them on SWA layers). ``fused_qkv`` writes one attn_qkv matrix (MiMo-V2.5
    checkpoints) instead of attn_q/attn_k/attn_v.

    ``n_mtp`` > 0 appends that many multi-token-prediction (NextN) blocks after the trunk, laid
    out as the pinned llama.cpp's converter (conversion/mimo.py) writes MiMo's ``model.mtp.layers``
    and as src/models/mimo2.cpp loads them: ``block_count`` counts trunk + MTP blocks,
    ``mimo2.nextn_predict_layers`` = n_mtp, the MTP blocks are SWA blocks (pattern and KV head
    arrays extended with SWA entries), each with a fused attn_qkv, attn_output, sinks, a dense FFN,
    ``nextn.eh_proj`` / ``nextn.enorm`` / ``nextn.hnorm`` and ``layer_output_norm`` (the MTP
    head's own output norm); token embedding and LM head are the trunk's (no nextn.embed_tokens /
    shared_head). MTP blocks always use a fused attn_qkv: the MTP graph requires it.

    ``mtp_head="echo"`` makes each MTP block predict its input token instead (a test construct, so
    that drafts get accepted): eh_proj passes the normed token embedding through (identity on that
    half, zero on the hidden-state half), attn_output and ffn_down are zero (the block adds nothing),
    and ``nextn.shared_head_head`` is a copy of token_embd, whose row of the input token then scores
    highest. Drafts repeat the last token; the trunk accepts them wherever it repeats a token.
    """
    if mtp_head not in ("random", "echo"):
        raise ValueError(f"mtp_head must be 'random' or 'echo', not {mtp_head!r}")
    if preset not in MIMO_PRESETS:
        raise ValueError(f"unknown mimo preset {preset!r}; known: {sorted(MIMO_PRESETS)}")
    p = dict(MIMO_PRESETS[preset])
    if n_layer is not None:
        p["n_layer"] = n_layer
        if "swa_pattern" not in overrides:
            p["swa_pattern"] = None
    unknown = set(overrides) - set(p)
    if unknown:
        raise TypeError(f"unknown parameters: {sorted(unknown)}")
    p.update(overrides)
    nl = p["n_layer"]
    n_mtp = int(p.get("n_mtp") or 0)
    if n_mtp < 0:
        raise ValueError(f"n_mtp must be >= 0, not {n_mtp}")
    pattern = list(p["swa_pattern"]) if p["swa_pattern"] is not None else mimo_swa_pattern(nl)
    if len(pattern) != nl:
        raise ValueError(f"swa_pattern has {len(pattern)} entries for {nl} layers")
    if sinks not in ("swa", "all", "none"):
        raise ValueError(f"sinks must be 'swa', 'all' or 'none', not {sinks!r}")
    # the MTP blocks attend like SWA layers (conversion/mimo.py extends the pattern with 1s)
    pattern_all = pattern + [1] * n_mtp
    nl_all = nl + n_mtp

    n_embd, n_head, hk, hv = p["n_embd"], p["n_head"], p["head_k"], p["head_v"]
    kv_heads = [p["n_head_kv_swa"] if s else p["n_head_kv_full"] for s in pattern_all]
    wt = _qtype(p["weight_type"])
    expert_t = GQT.F16 if wt == GQT.F16 else GQT.Q8_0
    sc = _Scales()

    tok = read_tokenizer_kv(tokenizer_from or default_tokenizer_source())
    out = _Streamer(Path(path), "mimo2", seed)
    w = out.writer
    w.add_name(f"llama-vq synthetic mimo2 ({preset})")
    w.add_context_length(p["n_ctx_train"])
    w.add_embedding_length(n_embd)
    w.add_block_count(nl_all)
    w.add_feed_forward_length(p["n_ff"])
    w.add_head_count(n_head)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(hk)
    w.add_value_length(hv)
    w.add_rope_dimension_count(p["n_rot"])
    w.add_rope_freq_base(5_000_000.0)
    w.add_rope_freq_base_swa(10_000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_sliding_window(p["n_swa"])
    w.add_sliding_window_pattern(pattern_all)
    w.add_expert_count(p["n_expert"])
    w.add_expert_used_count(p["n_expert_used"])
    w.add_expert_feed_forward_length(p["n_ff_exp"])
    if n_mtp:
        w.add_nextn_predict_layers(n_mtp)
    w.add_file_type(
        gguf.LlamaFileType.MOSTLY_F16 if wt == GQT.F16 else gguf.LlamaFileType.MOSTLY_Q8_0
    )
    n_vocab = _add_tokenizer(w, tok, p["n_vocab"])
    w.add_vocab_size(n_vocab)

    ones, rnd = _ones, _rnd

    qk_std = _w_std(n_embd, _ATTN_SCORE_STD)

    def zeros(shape_ggml: Sequence[int]) -> _Maker:
        return lambda r: (np.zeros(tuple(reversed(shape_ggml)), dtype=np.float16), None)

    def add_attention(il: int, fused: bool, zero_out: bool = False) -> None:
        nkv = kv_heads[il]
        b = f"blk.{il}."
        out.add(b + "attn_norm.weight", (n_embd,), GQT.F32, ones(n_embd))
        if fused:
            # rows: [Q (n_head*hk) | K (nkv*hk) | V (nkv*hv)]; one std for all three
            n_qkv = n_head * hk + nkv * hk + nkv * hv
            out.add(b + "attn_qkv.weight", (n_embd, n_qkv), wt, rnd((n_embd, n_qkv), wt, qk_std))
        else:
            out.add(
                b + "attn_q.weight",
                (n_embd, n_head * hk),
                wt,
                rnd((n_embd, n_head * hk), wt, qk_std),
            )
            out.add(
                b + "attn_k.weight", (n_embd, nkv * hk), wt, rnd((n_embd, nkv * hk), wt, qk_std)
            )
            out.add(
                b + "attn_v.weight",
                (n_embd, nkv * hv),
                wt,
                rnd((n_embd, nkv * hv), wt, _w_std(n_embd)),
            )
        if zero_out:
            out.add(b + "attn_output.weight", (n_head * hv, n_embd), GQT.F16, zeros((n_head * hv, n_embd)))
        else:
            out.add(
                b + "attn_output.weight",
                (n_head * hv, n_embd),
                wt,
                rnd((n_head * hv, n_embd), wt, _w_std(n_head * hv, sc.attn_out_gain * 2.0)),
            )
        if sinks == "all" or (sinks == "swa" and pattern_all[il]):
            out.add(
                b + "attn_sinks.weight",
                (n_head,),
                GQT.F32,
                lambda r: ((r.rng.standard_normal(n_head) * 0.5 + 1.0).astype(np.float32), None),
            )
        out.add(b + "ffn_norm.weight", (n_embd,), GQT.F32, ones(n_embd))

    def add_dense_ffn(il: int, zero_out: bool = False) -> None:
        b = f"blk.{il}."
        nf = p["n_ff"]
        out.add(b + "ffn_gate.weight", (n_embd, nf), wt, rnd((n_embd, nf), wt, _w_std(n_embd)))
        out.add(b + "ffn_up.weight", (n_embd, nf), wt, rnd((n_embd, nf), wt, _w_std(n_embd)))
        if zero_out:
            out.add(b + "ffn_down.weight", (nf, n_embd), GQT.F16, zeros((nf, n_embd)))
        else:
            out.add(
                b + "ffn_down.weight",
                (nf, n_embd),
                wt,
                rnd((nf, n_embd), wt, _w_std(nf, sc.ffn_out_gain)),
            )

    tok_embd = rnd((n_embd, n_vocab), wt, sc.embd_std)
    i_tok_embd = len(out.plan)  # its generator's seed index: an echo head redraws the same tensor
    out.add("token_embd.weight", (n_embd, n_vocab), wt, tok_embd)
    for il in range(nl):
        b = f"blk.{il}."
        add_attention(il, fused_qkv)
        if il == 0 or p["n_expert"] == 0:
            add_dense_ffn(il)
        else:
            ne, nfe = p["n_expert"], p["n_ff_exp"]
            out.add(
                b + "ffn_gate_inp.weight",
                (n_embd, ne),
                GQT.F32,
                rnd((n_embd, ne), GQT.F32, _w_std(n_embd)),
            )
            out.add(
                b + "exp_probs_b.bias",
                (ne,),
                GQT.F32,
                lambda r, ne=ne: (np.zeros(ne, dtype=np.float32), None),
            )
            out.add(
                b + "ffn_gate_exps.weight",
                (n_embd, nfe, ne),
                expert_t,
                rnd((n_embd, nfe, ne), expert_t, _w_std(n_embd)),
            )
            out.add(
                b + "ffn_up_exps.weight",
                (n_embd, nfe, ne),
                expert_t,
                rnd((n_embd, nfe, ne), expert_t, _w_std(n_embd)),
            )
            out.add(
                b + "ffn_down_exps.weight",
                (nfe, n_embd, ne),
                expert_t,
                rnd((nfe, n_embd, ne), expert_t, _w_std(nfe, sc.ffn_out_gain)),
            )
    out.add("output_norm.weight", (n_embd,), GQT.F32, ones(n_embd))
    out.add(
        "output.weight",
        (n_embd, n_vocab),
        wt,
        rnd((n_embd, n_vocab), wt, sc.logit_std / math.sqrt(n_embd)),
    )
    for il in range(nl, nl_all):
        # MTP block (after the trunk's tensors, so that its random draws stay those of the model
        # without MTP blocks): eh_proj([enorm(embd(t+1)) | hnorm(h_t)]) -> decoder block -> layer_output_norm
        # -> the trunk's LM head
        echo = mtp_head == "echo"
        add_attention(il, True, zero_out=echo)
        add_dense_ffn(il, zero_out=echo)
        eh_proj = _tensor_name(gguf.MODEL_TENSOR.NEXTN_EH_PROJ, il)
        if echo:
            # rows are outputs; columns [0, n_embd) read enorm(embd), [n_embd, 2 n_embd) hnorm(h)
            eye = np.hstack([np.eye(n_embd), np.zeros((n_embd, n_embd))]).astype(np.float16)
            out.add(eh_proj, (2 * n_embd, n_embd), GQT.F16, lambda r, eye=eye: (eye, None))
            out.add(
                _tensor_name(gguf.MODEL_TENSOR.NEXTN_SHARED_HEAD_HEAD, il),
                (n_embd, n_vocab),
                wt,
                lambda r: tok_embd(_Rand([seed, i_tok_embd])),
            )
        else:
            out.add(eh_proj, (2 * n_embd, n_embd), wt, rnd((2 * n_embd, n_embd), wt, _w_std(2 * n_embd)))
        for t in (
            gguf.MODEL_TENSOR.NEXTN_ENORM,
            gguf.MODEL_TENSOR.NEXTN_HNORM,
            gguf.MODEL_TENSOR.LAYER_OUT_NORM,
        ):
            out.add(_tensor_name(t, il), (n_embd,), GQT.F32, ones(n_embd))
    out.write()
    return Path(path)


# ----------------------------------------------------------------------------
# Llama-like (arch llama), Q4_K_M-like

LLAMA_PRESETS: dict[str, dict] = {
    "llama-3.1-8b": dict(
        n_layer=32,
        n_embd=4096,
        n_head=32,
        n_head_kv=8,
        n_ff=14336,
        n_vocab=128256,
        rope_base=500000.0,
        n_ctx_train=131072,
        recipe="q4_k_m",
    ),
    # CPU tests: Q4_K needs rows that are multiples of 256
    "tiny": dict(
        n_layer=2,
        n_embd=256,
        n_head=4,
        n_head_kv=2,
        n_ff=512,
        n_vocab=None,
        rope_base=10000.0,
        n_ctx_train=4096,
        recipe="q4_k_m",
    ),
}


def _q4_k_m_more_bits(il: int, n_layer: int) -> bool:
    # llama.cpp's use_more_bits() for Q4_K_M's attn_v / ffn_down
    return il < n_layer // 8 or il >= 7 * n_layer // 8 or (il - n_layer // 8) % 3 == 2


def write_llama_like(
    path: str | os.PathLike,
    preset: str = "llama-3.1-8b",
    *,
    tokenizer_from: str | os.PathLike | None = None,
    seed: int = 0,
    **overrides,
) -> Path:
    """Write a random-weight GGUF of arch ``llama`` and return its path.

    Presets: "llama-3.1-8b" (32 layers, 32 heads, 8 KV heads, head 128, n_ff 14336, vocab
    128256 padded from the tokenizer source) and "tiny". Weights follow llama.cpp's Q4_K_M
    recipe: Q4_K, with Q6_K for output.weight and for attn_v / ffn_down on the layers
    use_more_bits() selects. ``recipe="f16"`` writes F16 weights instead.
    """
    if preset not in LLAMA_PRESETS:
        raise ValueError(f"unknown llama preset {preset!r}; known: {sorted(LLAMA_PRESETS)}")
    p = dict(LLAMA_PRESETS[preset])
    unknown = set(overrides) - set(p)
    if unknown:
        raise TypeError(f"unknown parameters: {sorted(unknown)}")
    p.update(overrides)
    nl, n_embd, n_head, n_kv, n_ff = (
        p["n_layer"],
        p["n_embd"],
        p["n_head"],
        p["n_head_kv"],
        p["n_ff"],
    )
    hd = n_embd // n_head
    if p["recipe"] == "q4_k_m":
        base_t, more_t, out_t, ftype = (
            GQT.Q4_K,
            GQT.Q6_K,
            GQT.Q6_K,
            gguf.LlamaFileType.MOSTLY_Q4_K_M,
        )
    elif p["recipe"] == "f16":
        base_t = more_t = out_t = GQT.F16
        ftype = gguf.LlamaFileType.MOSTLY_F16
    else:
        raise ValueError(f"recipe must be 'q4_k_m' or 'f16', not {p['recipe']!r}")
    sc = _Scales()

    tok = read_tokenizer_kv(tokenizer_from or default_tokenizer_source())
    out = _Streamer(Path(path), "llama", seed)
    w = out.writer
    w.add_name(f"llama-vq synthetic llama ({preset})")
    w.add_context_length(p["n_ctx_train"])
    w.add_embedding_length(n_embd)
    w.add_block_count(nl)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(p["rope_base"])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(ftype)
    n_vocab = _add_tokenizer(w, tok, p["n_vocab"])
    w.add_vocab_size(n_vocab)

    ones, rnd = _ones, _rnd
    qk_std = _w_std(n_embd, _ATTN_SCORE_STD)
    out.add(
        "token_embd.weight", (n_embd, n_vocab), base_t, rnd((n_embd, n_vocab), base_t, sc.embd_std)
    )
    for il in range(nl):
        b = f"blk.{il}."
        more = more_t if _q4_k_m_more_bits(il, nl) else base_t
        out.add(b + "attn_norm.weight", (n_embd,), GQT.F32, ones(n_embd))
        out.add(
            b + "attn_q.weight", (n_embd, n_embd), base_t, rnd((n_embd, n_embd), base_t, qk_std)
        )
        out.add(
            b + "attn_k.weight",
            (n_embd, n_kv * hd),
            base_t,
            rnd((n_embd, n_kv * hd), base_t, qk_std),
        )
        out.add(
            b + "attn_v.weight",
            (n_embd, n_kv * hd),
            more,
            rnd((n_embd, n_kv * hd), more, _w_std(n_embd)),
        )
        out.add(
            b + "attn_output.weight",
            (n_embd, n_embd),
            base_t,
            rnd((n_embd, n_embd), base_t, _w_std(n_embd, sc.attn_out_gain * 2.0)),
        )
        out.add(b + "ffn_norm.weight", (n_embd,), GQT.F32, ones(n_embd))
        out.add(
            b + "ffn_gate.weight",
            (n_embd, n_ff),
            base_t,
            rnd((n_embd, n_ff), base_t, _w_std(n_embd)),
        )
        out.add(
            b + "ffn_up.weight", (n_embd, n_ff), base_t, rnd((n_embd, n_ff), base_t, _w_std(n_embd))
        )
        out.add(
            b + "ffn_down.weight",
            (n_ff, n_embd),
            more,
            rnd((n_ff, n_embd), more, _w_std(n_ff, sc.ffn_out_gain)),
        )
    out.add("output_norm.weight", (n_embd,), GQT.F32, ones(n_embd))
    out.add(
        "output.weight",
        (n_embd, n_vocab),
        out_t,
        rnd((n_embd, n_vocab), out_t, sc.logit_std / math.sqrt(n_embd)),
    )
    out.write()
    return Path(path)


# ----------------------------------------------------------------------------
# vocab-only GGUF (small tokenizer source to carry to another machine)


def write_vocab_only(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """Write a GGUF holding only the ``tokenizer.*`` metadata of ``src`` (a few MB)."""
    tok = read_tokenizer_kv(src)
    w = gguf.GGUFWriter(str(dst), "llama")
    _add_tokenizer(w, tok, None)
    w.write_header_to_file(Path(dst))
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return Path(dst)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("mimo", help="write a mimo2 model")
    m.add_argument("out")
    m.add_argument("--preset", default="tiny", choices=sorted(MIMO_PRESETS))
    m.add_argument("--n-layer", type=int)
    m.add_argument("--sinks", default="swa", choices=["swa", "all", "none"])
    m.add_argument(
        "--split-qkv", action="store_true", help="attn_q/k/v instead of a fused attn_qkv"
    )
    m.add_argument("--weight-type", choices=["f16", "q8_0", "q4_0"])
    m.add_argument("--n-vocab", type=int, help="pad the vocabulary to this many tokens")
    m.add_argument(
        "--mtp-head",
        default="random",
        choices=["random", "echo"],
        help="echo: MTP blocks predict their input token (drafts that get accepted; a test construct)",
    )
    m.add_argument(
        "--mtp",
        type=int,
        metavar="N",
        help="append N multi-token-prediction (nextn) blocks (MiMo-V2-Flash has 3); "
        "overrides the preset's n_mtp",
    )
    ll = sub.add_parser("llama", help="write a llama model")
    ll.add_argument("out")
    ll.add_argument("--preset", default="llama-3.1-8b", choices=sorted(LLAMA_PRESETS))
    ll.add_argument("--n-layer", type=int)
    ll.add_argument("--recipe", choices=["q4_k_m", "f16"])
    for sp in (m, ll):
        sp.add_argument("--tokenizer-from", help="GGUF to copy tokenizer.* from (default: SmolLM2)")
        sp.add_argument("--seed", type=int, default=0)
    v = sub.add_parser("vocab-only", help="copy tokenizer.* metadata into a tensor-less GGUF")
    v.add_argument("src")
    v.add_argument("out")
    a = ap.parse_args(argv)

    if a.cmd == "vocab-only":
        write_vocab_only(a.src, a.out)
    elif a.cmd == "mimo":
        kw = {}
        if a.weight_type:
            kw["weight_type"] = a.weight_type
        if a.n_vocab:
            kw["n_vocab"] = a.n_vocab
        if a.mtp is not None:
            kw["n_mtp"] = a.mtp
        write_mimo_like(
            a.out,
            preset=a.preset,
            n_layer=a.n_layer,
            tokenizer_from=a.tokenizer_from,
            seed=a.seed,
            sinks=a.sinks,
            fused_qkv=not a.split_qkv,
            mtp_head=a.mtp_head,
            **kw,
        )
    else:
        kw = {}
        if a.n_layer:
            kw["n_layer"] = a.n_layer
        if a.recipe:
            kw["recipe"] = a.recipe
        write_llama_like(a.out, a.preset, tokenizer_from=a.tokenizer_from, seed=a.seed, **kw)
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
