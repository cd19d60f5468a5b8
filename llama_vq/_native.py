"""ctypes access to the few native functions llama_cpp does not bind: KV sizes, devices, RPC.

libllama is llama_cpp's own CDLL (imported only after _binding.bind(), so it is llama_vq's library); libggml comes
through _cdll, the loader of our libraries. Each table below is the one place a signature is declared.
"""

from __future__ import annotations

import ctypes
import functools

import llama_cpp

from . import _cdll

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
        # backend modules of a DL build (_backends.py)
        "ggml_backend_load": ([_cp], _vp),
        "ggml_backend_reg_dev_count": ([_vp], _sz),
        "ggml_backend_reg_dev_get": ([_vp, _sz], _vp),
        "ggml_backend_reg_name": ([_vp], _cp),
        "ggml_backend_dev_backend_reg": ([_vp], _vp),
        "ggml_backend_dev_get_props": ([_vp, _vp], None),
        # ggml's log callback, held aside while a GPU module starts (_backends.py)
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


# libllama's functions of our patches (a build without a patch lacks its functions: has_* say which are there)
LLAMA_VQ_FUNCTIONS: _cdll.Signatures = {
    "llama_kv_cache_size": ([_vp, _P(_sz), _P(_sz), _P(ctypes.c_uint32)], ctypes.c_bool),
    "llama_vq_set_next_swa_cache_types": ([_i, _i], None),
    "llama_vq_kv_cache_swa": ([_vp, _P(_i), _P(_i), _P(_sz), _P(_sz)], ctypes.c_bool),
    "llama_vq_set_attn_scratch": ([_sz], None),
    "llama_vq_compute_buffer_size": ([_vp], _sz),
    "llama_vq_flash_attn_type": ([_vp], _i),
    "llama_vq_attn_layers": ([_vp], _cp),
}


def ggml() -> ctypes.CDLL:
    return _cdll.load(GGML)


_ggml = ggml


@functools.cache
def _llama() -> ctypes.CDLL:
    lib = llama_cpp.llama_cpp._lib
    _cdll.declare(lib, {n: sig for n, sig in LLAMA_VQ_FUNCTIONS.items() if hasattr(lib, n)})
    return lib


def has_kv_cache_size() -> bool:
    return hasattr(_llama(), "llama_kv_cache_size")


def kv_cache_size(ctx: int) -> tuple[int, int, int] | None:
    """(bytes of K, bytes of V, cells) from llama_kv_cache_size(); None when memory is not a KV cache."""
    k, v, n = ctypes.c_size_t(), ctypes.c_size_t(), ctypes.c_uint32()
    if not _llama().llama_kv_cache_size(ctypes.c_void_p(ctx), ctypes.byref(k), ctypes.byref(v), ctypes.byref(n)):
        return None
    return k.value, v.value, n.value


def has_swa_cache_types() -> bool:
    return hasattr(_llama(), "llama_vq_set_next_swa_cache_types")


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


def has_attention_modes() -> bool:
    return hasattr(_llama(), "llama_vq_flash_attn_type")


def set_attn_scratch(n_bytes: int) -> None:
    """The scratch budget of the attention without flash attention, for every context created after (process-wide)."""
    _llama().llama_vq_set_attn_scratch(n_bytes)


def compute_buffer_size(ctx: int) -> int:
    """Bytes of a context's compute buffers on all its devices."""
    return int(_llama().llama_vq_compute_buffer_size(ctypes.c_void_p(ctx)))


def flash_attn_type(ctx: int) -> int:
    """The attention a context runs, "auto" resolved: 1 (flash attention), 0 (without), 2 (prefill mode)."""
    return int(_llama().llama_vq_flash_attn_type(ctypes.c_void_p(ctx)))


def has_attn_layers() -> bool:
    return hasattr(_llama(), "llama_vq_attn_layers")


def attn_layers(ctx: int) -> str:
    """llama_vq_attn_layers(): one line per distinct layer kind of a context (attn_choice.parse_layers)."""
    return (_llama().llama_vq_attn_layers(ctypes.c_void_p(ctx)) or b"").decode()


def buffer_types() -> dict[str, int]:
    """Buffer-type name -> handle for every registered device ("CPU", "CUDA0", "ROCm0", "RPC[...]")."""
    lib = _ggml()
    out: dict[str, int] = {}
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        buft = lib.ggml_backend_dev_buffer_type(dev)
        if buft:
            out[lib.ggml_backend_buft_name(buft).decode()] = buft
    return out


def devices() -> list[str]:
    lib = _ggml()
    return [
        lib.ggml_backend_dev_name(lib.ggml_backend_dev_get(i)).decode() for i in range(lib.ggml_backend_dev_count())
    ]


def add_rpc_server(endpoint: str) -> list[int]:
    """Register the devices of one 'host:port' rpc-server, as llama.cpp's --rpc does; returns them. Registered
    devices stay for the life of the process (ggml has no way to remove one)."""
    lib = _ggml()
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
    lib = _ggml()
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


class TensorBuftOverride(ctypes.Structure):
    """struct llama_model_tensor_buft_override { const char * pattern; ggml_backend_buffer_type_t buft; }"""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]
