"""The one typed configuration of llama-vq-server: llama-vq's flags (options.py) and what the front end reads of
llama-server's parsed parameters (host, port, keys, CORS), validated once."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llama_vq import parse_cache_type
from llama_vq.errors import CacheConfigError

from .options import DEFAULTS, OptionError


def _ours(name: str) -> Any:
    """The default of a llama-vq flag, from options.FLAGS."""
    return DEFAULTS[name]


# At the pinned llama.cpp, -sm row needs a backend's split buffer type, which ggml-cuda (CUDA and HIP) and ggml-rpc
# do not provide (llama-model.cpp then throws while loading); tests/server/test_server_split_mode.py checks the
# pinned source
ROW_SPLIT_REFUSED = (
    "-sm row (--split-mode row, LLAMA_ARG_SPLIT_MODE=row): the pinned llama.cpp has no row split for CUDA, HIP or "
    "RPC devices (their backends provide no split buffer), so the model would fail to load with 'device CUDA0 "
    "does not support split buffers'; use -sm layer -ts A,B to split the layers and their KV cache across the "
    "GPUs (llama.cpp's default), or -sm none -mg N for one GPU"
)


def _env_path(environ: Mapping[str, str], name: str, default: str) -> str:
    value = environ.get(name) or default
    return value if not value or value.startswith("/") else "/" + value


@dataclass(frozen=True)
class GcpParams:
    """Google Cloud Vertex AI's prediction mode, from the AIP_* environment as llama-server reads it (gcp.py)."""

    enabled: bool = False
    path_health: str = ""  # "": no alias of /health
    path_predict: str = "/predict"
    port: int = 8080

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> GcpParams:
        return cls(
            enabled=environ.get("AIP_MODE", "") == "PREDICTION",
            path_health=_env_path(environ, "AIP_HEALTH_ROUTE", ""),
            path_predict=_env_path(environ, "AIP_PREDICT_ROUTE", "/predict"),
            port=int(environ.get("AIP_HTTP_PORT") or 8080),
        )


@dataclass(frozen=True)
class Settings:
    # llama-server's, as its parser left them (engine.params)
    host: str = "127.0.0.1"
    hosts: tuple[str, ...] = ("127.0.0.1",)  # --host a,b: llama-server listens on each
    port: int = 8080
    api_prefix: str = ""
    api_keys: tuple[str, ...] = ()
    cors_origins: str = "*"
    cors_methods: str = "GET, POST, DELETE, OPTIONS"
    cors_headers: str = "*"
    cors_credentials: bool = True
    n_parallel: int = 4
    metrics: bool = False
    slot_save_path: str = ""
    ui_mcp_proxy: bool = False  # --ui-mcp-proxy: /cors-proxy forwards (cors_proxy.py)
    # llama-vq's own
    state_dir: Path | None = None
    state_budget: int = _ours("state_budget")
    cache_type_k_swa: int | None = None  # ggml type ids
    cache_type_v_swa: int | None = None
    drain_timeout: float = _ours("drain_timeout")
    max_body_size: int = _ours("max_body_size")
    sse_keepalive: float = _ours("sse_keepalive")
    gcp: GcpParams = field(default_factory=GcpParams)  # AIP_MODE=PREDICTION: AIP_HTTP_PORT is the port

    @classmethod
    def build(cls, ours: dict[str, Any], params: dict[str, Any]) -> Settings:
        """From options.split_argv's values and Engine.params; raises OptionError on a bad combination."""
        swa = {}
        for key in ("cache_type_k_swa", "cache_type_v_swa"):
            if ours.get(key) is not None:
                flag = "--" + key.replace("_", "-")
                try:
                    swa[key] = parse_cache_type(str(ours[key]), param=flag).ggml_type
                except (ValueError, CacheConfigError) as e:
                    raise OptionError(str(e)) from None
        state_dir = Path(str(ours["state_dir"])).expanduser() if ours.get("state_dir") else None
        if params.get("split_mode") == "row":
            raise OptionError(ROW_SPLIT_REFUSED)
        if params.get("ssl"):
            raise OptionError(
                "--ssl-key-file/--ssl-cert-file: llama-vq-server serves plain HTTP; put a TLS proxy "
                "in front of it (or run llama-server for built-in TLS)"
            )
        gcp = GcpParams.from_env()
        d = cls()  # the defaults: llama-server's as its parser sets them, ours from options.FLAGS
        host = str(params.get("host", d.host))
        return cls(
            host=host,
            hosts=tuple(str(h) for h in params.get("hosts") or ()) or (host,),
            port=gcp.port if gcp.enabled else int(params.get("port", d.port)),
            api_prefix=str(params.get("api_prefix", d.api_prefix)),
            api_keys=tuple(params.get("api_keys", d.api_keys)),
            cors_origins=str(params.get("cors_origins", d.cors_origins)),
            cors_methods=str(params.get("cors_methods", d.cors_methods)),
            cors_headers=str(params.get("cors_headers", d.cors_headers)),
            cors_credentials=bool(params.get("cors_credentials", d.cors_credentials)),
            n_parallel=int(params.get("n_parallel", d.n_parallel)),
            metrics=bool(params.get("endpoint_metrics", d.metrics)),
            slot_save_path=str(params.get("slot_save_path", d.slot_save_path)),
            ui_mcp_proxy=bool(params.get("ui_mcp_proxy", d.ui_mcp_proxy)),
            state_dir=state_dir,
            state_budget=int(ours.get("state_budget", d.state_budget)),
            cache_type_k_swa=swa.get("cache_type_k_swa"),
            cache_type_v_swa=swa.get("cache_type_v_swa"),
            drain_timeout=float(ours.get("drain_timeout", d.drain_timeout)),
            max_body_size=int(ours.get("max_body_size", d.max_body_size)),
            sse_keepalive=float(ours.get("sse_keepalive", d.sse_keepalive)),
            gcp=gcp,
        )
