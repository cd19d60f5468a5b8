"""The steps of llama_vq.Llama's constructor before llama.cpp loads anything: the arguments parsed and checked
against the model (Config), the RPC servers reached and registered, what the model and context params get, and
-fa auto's measured mode. llama.py's Llama calls them in that order."""

from __future__ import annotations

import ctypes
import os
import re
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import llama_cpp

from . import _backends, _gguf, _llama_cpp, attn_choice
from ._validate import check_cache_config
from .cache_types import FLASH_ATTN_AUTO, CacheType, parse_cache_type, parse_flash_attn
from .errors import CacheConfigError, ConfigError, TensorOverrideError

_RPC_DEVICES: dict[str, list[int]] = {}  # 'host:port' -> its devices, registered once for the process
RPC_CONNECT_TIMEOUT_S = 5.0


def check_rpc_server(endpoint: str) -> None:
    """A ConfigError naming the fix when nothing answers at 'host:port' (llama.cpp would abort the process)."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"rpc server {endpoint!r} is not host:port")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=RPC_CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise ConfigError(
            f"rpc server {endpoint} cannot be reached ({e}). Fix: start rpc-server there, or leave it out of "
            "rpc_servers"
        ) from None


def parse_overrides(overrides: Iterable[tuple[str, str] | str] | None) -> list[tuple[str, str]]:
    """Accept [("exps", "CPU")] or llama-server's "exps=CPU" strings (comma-separated lists too)."""
    out: list[tuple[str, str]] = []
    for item in overrides or ():
        if isinstance(item, str):
            for part in item.split(","):
                pattern, sep, buft = part.partition("=")
                if not sep or not pattern or not buft:
                    raise TensorOverrideError(
                        f"tensor override {part!r} is not PATTERN=BUFFER (for example 'exps=CPU')"
                    )
                out.append((pattern, buft))
        else:
            pattern, buft = item
            out.append((str(pattern), str(buft)))
    for pattern, _ in out:
        try:
            re.compile(pattern)
        except re.error as e:
            raise TensorOverrideError(f"tensor override pattern {pattern!r} is not a valid regex: {e}") from e
    return out


def why(requested: int, choice: attn_choice.Choice | None, mode: str) -> str:
    if requested != FLASH_ATTN_AUTO:
        return "asked for"
    if choice is None:
        return "static rule"
    if choice.how != "static" and choice.mode != mode:
        return f"{choice.why()}; {choice.mode} passed over by the placement check"
    return choice.why()


@dataclass(frozen=True)
class Config:
    """The constructor's cache and attention arguments, parsed and checked against the model before anything loads."""

    tk: CacheType
    tv: CacheType
    tk_swa: CacheType
    tv_swa: CacheType
    fa: int
    overrides: list[tuple[str, str]]

    @property
    def swa_differs(self) -> bool:
        return (self.tk_swa, self.tv_swa) != (self.tk, self.tv)

    @classmethod
    def checked(
        cls,
        model_path: str,
        type_k: str | int | CacheType | None,
        type_v: str | int | CacheType | None,
        type_k_swa: str | int | CacheType | None,
        type_v_swa: str | int | CacheType | None,
        flash_attn: bool | str | int,
        attn_scratch_mib: int | None,
        tensor_overrides: Sequence[tuple[str, str] | str] | None,
    ) -> Config:
        tk = parse_cache_type("f16" if type_k is None else type_k, param="type_k")
        tv = parse_cache_type("f16" if type_v is None else type_v, param="type_v")
        tk_swa = tk if type_k_swa is None else parse_cache_type(type_k_swa, param="type_k_swa")
        tv_swa = tv if type_v_swa is None else parse_cache_type(type_v_swa, param="type_v_swa")
        fa = parse_flash_attn(flash_attn)
        if attn_scratch_mib is not None:
            if isinstance(attn_scratch_mib, bool) or not isinstance(attn_scratch_mib, int) or attn_scratch_mib <= 0:
                raise CacheConfigError(f"attn_scratch_mib={attn_scratch_mib!r} is not a positive number of MiB")
        cfg = cls(tk, tv, tk_swa, tv_swa, fa, parse_overrides(tensor_overrides))
        if not os.path.exists(model_path):
            raise ValueError(f"Model path does not exist: {model_path}")
        check_cache_config(model_path, tk, tv)
        if cfg.swa_differs:
            check_cache_config(model_path, tk_swa, tv_swa, names=("type_k_swa", "type_v_swa"))
        return cfg


