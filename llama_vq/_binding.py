"""Point llama_cpp at llama_vq's own native library before llama_cpp loads one.

llama_cpp (llama-cpp-python's bindings, shipped inside llama-vq's wheel: docs/architecture.md, decision 3) loads
``libllama`` at import time from ``$LLAMA_CPP_LIB_PATH`` or from its own ``lib`` folder. We set that variable to
``llama_vq/lib`` first; if llama_cpp was already imported with another library, there is no way to swap it inside
this process, so we refuse with an ImportError that says what to do. A separately installed llama-cpp-python
writes its own ``llama_cpp`` package over ours (or ours over its): refused too, with the fix.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from pathlib import Path

from ._cdll import BIN_DIR, LIB_DIR, SUFFIX
from .errors import BindingError

__all__ = ["BIN_DIR", "LIB_DIR", "bind"]
_LIB_NAME = f"libllama{SUFFIX}"


def _loaded_library_path() -> Path | None:
    mod = sys.modules.get("llama_cpp.llama_cpp")
    lib = getattr(mod, "_lib", None)
    name = getattr(lib, "_name", None)
    return Path(name).resolve() if name else None


def foreign_llama_cpp_python() -> str | None:
    """A message naming the fix when a llama-cpp-python distribution is installed beside llama-vq, else None."""
    try:
        dist = importlib.metadata.distribution("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        return None
    where = dist.locate_file("")
    return (
        f"llama-cpp-python {dist.version} is installed in this environment ({where}). llama-vq ships the pinned "
        "llama_cpp bindings itself, bound to its own libllama; both install the package llama_cpp into the same "
        "folder, so one has overwritten the other's files. Fix: `pip uninstall -y llama-cpp-python`, then "
        "`pip install --force-reinstall --no-deps llama-vq` (or the wheel or checkout you installed llama-vq from)."
    )


def bind() -> None:
    """Make ``import llama_cpp`` use llama_vq/lib; raise BindingError if it is too late for that, or if a
    separately installed llama-cpp-python shares the llama_cpp package with ours."""
    foreign = foreign_llama_cpp_python()
    if foreign is not None:
        raise BindingError(foreign)
    ours = (LIB_DIR / _LIB_NAME).resolve()
    if not ours.exists():
        raise BindingError(
            f"llama_vq's native library is missing ({ours}). The package was not built: reinstall with "
            "`pip install --force-reinstall llama-vq` (or `scripts/run.sh setup` in a checkout)."
        )
    if "llama_cpp.llama_cpp" in sys.modules:
        loaded = _loaded_library_path()
        if loaded != ours:
            raise BindingError(
                f"llama_cpp was imported before llama_vq and is bound to {loaded or 'another library'}, "
                f"not to llama_vq's {ours}. A process can load only one libllama. Fix: import llama_vq "
                "before anything imports llama_cpp (or set LLAMA_CPP_LIB_PATH to "
                f"{LIB_DIR} before starting Python)."
            )
        return
    current = os.environ.get("LLAMA_CPP_LIB_PATH")
    if current and Path(current).resolve() != LIB_DIR.resolve():
        raise BindingError(
            f"LLAMA_CPP_LIB_PATH={current} points llama_cpp at another library; llama_vq needs its own "
            f"({LIB_DIR}). Fix: unset LLAMA_CPP_LIB_PATH."
        )
    os.environ["LLAMA_CPP_LIB_PATH"] = str(LIB_DIR)
