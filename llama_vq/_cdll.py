"""The one ctypes loader of llama-vq's native libraries in llama_vq/lib (libggml for backends, devices and RPC,
libllama-vq-chat, libllama-vq-server): path, function signatures, ABI version check, and the JSON strings they
return; and the build's own record of itself (_build_config.json). libllama itself is llama_cpp's (_llama_cpp.py
points llama_cpp at this folder).

Nothing here imports llama_cpp, so _llama_cpp.bind() can use it before llama_cpp loads.
"""

from __future__ import annotations

import ctypes
import functools
import json
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import LlamaVQError

LIB_DIR = Path(__file__).resolve().parent / "lib"
BIN_DIR = Path(__file__).resolve().parent / "bin"
SUFFIX = ".dylib" if sys.platform == "darwin" else ".so"
BUILD_CONFIG = Path(__file__).resolve().parent / "_build_config.json"

Signatures = Mapping[str, tuple[list[Any], Any]]


@dataclass(frozen=True)
class Library:
    """One of our libraries: lib<name> in LIB_DIR, the signatures to declare, and its ABI check."""

    name: str  # "llama-vq-chat" is LIB_DIR/libllama-vq-chat.so
    signatures: Signatures = field(default_factory=dict)
    abi_function: str | None = None  # returns the library's ABI version (an int)
    abi_version: int = 0  # the version this package was written against
    error: type[Exception] = LlamaVQError  # raised when missing or of another ABI

    @property
    def path(self) -> Path:
        return LIB_DIR / f"lib{self.name}{SUFFIX}"


_lock = threading.Lock()
_loaded: dict[tuple[str, str | None, int], ctypes.CDLL] = {}


def load(spec: Library) -> ctypes.CDLL:
    """The library, loaded once per process with its signatures declared; raises spec.error when it is missing
    or its ABI version is not the one this package needs (both: rebuild or reinstall llama-vq)."""
    key = (spec.name, spec.abi_function, spec.abi_version)
    with _lock:
        lib = _loaded.get(key)
        if lib is not None:
            return lib
        if not spec.path.exists():
            raise spec.error(
                f"{spec.path} is missing: this llama-vq build has no lib{spec.name}. Fix: rebuild "
                "llama-vq (`scripts/run.sh setup` in a checkout) or reinstall it"
            )
        lib = ctypes.CDLL(str(spec.path))
        declare(lib, spec.signatures)
        if spec.abi_function is not None:
            got = getattr(lib, spec.abi_function)()
            if got != spec.abi_version:
                raise spec.error(
                    f"{spec.path} has ABI version {got}, this package needs {spec.abi_version}. Fix: "
                    "rebuild llama-vq (`scripts/run.sh setup` in a checkout) or reinstall it"
                )
        _loaded[key] = lib
        return lib


def declare(lib: ctypes.CDLL, signatures: Signatures) -> None:
    """Set argtypes and restype of each named function of lib."""
    for name, (args, res) in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res


def take_json(lib: ctypes.CDLL, free: str, ptr: int | None) -> Any:
    """Decode a NUL-terminated UTF-8 JSON string that lib allocated, then free it with lib's function `free`;
    None for a NULL pointer. Invalid UTF-8 is replaced, never raised."""
    if not ptr:
        return None
    try:
        return json.loads(ctypes.string_at(ptr).decode("utf-8", "replace"))
    finally:
        getattr(lib, free)(ptr)


@functools.cache
def build_config() -> dict[str, Any]:
    """What CMake recorded of this build (backend, targets, commit, patches, tools): llama_vq/_build_config.json."""
    if not BUILD_CONFIG.exists():
        raise RuntimeError(f"{BUILD_CONFIG} is missing: this llama_vq was not built by its CMake build")
    return json.loads(BUILD_CONFIG.read_text())
