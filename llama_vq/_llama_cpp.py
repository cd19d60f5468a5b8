"""The one module that hooks llama-vq into llama_cpp (llama-cpp-python's bindings, shipped inside llama-vq's wheel:
docs/architecture.md, decision 3). Every way the package reaches into llama_cpp is here; the package import runs
the first three steps, in this order:

1. ``bind()``, before llama_cpp loads: llama_cpp loads ``libllama`` at import time from ``$LLAMA_CPP_LIB_PATH`` or
   its own ``lib`` folder; we set that variable to ``llama_vq/lib``. If llama_cpp was already imported with another
   library there is no way to swap it inside this process, so we refuse with an ImportError that says what to do. A
   separately installed llama-cpp-python writes its own ``llama_cpp`` package over ours (or ours over its): refused
   too, with the fix.
2. ``check_series()``: the library carries the whole patch series (patches/series is always applied whole): every
   function our patches add to libllama is there. A library without them is refused once, here, with the fix;
   nothing else in the package asks whether a patch is there.
3. ``install()``: llama_cpp.Llama builds its parameter structs and loads the model in one constructor and has no
   place for what llama_vq adds (flash_attn "auto"/"prefill", tensor buffer overrides, devices). We wrap the two
   internal classes it constructs (``llama_cpp._internals.LlamaModel`` / ``LlamaContext``, pinned version) so that,
   while a llama_vq.Llama is being constructed on this thread (``adjusting()``), its adjustments are applied to the
   parameter structs just before the native calls; outside that window the wrappers do nothing. And llama.cpp's log
   lines go to _logs' callback (llama.cpp's reasons for a refusal).
4. The functions our patches add to libllama, declared on llama_cpp's own CDLL (``LLAMA_VQ_FUNCTIONS``).

Nothing here imports llama_cpp at module level: step 1 must run before it loads.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.metadata
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from . import _cdll
from ._cdll import LIB_DIR, SUFFIX
from .errors import BindingError

_LIB_NAME = f"libllama{SUFFIX}"

_vp, _sz, _i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
_P = ctypes.POINTER

# libllama's functions of our patches (patches/series), one place for their signatures
LLAMA_VQ_FUNCTIONS: _cdll.Signatures = {
    # 0001-bindings-introspection-build-tag-and-kv-cache-size
    "llama_kv_cache_size": ([_vp, _P(_sz), _P(_sz), _P(ctypes.c_uint32)], ctypes.c_bool),
    # 0010-llama-swa-layer-cache-types
    "llama_vq_set_next_swa_cache_types": ([_i, _i], None),
    "llama_vq_kv_cache_swa": ([_vp, _P(_i), _P(_i), _P(_sz), _P(_sz)], ctypes.c_bool),
    # 0017-llama-attn-split-scratch-budget
    "llama_vq_set_attn_scratch": ([_sz], None),
    "llama_vq_compute_buffer_size": ([_vp], _sz),
    # 0018-llama-flash-attn-prefill-mode
    "llama_vq_flash_attn_type": ([_vp], _i),
    "llama_vq_attn_layers": ([_vp], ctypes.c_char_p),
}


# ---- 1. bind ----


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


# ---- 2. the whole series ----


def check_series(lib: Any = None) -> None:
    """Raise BindingError, naming the fix, when libllama (llama_cpp's, or ``lib``) lacks a function of our patches:
    a library built without the whole series (a stale build, another project's libllama)."""
    if lib is None:
        lib = _llama_lib()
    missing = [name for name in LLAMA_VQ_FUNCTIONS if not hasattr(lib, name)]
    if missing:
        where = getattr(lib, "_name", None) or "libllama"
        raise BindingError(
            f"{where} lacks llama-vq's functions {', '.join(missing)}: it was not built with llama-vq's whole "
            "patch series (patches/series). Fix: rebuild llama-vq (`scripts/run.sh setup` in a checkout) or "
            "reinstall it (`pip install --force-reinstall llama-vq`)."
        )


# ---- 3. the hooks ----

_state = threading.local()
_Adjust = Callable[[Any], None]


def install() -> None:
    """Wrap llama_cpp's LlamaModel / LlamaContext (once per process) and send llama.cpp's log to _logs."""
    import llama_cpp
    from llama_cpp import _internals

    from . import _logs

    if getattr(_internals.LlamaModel, "_llama_vq_hook", False):
        return

    class _Model(_internals.LlamaModel):
        _llama_vq_hook = True

        def __init__(self, *, path_model: str, params: Any, verbose: bool = True) -> None:
            adjust = getattr(_state, "model", None)
            if adjust is not None:
                adjust(params)
            super().__init__(path_model=path_model, params=params, verbose=verbose)

        def close(self) -> None:
            if hasattr(self, "_exit_stack"):  # an adjustment may refuse before the base __init__ ran
                super().close()

    class _Context(_internals.LlamaContext):
        def __init__(self, *, model: Any, params: Any, verbose: bool = True) -> None:
            adjust = getattr(_state, "context", None)
            if adjust is not None:
                adjust(params)
            super().__init__(model=model, params=params, verbose=verbose)

        def close(self) -> None:
            if hasattr(self, "_exit_stack"):
                super().close()

    # the hook's whole job: llama_cpp.Llama constructs these two by their module names
    _internals.LlamaModel = _Model  # type: ignore[misc]
    _internals.LlamaContext = _Context  # type: ignore[misc]
    llama_cpp.llama_log_set(_logs.callback, ctypes.c_void_p(0))


@contextlib.contextmanager
def adjusting(model: _Adjust | None = None, context: _Adjust | None = None) -> Iterator[None]:
    """While the block runs on this thread, ``model(params)`` / ``context(params)`` adjust the parameter structs of
    the LlamaModel / LlamaContext that llama_cpp.Llama constructs."""
    prev = getattr(_state, "model", None), getattr(_state, "context", None)
    _state.model, _state.context = model, context
    try:
        yield
    finally:
        _state.model, _state.context = prev


class TensorBuftOverride(ctypes.Structure):
    """struct llama_model_tensor_buft_override { const char * pattern; ggml_backend_buffer_type_t buft; }"""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


# ---- 4. libllama's functions of our patches ----


def _llama_lib() -> Any:
    import llama_cpp

    return llama_cpp.llama_cpp._lib


@functools.cache
def _llama() -> ctypes.CDLL:
    lib = _llama_lib()
    _cdll.declare(lib, LLAMA_VQ_FUNCTIONS)
    return lib


def kv_cache_size(ctx: int) -> tuple[int, int, int] | None:
    """(bytes of K, bytes of V, cells) from llama_kv_cache_size(); None when memory is not a KV cache."""
    k, v, n = ctypes.c_size_t(), ctypes.c_size_t(), ctypes.c_uint32()
    if not _llama().llama_kv_cache_size(ctypes.c_void_p(ctx), ctypes.byref(k), ctypes.byref(v), ctypes.byref(n)):
        return None
    return k.value, v.value, n.value


def set_next_swa_cache_types(type_k: int, type_v: int) -> None:
    """Cache types of an iSWA model's sliding-window layers for the next context created on this thread."""
    _llama().llama_vq_set_next_swa_cache_types(type_k, type_v)


def kv_cache_swa(ctx: int) -> tuple[int, int, int, int] | None:
    """(type of K, type of V, bytes of K, bytes of V) of the sliding-window layers' cache; None if not iSWA."""
    tk, tv, k, v = ctypes.c_int(), ctypes.c_int(), ctypes.c_size_t(), ctypes.c_size_t()
    if not _llama().llama_vq_kv_cache_swa(
        ctypes.c_void_p(ctx), ctypes.byref(tk), ctypes.byref(tv), ctypes.byref(k), ctypes.byref(v)
    ):
        return None
    return tk.value, tv.value, k.value, v.value


def set_attn_scratch(n_bytes: int) -> None:
    """The scratch budget of the attention without flash attention, for every context created after (process-wide)."""
    _llama().llama_vq_set_attn_scratch(n_bytes)


def compute_buffer_size(ctx: int) -> int:
    """Bytes of a context's compute buffers on all its devices."""
    return int(_llama().llama_vq_compute_buffer_size(ctypes.c_void_p(ctx)))


def flash_attn_type(ctx: int) -> int:
    """The attention a context runs, "auto" resolved: 1 (flash attention), 0 (without), 2 (prefill mode)."""
    return int(_llama().llama_vq_flash_attn_type(ctypes.c_void_p(ctx)))


def attn_layers(ctx: int) -> str:
    """llama_vq_attn_layers(): one line per distinct layer kind of a context (attn_choice.parse_layers)."""
    return (_llama().llama_vq_attn_layers(ctypes.c_void_p(ctx)) or b"").decode()
