"""libggml's backends through ctypes (llama_cpp does not bind them): a wheel build's backend modules, loaded once
at import; the devices they register, their buffer types, and llama.cpp's RPC servers as devices. Each signature
is declared once, in GGML (loaded through _cdll, the one loader of our libraries).

A build made with LLAMA_VQ_BACKEND_DL=ON (scripts/wheels.sh) links no backend into libggml: each is a module,
``libggml-<name>.so``, the CPU one per SIMD level (``libggml-cpu-x64.so``, ``-haswell``, ``-skylakex``,
``-icelake``). ggml's own search looks beside the executable and in the working directory, never in our package,
so we load them here, in ggml's order (GPU backends, RPC, then the CPU):

* a GPU module (``libggml-hip.so`` of llama-vq-hip, ``libggml-cuda.so`` of llama-vq-cuda) needs the system's
  runtime: the ROCm or CUDA libraries it was linked with (``_runtime_sonames`` reads them from the module; RUNTIMES
  names their families and the fix). When one cannot be loaded, or the runtime sees no GPU (the module registers no
  device), that is said once on stderr with the reason and the fix, and llama-vq runs on the CPU
  (``build_info().backend_notes`` keeps the line);
* the CPU module is the one with the highest ``ggml_backend_score()`` (ggml's rule: the most instructions this CPU
  has), or the one named by ``LLAMA_VQ_CPU_VARIANT`` (e.g. ``haswell``: tests force a level this way; refused when
  this CPU cannot run it).

A build without DL registers its backends when libggml loads; nothing is done then.
"""

from __future__ import annotations

import _ctypes
import ctypes
import mmap
import os
import re
import struct
import sys
from dataclasses import dataclass, field

from . import _cdll, _envs
from ._cdll import LIB_DIR, SUFFIX, build_config
from .errors import LlamaVQError

_vp, _cp, _sz, _i = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int
_P = ctypes.POINTER

GGML = _cdll.Library(
    "ggml",
    {
        "ggml_backend_dev_count": ([], _sz),
        "ggml_backend_dev_get": ([_sz], _vp),
        "ggml_backend_dev_name": ([_vp], _cp),
        "ggml_backend_dev_type": ([_vp], _i),
        "ggml_backend_dev_buffer_type": ([_vp], _vp),
        "ggml_backend_buft_name": ([_vp], _cp),
        "ggml_backend_reg_by_name": ([_cp], _vp),
        "ggml_backend_reg_get_proc_address": ([_vp, _cp], _vp),
        "ggml_backend_register": ([_vp], None),
        # backend modules of a DL build
        "ggml_backend_load": ([_cp], _vp),
        "ggml_backend_reg_dev_count": ([_vp], _sz),
        "ggml_backend_reg_dev_get": ([_vp, _sz], _vp),
        "ggml_backend_reg_name": ([_vp], _cp),
        "ggml_backend_dev_backend_reg": ([_vp], _vp),
        "ggml_backend_dev_get_props": ([_vp, _vp], None),
        # ggml's log callback, held aside while a GPU module starts
        "ggml_log_get": ([_P(_vp), _P(_vp)], None),
        "ggml_log_set": ([_vp, _vp], None),
    },
)

# enum ggml_backend_dev_type
DEV_CPU, DEV_GPU, DEV_IGPU, DEV_ACCEL = 0, 1, 2, 3


class _DevCaps(ctypes.Structure):
    _fields_ = [("async_", ctypes.c_bool), ("host_buffer", ctypes.c_bool),
                ("buffer_from_host_ptr", ctypes.c_bool), ("events", ctypes.c_bool)]  # fmt: skip


class _DevProps(ctypes.Structure):
    """struct ggml_backend_dev_props"""

    _fields_ = [("name", _cp), ("description", _cp), ("memory_free", _sz), ("memory_total", _sz), ("type", _i),
                ("device_id", _cp), ("caps", _DevCaps)]  # fmt: skip


def ggml() -> ctypes.CDLL:
    return _cdll.load(GGML)


CPU_VARIANT_ENV = "LLAMA_VQ_CPU_VARIANT"
# ggml_backend_load_all_from_path's order for the modules we ship: devices are numbered in load order
GPU_BACKENDS = ("cuda", "hip")


class BackendLoadError(LlamaVQError, ImportError):
    """A backend module of this wheel build cannot be loaded (a forced CPU variant that this CPU cannot run, a module
    file that does not load)."""


@dataclass(frozen=True)
class Runtime:
    """What a GPU module needs from the system: its runtime's libraries (soname families: the module names the exact
    sonames) and the fix when they are missing."""

    name: str  # "ROCm", "CUDA"
    gpu: str  # "AMD", "NVIDIA"
    families: tuple[str, ...]  # "libamdhip64.so": the module needs some "libamdhip64.so.N"
    default_sonames: tuple[str, ...]  # when the module's own list cannot be read
    fix: str  # {major}: the runtime's major version, from the module's first soname


