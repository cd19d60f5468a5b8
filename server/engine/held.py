"""The batch loop's short llama.cpp calls, made without letting go of the GIL.

ctypes releases the GIL around every call into a ``CDLL`` and takes it back afterwards. In the server
the event loop thread (HTTP, SSE: a JSON chunk and a socket write per token) holds the GIL for its
Python work, so each time the worker thread comes back from llama.cpp it may wait for the GIL until
the loop thread lets go (at the latest after the interpreter's switch interval, 5 ms). A decode step
of n generating slots made ~3n such calls (sample, end-of-generation test, token piece), each one a
chance to wait, for work that takes microseconds. Measured on the H200 (MiMo-shaped model, 4 clients):
the engine driven in-process decoded ~400 tok/s, the same engine behind HTTP 282-359.

So the worker lets go of the GIL only where llama.cpp works for long: ``llama_decode`` and the wait
for its results (``llama_synchronize``, before the step's first sample); the short calls after it go
through a ``PyDLL`` view of the same library, which keeps the GIL. Their signatures are the bindings'.
The price: while one of them runs, the event loop waits too; a sample through a large grammar can take a
millisecond or more, about what the loop used to wait for the worker anyway. Measured after the change on the
same H200 model: the served 4-client rate did not move measurably (RESULTS.md, engine section, round 5). In round 6
the loss did not show (served 4-client rates at the in-process ones), and py-spy found the worker holding the GIL in
7.8 % of its samples, the HTTP loop in 5.5 %: at 4 clients on the H200 the GPU, not the GIL, sets the rate.
"""

from __future__ import annotations

import ctypes
import logging

import llama_cpp

log = logging.getLogger("llama_vq.server.engine")

_NAMES = (
    "llama_sampler_sample",
    "llama_sampler_accept",
    "llama_vocab_is_eog",
    "llama_token_to_piece",
    "llama_memory_seq_pos_min",
    "llama_memory_seq_pos_max",
    "llama_get_memory",
)


def _bind() -> dict[str, object]:
    calls = {name: getattr(llama_cpp, name) for name in _NAMES}
    lib = getattr(getattr(llama_cpp, "llama_cpp", None), "_lib", None)
    if not isinstance(lib, ctypes.CDLL):  # bindings laid out otherwise: the GIL-releasing calls still work
        log.warning("llama_cpp's library handle not found: the batch loop's short calls release the GIL")
        return calls
    held = ctypes.PyDLL(lib._name, handle=lib._handle)  # the loaded library, not a second copy
    for name, orig in calls.items():
        f = getattr(held, name)
        f.argtypes, f.restype = orig.argtypes, orig.restype
        calls[name] = f
    return calls


_CALLS = _bind()
sampler_sample = _CALLS["llama_sampler_sample"]
sampler_accept = _CALLS["llama_sampler_accept"]
vocab_is_eog = _CALLS["llama_vocab_is_eog"]
token_to_piece = _CALLS["llama_token_to_piece"]
memory_seq_pos_min = _CALLS["llama_memory_seq_pos_min"]
memory_seq_pos_max = _CALLS["llama_memory_seq_pos_max"]
get_memory = _CALLS["llama_get_memory"]
