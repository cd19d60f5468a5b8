"""Keep llama.cpp's recent log lines so that refusals surface with llama.cpp's own reason.

llama_cpp's log callback is replaced (by _llama_cpp.install()) with ``callback``, which records every line in a
bounded buffer and then prints to stderr when the llama-cpp-python logger's level lets it through
(``verbose=True``: all; ``verbose=False``: errors). llama-cpp-python 0.3.36 maps ggml's log levels from an older
ggml.h (its ERROR is ggml's WARN), which would hide llama.cpp's errors; we use the pinned ggml.h values.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import re
import sys
import threading

import llama_cpp
from llama_cpp import _logger as _lc_logger

# enum ggml_log_level at the pinned commit
_LEVEL_ERROR, _LEVEL_CONT = 4, 5
_TO_LOGGING = {0: logging.CRITICAL, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_lock = threading.Lock()
_lines: collections.deque[tuple[int, str]] = collections.deque(maxlen=400)
_last_level = 1


@llama_cpp.llama_log_callback
def callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    global _last_level
    s = text.decode("utf-8", errors="replace")
    eff = _last_level if level == _LEVEL_CONT else level
    with _lock:
        if level == _LEVEL_CONT and _lines:
            lvl, prev = _lines[-1]
            _lines[-1] = (lvl, prev + s)
        else:
            _lines.append((eff, s))
    _last_level = eff
    mapped = _TO_LOGGING.get(eff, logging.DEBUG)
    if _lc_logger.logger.level <= mapped:
        print(s, end="", flush=True, file=sys.stderr)


class Capture:
    """Collects the lines logged while the `with` block runs (single model load at a time)."""

    def __enter__(self) -> Capture:
        with _lock:
            _lines.clear()
        return self

    def __exit__(self, *exc: object) -> None:
        with _lock:
            self.lines = list(_lines)

    def _snapshot(self) -> list[tuple[int, str]]:
        lines = getattr(self, "lines", None)  # set on exit; live view inside the block
        if lines is None:
            with _lock:
                lines = list(_lines)
        return lines

    def text(self) -> str:
        return "".join(s for _, s in self._snapshot())

    def errors(self) -> list[str]:
        return [s.strip() for lvl, s in self._snapshot() if lvl == _LEVEL_ERROR and s.strip()]


_REASON_SKIP = re.compile(r"failed to (initialize|create) (the )?(llama_)?context\s*$|^\s*$")


def reason(cap: Capture) -> str | None:
    """llama.cpp's most specific error line, without the function-name prefix."""
    errs = [e for e in cap.errors() if not _REASON_SKIP.search(e)]
    if not errs:
        errs = cap.errors()
    if not errs:
        return None
    msg = errs[0]
    return re.sub(r"^[A-Za-z_:0-9]+: ", "", msg)
