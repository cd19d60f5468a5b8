"""Which cached state a new prompt starts from, and where states go when a slot is reused.

Order of sources for a prompt assigned to a slot: the slot's own sequence, the RAM cache
(``--cache-ram``), the state files (``--state-dir``); the one giving the longest usable prefix wins
(a file only when it saves at least ``--state-min-tokens``). Before a slot's sequence is overwritten
by a prompt that would lose part of it, the sequence (with its checkpoints) goes into the RAM cache,
as llama-server does. After a request, its sequence is written to the state directory.
"""

from __future__ import annotations

import logging

import llama_cpp
import numpy as np

from ..kv_store import Entry, KVStore, StateFileError, common_prefix
from .prompt_cache import PARTIAL, Checkpoint, RamCache, SavedState, get_state, seq_pos_range, set_state, usable_prefix
from .slots import Slot

log = logging.getLogger("llama_vq.server.engine")


def _meta_checkpoints(meta: dict) -> list[Checkpoint]:
    return [Checkpoint(int(n), int(a), int(b), b"") for n, a, b, _ in meta.get("checkpoints", [])]


class CachePolicy:
    def __init__(self, core, ram: RamCache, store: KVStore | None, on_restore=None) -> None:
        self.core = core
        self.ram = ram
        self.store = store
        self.on_restore = on_restore or (lambda n: None)

    # ---- before a request ----------------------------------------------------------------------

    def prepare(self, slot: Slot, prompt: np.ndarray, use: int) -> None:
        """Leave ``slot``'s sequence holding the longest usable prefix of ``prompt``; set n_past."""
        core = self.core
        if use < 0:  # cache_prompt false: start from nothing
            self._stash(slot, 0)
            self._reset(slot)
        else:
            floor = max(use, core.state_min_tokens - 1)
            cap = len(prompt) - 1
            ram = self.ram.best(prompt, cap, core.n_swa_eff, floor) if self.ram.enabled else None
            disk = self._disk_best(prompt, max(floor, ram[2] if ram else 0))
            if disk is not None:
                self._stash(slot, 0)
                self._load_disk(slot, *disk)
            elif ram is not None:
                self._stash(slot, 0)
                st = self.ram.take(ram[0])
                if st is None or not self._load(slot, st):
                    self._reset(slot)
            else:
                self._stash(slot, use)
        self._cut(slot, prompt)

    def _reset(self, slot: Slot) -> None:
        llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(self.core.ctx), slot.id, -1, -1)
        slot.tokens, slot.n_past, slot.pos_min, slot.checkpoints = [], 0, -1, []

    def _stash(self, slot: Slot, keep: int) -> None:
        """Copy the slot's sequence into the RAM cache when ``keep`` tokens of it will survive."""
        if not self.ram.enabled or slot.n_past < max(1, self.core.state_min_tokens) or keep >= slot.n_past:
            return
        data = get_state(self.core.ctx, slot.id)
        self.ram.put(
            SavedState(np.asarray(slot.tokens[: slot.n_past], np.int32), data, slot.pos_min, list(slot.checkpoints))
        )

    def _load(self, slot: Slot, st: SavedState) -> bool:
        if not set_state(self.core.ctx, slot.id, st.data):
            log.warning("llama.cpp refused a cached state of %d tokens; recomputing", len(st.tokens))
            return False
        slot.tokens = [int(t) for t in st.tokens]
        slot.n_past = len(slot.tokens)
        slot.pos_min = seq_pos_range(self.core.ctx, slot.id)[0]
        slot.checkpoints = list(st.checkpoints)
        return True

    def _cut(self, slot: Slot, prompt: np.ndarray) -> None:
        core = self.core
        cap = len(prompt) - 1
        cached = np.asarray(slot.tokens[: slot.n_past], dtype=np.int32)
        n_common = min(common_prefix(cached, prompt), cap)
        use, ck = usable_prefix(n_common, slot.n_past, slot.pos_min, slot.checkpoints, core.n_swa_eff)
        if ck is not None and not set_state(core.ctx, slot.id, ck.data, PARTIAL):
            log.warning("slot %d: llama.cpp refused a checkpoint; recomputing", slot.id)
            use = 0
        mem = llama_cpp.llama_get_memory(core.ctx)
        if use <= 0:
            llama_cpp.llama_memory_seq_rm(mem, slot.id, -1, -1)
            slot.checkpoints = []
        else:
            llama_cpp.llama_memory_seq_rm(mem, slot.id, use, -1)
            slot.checkpoints = [c for c in slot.checkpoints if c.n_tokens <= use]
        if ck is not None and use > 0:
            log.info("slot %d: restored the checkpoint at %d tokens", slot.id, use)
        slot.tokens = [int(t) for t in prompt]
        slot.n_past = max(0, use)
        slot.pos_min = seq_pos_range(core.ctx, slot.id)[0]

    # ---- state files ---------------------------------------------------------------------------

    def _disk_best(self, prompt: np.ndarray, floor: int) -> tuple[Entry, int] | None:
        if self.store is None:
            return None
        cap = len(prompt) - 1
        n_swa = self.core.n_swa_eff

        def usable(e: Entry, n: int) -> int:
            n = min(n, cap)
            meta = e.meta
            return usable_prefix(n, len(e.tokens), int(meta.get("pos_min", 0)), _meta_checkpoints(meta), n_swa)[0]

        return self.store.lookup(prompt, better_than=floor, usable=usable)

    def _load_disk(self, slot: Slot, entry: Entry, n_use: int) -> None:
        try:
            payload = self.store.load(entry)
        except StateFileError:
            self._reset(slot)
            return
        meta = entry.meta
        n_state = int(meta.get("state_bytes", len(payload)))
        ckpts, off = [], n_state
        for n, a, b, size in meta.get("checkpoints", []):
            ckpts.append(Checkpoint(int(n), int(a), int(b), bytes(payload[off : off + size])))
            off += size
        st = SavedState(entry.tokens, bytes(payload[:n_state]), int(meta.get("pos_min", 0)), ckpts)
        if not self._load(slot, st):
            self.store.reject(entry, f"llama.cpp refused it (read less than {n_state} bytes)")
            self._reset(slot)
            return
        self.on_restore(len(entry.tokens))
        log.info("restored KV state of %d tokens from %s (%d usable)", len(entry.tokens), entry.path.name, n_use)

    # ---- after a request -----------------------------------------------------------------------

    def save_to_disk(self, slot: Slot) -> None:
        store, n = self.store, slot.n_past
        if store is None or n < self.core.state_min_tokens:
            return
        toks = np.asarray(slot.tokens[:n], dtype=np.int32)
        existing = store.has(toks)
        if existing is not None:
            store.touch(existing)
            return
        data = get_state(self.core.ctx, slot.id)
        if len(data) == 0:
            log.warning("llama.cpp returned no KV state for %d tokens; not saved", n)
            return
        pos_min = seq_pos_range(self.core.ctx, slot.id)[0]
        meta = {
            "state_bytes": len(data),
            "pos_min": pos_min,
            "checkpoints": [[c.n_tokens, c.pos_min, c.pos_max, c.size] for c in slot.checkpoints],
        }
        payload = b"".join([data, *(c.data for c in slot.checkpoints)])
        store.save(toks, payload, supersede=self.core.n_swa_eff == 0, meta=meta)
