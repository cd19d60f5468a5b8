"""Adjust llama.cpp's model and context parameters inside llama_cpp.Llama.__init__.

llama_cpp.Llama builds its parameter structs and loads the model in one constructor, and has no
place for what llama_vq adds (flash_attn "auto", tensor buffer overrides). We wrap the two
internal classes it constructs (llama_cpp._internals.LlamaModel / LlamaContext, pinned version) so
that, while a llama_vq.Llama is being constructed on this thread, its adjustments are applied to
the parameter structs just before the native calls. Outside that window the wrappers do nothing.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from llama_cpp import _internals

_state = threading.local()
_Adjust = Callable[[Any], None]


class _Model(_internals.LlamaModel):
    def __init__(self, *, path_model: str, params: Any, verbose: bool = True) -> None:
        adjust = getattr(_state, "model", None)
        if adjust is not None:
            adjust(params)
        super().__init__(path_model=path_model, params=params, verbose=verbose)

    def close(self) -> None:
        if hasattr(self, "_exit_stack"):  # an adjustment may refuse before the base __init__ ran
            super().close()


class _Context(_internals.LlamaContext):
    def __init__(self, *, model: Any, params: Any, verbose: bool = True) -> None:
        adjust = getattr(_state, "context", None)
        if adjust is not None:
            adjust(params)
        super().__init__(model=model, params=params, verbose=verbose)

    def close(self) -> None:
        if hasattr(self, "_exit_stack"):
            super().close()


def install() -> None:
    if _internals.LlamaModel is not _Model:
        # the hook's whole job: llama_cpp.Llama constructs these two by their module names
        _internals.LlamaModel = _Model  # type: ignore[misc]
        _internals.LlamaContext = _Context  # type: ignore[misc]


@contextlib.contextmanager
def adjusting(model: _Adjust | None = None, context: _Adjust | None = None) -> Iterator[None]:
    prev = getattr(_state, "model", None), getattr(_state, "context", None)
    _state.model, _state.context = model, context
    try:
        yield
    finally:
        _state.model, _state.context = prev