def rpc_devices(rpc_servers: str | Sequence[str] | None) -> list[int]:
    """The RPC devices of a model's rpc_servers, each server checked to answer first (llama.cpp's RPC backend aborts
    the process on a server it cannot reach) and registered once per process."""
    endpoints = rpc_servers.split(",") if isinstance(rpc_servers, str) else list(rpc_servers or [])
    devices: list[int] = []
    for ep in dict.fromkeys(e.strip() for e in endpoints if e.strip()):
        check_rpc_server(ep)
        if ep not in _RPC_DEVICES:
            _RPC_DEVICES[ep] = _backends.add_rpc_server(ep)
        devices += _RPC_DEVICES[ep]
    return devices


def model_adjuster(overrides: list[tuple[str, str]], rpc_devices: list[int], keep: list[Any]) -> Callable[[Any], None]:
    """What the model params get before llama.cpp loads the model: the devices (this model's RPC servers and the
    local ones) and the tensor overrides; keep holds the ctypes objects they point to."""

    def adjust_model(params: Any) -> None:
        if _RPC_DEVICES:
            # the devices of this model's rpc_servers and the local ones, not the RPC devices that earlier
            # models of this process registered: their servers may be gone, and llama.cpp would use them all
            devs = rpc_devices + _backends.local_model_devices(params.split_mode == llama_cpp.LLAMA_SPLIT_MODE_TENSOR)
            arr_devs = (ctypes.c_void_p * (len(devs) + 1))(*devs, None)
            keep.append(arr_devs)
            params.devices = ctypes.cast(arr_devs, ctypes.c_void_p)
        if not overrides:
            return
        bufts = _backends.buffer_types()
        arr = (_llama_cpp.TensorBuftOverride * (len(overrides) + 1))()
        for i, (pattern, name) in enumerate(overrides):
            if name not in bufts:
                raise TensorOverrideError(
                    f"tensor override buffer {name!r} is not a device buffer type here; "
                    f"available: {', '.join(sorted(bufts))}"
                )
            b = pattern.encode()
            keep.append(b)
            arr[i].pattern = b
            arr[i].buft = bufts[name]
        keep.append(arr)
        params.tensor_buft_overrides = ctypes.cast(arr, ctypes.c_void_p)

    return adjust_model


def context_adjuster(
    cfg: Config, attn_scratch_mib: int | None, n_seq_max: int, kv_unified: bool
) -> Callable[[Any], None]:
    """What the context params get before llama.cpp creates the context: the attention mode, the scratch budget,
    the sliding-window layers' cache types, the sequences."""

    def adjust_context(params: Any) -> None:
        params.flash_attn_type = cfg.fa
        if attn_scratch_mib is not None:
            _llama_cpp.set_attn_scratch(attn_scratch_mib << 20)
        if cfg.swa_differs:  # for the llama_init_from_model() that follows on this thread
            _llama_cpp.set_next_swa_cache_types(cfg.tk_swa.ggml_type, cfg.tv_swa.ggml_type)
        params.n_seq_max = n_seq_max
        params.kv_unified = kv_unified

    return adjust_context


def measured_choice(model_path: str, cfg: Config, kwargs: Mapping[str, Any]) -> attn_choice.Choice | None:
    """For "auto": the mode measured on this device (cached after the first time), which the native auto tries first;
    its placement check may still pass it over (attn_choice.py). None for a mode asked for."""
    if cfg.fa != FLASH_ATTN_AUTO:
        return None
    return attn_choice.choose(
        model_path,
        cfg.tk.ggml_type,
        cfg.tv.ggml_type,
        n_ubatch=int(kwargs.get("n_ubatch", 512)),
        n_ctx=int(kwargs.get("n_ctx", 512)) or attn_choice.context_length(_gguf.read_metadata(model_path)),
        n_threads=kwargs.get("n_threads"),
        device=attn_choice.model_device(gpu=int(kwargs.get("n_gpu_layers", 0)) != 0),
    )
