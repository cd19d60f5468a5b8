"""The start-up line that says what the server's KV cache is: its types, attention mode and bytes, beside what an f16
cache of the same cells would take.

    KV cache: K q8_0, V q4_0, 4096 cells, 29.5 MiB (f16: 90.0 MiB, 3.05x); attention: off (llama-vq's, quantized V)
"""

from __future__ import annotations

from typing import Any

from ..cache_types import CACHE_TYPES

MIB = 1024 * 1024
# llama_vq_flash_attn_type()'s values: the attention a context runs, "auto" resolved
ATTENTION = {
    0: "off (llama-vq's, without flash attention)",
    1: "on (flash attention)",
    2: "prefill (flash attention for prompts, llama-vq's for decode)",
}


def f16_bytes(n_bytes: int, type_name: str) -> int:
    """Bytes an f16 cache would take for what n_bytes holds in type_name."""
    t = CACHE_TYPES.get(type_name)
    if t is None:
        raise ValueError(f"unknown KV cache type {type_name!r}")
    return round(n_bytes * 2 / t.bytes_per_element)


def kv_cache_line(kv: dict[str, Any]) -> str:
    """One line from Engine.kv_cache()'s document."""
    k, v = int(kv["k_bytes"]), int(kv["v_bytes"])
    swa_k, swa_v = int(kv.get("swa_k_bytes", 0)), int(kv.get("swa_v_bytes", 0))
    types = f"K {kv['type_k']}, V {kv['type_v']}"
    f16 = f16_bytes(k - swa_k, kv["type_k"]) + f16_bytes(v - swa_v, kv["type_v"])
    if "type_k_swa" in kv:
        types += f" (sliding-window layers: K {kv['type_k_swa']}, V {kv['type_v_swa']})"
        f16 += f16_bytes(swa_k, kv["type_k_swa"]) + f16_bytes(swa_v, kv["type_v_swa"])
    total = k + v
    ratio = f16 / total if total else 1.0
    attention = ATTENTION.get(int(kv["flash_attn"]), str(kv["flash_attn"]))
    return (
        f"KV cache: {types}, {kv['n_cells']} cells, {total / MIB:.1f} MiB "
        f"(f16: {f16 / MIB:.1f} MiB, {ratio:.2f}x); attention: {attention}"
    )
