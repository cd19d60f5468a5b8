"""KV cache types and flash-attention modes: parsing user input into llama.cpp's numbers.

Cache types are the ones llama.cpp's own tools accept for ``--cache-type-k/-v``; names match any
case (``"q4_0"``, ``"Q8_0"``), numbers are ggml_type values (``2`` is q4_0).
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import CacheConfigError


@dataclass(frozen=True)
class CacheType:
    """One KV cache element type: its ggml name and number, block size and bytes per block."""

    name: str
    ggml_type: int
    block_size: int
    block_bytes: int

    @property
    def quantized(self) -> bool:
        return self.name not in ("f32", "f16", "bf16")

    @property
    def bytes_per_element(self) -> float:
        return self.block_bytes / self.block_size


# ggml_type values and block layouts from ggml.h / ggml-common.h at the pinned commit.
CACHE_TYPES: dict[str, CacheType] = {
    t.name: t
    for t in (
        CacheType("f32", 0, 1, 4),
        CacheType("f16", 1, 1, 2),
        CacheType("bf16", 30, 1, 2),
        CacheType("q8_0", 8, 32, 34),
        CacheType("q4_0", 2, 32, 18),
        CacheType("q4_1", 3, 32, 20),
        CacheType("iq4_nl", 20, 32, 18),
        CacheType("q5_0", 6, 32, 22),
        CacheType("q5_1", 7, 32, 24),
    )
}
_BY_NUMBER = {t.ggml_type: t for t in CACHE_TYPES.values()}

FLASH_ATTN_AUTO = -1  # LLAMA_FLASH_ATTN_TYPE_AUTO
FLASH_ATTN_OFF = 0  # LLAMA_FLASH_ATTN_TYPE_DISABLED
FLASH_ATTN_ON = 1  # LLAMA_FLASH_ATTN_TYPE_ENABLED
# LLAMA_FLASH_ATTN_TYPE_PREFILL (llama-vq): flash attention for prompt batches, the attention without it (which reads
# a quantized V) for decode batches, one cache for both
FLASH_ATTN_PREFILL = 2
_FA_NAMES = {
    "on": FLASH_ATTN_ON,
    "off": FLASH_ATTN_OFF,
    "auto": FLASH_ATTN_AUTO,
    "prefill": FLASH_ATTN_PREFILL,
    "true": FLASH_ATTN_ON,
    "false": FLASH_ATTN_OFF,
    "enabled": FLASH_ATTN_ON,
    "disabled": FLASH_ATTN_OFF,
    "1": FLASH_ATTN_ON,
    "0": FLASH_ATTN_OFF,
    "2": FLASH_ATTN_PREFILL,
}


def valid_cache_type_names() -> list[str]:
    return list(CACHE_TYPES)


def parse_cache_type(value: str | int | CacheType, *, param: str = "type") -> CacheType:
    """Return the CacheType for a name (any case) or a ggml_type number.

    Raises CacheConfigError (a ValueError) naming the valid choices.
    """
    if isinstance(value, CacheType):
        return value
    if isinstance(value, bool):  # bool is an int: refuse it explicitly
        raise CacheConfigError(f"{param}={value!r} is not a cache type; use one of {valid_cache_type_names()}")
    if isinstance(value, int):
        t = _BY_NUMBER.get(value)
        if t is None:
            valid = ", ".join(f"{t.ggml_type} ({t.name})" for t in CACHE_TYPES.values())
            raise CacheConfigError(f"{param}={value} is not a KV cache type number; valid: {valid}")
        return t
    if isinstance(value, str):
        t = CACHE_TYPES.get(value.strip().lower())
        if t is None:
            raise CacheConfigError(f"{param}={value!r} is not a KV cache type; valid names: {', '.join(CACHE_TYPES)}")
        return t
    raise CacheConfigError(f"{param} must be a type name or number, not {type(value).__name__}")


def parse_flash_attn(value: bool | str | int | None) -> int:
    """Map True/False, "on"/"off"/"auto"/"prefill" (any case) or -1/0/1/2 to llama.cpp's flash_attn_type."""
    if value is None:
        return FLASH_ATTN_AUTO
    if isinstance(value, bool):
        return FLASH_ATTN_ON if value else FLASH_ATTN_OFF
    if isinstance(value, int) and value in (FLASH_ATTN_AUTO, FLASH_ATTN_OFF, FLASH_ATTN_ON, FLASH_ATTN_PREFILL):
        return value
    if isinstance(value, str) and value.strip().lower() in _FA_NAMES:
        return _FA_NAMES[value.strip().lower()]
    raise CacheConfigError(f"flash_attn={value!r} is not valid; use True/False or 'on', 'off', 'auto', 'prefill'")


def flash_attn_name(mode: int) -> str:
    return {FLASH_ATTN_ON: "on", FLASH_ATTN_OFF: "off", FLASH_ATTN_AUTO: "auto", FLASH_ATTN_PREFILL: "prefill"}[mode]
