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
        # ggml's log callback, held aside while a GPU module starts (_backends.py)
        "ggml_log_get": ([_P(_vp), _P(_vp)], None),
        "ggml_log_set": ([_vp, _vp], None),
    },
)

# libllama's functions of our patches (a build without a patch lacks its functions: has_* say which are there)
LLAMA_VQ_FUNCTIONS: _cdll.Signatures = {
    "llama_kv_cache_size": ([_vp, _P(_sz), _P(_sz), _P(ctypes.c_uint32)], ctypes.c_bool),
    "llama_vq_set_next_swa_cache_types": ([_i, _i], None),
    "llama_vq_kv_cache_swa": ([_vp, _P(_i), _P(_i), _P(_sz), _P(_sz)], ctypes.c_bool),
    "llama_vq_set_attn_scratch": ([_sz], None),
    "llama_vq_compute_buffer_size": ([_vp], _sz),
    "llama_vq_flash_attn_type": ([_vp], _i),
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