RUNTIMES = {
    "hip": Runtime(
        "ROCm",
        "AMD",
        ("libamdhip64.so", "libhipblas.so", "librocblas.so"),
        ("libamdhip64.so.6", "libhipblas.so.2", "librocblas.so.4"),
        "install ROCm {major}.x (https://rocm.docs.amd.com; the hip-runtime-amd, hipblas and rocblas packages) and "
        "make its lib folder visible (`export LD_LIBRARY_PATH=/opt/rocm/lib`), or `pip uninstall llama-vq-hip`",
    ),
    "cuda": Runtime(
        "CUDA",
        "NVIDIA",
        ("libcudart.so", "libcublas.so", "libcublasLt.so", "libcuda.so"),
        ("libcudart.so.12", "libcublas.so.12", "libcuda.so.1"),
        "install the NVIDIA driver (libcuda.so.1) and the CUDA {major} runtime with cuBLAS (the toolkit's "
        "libraries, or `pip install {pip}` with their lib folder on LD_LIBRARY_PATH), or `pip uninstall llama-vq-cuda`",
    ),
}


def _elf_needed(path: str) -> list[str]:
    """DT_NEEDED of a 64-bit little-endian ELF shared object: the sonames the dynamic loader will look for."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        if m[:4] != b"\x7fELF" or m[4] != 2 or m[5] != 1:
            raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
        phoff, phentsize, phnum = struct.unpack_from("<Q", m, 0x20)[0], *struct.unpack_from("<HH", m, 0x36)
        loads, dynamic = [], None
        for i in range(phnum):
            p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", m, phoff + i * phentsize)
            if p_type == 1:  # PT_LOAD
                loads.append((p_vaddr, p_offset, p_filesz))
            elif p_type == 2:  # PT_DYNAMIC
                dynamic = (p_offset, p_filesz)
        if dynamic is None:
            return []
        needed, strtab = [], None
        for off in range(dynamic[0], dynamic[0] + dynamic[1], 16):
            tag, val = struct.unpack_from("<qQ", m, off)
            if tag == 0:  # DT_NULL
                break
            if tag == 1:  # DT_NEEDED: an offset into the string table
                needed.append(val)
            elif tag == 5:  # DT_STRTAB: an address
                strtab = next(o + val - v for v, o, n in loads if v <= val < v + n)
        if strtab is None:
            raise ValueError(f"{path}: no string table")
        return [m[strtab + n : m.find(b"\0", strtab + n)].decode() for n in needed]


def _runtime_sonames(path: str, rt: Runtime) -> list[str]:
    """The runtime libraries a GPU module was linked with (libamdhip64.so.6, libcudart.so.13, ...)."""
    try:
        needed = _elf_needed(path)
    except (OSError, ValueError, StopIteration, struct.error):
        return list(rt.default_sonames)
    ours = [n for n in needed if n.rsplit(".so", 1)[0] + ".so" in rt.families]
    return sorted(ours, key=lambda n: rt.families.index(n.rsplit(".so", 1)[0] + ".so"))  # the runtime's own first


def _fix(rt: Runtime, sonames: list[str]) -> str:
    # the runtime's major version: the soname's of its first family (libamdhip64.so.6, libcudart.so.13)
    first = [n for n in sonames if n.startswith(rt.families[0] + ".")]
    major = first[0].rsplit(".so.", 1)[-1] if first else "?"
    pip = "nvidia-cuda-runtime-cu12 nvidia-cublas-cu12" if major == "12" else "nvidia-cuda-runtime nvidia-cublas"
    return rt.fix.format(major=major, pip=pip)


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


def _missing(sonames: list[str]) -> list[str]:
    missing = []
    for soname in sonames:
        try:
            ctypes.CDLL(soname)
        except OSError:
            missing.append(soname)
    return missing


def _note(state: Loaded, text: str) -> None:
    state.notes.append(text)
    print(text, file=sys.stderr, flush=True)


def _load_gpu(name: str, state: Loaded) -> None:
    """Load a GPU module, or say once why this process runs without it (then llama-vq runs on the CPU)."""
    path = _module(name)
    rt = RUNTIMES[name]
    sonames = _runtime_sonames(path, rt)
    missing = _missing(sonames)
    module = f"libggml-{name}{SUFFIX} (llama-vq-{name})"
    if missing:
        _note(
            state,
            f"llama-vq: {module} is installed, but the {rt.name} runtime it needs is missing: {', '.join(missing)} "
            f"cannot be loaded; running on the CPU. Fix: {_fix(rt, sonames)}.",
        )
        return
    lib = ggml()
    # ggml's own lines from the runtime's start (a device list, or why it found none) go into our one line
    with _GgmlLog() as log:
        reg = lib.ggml_backend_load(path.encode())
    if not reg:
        _note(state, f"llama-vq: {module} did not load ({log.text() or 'no reason given'}); running on the CPU.")
        return
    # no score function in GPU modules: a module whose runtime finds no GPU registers with no device
    if not lib.ggml_backend_reg_dev_count(reg):
        reason = f" ({log.text()})" if log.text() else ""
        _note(
            state, f"llama-vq: {module} is installed, but {rt.name} found no {rt.gpu} GPU{reason}; running on the CPU."
        )
        return
    if log.raw:
        sys.stderr.write(log.raw)  # what ggml prints at a GPU's start, as without the capture
    state.modules.append(f"libggml-{name}{SUFFIX}")


_LOG_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


class _GgmlLog:
    """ggml's log lines while a module loads, kept instead of printed; the callback set before is restored."""

    def __enter__(self) -> _GgmlLog:
        self.raw = ""
        self._lines: list[tuple[int, str]] = []
        lib = ggml()
        self._set = lib.ggml_log_set
        self._prev, self._prev_data = ctypes.c_void_p(), ctypes.c_void_p()
        lib.ggml_log_get(ctypes.byref(self._prev), ctypes.byref(self._prev_data))
        self._cb = _LOG_CALLBACK(self._add)  # referenced while it is set
        self._set(ctypes.cast(self._cb, ctypes.c_void_p), None)
        return self

    def _add(self, level: int, text: bytes | None, user_data: object) -> None:
        s = (text or b"").decode(errors="replace")
        self.raw += s
        if level == 5 and self._lines:  # GGML_LOG_LEVEL_CONT: the line before goes on
            self._lines[-1] = (self._lines[-1][0], self._lines[-1][1] + s)
        else:
            self._lines.append((level, s))

    def text(self) -> str:
        """The warnings and errors (e.g. why the runtime found no GPU), one line, without function-name prefixes."""
        lines = [t.strip() for lvl, t in self._lines if lvl >= 3 and t.strip()]  # GGML_LOG_LEVEL_WARN, _ERROR
        return "; ".join(re.sub(r"^[A-Za-z_0-9]+: ", "", ln) for ln in lines)

    def __exit__(self, *exc: object) -> None:
        self._set(self._prev, self._prev_data)


