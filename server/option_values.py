"""Parsers of the server's option values (each raises ValueError saying what is accepted) and the
one exception for a configuration that cannot work."""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

SPLIT_MODES = {"none": 0, "layer": 1, "row": 2}
FLASH_ATTN_MODES = ("on", "off", "auto")
LOG_LEVELS = ("debug", "info", "warning", "error")
REASONING_FORMATS = ("none", "deepseek", "deepseek-legacy", "auto")
# The names llama.cpp's tools accept for --cache-type-k/-v (llama_vq.CACHE_TYPES is authoritative).
_FALLBACK_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


class SettingsError(ValueError):
    """A configuration value that cannot work; the message names the option, value and fix."""


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
