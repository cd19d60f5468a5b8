"""Server configuration: one typed, frozen Settings object from CLI flags or LLAMA_VQ_* variables.

Every option has a flag (llama-server's spelling where one exists) and an environment variable
``LLAMA_VQ_<FLAG>`` (``--ctx-size`` -> ``LLAMA_VQ_CTX_SIZE``); a flag wins over the variable.
``parse_settings`` validates everything once and raises SettingsError with a message naming the
option, the value and what is accepted; the CLI turns that into exit status 2 before the model
loads.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .options import (  # noqa: F401  (re-exported: the option table is options.py, the value parsers option_values.py)
    FLASH_ATTN_MODES,
    LOG_LEVELS,
    OPTIONS,
    REASONING_FORMATS,
    SPLIT_MODES,
    Option,
    SettingsError,
    build_parser,
    is_loopback,
    parse_gpu_layers,
    parse_hosts,
    parse_overrides,
    parse_rpc,
    parse_size,
    parse_tensor_split,
)


@dataclass(frozen=True)
class Settings:
    """Everything the server needs, validated. Units: bytes for sizes, tokens for lengths."""

    model: Path | None = None  # None: the embedded default model (resolved by resolve_model)
    alias: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 8080
    ctx_size: int = 4096
    n_gpu_layers: int = 0
    split_mode: str = "layer"
    tensor_split: tuple[float, ...] | None = None
    main_gpu: int = 0
    override_tensor: tuple[tuple[str, str], ...] = ()
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: str = "auto"
    threads: int | None = None
    batch_size: int = 512
    ubatch_size: int = 512
    rpc: tuple[str, ...] = ()
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    state_dir: Path | None = None
    state_budget: int = 8 << 30
    state_min_tokens: int = 128
    max_queue: int = 16
    max_body_bytes: int = 16 << 20
    chat_format: str | None = None
    log_level: str = "info"
    verbose: bool = False
    # perf (issue 12): per-layer cache types of iSWA models; None = the same as cache_type_k / cache_type_v
    cache_type_k_swa: str | None = None
    cache_type_v_swa: str | None = None
    # ---- serving: chat templates and llama-server compatibility (issue 9) ----
    jinja: bool = True
    chat_template: str | None = None  # a built-in template name of llama.cpp, or Jinja source
    chat_template_file: Path | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    reasoning_format: str = "auto"
    cors_origins: tuple[str, ...] = ()
    # ---- end serving ----
    # ---- engine (issue 10): slots, prompt cache, limits, shutdown ----
    parallel: int = 4
    cache_ram: int = 8192 << 20  # bytes; 0 disables the RAM cache of sequence states
    swa_full: bool = False
    kv_unified: bool = True  # one KV cache for all slots (False: a stream per slot, n_ctx / parallel cells each)
    ctx_checkpoints: int = 32
    checkpoint_every: int = 8192
    n_predict: int = -1  # -1: up to the end of the context
    timeout: float = 0.0  # seconds per request; 0: no limit
    drain_timeout: float = 2.5
    sse_keepalive: float = 5.0

    @property
    def split_mode_value(self) -> int:
        return SPLIT_MODES[self.split_mode]

    @property
    def hosts(self) -> tuple[str, ...]:
        """The addresses to listen on (--host takes several, comma-separated)."""
        return parse_hosts(self.host)

    @property
    def loopback(self) -> bool:
        return all(is_loopback(h) for h in self.hosts)


def parse_settings(
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    parser: argparse.ArgumentParser | None = None,
) -> Settings:
    """Flags (argv) over environment over defaults; raise SettingsError naming the bad value.

    argparse itself exits 2 on unknown flags; --help exits 0.
    """
    environ = os.environ if environ is None else environ
    parser = parser or build_parser()
    ns = parser.parse_args(argv)
    values: dict[str, Any] = {}
    for o in OPTIONS:
        raw = getattr(ns, o.dest)
        source = "/".join(o.flags)
        if raw is None and environ.get(o.env) not in (None, ""):
            raw, source = environ[o.env], o.env
            if o.repeat:
                raw = [raw]
        if raw is None:
            continue
        try:
            if o.repeat:
                values[o.dest] = tuple(x for item in raw for x in o.parse(item))
            else:
                values[o.dest] = o.parse(raw)
        except ValueError as e:
            shown = "" if o.dest == "api_key" else f" {raw if not o.repeat else ', '.join(raw)!r}"
            raise SettingsError(f"{source}{shown}: {e}") from None
    return _finish(values)


def _finish(v: dict[str, Any]) -> Settings:
    _api_keys(v)
    _paths(v)
    _negated_switches(v)
    # llama.cpp lowers the micro-batch to the batch (llama_context: n_ubatch = min(n_batch, n_ubatch)),
    # so `-b 32` alone works as it does with llama-server.
    if v.get("ubatch_size", Settings.ubatch_size) > v.get("batch_size", Settings.batch_size):
        v["ubatch_size"] = v.get("batch_size", Settings.batch_size)
    st = Settings(**v)
    if st.state_budget <= 0:
        raise SettingsError("--state-budget: must be larger than 0")
    if st.max_body_bytes < 1024:
        raise SettingsError("--max-body-size: must be at least 1K")
    return st


def _api_keys(v: dict[str, Any]) -> None:
    """--api-key (comma-separated) and --api-key-file (one per line) into api_keys, deduplicated."""
    keys: list[str] = []
    if "api_key" in v:
        keys += [k.strip() for k in v.pop("api_key").split(",") if k.strip()]
    if "api_key_file" in v:
        path = Path(v.pop("api_key_file")).expanduser()
        try:
            lines = path.read_text().splitlines()
        except OSError as e:
            raise SettingsError(
                f"--api-key-file {str(path)!r}: cannot read it ({e.strerror})"
            ) from None
        file_keys = [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
        if not file_keys:
            raise SettingsError(f"--api-key-file {str(path)!r}: holds no key (one key per line)")
        keys += file_keys
    if keys:
        v["api_keys"] = tuple(dict.fromkeys(keys))


def _paths(v: dict[str, Any]) -> None:
    """--model, --chat-template-file and --state-dir checked and resolved before anything loads."""
    if "model" in v:
        path = Path(v["model"]).expanduser()
        if not path.is_file():
            what = "is a directory, not a GGUF file" if path.is_dir() else "does not exist"
            raise SettingsError(f"--model {str(path)!r}: {what}")
        if not os.access(path, os.R_OK):
            raise SettingsError(f"--model {str(path)!r}: is not readable by this user")
        v["model"] = path.resolve()
    if "chat_template_file" in v:
        path = Path(v["chat_template_file"]).expanduser()
        try:
            path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            why = getattr(e, "strerror", None) or str(e)
            raise SettingsError(f"--chat-template-file {str(path)!r}: cannot read it ({why})") from None
        v["chat_template_file"] = path.resolve()
        if "chat_template" in v:
            raise SettingsError("--chat-template and --chat-template-file: give one of them, not both")
    if "state_dir" in v:
        d = Path(v["state_dir"]).expanduser()
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SettingsError(
                f"--state-dir {str(d)!r}: cannot create it ({e.strerror})"
            ) from None
        if not os.access(d, os.W_OK | os.X_OK):
            raise SettingsError(f"--state-dir {str(d)!r}: is not writable by this user")
        v["state_dir"] = d.resolve()


def _negated_switches(v: dict[str, Any]) -> None:
    """--no-jinja and --no-kv-unified turn their positive settings off."""
    if "no_jinja" in v:
        if v.pop("no_jinja"):
            v["jinja"] = False
    if v.pop("no_kv_unified", False):
        if v.get("kv_unified"):
            raise SettingsError("--kv-unified and --no-kv-unified: choose one")
        v["kv_unified"] = False


def resolve_model(s: Settings) -> Path:
    """The GGUF path to load: --model, or the embedded default model (fetched on first use)."""
    if s.model is not None:
        return s.model
    from llama_vq import default_model_path  # noqa: PLC0415

    return Path(default_model_path())


def check_against_model(s: Settings, model: Path) -> None:
    """Checks that need the model's metadata but no native load (cache types, head sizes, V patch).

    Raises SettingsError with llama_vq's message (value, constraint, fix).
    """
    try:
        import llama_vq  # noqa: PLC0415
    except ImportError:
        return
    try:
        llama_vq.check_config(model, type_k=s.cache_type_k, type_v=s.cache_type_v,
                              flash_attn=s.flash_attn, type_k_swa=s.cache_type_k_swa,
                              type_v_swa=s.cache_type_v_swa)
    except llama_vq.ConfigError as e:
        raise SettingsError(str(e)) from None
    check_chat_template(s)


def check_chat_template(s: Settings) -> None:
    """--chat-template / --chat-template-file parse in llama.cpp's Jinja engine; --no-jinja names a
    built-in template. Raises SettingsError naming the flag."""
    try:
        from llama_vq.chat import ChatTemplateError, ChatTemplates, builtin_templates  # noqa: PLC0415
    except ImportError:
        return
    builtins = tuple(n for n in builtin_templates() if n != "chatml")
    if not s.jinja and s.chat_template not in builtins:
        raise SettingsError(
            "--no-jinja needs --chat-template NAME naming one of llama.cpp's built-in templates "
            f"({', '.join(builtins)}); without it the model's Jinja template is used (--jinja)"
        )
    if s.chat_template_file is not None:
        flag, text = f"--chat-template-file {str(s.chat_template_file)!r}", s.chat_template_file.read_text("utf-8")
    elif s.chat_template is not None:
        flag, text = "--chat-template", s.chat_template
    else:
        return
    try:
        ChatTemplates(None, text).close()
    except ChatTemplateError as e:
        raise SettingsError(f"{flag}: {e.message}") from None
