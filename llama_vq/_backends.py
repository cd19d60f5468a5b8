"""The ggml backends of a wheel build (GGML_BACKEND_DL): modules in llama_vq/lib, loaded once at import.

A build made with LLAMA_VQ_BACKEND_DL=ON (scripts/wheels.sh) links no backend into libggml: each is a module,
``libggml-<name>.so``, the CPU one per SIMD level (``libggml-cpu-x64.so``, ``-haswell``, ``-skylakex``,
``-icelake``). ggml's own search looks beside the executable and in the working directory, never in our package,
so we load them here, in ggml's order (GPU backends, RPC, then the CPU):

* a GPU module (``libggml-hip.so`` of llama-vq-hip, ``libggml-cuda.so`` of llama-vq-cuda) needs the system's
  runtime (ROCm 6, CUDA 12: RUNTIMES names the sonames). Missing runtime libraries raise BackendLoadError naming
  them and the fix; a runtime without a GPU (ggml's score 0, or no device) is said once on stderr, and llama-vq runs
  on the CPU;
* the CPU module is the one with the highest ``ggml_backend_score()`` (ggml's rule: the most instructions this CPU
  has), or the one named by ``LLAMA_VQ_CPU_VARIANT`` (e.g. ``haswell``: tests force a level this way; refused when
  this CPU cannot run it).

A build without DL registers its backends when libggml loads; nothing is done then.
"""

from __future__ import annotations

import _ctypes
import ctypes
import os
import sys
from dataclasses import dataclass, field

from . import _native
from ._build import _config
from ._cdll import LIB_DIR, SUFFIX
from .errors import LlamaVQError

CPU_VARIANT_ENV = "LLAMA_VQ_CPU_VARIANT"
# ggml_backend_load_all_from_path's order for the modules we ship: devices are numbered in load order
GPU_BACKENDS = ("cuda", "hip")


class BackendLoadError(LlamaVQError, ImportError):
    """A backend module of this wheel build cannot be loaded (runtime libraries missing, or a forced CPU variant
    that this CPU cannot run)."""


@dataclass(frozen=True)
class Runtime:
    """What a GPU module needs from the system, and the fix when it is missing."""

    name: str
    sonames: tuple[str, ...]
    fix: str


RUNTIMES = {
    "hip": Runtime(
        "ROCm 6",
        ("libamdhip64.so.6", "libhipblas.so.2", "librocblas.so.4"),
        "install ROCm 6.x (https://rocm.docs.amd.com; the hip-runtime-amd, hipblas and rocblas packages) and make its "
        "lib folder visible (`export LD_LIBRARY_PATH=/opt/rocm/lib`), or `pip uninstall llama-vq-hip` to run on the "
        "CPU",
    ),
    "cuda": Runtime(
        "CUDA 12",
        ("libcudart.so.12", "libcublas.so.12", "libcuda.so.1"),
        "install the NVIDIA driver and the CUDA 12 runtime with cuBLAS (the cuda-cudart-12-x and libcublas-12-x "
        "packages, or `pip install nvidia-cuda-runtime-cu12 nvidia-cublas-cu12` and their lib folders on "
        "LD_LIBRARY_PATH), or `pip uninstall llama-vq-cuda` to run on the CPU",
    ),
}


@dataclass
class Loaded:
    """What load() did: the CPU module chosen, the GPU and RPC modules loaded, and notes said to the user."""

    backend_dl: bool = False
    cpu_variant: str | None = None
    modules: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


_loaded: Loaded | None = None


def _module(name: str) -> str:
    return str(LIB_DIR / f"libggml-{name}{SUFFIX}")


def cpu_variants() -> list[str]:
    """The CPU modules this build ships, by tag name ("x64", "haswell", ...); empty without DL."""
    prefix, names = "libggml-cpu-", []
    for p in sorted(LIB_DIR.glob(f"{prefix}*{SUFFIX}")):
        names.append(p.name[len(prefix) : -len(SUFFIX)])
    return names


