"""Refuse KV cache / attention combinations that cannot work, before any native call."""

from __future__ import annotations

from pathlib import Path

from ._gguf import GGUFError, head_sizes, read_metadata
from .cache_types import FLASH_ATTN_OFF, FLASH_ATTN_PREFILL, CacheType
from .errors import CacheConfigError


def _fix_for(head: int) -> str:
    return "use f16 or bf16 (every quantized cache type has 32-element blocks)" if head % 32 else "use f16"


def check_cache_config(
    model_path: str | Path,
    type_k: CacheType,
    type_v: CacheType,
    flash_attn: int,
    *,
    nonfa_quantized_v: bool,
    names: tuple[str, str] = ("type_k", "type_v"),
) -> None:
    """Raise CacheConfigError naming the value, the constraint and the fix.

    ``nonfa_quantized_v``: whether the loaded library can run a quantized V without flash attention.
    ``names``: the parameters the types came from (("type_k_swa", "type_v_swa") for sliding-window layers).
    """
    if type_v.quantized and flash_attn in (FLASH_ATTN_OFF, FLASH_ATTN_PREFILL) and not nonfa_quantized_v:
        raise CacheConfigError(
            f"{names[1]}={type_v.name!r} with flash_attn off or prefill needs llama-vq's V patch, which this build "
            "does not carry (see llama_vq.build_info()['patches']). Fix: use flash_attn='on', or "
            f"{names[1]}='f16', or install a llama-vq build with the V patch."
        )
    try:
        meta = read_metadata(model_path)
    except (OSError, GGUFError):
        return  # llama.cpp reports unreadable models itself, with its own reason
    k_heads, v_heads = head_sizes(meta)
    for name, t, heads, what in ((names[0], type_k, k_heads, "K"), (names[1], type_v, v_heads, "V")):
        if not t.quantized:
            continue
        for h in sorted(heads):
            if h % t.block_size:
                raise CacheConfigError(
                    f"{name}={t.name!r} needs head sizes divisible by its block size {t.block_size}; "
                    f"this model's {what} head size is {h}: {_fix_for(h)}"
                )


def check_config(
    model_path: str | Path,
    *,
    type_k: str | int | CacheType | None = None,
    type_v: str | int | CacheType | None = None,
    flash_attn: bool | str | int = False,
    type_k_swa: str | int | CacheType | None = None,
    type_v_swa: str | int | CacheType | None = None,
) -> None:
    """Check a cache/attention configuration against a model's metadata and this build, loading nothing.

    The same checks ``Llama(...)`` runs before any native call (``type_k_swa``/``type_v_swa``: the
    sliding-window layers' types, default type_k/type_v). Raises CacheConfigError (a ValueError)
    whose message names the value, the constraint and the fix.
    """
    from ._build import build_info
    from .cache_types import parse_cache_type, parse_flash_attn

    tk = parse_cache_type("f16" if type_k is None else type_k, param="type_k")
    tv = parse_cache_type("f16" if type_v is None else type_v, param="type_v")
    fa = parse_flash_attn(flash_attn)
    check_cache_config(model_path, tk, tv, fa, nonfa_quantized_v=build_info().nonfa_quantized_v)
    tk_swa = tk if type_k_swa is None else parse_cache_type(type_k_swa, param="type_k_swa")
    tv_swa = tv if type_v_swa is None else parse_cache_type(type_v_swa, param="type_v_swa")
    if (tk_swa, tv_swa) != (tk, tv):
        check_cache_config(
            model_path,
            tk_swa,
            tv_swa,
            fa,
            nonfa_quantized_v=build_info().nonfa_quantized_v,
            names=("type_k_swa", "type_v_swa"),
        )
