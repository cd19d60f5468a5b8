"""The engine: slots with continuous batching and a prompt cache over llama.cpp's low-level API.

Modules: request (pure data in and out), errors (the engine's exceptions), job (Job and the FIFO
queue), sampling (sampler chains, text and stop strings), slots, prompt_cache (states, checkpoints,
RAM cache), cache_policy (where a prompt starts from), scheduler (the batch loop), loader (model and
context), engine (the facade). Importing this package does not load llama_cpp: ``Engine`` and
``ModelInfo`` are imported on first use, after llama_vq has bound llama_cpp to its own build.
"""

from __future__ import annotations

from typing import Any

from .errors import (
    Draining,
    EngineError,
    EngineFailure,
    InvalidGrammar,
    InvalidRequest,
    NotReady,
    PromptTooLong,
    QueueFull,
)
from .request import DoneEvent, GenerationRequest, Grammar, ProgressEvent, Reasoning, Sampling, TokenEvent

__all__ = [
    "DoneEvent",
    "Draining",
    "Engine",
    "EngineError",
    "EngineFailure",
    "GenerationRequest",
    "Grammar",
    "InvalidGrammar",
    "InvalidRequest",
    "Job",
    "ModelInfo",
    "NotReady",
    "ProgressEvent",
    "PromptTooLong",
    "QueueFull",
    "Reasoning",
    "Sampling",
    "TokenEvent",
    "attn_rotation_disabled",
]


def __getattr__(name: str) -> Any:
    if name in ("Engine", "ModelInfo", "attn_rotation_disabled"):
        from . import engine

        return getattr(engine, name)
    if name == "Job":
        from .job import Job

        return Job
    raise AttributeError(name)
