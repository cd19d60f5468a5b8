"""Helpers for the in-process engine tests: a real Engine (real model, real llama.cpp context) built
from server flags, and a way to run requests on it from a test's own event loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

LOAD_DEADLINE_S = 120.0


def start_engine(model: Path, *flags: str) -> Any:
    import llama_vq  # noqa: F401  (binds llama_cpp before the engine imports it)
    from server.engine import Engine
    from server.metrics import Metrics
    from server.settings import parse_settings

    cfg = parse_settings(["-m", str(model), *flags], {})
    engine = Engine(cfg, Metrics(), cfg.model)
    engine.start()
    end = time.monotonic() + LOAD_DEADLINE_S
    while engine.status == "loading" and time.monotonic() < end:
        time.sleep(0.02)  # polls the load with a deadline
    assert engine.status == "ready", engine.load_error
    return engine


def greedy(prompt: Sequence[int], max_tokens: int, **kw: Any) -> Any:
    from server.engine import GenerationRequest, Sampling

    return GenerationRequest(tuple(prompt), Sampling(temperature=0.0), max_tokens=max_tokens, **kw)


async def collect(job: Any) -> tuple[tuple[int, ...], str, Any]:
    """(generated token ids, text, DoneEvent) of a job."""
    from server.engine import DoneEvent, TokenEvent

    ids: list[int] = []
    text = ""
    async for ev in job.events():
        if isinstance(ev, TokenEvent):
            ids += ev.token_ids
            text += ev.text
        elif isinstance(ev, DoneEvent):
            return tuple(ids), text, ev
    raise AssertionError("no DoneEvent")


def run_one(engine: Any, req: Any) -> tuple[tuple[int, ...], str, Any]:
    async def go():
        return await collect(engine.submit(req))

    return asyncio.run(go())


def run_together(engine: Any, reqs: Sequence[Any]) -> list[tuple[tuple[int, ...], str, Any]]:
    async def go():
        jobs = [engine.submit(r) for r in reqs]
        return await asyncio.gather(*(collect(j) for j in jobs))

    return asyncio.run(go())
