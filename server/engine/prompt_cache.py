"""Prompt cache: which cached prefix a new prompt can use, sequence states and SWA checkpoints, and an
LRU RAM cache of sequence states (``--cache-ram``) in front of the on-disk store (kv_store.py).

Sliding-window (SWA/iSWA) models keep only the last ``n_swa`` positions of their SWA layers (unless
``--swa-full``), so a cached sequence can be cut back only to a point whose window is still there.
As llama-server does, the engine takes *checkpoints* of the part of a sequence's state that cannot be
rolled back (``llama_state_seq_get_data_ext`` with ``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``: the SWA
cells) near the end of each prompt and every ``--checkpoint-every`` tokens of a long one; a new prompt
that diverges inside the window restores the newest checkpoint before the divergence, and the full
attention layers are cut back with ``llama_memory_seq_rm``.

A ``SavedState`` (a whole sequence: full state + its checkpoints) lives in RAM or in a file; both carry
a checksum of their bytes and the engine's identity (model, cache types, flash attention, build, K/V
rotation), and are refused, never loaded, when either does not match. Files carry a sha256
(kv_store.py); RAM entries a CRC-32, computed off the batch loop (a background thread) when the entry
is stored and checked before it is loaded: it guards against damage in memory, not against an attacker,
and storing must not stall every slot (a sha256 of a 28 MiB state is ~15 ms, a CRC-32 ~4 ms).

State bytes are numpy uint8 arrays (file-loaded ones may be ``bytes``) over their own anonymous mapping,
faulted in by the kernel in one go (MAP_POPULATE), which llama.cpp then writes once: no zero-fill, no
second copy. The batch loop takes a state when it admits a request over a slot (the RAM cache's stash)
and at each prompt's end (an SWA checkpoint), every slot waiting meanwhile. Measured in the engine's
process on this project's CPU VM (48-layer MiMo-shaped model, 28 MiB states; noisy): a ctypes array then
``bytes()`` plus a synchronous sha256 took ~57 ms per stash, numpy's own allocation (it asks for
transparent huge pages) ~56 ms, this with the checksum in the background ~27-34 ms. First-touching fresh
memory is most of it there; a reserve of buffers written ahead by a background thread did not remove it.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import llama_cpp
import numpy as np

from ..kv_store import common_prefix
from . import held

log = logging.getLogger("llama_vq.server.engine")

PARTIAL = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY

StateBytes = bytes | np.ndarray  # a state as llama.cpp wrote it (uint8 array) or as read from a file


@dataclass
class Checkpoint:
    """The SWA part of a sequence's state after its first ``n_tokens`` tokens."""

    n_tokens: int
    pos_min: int
    pos_max: int
    data: StateBytes

    @property
    def size(self) -> int:
        return len(self.data)


@dataclass
class SavedState:
    """A whole sequence: tokens, full state (flags 0), the state's oldest position, checkpoints."""

    tokens: np.ndarray  # int32
    data: StateBytes
    pos_min: int
    checkpoints: list[Checkpoint]
    identity: str = ""
    digest: str = ""
    last_used: float = field(default_factory=time.monotonic)
    pending: Future | None = field(default=None, repr=False)  # the digest, while the hasher computes it

    @property
    def size(self) -> int:
        return len(self.data) + sum(c.size for c in self.checkpoints)

    def compute_digest(self) -> str:
        return _digest(self.identity, self.tokens, self.data, self.checkpoints)

    def stored_digest(self) -> str:
        """The digest taken when the entry was stored (waits for the hasher if it is still at it)."""
        if self.pending is not None:
            self.digest, self.pending = self.pending.result(), None
        return self.digest


def _digest(identity: str, tokens: np.ndarray, data: StateBytes, checkpoints: Sequence[Checkpoint]) -> str:
    crc = zlib.crc32(identity.encode())
    crc = zlib.crc32(np.asarray(tokens, "<i4").tobytes(), crc)
    crc = zlib.crc32(data, crc)
    for c in checkpoints:
        crc = zlib.crc32(f"{c.n_tokens},{c.pos_min},{c.pos_max}".encode(), crc)
        crc = zlib.crc32(c.data, crc)
    return f"crc32:{crc:08x}"


# ---- llama.cpp state calls (worker thread only) ------------------------------------------------


_U8P = ctypes.POINTER(ctypes.c_uint8)
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def _state_buffer(size: int) -> np.ndarray:
    if size < 1 << 20:
        return np.empty(size, np.uint8)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _POPULATE
    return np.frombuffer(mmap.mmap(-1, size, flags=flags), np.uint8)  # the array keeps the mapping


def get_state(ctx: object, seq: int, flags: int = 0) -> np.ndarray:
    """The sequence's state as a uint8 array (llama.cpp writes it in place: no zero-fill, no copy)."""
    size = llama_cpp.llama_state_seq_get_size_ext(ctx, seq, flags)
    buf = _state_buffer(size)
    got = llama_cpp.llama_state_seq_get_data_ext(ctx, buf.ctypes.data_as(_U8P), size, seq, flags)
    return buf[:got]


