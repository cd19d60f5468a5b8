"""Slots: one KV sequence each (seq id = slot id), its cached tokens and checkpoints, and the request
running in it (sampler chain, text stream, limits, counters). Slot choice prefers the idle slot
whose cached tokens give the new prompt the longest usable prefix, then the least recently used.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..kv_store import common_prefix
from .job import Job
from .prompt_cache import Checkpoint, usable_prefix
from .reasoning import ReasoningWatch
from .text import TextStream


@dataclass
class Slot:
    id: int
    tokens: list[int] = field(default_factory=list)  # prompt + accepted generated tokens
    n_past: int = 0  # how many of ``tokens`` are in the KV cache
    # oldest cached position of this sequence (SWA window), -1 when empty; read again from llama.cpp before a
    # request is placed: another sequence's decode may reuse this one's cells that left its window
    pos_min: int = -1
    checkpoints: list[Checkpoint] = field(default_factory=list)
    last_used: float = 0.0
    # the running request
    job: Job | None = None
    chain: Any = None
    samplers: Any = None  # sampling.Samplers (chain, rest, grammar)
    watch: ReasoningWatch | None = None  # the reasoning block a lazy grammar is gated on
    preserved: frozenset[int] = frozenset()  # special tokens rendered as text (empty: all, when asked)
    stream: TextStream | None = None
    n_prompt: int = 0
    n_cached: int = 0
    n_generated: int = 0
    max_new: int = 0
    deadline: float | None = None
    t_start: float = 0.0
    t_prompt_done: float = 0.0
    t_last: float = 0.0
    i_batch: int = -1  # index of this slot's output row in the current batch, -1 when none
    last_checkpoint_at: int = 0

    @property
    def busy(self) -> bool:
        return self.job is not None

    @property
    def state(self) -> str:
        if self.job is None:
            return "idle"
        return "processing_prompt" if self.n_past < self.n_prompt else "generating"

    def prompt_left(self) -> int:
        return max(0, self.n_prompt - self.n_past) if self.job is not None else 0

    def usable_for(self, prompt: np.ndarray, n_swa: int) -> int:
        cap = len(prompt) - 1
        cached = np.asarray(self.tokens[: self.n_past], dtype=np.int32)
        n = min(common_prefix(cached, prompt), cap)
        return usable_prefix(n, self.n_past, self.pos_min, self.checkpoints, n_swa)[0]

    def release(self) -> None:
        self.job = None
        self.t_prompt_done = 0.0
        self.stream = None
        self.i_batch = -1
        self.deadline = None
        self.last_used = time.monotonic()

    def info(self, n_ctx: int) -> dict[str, Any]:
        """GET /slots entry (read-only)."""
        return {
            "id": self.id,
            "state": self.state,
            "is_processing": self.job is not None,
            "n_ctx": n_ctx,
            "n_past": self.n_past,
            "n_cached_tokens": self.n_past,
            "n_prompt_tokens": self.n_prompt if self.job else 0,
            "n_decoded": self.n_generated if self.job else 0,
            "n_checkpoints": len(self.checkpoints),
            "id_task": self.job.id if self.job else -1,
        }


def choose_slot(slots: list[Slot], prompt: np.ndarray, n_swa: int) -> tuple[Slot, int] | None:
    """The idle slot with the longest usable prefix for ``prompt`` (ties: least recently used)."""
    best: tuple[Slot, int] | None = None
    for s in slots:
        if s.busy:
            continue
        use = s.usable_for(prompt, n_swa)
        if best is None or use > best[1] or (use == best[1] and s.last_used < best[0].last_used):
            best = (s, use)
    return best
