"""The batch loop (worker thread): continuous batching over all slots of one llama.cpp context.

Each step builds ONE llama_batch holding the next token of every generating slot and prompt chunks
of the slots still processing their prompt (up to n_batch tokens), calls llama_decode once, then
samples for every slot whose last token produced logits. A slot's progress is ``n_past`` (tokens in
its KV sequence); when a decode is aborted or fails, each sequence's real end is read back from
llama.cpp (llama_memory_seq_pos_max) and its slot resumes from there.

While a batch holds prompt tokens over more than one ubatch, llama.cpp's abort callback is set: a
cancelled, timed-out or drained request in prefill stops the decode within the current ubatch (a
one-ubatch decode is checked between steps, which is as soon).
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Callable

import llama_cpp
import numpy as np

from . import held
from .errors import EngineFailure
from .job import Job, JobQueue
from .prompt_cache import PARTIAL, Checkpoint, get_state, seq_pos_range
from .reasoning import ReasoningWatch
from .request import DoneEvent, ProgressEvent, TokenEvent
from .sampling import build_samplers, token_piece
from .slots import Slot, choose_slot
from .text import TextStream

log = logging.getLogger("llama_vq.server.engine")
_WATCH_MIN_TOKENS = 64


class Scheduler:
    def __init__(self, core, queue: JobQueue, cache, observe: Callable[[str, float], None]) -> None:
        self.core = core  # engine.Core: ctx, vocab, sizes, settings
        self.queue = queue
        self.cache = cache  # cache_policy.CachePolicy
        self.observe = observe  # metrics hook: (name, value)
        self.slots = [Slot(i) for i in range(core.n_slots)]
        self.batch = llama_cpp.llama_batch_init(core.n_batch, 0, 1)
        self._prefill_jobs: list[Job] = []
        self._abort_cb = llama_cpp.ggml_abort_callback(self._should_abort)
        self.stopping = False
        self.drain_deadline: float | None = None

    # ---- loop ----------------------------------------------------------------------------------

    def run(self) -> None:
        while True:
            self._admit()
            self._expire()
            active = [s for s in self.slots if s.busy]
            if not active:
                if self.stopping and not len(self.queue):
                    return
                self.queue.wait(0.25)
                continue
            try:
                self._step(active)
            except Exception as e:  # noqa: BLE001 (a failed step ends its requests, not the worker)
                log.exception("engine step failed")
                for s in active:
                    if s.busy:
                        self._finish(s, "error", error=f"{type(e).__name__}: {e}")

    def close(self) -> None:
        llama_cpp.llama_batch_free(self.batch)

    def _admit(self) -> None:
        while any(not s.busy for s in self.slots):
            job = self.queue.pop()
            if job is None:
                return
            if job.cancelled:  # cancelled while being taken off the queue: it still gets its end
                job.emit(DoneEvent(job.cancel_reason, None, len(job.request.prompt), 0, 0))
                continue
            try:
                self._start(job)
            except Exception as e:  # noqa: BLE001
                log.exception("starting a request failed")
                job.emit(DoneEvent("error", None, len(job.request.prompt), 0, 0, error=str(e)))

    def _expire(self) -> None:
        now = time.monotonic()
        drained = self.drain_deadline is not None and now >= self.drain_deadline
        if drained:
            for job in self.queue.drain_all():
                job.emit(DoneEvent("cancelled", None, len(job.request.prompt), 0, 0))
        for s in self.slots:
            if not s.busy:
                continue
            if s.job.cancelled:
                self._finish(s, s.job.cancel_reason)
            elif s.deadline is not None and now >= s.deadline:
                self._finish(s, "timeout")
            elif drained:
                self._finish(s, "cancelled", save=False)

    # ---- starting a request --------------------------------------------------------------------

    def _start(self, job: Job) -> None:
        core, req = self.core, job.request
        prompt = np.asarray(req.prompt, dtype=np.int32)
        smp = build_samplers(core.vocab, core.n_vocab, core.n_ctx, req.sampling, req.grammar)  # may raise
        chain = smp.chain
        for s in self.slots:  # a decode may have taken the window-masked SWA cells of an idle sequence
            if not s.busy:
                s.pos_min = seq_pos_range(core.ctx, s.id)[0]
        if req.cache_prompt:
            slot, use = choose_slot(self.slots, prompt, core.n_swa_eff)
        else:
            slot, use = min((s for s in self.slots if not s.busy), key=lambda s: s.last_used), -1
        job.slot_id = slot.id
        slot.t_start = time.monotonic()
        try:
            self.cache.prepare(slot, prompt, use)
        except Exception:
            llama_cpp.llama_sampler_free(chain)
            raise
        slot.job, slot.chain, slot.stream = job, chain, TextStream(req.stop)
        slot.samplers = smp
        gated = req.grammar is not None and req.grammar.lazy and req.reasoning is not None  # as llama-server
        slot.watch = ReasoningWatch(req.reasoning) if gated else None
        slot.preserved = frozenset(req.preserved_token_ids)
        slot.n_prompt = len(prompt)
        slot.n_cached = slot.n_past
        slot.n_generated = 0
        slot.last_checkpoint_at = max([c.n_tokens for c in slot.checkpoints] + [0])
        limit = req.max_tokens if req.max_tokens is not None else core.n_predict
        room = core.n_ctx - len(prompt)
        slot.max_new = room if limit is None or limit < 0 else min(limit, room)
        timeout = req.timeout_s if req.timeout_s is not None else core.timeout_s
        slot.deadline = job.arrival + timeout if timeout and timeout > 0 else None
        job.emit(ProgressEvent(slot.n_past, slot.n_prompt, slot.n_cached))

    # ---- one step ------------------------------------------------------------------------------

    def _step(self, active: list[Slot]) -> None:
        core, b = self.core, self.batch
        n, added, prefill = self._fill(active)
        if n == 0:
            return
        b.n_tokens = n
        # The abort callback is a Python call per graph node: worth it for decodes that take a while
        # (several ubatches, or a big prompt chunk, which can take seconds on a large model), not for a
        # few tokens, which are checked between steps anyway.
        watch = sum(added[p.id] for p in prefill) >= _WATCH_MIN_TOKENS or (bool(prefill) and n > core.n_ubatch)
        if watch:
            self._prefill_jobs = [s.job for s in prefill]
            llama_cpp.llama_set_abort_callback(core.ctx, self._abort_cb, None)
        t0 = time.monotonic()
        try:
            ret = llama_cpp.llama_decode(core.ctx, b)
        finally:
            if watch:
                llama_cpp.llama_set_abort_callback(core.ctx, llama_cpp.ggml_abort_callback(), None)
                self._prefill_jobs = []
        self.observe("decode_seconds", time.monotonic() - t0)
        by_id = {s.id: s for s in active}
        if ret != 0:
            self._after_failed_decode(ret, by_id, added)
            return
        for sid, k in added.items():
            by_id[sid].n_past += k
        for s in prefill:
            if s.n_past < s.n_prompt:
                s.job.emit(ProgressEvent(s.n_past, s.n_prompt, s.n_cached))
        sampling = [s for s in active if s.busy and s.i_batch >= 0]
        if sampling:
            llama_cpp.llama_synchronize(core.ctx)  # the wait for the GPU, without the GIL (held.py)
        for s in sampling:
            self._sample(s)

    def _fill(self, active: list[Slot]) -> tuple[int, dict[int, int], list[Slot]]:
        """The step's batch: one token of every generating slot, then prompt chunks (oldest request first) up to
        n_batch. (tokens, {slot id: tokens added}, the slots whose prompt is in it)."""
        core = self.core
        n = 0
        added: dict[int, int] = {}
        prefill: list[Slot] = []
        for s in active:  # decode tokens first: one each
            s.i_batch = -1
            if s.n_past >= s.n_prompt and s.n_past == len(s.tokens) - 1:
                self._add(n, s.tokens[s.n_past], s.n_past, s.id, True)
                s.i_batch = n
                added[s.id] = 1
                n += 1
        for s in sorted(active, key=lambda s: s.job.arrival):
            if s.n_past >= s.n_prompt or n >= core.n_batch:
                continue
            self._maybe_checkpoint(s)
            take = min(core.n_batch - n, self._chunk_end(s) - s.n_past)
            for i in range(take):
                p = s.n_past + i
                last = p == s.n_prompt - 1
                self._add(n, s.tokens[p], p, s.id, last)
                if last:
                    s.i_batch = n
                n += 1
            added[s.id] = take
            prefill.append(s)
        return n, added, prefill

    def _add(self, i: int, token: int, pos: int, seq: int, logits: bool) -> None:
        b = self.batch
        b.token[i] = token
        b.pos[i] = pos
        b.n_seq_id[i] = 1
        b.seq_id[i][0] = seq
        b.logits[i] = logits

    def _should_abort(self, _data: ctypes.c_void_p) -> bool:
        now = None
        for j in self._prefill_jobs:
            if j.cancelled:
                return True
            if j.slot_id is not None:
                d = self.slots[j.slot_id].deadline
                if d is not None:
                    now = now or time.monotonic()
                    if now >= d:
                        return True
        dd = self.drain_deadline
        return dd is not None and time.monotonic() >= dd

    def _after_failed_decode(self, ret: int, by_id: dict[int, Slot], added: dict[int, int]) -> None:
        """Abort (2) or no KV room (1): resume every sequence from where llama.cpp has it."""
        for sid in added:
            s = by_id[sid]
            _, pmax = seq_pos_range(self.core.ctx, sid)
            s.n_past = max(0, min(pmax + 1, len(s.tokens)))
        if ret == 2:
            return  # the cancelled / expired jobs are finished by _expire
        if ret == 1:  # the shared cache is full: end the longest request, as at the context end
            victim = max(by_id.values(), key=lambda s: s.n_past)
            log.warning("KV cache full: ending the request in slot %d (%d tokens)", victim.id, victim.n_past)
            self._finish(victim, "length")
            return
        raise EngineFailure(f"llama_decode failed ({ret})")

    # ---- checkpoints (SWA) ---------------------------------------------------------------------

    def _chunk_end(self, s: Slot) -> int:
        """Where this slot's prompt chunk must stop so that a checkpoint can be taken there."""
        end = s.n_prompt
        if self.core.n_swa_eff <= 0:
            return end
        for p in self._checkpoint_points(s):
            if p > s.n_past:
                end = min(end, p)
        return end

    def _checkpoint_points(self, s: Slot) -> list[int]:
        core = self.core
        pts = [s.n_prompt - 4, s.n_prompt - 4 - core.n_ubatch]
        if core.checkpoint_every > 0:
            pts.append(s.last_checkpoint_at + core.checkpoint_every)
        return [p for p in pts if 0 < p < s.n_prompt]

    def _maybe_checkpoint(self, s: Slot) -> None:
        core = self.core
        if core.n_swa_eff <= 0 or core.max_checkpoints <= 0 or s.n_past <= 0:
            return
        if s.n_past not in self._checkpoint_points(s):
            return
        if any(c.n_tokens == s.n_past for c in s.checkpoints):
            return
        pmin, pmax = seq_pos_range(core.ctx, s.id)
        if pmin < 0:
            return
        data = get_state(core.ctx, s.id, PARTIAL)
        s.checkpoints.append(Checkpoint(s.n_past, pmin, pmax, data))
        s.last_checkpoint_at = s.n_past
        while len(s.checkpoints) > core.max_checkpoints:
            s.checkpoints.pop(0)
        log.debug("slot %d: checkpoint at %d tokens (pos %d..%d, %d bytes)", s.id, s.n_past, pmin, pmax, len(data))

    # ---- sampling and finishing ----------------------------------------------------------------

    def _sample(self, s: Slot) -> None:
        core, job = self.core, s.job
        now = time.monotonic()
        if s.n_generated == 0:
            s.t_prompt_done = now
            self.observe("ttft", now - job.arrival)
        watch = s.watch
        smpl = s.samplers.rest if watch is not None and watch.inside else s.chain  # grammar gated
        tok = int(held.sampler_sample(smpl, core.ctx, s.i_batch))
        s.i_batch = -1
        if held.vocab_is_eog(core.vocab, tok) and not job.request.ignore_eos:
            self._finish(s, "stop")
            return
        s.tokens.append(tok)
        if watch is not None:
            for t in watch.push(tok, token_piece(core.vocab, tok, True)):  # a closing end tag: the grammar
                held.sampler_accept(s.samplers.grammar, t)  # sees it (a trigger may start there)
        if s.n_generated:
            self.observe("tpot", now - s.t_last)
        s.t_last = now
        s.n_generated += 1
        special = job.request.render_special and (not s.preserved or tok in s.preserved)
        text, ids, stop = s.stream.push(tok, token_piece(core.vocab, tok, special))
        if text:
            job.emit(TokenEvent(text, ids))
        if stop is not None:
            self._finish(s, "stop", stop_word=stop)
        elif s.n_generated >= s.max_new or len(s.tokens) >= core.n_ctx:
            self._finish(s, "length")

    def _finish(
        self, s: Slot, reason: str, stop_word: str | None = None, error: str | None = None, save: bool = True
    ) -> None:
        job = s.job
        if job is None:
            return
        if reason in ("stop", "length") and stop_word is None and s.stream is not None:
            text, ids = s.stream.flush()
            if text:
                job.emit(TokenEvent(text, ids))
        now = time.monotonic()
        prompt_n = max(0, min(s.n_past, s.n_prompt) - s.n_cached)
        t_pd = s.t_prompt_done or now
        prompt_ms = (t_pd - s.t_start) * 1e3
        pred_ms = (now - t_pd) * 1e3 if s.n_generated else 0.0
        timings: dict[str, float] = {
            "cache_n": s.n_cached,
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": prompt_n / prompt_ms * 1e3 if prompt_ms > 0 else 0.0,
            "predicted_n": s.n_generated,
            "predicted_ms": pred_ms,
            "predicted_per_token_ms": pred_ms / s.n_generated if s.n_generated else 0.0,
            "predicted_per_second": s.n_generated / pred_ms * 1e3 if pred_ms > 0 else 0.0,
        }
        if s.chain is not None:
            llama_cpp.llama_sampler_free(s.chain)
            s.chain = s.samplers = s.watch = None
        done = DoneEvent(reason, stop_word, s.n_prompt, s.n_cached, s.n_generated, timings, error=error)
        self.core.on_done(job, done)
        s.pos_min = seq_pos_range(self.core.ctx, s.id)[0]  # the window moved during generation
        # free the slot before the client hears it is done (GET /slots right after must read idle); the state
        # file is written after, from the slot's tokens, before this worker thread can hand the slot out again
        s.release()
        job.emit(done)
        if save and reason in ("stop", "length") and s.n_past >= s.n_prompt:
            self.cache.save_to_disk(s)
