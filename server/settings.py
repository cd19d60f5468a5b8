"""Server configuration: one typed, frozen Settings object from CLI flags or LLAMA_VQ_* variables.

Every option has a flag (llama-server's spelling where one exists) and an environment variable
``LLAMA_VQ_<FLAG>`` (``--ctx-size`` -> ``LLAMA_VQ_CTX_SIZE``); a flag wins over the variable.
``parse_settings`` validates everything once and raises SettingsError with a message naming the
option, the value and what is accepted; the CLI turns that into exit status 2 before the model
loads.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SPLIT_MODES = {"none": 0, "layer": 1, "row": 2}
FLASH_ATTN_MODES = ("on", "off", "auto")
LOG_LEVELS = ("debug", "info", "warning", "error")
REASONING_FORMATS = ("none", "deepseek", "deepseek-legacy", "auto")
# The names llama.cpp's tools accept for --cache-type-k/-v (llama_vq.CACHE_TYPES is authoritative).
_FALLBACK_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


class SettingsError(ValueError):
    """A configuration value that cannot work; the message names the option, value and fix."""


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


def is_loopback(host: str) -> bool:
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# ---- value parsers: each raises ValueError with a message meant for the user --------------------


def _int_range(lo: int | None = None, hi: int | None = None) -> Callable[[str], int]:
    def parse(s: str) -> int:
        try:
            v = int(s.strip())
        except ValueError:
            raise ValueError("must be an integer") from None
        if lo is not None and v < lo:
            raise ValueError(f"must be >= {lo}")
        if hi is not None and v > hi:
            raise ValueError(f"must be <= {hi}")
        return v

    return parse


def _choice(choices: Sequence[str]) -> Callable[[str], str]:
    def parse(s: str) -> str:
        v = s.strip().lower()
        if v not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return v

    return parse


def parse_gpu_layers(s: str) -> int:
    v = s.strip().lower()
    if v in ("all", "auto", "-1"):
        return -1
    return _int_range(-1)(v)


def parse_tensor_split(s: str) -> tuple[float, ...]:
    parts = [p for p in re.split(r"[,/]", s) if p.strip()]
    try:
        vals = tuple(float(p) for p in parts)
    except ValueError:
        raise ValueError("must be comma-separated numbers, one per GPU (e.g. 3,1)") from None
    if not vals or any(v < 0 or v != v for v in vals) or sum(vals) <= 0:
        raise ValueError("needs one non-negative proportion per GPU with a positive sum (e.g. 3,1)")
    if len(vals) > 128:
        raise ValueError("lists more than 128 devices")
    return vals


def parse_overrides(s: str) -> tuple[tuple[str, str], ...]:
    """llama-server's PATTERN=BUFFER, several separated by commas (e.g. 'exps=CPU')."""
    out = []
    for part in s.split(","):
        pattern, sep, buft = part.strip().partition("=")
        if not sep or not pattern or not buft:
            raise ValueError(
                f"{part!r} is not PATTERN=BUFFER (e.g. 'blk\\.[0-9]+\\.ffn_.*_exps=CPU')"
            )
        try:
            re.compile(pattern)
        except re.error as e:
            raise ValueError(
                f"pattern {pattern!r} is not a valid regular expression: {e}"
            ) from None
        out.append((pattern, buft.strip()))
    return tuple(out)


def parse_rpc(s: str) -> tuple[str, ...]:
    out = []
    for ep in (e.strip() for e in s.split(",")):
        if not ep:
            continue
        host, sep, port = ep.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{ep!r} is not host:port (e.g. 192.168.1.20:50052)")
        out.append(ep)
    if not out:
        raise ValueError("lists no host:port")
    return tuple(out)


