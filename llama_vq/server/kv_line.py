"""The start-up lines that say what the server's KV cache is: its types, attention mode and bytes, beside what an f16
cache of the same cells would take; then, per distinct layer kind, the attention's paths, types and device.

    KV cache: K q8_0, V q4_0, 4096 cells, 29.5 MiB (f16: 90.0 MiB, 3.05x); attention: off (llama-vq's, quantized V)
    attention mode off (measured at depth 2048, ubatch 512: prompt flash 96.1 / llama-vq 410.3 tok/s, ...)
    attention, full-attention layers (30): prompt llama-vq's, decode llama-vq's; K q8_0, V q4_0; CPU
"""

from __future__ import annotations

from typing import Any

from .. import _envs, attn_choice
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


def resolve_attn_choice(params: dict[str, Any]) -> dict[str, Any] | None:
    """For -fa auto: attn_choice's mode for the engine's model, cache types, micro-batch and context, set as the
    mode the native auto tries first (LLAMA_VQ_FA_AUTO, process-wide: the server's contexts are all alike).
    None when -fa is not auto."""
    if int(params.get("flash_attn_type", 0)) != -1:
        return None
    model = str(params["model_path"])
    n_ctx = int(params.get("n_ctx") or 0)
    if n_ctx <= 0:
        from .._gguf import read_metadata

        n_ctx = attn_choice.context_length(read_metadata(model))
    n_threads = int(params.get("n_threads") or 0) or None
    choice = attn_choice.choose(
        model,
        int(params["cache_type_k"]),
        int(params["cache_type_v"]),
        n_ubatch=int(params.get("n_ubatch") or 512),
        n_ctx=n_ctx,
        n_threads=n_threads,
        device=attn_choice.model_device(gpu=int(params.get("n_gpu_layers", -1)) != 0),
    )
    if choice.how != "static":
        _envs.set_value("LLAMA_VQ_FA_AUTO", choice.mode)
    return choice.as_dict()


def attention_lines(kv: dict[str, Any], choice: dict[str, Any] | None) -> list[str]:
    """The attention mode and why, then one line per distinct layer kind (Engine.kv_cache()'s "attn_layers")."""
    mode = {0: "off", 1: "on", 2: "prefill"}.get(int(kv["flash_attn"]), str(kv["flash_attn"]))
    if choice is None:
        why = "asked for"
    elif choice["mode"] != mode and choice["how"] != "static":
        why = f"{choice['why']}; {choice['mode']} passed over by the placement check"
    else:
        why = choice["why"]
    lines = [f"attention mode {mode} ({why})"]
    for d in kv.get("attn_layers", []):
        lines.append(attn_choice.AttnLayers(**d).line())
    return lines