def _pick_cpu() -> str:
    variants = cpu_variants()
    forced = (_envs.get(CPU_VARIANT_ENV) or "").strip()
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
    state = Loaded(backend_dl=bool(build_config().get("backend_dl", False)))
    if state.backend_dl:
        lib = ggml()
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


def buffer_types() -> dict[str, int]:
    """Buffer-type name -> handle for every registered device ("CPU", "CUDA0", "ROCm0", "RPC[...]")."""
    lib = ggml()
    out: dict[str, int] = {}
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        buft = lib.ggml_backend_dev_buffer_type(dev)
        if buft:
            out[lib.ggml_backend_buft_name(buft).decode()] = buft
    return out


def devices() -> list[str]:
    lib = ggml()
    return [
        lib.ggml_backend_dev_name(lib.ggml_backend_dev_get(i)).decode() for i in range(lib.ggml_backend_dev_count())
    ]


def add_rpc_server(endpoint: str) -> list[int]:
    """Register the devices of one 'host:port' rpc-server, as llama.cpp's --rpc does; returns them. Registered
    devices stay for the life of the process (ggml has no way to remove one)."""
    lib = ggml()
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise RuntimeError("this build has no RPC backend (GGML_RPC was off)")
    addr = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server")
    if not addr:
        raise RuntimeError("the RPC backend does not export ggml_backend_rpc_add_server")
    add = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(addr)
    r = add(endpoint.encode())
    if not r:
        raise RuntimeError(f"could not add RPC server {endpoint}")
    lib.ggml_backend_register(r)
    return [lib.ggml_backend_reg_dev_get(r, i) for i in range(lib.ggml_backend_reg_dev_count(r))]


def local_model_devices(tensor_split: bool) -> list[int]:
    """The devices llama.cpp's default selection gives a model (llama_prepare_model_devices), without any RPC
    device: discrete GPUs (one per device id), else the integrated GPUs of one backend; with tensor split, every
    device but the CPU's. A model given an explicit list with these after its own RPC devices is placed as by
    default, without the RPC devices other models of the process registered."""
    lib = ggml()
    gpus: list[int] = []
    igpus: list[int] = []
    ids: set[bytes] = set()
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        kind = lib.ggml_backend_dev_type(dev)
        reg = lib.ggml_backend_dev_backend_reg(dev)
        if kind not in (DEV_GPU, DEV_IGPU) or lib.ggml_backend_reg_name(reg) == b"RPC":
            continue
        if tensor_split:
            gpus.append(dev)
        elif kind == DEV_GPU:
            props = _DevProps()
            lib.ggml_backend_dev_get_props(dev, ctypes.byref(props))
            if props.device_id and props.device_id in ids:
                continue  # the same GPU seen by a second backend
            if props.device_id:
                ids.add(props.device_id)
            gpus.append(dev)
        elif not igpus or reg == lib.ggml_backend_dev_backend_reg(igpus[-1]):
            igpus.append(dev)
    return gpus + (igpus if not gpus else [])
