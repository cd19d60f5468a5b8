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
a sha256 of their bytes and the engine's identity (model, cache types, flash attention, build, K/V
rotation), and are refused, never loaded, when either does not match.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import llama_cpp
import numpy as np

from ..kv_store import common_prefix

log = logging.getLogger("llama_vq.server.engine")

PARTIAL = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY


@dataclass
class Checkpoint:
    """The SWA part of a sequence's state after its first ``n_tokens`` tokens."""

    n_tokens: int
    pos_min: int
    pos_max: int
    data: bytes

    @property
    def size(self) -> int:
        return len(self.data)


@dataclass
class SavedState:
    """A whole sequence: tokens, full state (flags 0), the state's oldest position, checkpoints."""

    tokens: np.ndarray  # int32
    data: bytes
    pos_min: int
    checkpoints: list[Checkpoint]
    identity: str = ""
    digest: str = ""
    last_used: float = field(default_factory=time.monotonic)

    @property
    def size(self) -> int:
        return len(self.data) + sum(c.size for c in self.checkpoints)

    def compute_digest(self) -> str:
        h = hashlib.sha256(self.identity.encode())
        h.update(np.asarray(self.tokens, "<i4").tobytes())
        h.update(self.data)
        for c in self.checkpoints:
            h.update(f"{c.n_tokens},{c.pos_min},{c.pos_max}".encode())
            h.update(c.data)
        return h.hexdigest()


# ---- llama.cpp state calls (worker thread only) ------------------------------------------------


def get_state(ctx: object, seq: int, flags: int = 0) -> bytes:
    size = llama_cpp.llama_state_seq_get_size_ext(ctx, seq, flags)
    buf = (ctypes.c_uint8 * size)()
    got = llama_cpp.llama_state_seq_get_data_ext(ctx, buf, size, seq, flags)
    return bytes(memoryview(buf)[:got])


def set_state(ctx: object, seq: int, data: bytes, flags: int = 0) -> bool:
    """Load a state into ``seq``; False (and the sequence cleared) when llama.cpp refuses it."""
    mem = llama_cpp.llama_get_memory(ctx)
    if flags == 0:
        llama_cpp.llama_memory_seq_rm(mem, seq, -1, -1)
    buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
    got = llama_cpp.llama_state_seq_set_data_ext(ctx, buf, len(data), seq, flags)
    if got != len(data):
        llama_cpp.llama_memory_seq_rm(mem, seq, -1, -1)
        return False
    return True


def seq_pos_range(ctx: object, seq: int) -> tuple[int, int]:
    mem = llama_cpp.llama_get_memory(ctx)
    return (
        int(llama_cpp.llama_memory_seq_pos_min(mem, seq)),
        int(llama_cpp.llama_memory_seq_pos_max(mem, seq)),
    )


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
        st.digest = st.compute_digest()
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
        if st.identity != self.identity or st.compute_digest() != st.digest:
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
