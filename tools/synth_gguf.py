"""GGUF plumbing for tools/synth_models.py: the gguf package (the copy vendored with the pinned llama.cpp), reading a
GGUF's header and tensors, tokenizer metadata to copy, random weights block by block (quantized or float), the
streaming writer, and the scale choices that keep a random model's activations O(1)."""

from __future__ import annotations

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
        "no tokenizer source: pass tokenizer_from=<a GGUF with tokenizer.* metadata> or set LLAMA_VQ_TOKENIZER_GGUF"
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


def _add_tokenizer(
    writer,
    tok: dict[str, _KV],
    n_vocab: int | None,
    *,
    added_tokens: Sequence[str] = (),
    chat_template: str | None = None,
) -> int:
    """Add tokenizer metadata to ``writer``, vocabulary padded to ``n_vocab``; return its size.

    ``added_tokens`` are appended as user-defined tokens (one token each, matched in any text, as a Hugging Face
    tokenizer's added tokens); ``chat_template`` replaces the source's ``tokenizer.chat_template``."""
    tokens = list(tok["tokenizer.ggml.tokens"].value)
    types = list(tok["tokenizer.ggml.token_type"].value) if "tokenizer.ggml.token_type" in tok else None
    clash = [t for t in added_tokens if t in tokens]
    if clash:
        raise ValueError(f"added tokens {clash} are already in the vocabulary")
    if added_tokens and types is None:
        raise ValueError("added tokens need the source's tokenizer.ggml.token_type")
    tokens += list(added_tokens)
    if types is not None:
        types += [int(gguf.TokenType.USER_DEFINED)] * len(added_tokens)
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
        elif key == "tokenizer.chat_template" and chat_template is not None:
            continue
        writer.add_key_value(key, value, kv.vtype, sub_type=kv.sub_type)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
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
        words = self.rng.integers(0, np.iinfo(np.uint64).max, size=(n + 7) // 8, dtype=np.uint64, endpoint=True)
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
            return (self.rng.standard_normal(shape, dtype=np.float32) * std).astype(np.float32), None
        if qtype == GQT.F16:
            return _f16(self.rng.standard_normal(shape, dtype=np.float32) * std), None
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        n_per_row = shape[-1]
        if n_per_row % block:
            raise ValueError(f"row length {n_per_row} is not a multiple of {qtype.name}'s block {block}")
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
            self.writer.add_tensor_info(name, np_shape, np.dtype(np.float32), nbytes, raw_dtype=qtype)
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
