"""ctypes access to the few native functions llama_cpp does not bind: KV sizes, devices, RPC.

Imported only after _binding.bind(), so the libraries are llama_vq's own.
"""

from __future__ import annotations

import ctypes
import functools
import sys

import llama_cpp

from ._binding import LIB_DIR

_SUFFIX = ".dylib" if sys.platform == "darwin" else ".so"


@functools.cache
def _ggml() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(LIB_DIR / f"libggml{_SUFFIX}"))
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_name.restype = ctypes.c_char_p
    lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_type.restype = ctypes.c_int
    lib.ggml_backend_dev_buffer_type.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_buffer_type.restype = ctypes.c_void_p
    lib.ggml_backend_buft_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_buft_name.restype = ctypes.c_char_p
    lib.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_reg_by_name.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    lib.ggml_backend_register.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_register.restype = None
    return lib


def has_kv_cache_size() -> bool:
    return hasattr(llama_cpp.llama_cpp._lib, "llama_kv_cache_size")


def kv_cache_size(ctx: int) -> tuple[int, int, int] | None:
    """(bytes of K, bytes of V, cells) from llama_kv_cache_size(); None when memory is not a KV cache."""
    fn = llama_cpp.llama_cpp._lib.llama_kv_cache_size
    fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t),
                   ctypes.POINTER(ctypes.c_uint32)]
    fn.restype = ctypes.c_bool
    k, v, n = ctypes.c_size_t(), ctypes.c_size_t(), ctypes.c_uint32()
    if not fn(ctypes.c_void_p(ctx), ctypes.byref(k), ctypes.byref(v), ctypes.byref(n)):
        return None
    return k.value, v.value, n.value


def has_swa_cache_types() -> bool:
    return hasattr(llama_cpp.llama_cpp._lib, "llama_vq_set_next_swa_cache_types")


def set_next_swa_cache_types(type_k: int, type_v: int) -> None:
    """Cache types of an iSWA model's sliding-window layers for the next context created on this thread."""
    fn = llama_cpp.llama_cpp._lib.llama_vq_set_next_swa_cache_types
    fn.argtypes = [ctypes.c_int, ctypes.c_int]
    fn.restype = None
    fn(type_k, type_v)


def kv_cache_swa(ctx: int) -> tuple[int, int, int, int] | None:
    """(type of K, type of V, bytes of K, bytes of V) of the sliding-window layers' cache; None if not iSWA."""
    fn = llama_cpp.llama_cpp._lib.llama_vq_kv_cache_swa
    fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int),
                   ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
    fn.restype = ctypes.c_bool
    tk, tv, k, v = ctypes.c_int(), ctypes.c_int(), ctypes.c_size_t(), ctypes.c_size_t()
    if not fn(ctypes.c_void_p(ctx), ctypes.byref(tk), ctypes.byref(tv), ctypes.byref(k), ctypes.byref(v)):
        return None
    return tk.value, tv.value, k.value, v.value


def has_attention_modes() -> bool:
    return hasattr(llama_cpp.llama_cpp._lib, "llama_vq_flash_attn_type")


def set_attn_scratch(n_bytes: int) -> None:
    """The scratch budget of the attention without flash attention, for every context created after (process-wide)."""
    fn = llama_cpp.llama_cpp._lib.llama_vq_set_attn_scratch
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = None
    fn(n_bytes)


def compute_buffer_size(ctx: int) -> int:
    """Bytes of a context's compute buffers on all its devices."""
    fn = llama_cpp.llama_cpp._lib.llama_vq_compute_buffer_size
    fn.argtypes = [ctypes.c_void_p]
    fn.restype = ctypes.c_size_t
    return int(fn(ctypes.c_void_p(ctx)))


def flash_attn_type(ctx: int) -> int:
    """The attention a context runs, "auto" resolved: 1 (flash attention), 0 (without), 2 (prefill mode)."""
    fn = llama_cpp.llama_cpp._lib.llama_vq_flash_attn_type
    fn.argtypes = [ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return int(fn(ctypes.c_void_p(ctx)))


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
    return [lib.ggml_backend_dev_name(lib.ggml_backend_dev_get(i)).decode()
            for i in range(lib.ggml_backend_dev_count())]


def add_rpc_servers(endpoints: list[str]) -> None:
    """Register one RPC device per 'host:port', as llama.cpp's --rpc does."""
    lib = _ggml()
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise RuntimeError("this build has no RPC backend (GGML_RPC was off)")
    addr = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server")
    if not addr:
        raise RuntimeError("the RPC backend does not export ggml_backend_rpc_add_server")
    add = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(addr)
    for ep in endpoints:
        r = add(ep.encode())
        if not r:
            raise RuntimeError(f"could not add RPC server {ep}")
        lib.ggml_backend_register(r)


class TensorBuftOverride(ctypes.Structure):
    """struct llama_model_tensor_buft_override { const char * pattern; ggml_backend_buffer_type_t buft; }"""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]
