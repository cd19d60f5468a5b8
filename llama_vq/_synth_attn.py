"""A small GGUF of a model's attention shape, and the timing of one attention path on it, for measuring the attention
paths (attn_choice.py).

Arch ``llama`` with one full-attention layer where K and V heads are the same size and there are no sinks; else arch
``mimo2`` as the pinned llama.cpp loads it (K and V head sizes that differ, MiMo's 192 / 128, and attention sinks),
which needs a sliding-window layer besides: a second layer with a 128-token window, whose attention costs little
next to the full layer's at depth. Dense FFNs; the weights are small random numbers (timing does not depend on them,
but zeros could let a kernel skip work). The vocabulary is 259 tokens (three specials and the 256 byte tokens
llama.cpp's SPM vocabulary needs).
"""

from __future__ import annotations

import logging
import struct
import time
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("llama_vq.attn_choice")

_ALIGN = 32
_U32, _I32, _F32, _BOOL, _STR, _ARR = 4, 5, 6, 7, 8, 9
_GGML_F32, _GGML_F16 = 0, 1
N_VOCAB = 259


def _s(text: str) -> bytes:
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def _kv(key: str, vtype: int, value: object) -> bytes:
    out = _s(key) + struct.pack("<I", vtype)
    if vtype == _U32:
        return out + struct.pack("<I", value)
    if vtype == _F32:
        return out + struct.pack("<f", value)
    if vtype == _STR:
        return out + _s(str(value))
    raise ValueError(vtype)


def _arr(key: str, etype: int, items: list) -> bytes:
    out = _s(key) + struct.pack("<IIQ", _ARR, etype, len(items))
    for it in items:
        if etype == _STR:
            out += _s(it)
        elif etype == _F32:
            out += struct.pack("<f", it)
        elif etype in (_I32, _U32):
            out += struct.pack("<i", it)
        elif etype == _BOOL:
            out += struct.pack("<?", it)
    return out


def write_attn_gguf(
    path: Path, *, n_head: int, n_head_kv: int, head_k: int, head_v: int, n_ctx_train: int, sinks: bool
) -> None:
    """Write the stand-in of this attention shape to path."""
    n_embd, n_ff = 256, 256
    rng = np.random.default_rng(0)
    tensors: list[tuple[str, tuple[int, ...], int, bytes]] = []

    def add(name: str, shape: tuple[int, ...], f16: bool = True) -> None:
        n = int(np.prod(shape))
        if name.endswith("norm.weight"):  # RMS norms of ones keep the activations O(1)
            a = np.ones(n, np.float32)
        else:
            a = rng.standard_normal(n).astype(np.float32) * 0.02
        data = a.astype(np.float16).tobytes() if f16 else a.tobytes()
        tensors.append((name, shape, _GGML_F16 if f16 else _GGML_F32, data))

    mimo = head_k != head_v or sinks
    n_layer = 2 if mimo else 1
    add("token_embd.weight", (n_embd, N_VOCAB))
    add("output_norm.weight", (n_embd,), f16=False)
    add("output.weight", (n_embd, N_VOCAB))
    for il in range(n_layer):
        add(f"blk.{il}.attn_norm.weight", (n_embd,), f16=False)
        add(f"blk.{il}.attn_q.weight", (n_embd, head_k * n_head))
        add(f"blk.{il}.attn_k.weight", (n_embd, head_k * n_head_kv))
        add(f"blk.{il}.attn_v.weight", (n_embd, head_v * n_head_kv))
        add(f"blk.{il}.attn_output.weight", (head_v * n_head, n_embd))
        if sinks:
            add(f"blk.{il}.attn_sinks.weight", (n_head,), f16=False)
        add(f"blk.{il}.ffn_norm.weight", (n_embd,), f16=False)
        add(f"blk.{il}.ffn_gate.weight", (n_embd, n_ff))
        add(f"blk.{il}.ffn_up.weight", (n_embd, n_ff))
        add(f"blk.{il}.ffn_down.weight", (n_ff, n_embd))

    a = "mimo2" if mimo else "llama"
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    kvs = [
        _kv("general.architecture", _STR, a),
        _kv("general.name", _STR, "llama-vq attention stand-in"),
        _kv(f"{a}.context_length", _U32, n_ctx_train),
        _kv(f"{a}.embedding_length", _U32, n_embd),
        _kv(f"{a}.block_count", _U32, n_layer),
        _kv(f"{a}.feed_forward_length", _U32, n_ff),
        _kv(f"{a}.attention.head_count", _U32, n_head),
        _kv(f"{a}.attention.head_count_kv", _U32, n_head_kv),
        _kv(f"{a}.attention.key_length", _U32, head_k),
        _kv(f"{a}.attention.value_length", _U32, head_v),
        _kv(f"{a}.rope.dimension_count", _U32, head_k),
        _kv(f"{a}.rope.freq_base", _F32, 10000.0),
        _kv(f"{a}.attention.layer_norm_rms_epsilon", _F32, 1e-5),
        _kv(f"{a}.vocab_size", _U32, N_VOCAB),
        _kv("tokenizer.ggml.model", _STR, "llama"),
        _arr("tokenizer.ggml.tokens", _STR, tokens),
        _arr("tokenizer.ggml.scores", _F32, [0.0] * len(tokens)),
        _arr("tokenizer.ggml.token_type", _I32, [3, 3, 3] + [6] * 256),
        _kv("tokenizer.ggml.bos_token_id", _U32, 1),
        _kv("tokenizer.ggml.eos_token_id", _U32, 2),
    ]
    if mimo:
        kvs += [
            _kv(f"{a}.attention.sliding_window", _U32, 128),
            _arr(f"{a}.attention.sliding_window_pattern", _BOOL, [False, True]),
            _kv(f"{a}.expert_count", _U32, 0),
            _kv(f"{a}.expert_used_count", _U32, 0),
            _kv(f"{a}.expert_feed_forward_length", _U32, n_ff),
        ]
    infos = b""
    offset = 0
    for name, shape, ttype, data in tensors:
        infos += _s(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape)
        infos += struct.pack("<IQ", ttype, offset)
        offset += (len(data) + _ALIGN - 1) // _ALIGN * _ALIGN
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs) + infos
    with open(path, "wb") as f:
        f.write(head)
        f.write(b"\0" * ((-len(head)) % _ALIGN))
        for _, _, _, data in tensors:
            f.write(data)
            f.write(b"\0" * ((-len(data)) % _ALIGN))


