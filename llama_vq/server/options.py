"""llama-vq-server's own flags, taken out of the command line before llama.cpp's parser sees the rest.

Every other argument is llama-server's and goes, untouched and in order, to llama.cpp's own argument parser
(common_params_parse for the server), so every llama-server flag and LLAMA_ARG_* variable works as documented
there. A flag of ours may also come from its environment variable (the flag wins).

FLAGS is the one source of our flags' names, help and defaults: settings.Settings takes its defaults from here,
--help prints them, and tests/server/test_server_options.py checks docs/server.md against them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass


class OptionError(ValueError):
    """A flag of llama-vq-server's has a missing or invalid value; the message names the flag and the fix."""


def parse_size(text: str, flag: str) -> int:
    """'512M', '8G', '1.5GiB', '1048576' -> bytes."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    mult = units.get(t[-1:], 1)
    num = t[:-1] if t[-1:] in units else t
    try:
        value = float(num)
    except ValueError:
        raise OptionError(f"{flag} {text!r}: not a size; write e.g. 512M or 8G") from None
    if value < 0:
        raise OptionError(f"{flag} {text!r}: must not be negative")
    return int(value * mult)


def _seconds(text: str, flag: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise OptionError(f"{flag} {text!r}: not a number of seconds") from None
    if value < 0:
        raise OptionError(f"{flag} {text!r}: must not be negative")
    return value


@dataclass(frozen=True)
class Flag:
    name: str  # the Settings field
    flag: str
    metavar: str
    help: str
    convert: Callable[[str, str], object] = lambda v, _f: v
    default_text: str | None = None  # the default as a user writes it ("8G"); None: unset

    @property
    def env(self) -> str:
        return "LLAMA_VQ_" + self.flag.lstrip("-").replace("-", "_").upper()

    @property
    def default(self) -> object:
        """The default value (default_text converted), None when unset."""
        return None if self.default_text is None else self.convert(self.default_text, self.flag)

    @property
    def help_line(self) -> str:
        default = f"default {self.default_text}; " if self.default_text is not None else ""
        return f"{self.help} ({default}env: {self.env})"


FLAGS: tuple[Flag, ...] = (
    Flag(
        "state_dir",
        "--state-dir",
        "DIR",
        "keep prompt caches on disk across restarts: each slot's KV state is saved there when the server stops "
        "(and restored when it starts), sha256-checked, with llama-server's slot files",
    ),
    Flag(
        "state_budget",
        "--state-budget",
        "SIZE",
        "disk budget of --state-dir (e.g. 200G); the least recently written states go beyond it",
        parse_size,
        "8G",
    ),
    Flag(
        "cache_type_k_swa",
        "--cache-type-k-swa",
        "TYPE",
        "K cache type of the sliding-window layers (f16, q8_0, q4_0, ...; default: --cache-type-k)",
    ),
    Flag(
        "cache_type_v_swa",
        "--cache-type-v-swa",
        "TYPE",
        "V cache type of the sliding-window layers (default: --cache-type-v)",
    ),
    Flag(
        "drain_timeout",
        "--drain-timeout",
        "SECONDS",
        "on SIGTERM/SIGINT, how long running requests may finish before they are cancelled (llama-swap kills "
        "after 5 s)",
        _seconds,
        "3",
    ),
    Flag("max_body_size", "--max-body-size", "SIZE", "largest request body accepted, else 413", parse_size, "64M"),
    Flag(
        "sse_keepalive",
        "--sse-keepalive",
        "SECONDS",
        "while a streamed request's prompt is processed, send an SSE comment every SECONDS so that clients and "
        "proxies keep the connection (0: off)",
        _seconds,
        "10",
    ),
)
_BY_FLAG = {f.flag: f for f in FLAGS}
DEFAULTS: dict[str, object] = {f.name: f.default for f in FLAGS}


def split_argv(argv: Sequence[str], environ: dict[str, str] | None = None) -> tuple[dict[str, object], list[str]]:
    """(our values by Settings field, llama-server's argv). Raises OptionError on a bad value of ours."""
    env = os.environ if environ is None else environ
    ours: dict[str, object] = {}
    for f in FLAGS:
        if env.get(f.env):
            ours[f.name] = f.convert(env[f.env], f.env)
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        flag = _BY_FLAG.get(name)
        if flag is None:
            rest.append(arg)
            i += 1
            continue
        if not eq:
            if i + 1 >= len(argv):
                raise OptionError(f"{name} needs a value ({flag.metavar})")
            value = argv[i + 1]
            i += 1
        ours[flag.name] = flag.convert(value, name)
        i += 1
    return ours, rest


def help_text() -> str:
    lines = ["llama-vq-server: llama-server's engine and flags, plus llama-vq's own:", ""]
    for f in FLAGS:
        lines.append(f"  {f.flag + ' ' + f.metavar:<26} {f.help_line}")
    lines += ["", "llama-server's flags follow (parsed by llama.cpp's own argument parser):", ""]
    return "\n".join(lines)