def _score(path: str) -> int:
    """ggml_backend_score() of a module (0: this machine cannot run it), as ggml's own search computes it."""
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return 0
    try:
        fn = getattr(lib, "ggml_backend_score", None)
        if fn is None:
            return 0
        fn.restype = ctypes.c_int
        return int(fn())
    finally:
        # unmapped again, as ggml's own search does: only the module chosen stays in the process
        _ctypes.dlclose(lib._handle)


def _missing_runtime(rt: Runtime) -> list[str]:
    missing = []
    for soname in rt.sonames:
        try:
            ctypes.CDLL(soname)
        except OSError:
            missing.append(soname)
    return missing


def _load_gpu(name: str, state: Loaded) -> None:
    path = _module(name)
    rt = RUNTIMES[name]
    missing = _missing_runtime(rt)
    if missing:
        raise BackendLoadError(
            f"{path} (llama-vq-{name}) needs the system's {rt.name} runtime, and {', '.join(missing)} cannot be "
            f"loaded. Fix: {rt.fix}."
        )
    lib = _native.ggml()
    # no score function in GPU modules: a module whose runtime finds no GPU registers with no device
    reg = lib.ggml_backend_load(path.encode())
    n_dev = lib.ggml_backend_reg_dev_count(reg) if reg else 0
    if not n_dev:
        gpu = "AMD" if name == "hip" else "NVIDIA"
        note = (
            f"llama-vq: {path} is installed but this machine has no {gpu} GPU that {rt.name} sees: running on the CPU"
        )
        state.notes.append(note)
        print(note, file=sys.stderr)
        return
    state.modules.append(f"libggml-{name}{SUFFIX}")


def _pick_cpu() -> str:
    variants = cpu_variants()
    forced = os.environ.get(CPU_VARIANT_ENV, "").strip()
    if forced:
        if forced not in variants:
            raise BackendLoadError(
                f"{CPU_VARIANT_ENV}={forced} names no CPU module of this build (it has {', '.join(variants)}). "
                f"Fix: one of those, or unset {CPU_VARIANT_ENV} to pick the best one this CPU runs."
            )
        if _score(_module(f"cpu-{forced}")) <= 0:
            raise BackendLoadError(
                f"{CPU_VARIANT_ENV}={forced}: this CPU lacks instructions that module needs. Fix: a lower level "
                f"({', '.join(variants)}) or unset {CPU_VARIANT_ENV}."
            )
        return forced
    scored = [(_score(_module(f"cpu-{v}")), v) for v in variants]
    best = max(scored, default=(0, ""))
    if best[0] <= 0:
        raise BackendLoadError(
            f"no CPU module in {LIB_DIR} runs on this CPU (scores {scored}). Fix: reinstall llama-vq "
            "(`pip install --force-reinstall llama-vq`)."
        )
    return best[1]


def load() -> Loaded:
    """Load this build's backend modules once per process (a no-op without DL); raises BackendLoadError."""
    global _loaded
    if _loaded is not None:
        return _loaded
    state = Loaded(backend_dl=bool(_config().get("backend_dl", False)))
    if state.backend_dl:
        lib = _native.ggml()
        for name in GPU_BACKENDS:
            if os.path.exists(_module(name)):
                _load_gpu(name, state)
        if os.path.exists(_module("rpc")):
            if not lib.ggml_backend_load(_module("rpc").encode()):
                raise BackendLoadError(f"{_module('rpc')} did not load: reinstall llama-vq")
            state.modules.append(f"libggml-rpc{SUFFIX}")
        variant = _pick_cpu()
        if not lib.ggml_backend_load(_module(f"cpu-{variant}").encode()):
            raise BackendLoadError(f"{_module(f'cpu-{variant}')} did not load: reinstall llama-vq")
        state.cpu_variant = variant
        state.modules.append(f"libggml-cpu-{variant}{SUFFIX}")
    _loaded = state
    return state