def time_path(
    model: Any, flash: bool, type_k: int, type_v: int, n_ubatch: int, n_ctx: int, depth: int, n_threads: int | None,
    steps: tuple[int, int],
) -> tuple[float | None, float | None]:  # fmt: skip
    """One attention path (flash attention, or llama-vq's without it) on a loaded stand-in: the cache filled to depth,
    then the fastest of steps[0] prompt batches of n_ubatch tokens and of steps[1] single-token decode steps, as
    tok/s; (None, None) where llama.cpp refuses the context for the path."""
    import llama_cpp

    from . import _logs

    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = n_ctx
    cp.n_batch = n_ubatch
    cp.n_ubatch = n_ubatch
    cp.n_seq_max = 1
    cp.type_k = type_k
    cp.type_v = type_v
    cp.flash_attn_type = 1 if flash else 0
    cp.no_perf = True
    if n_threads:
        cp.n_threads = cp.n_threads_batch = n_threads
    with _logs.Capture() as cap:
        ctx = llama_cpp.llama_init_from_model(model, cp)
    if not ctx:
        log.info(
            "attention path %s refused here: %s", "flash" if flash else "llama-vq", _logs.reason(cap) or "no reason"
        )
        return None, None
    batch = llama_cpp.llama_batch_init(n_ubatch, 0, 1)
    try:
        mem = llama_cpp.llama_get_memory(ctx)

        def run(pos0: int, n: int) -> None:
            batch.n_tokens = n
            for i in range(n):
                batch.token[i] = 3 + (pos0 + i) % (N_VOCAB - 3)
                batch.pos[i] = pos0 + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = i == n - 1
            if llama_cpp.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed while timing the attention paths")
            llama_cpp.llama_synchronize(ctx)

        pos = 0
        while pos < depth:  # fill the cache to the depth (its cost is the first start's, not a measurement)
            n = min(n_ubatch, depth - pos)
            run(pos, n)
            pos += n
        # the fastest of several runs: on a busy machine a run is only ever slowed down (another process, a thread
        # woken late), so the minimum is the path's own speed, for both paths alike
        prompt = float("inf")
        for _ in range(steps[0]):
            t0 = time.perf_counter()
            run(depth, n_ubatch)
            prompt = min(prompt, time.perf_counter() - t0)
            llama_cpp.llama_memory_seq_rm(mem, 0, depth, -1)
        run(depth, 1)  # warm-up of the decode graph
        llama_cpp.llama_memory_seq_rm(mem, 0, depth, -1)
        decode = float("inf")
        for i in range(steps[1]):
            t0 = time.perf_counter()
            run(depth + i, 1)
            decode = min(decode, time.perf_counter() - t0)
        return n_ubatch / prompt, 1.0 / decode
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