_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(s: str) -> int:
    """'8G', '512MiB', '1.5g', '1048576' -> bytes (binary units)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b)?\s*", s.lower())
    if not m:
        raise ValueError("must be a size such as 512M, 8G or a number of bytes")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])


def _cache_type(s: str) -> str:
    v = s.strip().lower()
    try:
        from llama_vq import CACHE_TYPES  # noqa: PLC0415 (binds llama_cpp: fine, we need it anyway)

        names = tuple(CACHE_TYPES)
    except ImportError:
        names = _FALLBACK_CACHE_TYPES
    if v not in names:
        raise ValueError(f"must be one of {', '.join(names)}")
    return v


def _nonempty(s: str) -> str:
    if not s.strip():
        raise ValueError("must not be empty")
    return s.strip()


def _aliases(s: str) -> tuple[str, ...]:
    names = tuple(a.strip() for a in s.split(",") if a.strip())
    if not names:
        raise ValueError("must name at least one model name")
    return names


def parse_hosts(s: str) -> tuple[str, ...]:
    """'127.0.0.1,::1' -> ('127.0.0.1', '::1'); IPv6 may be bracketed ('[::1]')."""
    out = []
    for part in s.split(","):
        h = part.strip()
        if h.startswith("[") and h.endswith("]"):
            h = h[1:-1]
        if not h:
            raise ValueError("lists an empty address (e.g. 127.0.0.1 or 127.0.0.1,::1)")
        if any(c.isspace() for c in h) or "/" in h:
            raise ValueError(f"{h!r} is not an address or host name")
        out.append(h)
    return tuple(dict.fromkeys(out))


def _hosts(s: str) -> str:
    return ",".join(parse_hosts(s))


def _template_kwargs(s: str) -> dict[str, Any]:
    try:
        v = json.loads(s)
    except json.JSONDecodeError as e:
        raise ValueError(f"is not JSON ({e.msg} at character {e.pos})") from None
    if not isinstance(v, dict):
        raise ValueError('must be a JSON object, e.g. \'{"enable_thinking": true}\'')
    return v


def _origins(s: str) -> tuple[str, ...]:
    out = tuple(o.strip().rstrip("/") for o in s.split(",") if o.strip())
    if not out:
        raise ValueError("must list '*' or origins such as https://chat.example.com")
    for o in out:
        if o != "*" and not re.fullmatch(r"https?://[^/\s]+", o):
            raise ValueError(f"{o!r} is not '*' or an origin such as https://chat.example.com")
    return out


def _mib(s: str) -> int:
    v = _int_range(-1)(s)
    return (1 << 62) if v < 0 else v << 20


def _seconds(s: str) -> float:
    try:
        v = float(s.strip())
    except ValueError:
        raise ValueError("must be a number of seconds") from None
    if not v >= 0:
        raise ValueError("must be >= 0")
    return v


def _removed_chat_format(s: str) -> str:
    raise ValueError(
        "llama-cpp-python's chat formats are gone: chats are rendered and parsed by llama.cpp's chat "
        "layer; use --chat-template NAME (a llama.cpp built-in such as chatml, llama3) or "
        "--chat-template-file PATH (tools work with templates that render them)"
    )


def _bool(s: str) -> bool:
    v = s.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("must be 1/0, true/false, yes/no or on/off")


@dataclass(frozen=True)
class Option:
    dest: str
    flags: tuple[str, ...]
    parse: Callable[[str], Any]
    help: str
    metavar: str | None = None
    repeat: bool = False  # repeatable flag; values are concatenated
    switch: bool = False  # flag without a value (store_true)

    @property
    def env(self) -> str:
        long = next(f for f in self.flags if f.startswith("--"))
        return "LLAMA_VQ_" + long[2:].upper().replace("-", "_")


OPTIONS: tuple[Option, ...] = (
    Option(
        "model",
        ("-m", "--model"),
        _nonempty,
        "GGUF model file (first shard of a split model). Default: the embedded SmolLM2-135M "
        "test model.",
        "PATH",
    ),
    Option(
        "alias",
        ("-a", "--alias"),
        _aliases,
        "Model name(s) clients send in 'model', comma-separated. Default: the file name without "
        ".gguf.",
        "NAME",
    ),
    Option(
        "host",
        ("--host",),
        _hosts,
        "Address(es) to listen on, comma-separated (e.g. 127.0.0.1,::1). Default 127.0.0.1; a "
        "non-loopback address without --api-key logs a warning.",
        "ADDR",
    ),
    Option("port", ("--port",), _int_range(1, 65535), "TCP port. Default 8080.", "PORT"),
    Option(
        "ctx_size",
        ("-c", "--ctx-size"),
        _int_range(0),
        "Context size in tokens shared by prompt and output; 0 = the model's training context. "
        "Default 4096.",
        "N",
    ),
    Option(
        "n_gpu_layers",
        ("-ngl", "--n-gpu-layers", "--gpu-layers"),
        parse_gpu_layers,
        "Layers to offload to the GPU(s); 'all' or -1 = all. Default 0 (CPU).",
        "N",
    ),
    Option(
        "split_mode",
        ("-sm", "--split-mode"),
        _choice(tuple(SPLIT_MODES)),
        "How to spread the model over several GPUs: none, layer (default) or row.",
        "MODE",
    ),
    Option(
        "tensor_split",
        ("-ts", "--tensor-split"),
        parse_tensor_split,
        "Share of the model per GPU, e.g. 1,1 or 3,2.",
        "P0,P1,...",
    ),
    Option(
        "main_gpu",
        ("-mg", "--main-gpu"),
        _int_range(0),
        "GPU for the whole model with --split-mode none (intermediate results with row). "
        "Default 0.",
        "I",
    ),
    Option(
        "override_tensor",
        ("-ot", "--override-tensor"),
        parse_overrides,
        "Keep tensors whose name matches the regex PATTERN in buffer type BUFFER (CPU, CUDA0, "
        "ROCm1, ...); repeatable, or comma-separated. "
        "Example: 'blk\\.([0-9]|1[0-9])\\.ffn_.*_exps=CPU'.",
        "PATTERN=BUFFER",
        repeat=True,
    ),
    Option(
        "cache_type_k",
        ("-ctk", "--cache-type-k"),
        _cache_type,
        "KV cache type of K: f16 (default), q8_0, q4_0, ...",
        "TYPE",
    ),
    Option(
        "cache_type_v",
        ("-ctv", "--cache-type-v"),
        _cache_type,
        "KV cache type of V: f16 (default), q8_0, q4_0, ... llama-vq runs a quantized V with "
        "flash attention off.",
        "TYPE",
    ),
    Option(
        "flash_attn",
        ("-fa", "--flash-attn"),
        _choice(FLASH_ATTN_MODES),
        "Flash attention: on, off or auto (default: llama.cpp decides per device).",
        "on|off|auto",
    ),
    Option(
        "threads",
        ("-t", "--threads"),
        _int_range(1),
        "CPU threads for generation. Default: llama.cpp's choice.",
        "N",
    ),
    Option(
        "batch_size",
        ("-b", "--batch-size"),
        _int_range(1),
        "Logical batch size for prompt processing. Default 512.",
        "N",
    ),
    Option(
        "ubatch_size",
        ("-ub", "--ubatch-size"),
        _int_range(1),
        "Physical batch size (micro-batch). Default 512, lowered to --batch-size when larger "
        "(as llama.cpp does).",
        "N",
    ),
    Option(
        "rpc",
        ("--rpc",),
        parse_rpc,
        "llama.cpp rpc-server endpoints to use as extra devices: host:port,host:port.",
        "HOSTS",
    ),
    Option(
        "api_key",
        ("--api-key",),
        _nonempty,
        "Require 'Authorization: Bearer KEY' on every endpoint but /health; comma-separated for "
        "several keys. Prefer --api-key-file or LLAMA_VQ_API_KEY: flags show in ps.",
        "KEY",
    ),
    Option(
        "api_key_file",
        ("--api-key-file",),
        _nonempty,
        "File with one API key per line ('#' comments allowed).",
        "PATH",
    ),
    Option(
        "state_dir",
        ("--state-dir",),
        _nonempty,
        "Keep the KV state of served prompts in this directory and reuse it for later requests "
        "sharing a prefix, across restarts. Default: off.",
        "DIR",
    ),
    Option(
        "state_budget",
        ("--state-budget",),
        parse_size,
        "Disk budget of --state-dir; least recently used states are deleted beyond it. Default 8G.",
        "SIZE",
    ),
    Option(
        "state_min_tokens",
        ("--state-min-tokens",),
        _int_range(1),
        "Save a state only when it covers at least N tokens. Default 128.",
        "N",
    ),
    Option(
        "max_queue",
        ("--max-queue",),
        _int_range(0),
        "Requests that may wait for the model; more get 429 with Retry-After. Default 16.",
        "N",
    ),
    Option(
        "max_body_bytes",
        ("--max-body-size",),
        parse_size,
        "Largest accepted request body; larger gets 413. Default 16M.",
        "SIZE",
    ),
    Option(
        "chat_format",
        ("--chat-format",),
        _removed_chat_format,
        "Removed: llama-cpp-python's chat formats are not used; see --chat-template.",
        "NAME",
    ),
    # ---- engine (issue 10) ------------------------------------------------------------------
    Option(
        "parallel",
        ("-np", "--parallel"),
        _int_range(1, 256),
        "Slots: requests processed at once, sharing one context (unified KV cache) with continuous "
        "batching; more wait in the queue. Default 4.",
        "N",
    ),
    Option(
        "cache_ram",
        ("-cram", "--cache-ram"),
        _mib,
        "RAM for sequence states of reused slots (prompt cache in front of --state-dir), in MiB; "
        "-1 = no limit, 0 = off. Default 8192.",
        "MIB",
    ),
    Option(
        "swa_full",
        ("--swa-full",),
        _bool,
        "Full-size cache for sliding-window layers (default: windowed, as llama-server; reuse of an "
        "older prefix then goes through checkpoints).",
        switch=True,
    ),
    Option(
        "ctx_checkpoints",
        ("-ctxcp", "--ctx-checkpoints"),
        _int_range(0, 1024),
        "Most SWA checkpoints kept per slot (0 = none). Default 32.",
        "N",
    ),
    Option(
        "checkpoint_every",
        ("--checkpoint-every",),
        _int_range(0),
        "Also checkpoint a long prompt every N tokens (0 = only near its end). Default 8192.",
        "N",
    ),
    Option(
        "n_predict",
        ("-n", "--n-predict"),
        _int_range(-1),
        "Default cap on generated tokens when a request sets no max_tokens; -1 = up to the context "
        "end. Default -1.",
        "N",
    ),
    Option(
        "timeout",
        ("-to", "--timeout"),
        _seconds,
        "Longest time a request may take, queue included, in seconds; it then ends with "
        "finish_reason 'timeout'. 0 = no limit (default).",
        "S",
    ),
    Option(
        "drain_timeout",
        ("--drain-timeout",),
        _seconds,
        "After SIGTERM, running and queued requests get this many seconds before they are "
        "cancelled (llama-swap kills after 5 s; the rest of the shutdown fits in what is left). "
        "Default 2.5.",
        "S",
    ),
    Option(
        "sse_keepalive",
        ("--sse-keepalive",),
        _seconds,
        "Send an SSE ': keepalive' comment after this many seconds without an event (prompt "
        "processing). Default 5.",
        "S",
    ),
    Option(
        "log_level",
        ("--log-level",),
        _choice(LOG_LEVELS),
        "debug, info (default), warning, error.",
        "LEVEL",
    ),
    Option("verbose", ("-v", "--verbose"), _bool, "Also print llama.cpp's own log.", switch=True),
    # perf (issue 12): per-layer cache types of iSWA models
    Option(
        "cache_type_k_swa",
        ("--cache-type-k-swa",),
        _cache_type,
        "KV cache type of K in the sliding-window layers of an iSWA model (e.g. MiMo-V2-Flash): "
        "default the same as --cache-type-k. Their cache is only window-sized, so f16 there costs "
        "little memory and avoids quantization error on most layers. Ignored for other models.",
        "TYPE",
    ),
    Option(
        "cache_type_v_swa",
        ("--cache-type-v-swa",),
        _cache_type,
        "KV cache type of V in the sliding-window layers of an iSWA model: default the same as "
        "--cache-type-v.",
        "TYPE",
    ),
    # ---- serving: chat templates and llama-server compatibility (issue 9) ----
    Option(
        "jinja",
        ("--jinja",),
        _bool,
        "Render chats with the model's Jinja template through llama.cpp's chat layer (tools, "
        "reasoning). Default on.",
        switch=True,
    ),
    Option(
        "no_jinja",
        ("--no-jinja",),
        _bool,
        "Use llama.cpp's built-in (non-Jinja) chat templates; no tool calls.",
        switch=True,
    ),
    Option(
        "chat_template",
        ("--chat-template",),
        _nonempty,
        "Chat template instead of the model's: a llama.cpp built-in name (chatml, llama3, ...) or "
        "Jinja source.",
        "NAME",
    ),
    Option(
        "chat_template_file",
        ("--chat-template-file",),
        _nonempty,
        "File holding the Jinja chat template to use instead of the model's.",
        "PATH",
    ),
    Option(
        "chat_template_kwargs",
        ("--chat-template-kwargs",),
        _template_kwargs,
        "JSON object of extra template variables for every request (a request's "
        'chat_template_kwargs overrides them), e.g. \'{"enable_thinking": true}\'.',
        "JSON",
    ),
    Option(
        "reasoning_format",
        ("--reasoning-format",),
        _choice(REASONING_FORMATS),
        "Where the model's thinking goes: none (left in content), deepseek (reasoning_content), "
        "deepseek-legacy (both), auto (default: as the template's format says).",
        "FORMAT",
    ),
    Option(
        "cors_origins",
        ("--cors-origin",),
        _origins,
        "Allow browsers on these origins (comma-separated, or '*') to call the API (CORS). "
        "Default: off.",
        "ORIGINS",
    ),
    # ---- end serving ----
)

_EPILOG = """\
Every option can also be set by an environment variable: LLAMA_VQ_ + the long flag in upper case
with '-' as '_' (LLAMA_VQ_CTX_SIZE=65536, LLAMA_VQ_API_KEY=...). A flag wins over its variable.

