"""Refuse KV cache types that cannot work with a model, before any native call."""

from __future__ import annotations

from pathlib import Path

from ._gguf import GGUFError, head_sizes, read_metadata
from .cache_types import CacheType
from .errors import CacheConfigError


def _fix_for(head: int) -> str:
    return "use f16 or bf16 (every quantized cache type has 32-element blocks)" if head % 32 else "use f16"


def check_cache_config(
    model_path: str | Path,
    type_k: CacheType,
    type_v: CacheType,
    *,
    names: tuple[str, str] = ("type_k", "type_v"),
) -> None:
    """Raise CacheConfigError naming the value, the constraint and the fix.

    ``names``: the parameters the types came from (("type_k_swa", "type_v_swa") for sliding-window layers).
    """
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
    """Check a cache/attention configuration against a model's metadata, loading nothing.

    The same checks ``Llama(...)`` runs before any native call (``type_k_swa``/``type_v_swa``: the
    sliding-window layers' types, default type_k/type_v). Every cache type runs with flash attention on,
    off or in prefill mode (the library carries the whole patch series: ``import llama_vq`` refuses one that
    does not), so ``flash_attn`` is only parsed. Raises CacheConfigError (a ValueError) whose message names
    the value, the constraint and the fix.
    """
    from .cache_types import parse_cache_type, parse_flash_attn

    tk = parse_cache_type("f16" if type_k is None else type_k, param="type_k")
    tv = parse_cache_type("f16" if type_v is None else type_v, param="type_v")
    parse_flash_attn(flash_attn)
    check_cache_config(model_path, tk, tv)
    tk_swa = tk if type_k_swa is None else parse_cache_type(type_k_swa, param="type_k_swa")
    tv_swa = tv if type_v_swa is None else parse_cache_type(type_v_swa, param="type_v_swa")
    if (tk_swa, tv_swa) != (tk, tv):
        check_cache_config(model_path, tk_swa, tv_swa, names=("type_k_swa", "type_v_swa"))
