"""Read a GGUF file's key/value metadata (not its tensors) without loading the model."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class GGUFError(ValueError):
    """The file is not a readable GGUF file."""


def _read(f: BinaryIO, n: int) -> bytes:
    b = f.read(n)
    if len(b) != n:
        raise GGUFError("truncated GGUF header")
    return b


def _value(f: BinaryIO, vtype: int, keep: bool) -> Any:
    if vtype in _SCALARS:
        fmt = _SCALARS[vtype]
        return struct.unpack(fmt, _read(f, struct.calcsize(fmt)))[0]
    if vtype == _STRING:
        (n,) = struct.unpack("<Q", _read(f, 8))
        raw = _read(f, n)
        return raw.decode("utf-8", errors="replace") if keep else None
    if vtype == _ARRAY:
        etype, count = struct.unpack("<IQ", _read(f, 12))
        if etype in _SCALARS and not keep:
            f.seek(struct.calcsize(_SCALARS[etype]) * count, 1)
            return None
        items = [_value(f, etype, keep) for _ in range(count)]
        return items if keep else None
    raise GGUFError(f"unknown GGUF value type {vtype}")


def read_metadata(path: str | Path, *, skip_arrays_over: int = 4096) -> dict[str, Any]:
    """Return the metadata key/values; arrays longer than ``skip_arrays_over`` (vocabularies) are None."""
    with open(path, "rb") as f:
        if _read(f, 4) != b"GGUF":
            raise GGUFError(f"{path} is not a GGUF file (bad magic)")
        (version,) = struct.unpack("<I", _read(f, 4))
        if version < 2:
            raise GGUFError(f"{path}: GGUF version {version} is too old")
        _n_tensors, n_kv = struct.unpack("<QQ", _read(f, 16))
        out: dict[str, Any] = {}
        for _ in range(n_kv):
            (klen,) = struct.unpack("<Q", _read(f, 8))
            key = _read(f, klen).decode("utf-8", errors="replace")
            (vtype,) = struct.unpack("<I", _read(f, 4))
            if vtype == _ARRAY:
                pos = f.tell()
                etype, count = struct.unpack("<IQ", _read(f, 12))
                f.seek(pos)
                out[key] = _value(f, vtype, keep=count <= skip_arrays_over)
            else:
                out[key] = _value(f, vtype, keep=True)
        return out


def head_sizes(meta: dict[str, Any]) -> tuple[set[int], set[int]]:
    """K and V head sizes the model's attention layers use (every variant the file declares)."""
    arch = meta.get("general.architecture", "")

    def get(key: str) -> Any:
        return meta.get(f"{arch}.{key}")

    def ints(v: Any) -> set[int]:
        if v is None:
            return set()
        if isinstance(v, list):
            return {int(x) for x in v if x}
        return {int(v)} if v else set()

    k = ints(get("attention.key_length")) | ints(get("attention.key_length_swa"))
    v = ints(get("attention.value_length")) | ints(get("attention.value_length_swa"))
    if get("attention.key_length_mla") is not None:  # MLA caches store the compressed sizes
        k = ints(get("attention.key_length_mla")) | ints(get("attention.key_length_mla_swa"))
        v = ints(get("attention.value_length_mla")) | ints(get("attention.value_length_mla_swa"))
    if not k or not v:
        n_embd = get("embedding_length")
        n_head = get("attention.head_count")
        heads = ints(n_head)
        if n_embd and heads:
            derived = {int(n_embd) // h for h in heads}
            k = k or derived
            v = v or derived
    return k, v