Endpoints: GET /v1/models, POST /v1/chat/completions, POST /v1/completions (OpenAI API, also
without /v1 as llama-server has them), POST /completion, /tokenize, /detokenize, /apply-template,
GET /props, GET /slots (llama-server's), GET /health (no key needed), GET /metrics (Prometheus, with
llama-server's llamacpp:* names).

Example (two GPUs, quantized V without flash attention, expert tensors of layers 0-24 on the CPU):
  llama-vq-server -m MiMo.gguf -c 65536 -ngl 999 -sm layer -ts 1,1 -ctk q8_0 -ctv q4_0 -fa off \\
      -ot 'blk\\.([0-9]|1[0-9]|2[0-4])\\.ffn_.*_exps\\.=CPU' --api-key-file key.txt --state-dir kv/
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llama-vq-server",
        description="OpenAI-compatible HTTP server for llama-vq (quantized V cache without flash "
        "attention).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for o in OPTIONS:
        help_text = f"{o.help} [env {o.env}]"
        if o.switch:
            p.add_argument(
                *o.flags, dest=o.dest, action="store_const", const="1", default=None, help=help_text
            )
        else:
            p.add_argument(
                *o.flags,
                dest=o.dest,
                metavar=o.metavar,
                default=None,
                action="append" if o.repeat else "store",
                help=help_text,
            )
    return p


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

    if "model" in v:
        path = Path(v["model"]).expanduser()
        if not path.is_file():
            what = "is a directory, not a GGUF file" if path.is_dir() else "does not exist"
            raise SettingsError(f"--model {str(path)!r}: {what}")
        if not os.access(path, os.R_OK):
            raise SettingsError(f"--model {str(path)!r}: is not readable by this user")
        v["model"] = path.resolve()

    if "no_jinja" in v:
        if v.pop("no_jinja"):
            v["jinja"] = False
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
