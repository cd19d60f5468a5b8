"""A request's handle (Job) and the FIFO queue of jobs waiting for a free slot.

The worker thread emits events; the event loop reads them (``async for ev in job.events()``).
``job.cancel()`` is thread-safe and idempotent: a queued job is dropped at once, a running one is
stopped by the worker (prefill aborted within one ubatch, decoding at the next step).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import threading
import time
from collections.abc import AsyncIterator, Callable

from .request import DoneEvent, Event, GenerationRequest

_ids = itertools.count(1)


class Job:
    def __init__(
        self,
        request: GenerationRequest,
        loop: asyncio.AbstractEventLoop | None,
        on_cancel: Callable[[Job], None],
    ) -> None:
        self.id = next(_ids)
        self.request = request
        self.arrival = time.monotonic()
        self._loop = loop
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        self._cancel = threading.Event()
        self._on_cancel = on_cancel
        self.cancel_reason = "cancelled"
        self.finished = threading.Event()
        self.slot_id: int | None = None

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def cancel(self, reason: str = "cancelled") -> None:
        """Stop this job (idempotent); its last event is a DoneEvent with finish_reason ``reason``."""
        if self.finished.is_set() or self._cancel.is_set():
            return
        self.cancel_reason = reason
        self._cancel.set()
        self._on_cancel(self)

    def emit(self, ev: Event) -> None:
        """Called by the worker thread (or by the queue for a dropped job)."""
        if isinstance(ev, DoneEvent):
            if self.finished.is_set():
                return
            self.finished.set()
        if self._loop is None:
            self._queue.put_nowait(ev)
            return
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, ev)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    async def next_event(self, timeout: float | None = None) -> Event | None:
        """The next event, or None after ``timeout`` seconds without one (a keepalive tick)."""
        if not self._queue.empty():  # the common case while tokens flow: no timer, no task
            return self._queue.get_nowait()
        try:
            return await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            return None

    def pending_event(self) -> Event | None:
        """An event already delivered to the loop, without waiting (None if there is none)."""
        return None if self._queue.empty() else self._queue.get_nowait()

    async def events(self) -> AsyncIterator[Event]:
        while True:
            ev = await self._queue.get()
            yield ev
            if isinstance(ev, DoneEvent):
                return


class JobQueue:
    """FIFO of jobs waiting for a slot, with a condition the worker sleeps on."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self._waiting: collections.deque[Job] = collections.deque()

    def __len__(self) -> int:
        return len(self._waiting)

    def push(self, job: Job) -> None:
        with self.cv:
            self._waiting.append(job)
            self.cv.notify_all()

    def pop(self) -> Job | None:
        with self.cv:
            return self._waiting.popleft() if self._waiting else None

    def remove(self, job: Job) -> bool:
        """Drop a queued job; False when it is not queued (running or done)."""
        with self.cv:
            try:
                self._waiting.remove(job)
            except ValueError:
                return False
            return True

    def wake(self) -> None:
        with self.cv:
            self.cv.notify_all()

    def wait(self, timeout: float | None) -> None:
        with self.cv:
            if not self._waiting:
                self.cv.wait(timeout)

    def drain_all(self) -> list[Job]:
        with self.cv:
            jobs = list(self._waiting)
            self._waiting.clear()
            return jobs
