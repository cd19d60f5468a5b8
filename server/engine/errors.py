"""The engine's exceptions. Serving maps them to HTTP answers in one place; none of them knows HTTP."""

from __future__ import annotations


class EngineError(Exception):
    """Base of every failure the engine reports to a caller."""


class NotReady(EngineError):
    """The model is still loading (``retry_after_s``) or failed to load (``load_error``)."""

    def __init__(self, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Draining(EngineError):
    """The engine is shutting down and takes no new requests."""


class QueueFull(EngineError):
    """More than --max-queue requests wait already."""

    def __init__(self, waiting: int, retry_after_s: int) -> None:
        super().__init__(f"the request queue is full ({waiting} requests waiting)")
        self.waiting = waiting
        self.retry_after_s = retry_after_s


class PromptTooLong(EngineError):
    def __init__(self, n_prompt: int, n_ctx: int) -> None:
        super().__init__(f"the prompt is {n_prompt} tokens but a slot holds at most {n_ctx}")
        self.n_prompt = n_prompt
        self.n_ctx = n_ctx


class InvalidRequest(EngineError):
    """A request the engine cannot run (empty prompt, token outside the vocabulary ...)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class InvalidGrammar(InvalidRequest):
    """llama.cpp could not build a sampler from the grammar."""


class EngineFailure(EngineError):
    """llama.cpp failed while running a request (decode error); the request ends with it."""
