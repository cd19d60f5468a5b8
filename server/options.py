"""The server's command-line options: the option table (llama-server's flag names, an ``LLAMA_VQ_*``
variable each) and the argparse parser built from it. ``server.settings`` turns parsed values into the
validated Settings object; the value parsers are in ``server.option_values``."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .option_values import (  # noqa: F401  (the constants and public parsers are re-exported)
    FLASH_ATTN_MODES,
    LOG_LEVELS,
    REASONING_FORMATS,
    SPLIT_MODES,
    SettingsError,
    _aliases,
    _bool,
    _cache_type,
    _choice,
    _hosts,
    _int_range,
    _mib,
    _nonempty,
    _origins,
    _removed_chat_format,
    _seconds,
    _template_kwargs,
    is_loopback,
    parse_gpu_layers,
    parse_hosts,
    parse_overrides,
    parse_rpc,
    parse_size,
    parse_tensor_split,
)


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
        "Slots: requests processed at once, sharing one context (a unified KV cache unless "
        "--no-kv-unified) with continuous batching; more wait in the queue. Default 4.",
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
        "kv_unified",
        ("-kvu", "--kv-unified"),
        _bool,
        "One KV cache shared by all slots, each slot able to fill the whole context (the default).",
        switch=True,
    ),
    Option(
        "no_kv_unified",
        ("-no-kvu", "--no-kv-unified"),
        _bool,
        "One KV cache stream per slot instead, as llama-server with an explicit -np: a slot holds at most "
        "--ctx-size / --parallel tokens, and a sequence's cells stay contiguous (its state copies are a few "
        "large reads instead of many small ones).",
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