def set_state(ctx: object, seq: int, data: StateBytes, flags: int = 0) -> bool:
    """Load a state into ``seq``; False (and the sequence cleared) when llama.cpp refuses it."""
    mem = llama_cpp.llama_get_memory(ctx)
    if flags == 0:
        llama_cpp.llama_memory_seq_rm(mem, seq, -1, -1)
    src = np.frombuffer(data, np.uint8)  # a view: llama.cpp only reads it
    got = llama_cpp.llama_state_seq_set_data_ext(ctx, src.ctypes.data_as(_U8P), len(src), seq, flags)
    if got != len(src):
        llama_cpp.llama_memory_seq_rm(mem, seq, -1, -1)
        return False
    return True


def seq_pos_range(ctx: object, seq: int) -> tuple[int, int]:
    mem = held.get_memory(ctx)
    return int(held.memory_seq_pos_min(mem, seq)), int(held.memory_seq_pos_max(mem, seq))


# ---- what a cached sequence can give a new prompt -----------------------------------------------


def usable_prefix(
    n_common: int, n_stored: int, pos_min: int, checkpoints: Sequence[Checkpoint], n_swa: int
) -> tuple[int, Checkpoint | None]:
    """How many tokens of a cached sequence (``n_stored`` tokens, oldest cached position ``pos_min``)
    sharing ``n_common`` tokens with a prompt can be kept, and the checkpoint to restore first.

    ``n_common`` is already capped so that one prompt token is left to evaluate. Without a window
    (n_swa == 0: no SWA layers, or --swa-full) every shared token is usable, and so is a sequence that
    the prompt extends (nothing is cut). Cutting a windowed sequence back needs the window before the
    cut still cached (llama-server's rule: pos_min < cut - n_swa); else the newest checkpoint at or
    before the cut is restored (a checkpoint holds the window of its own end), else nothing is usable.
    """
    if n_common <= 0:
        return 0, None
    if n_swa <= 0 or n_common >= n_stored:
        return n_common, None
    if pos_min < max(0, n_common - n_swa) or pos_min <= 0:
        return n_common, None
    for c in reversed(checkpoints):
        if c.n_tokens <= n_common and c.pos_max < c.n_tokens:
            return c.n_tokens, c
    return 0, None


# ---- RAM cache ----------------------------------------------------------------------------------


class RamCache:
    """LRU of SavedStates under a byte budget (``--cache-ram``); thread-safe for /metrics reads."""

    def __init__(self, budget_bytes: int, identity: str) -> None:
        self.budget = budget_bytes
        self.identity = identity
        self._lock = threading.Lock()
        self._items: OrderedDict[int, SavedState] = OrderedDict()
        self._next = 0
        self.rejected = 0
        self._hasher = ThreadPoolExecutor(1, thread_name_prefix="ram-cache-digest")  # off the batch loop

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return sum(s.size for s in self._items.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def put(self, st: SavedState) -> None:
        if st.size > self.budget:
            return
        st.identity = self.identity
        st.pending = self._hasher.submit(_digest, st.identity, st.tokens, st.data, list(st.checkpoints))
        with self._lock:
            for k, old in list(self._items.items()):  # a state that extends an older one replaces it
                n = common_prefix(old.tokens, st.tokens)
                if n == len(old.tokens) and not old.checkpoints:
                    del self._items[k]
            self._items[self._next] = st
            self._next += 1
            total = sum(s.size for s in self._items.values())
            while total > self.budget and self._items:
                _, victim = self._items.popitem(last=False)
                total -= victim.size

    def best(self, prompt: np.ndarray, cap: int, n_swa: int, better_than: int) -> tuple[int, SavedState, int] | None:
        """(key, state, usable tokens) of the entry serving the longest prefix of ``prompt``."""
        with self._lock:
            items = list(self._items.items())
        found = None
        for k, st in items:
            n = min(common_prefix(st.tokens, prompt), cap)
            use, _ = usable_prefix(n, len(st.tokens), st.pos_min, st.checkpoints, n_swa)
            if use > better_than and (found is None or use > found[2]):
                found = (k, st, use)
        return found

    def take(self, key: int) -> SavedState | None:
        """The entry, verified (identity and checksum); a damaged or foreign one is dropped."""
        with self._lock:
            st = self._items.get(key)
            if st is None:
                return None
            self._items.move_to_end(key)
        if st.identity != self.identity or st.compute_digest() != st.stored_digest():
            log.warning("RAM cache entry of %d tokens failed its check: dropped, recomputing", len(st.tokens))
            with self._lock:
                self._items.pop(key, None)
            self.rejected += 1
            return None
        st.last_used = time.monotonic()
        return st

    def entries(self) -> list[SavedState]:
        with self._lock:
            return list(self._items.values())
