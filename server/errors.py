"""ApiError and the OpenAI error body: every failure a client sees is built here, nowhere else.

``error_body`` is the one constructor of ``{"error": {"message", "type", "param", "code"}}``;
``from_exception`` is the one place where exceptions of the engine and the chat layer become
ApiErrors (HTTP status, type, code).
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("llama_vq.server.errors")


def error_body(
    message: str,
    type: str = "invalid_request_error",  # noqa: A002 (OpenAI's field name)
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    """OpenAI's error body (the only place it is built)."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class ApiError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",  # noqa: A002 (OpenAI's field name)
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def not_supported(param: str, what: str) -> ApiError:
    return ApiError(
        400,
        f"{param}: {what} is not supported by this server",
        param=param,
        code="unsupported_parameter",
    )


def context_exceeded(n_prompt: int, n_ctx: int) -> ApiError:
    return ApiError(
        400,
        f"the prompt is {n_prompt} tokens but this server's context is {n_ctx} tokens "
        f"(a prompt may use at most {n_ctx - 1}, leaving room for one generated token); "
        "shorten the prompt or restart the server with a larger --ctx-size",
        param="messages",
        code="context_length_exceeded",
    )


def overloaded(retry_after_s: int, waiting: int) -> ApiError:
    return ApiError(
        429,
        f"the request queue is full ({waiting} requests waiting); retry after {retry_after_s} s",
        type="rate_limit_error",
        code="queue_full",
        headers={"Retry-After": str(retry_after_s)},
    )


def unavailable(message: str, retry_after_s: int | None = None) -> ApiError:
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s else None
    return ApiError(503, message, type="server_error", code="unavailable", headers=headers)


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def internal(message: str) -> ApiError:
    return ApiError(500, message, type="server_error", code="internal_error")


# ---- engine and chat-layer exceptions -> ApiError (the one mapping) ----------------------------

# Exception class name -> (status, code). Matched by name along the MRO so that this module does not
# import the engine or the chat layer (both import llama_cpp); their modules define the classes.
_BY_CLASS: dict[str, tuple[int, str]] = {
    "ChatRequestError": (400, "invalid_request"),
    "ChatTemplateError": (400, "invalid_request"),
    "InvalidRequest": (400, "invalid_request"),
    "InvalidGrammar": (400, "invalid_grammar"),
    "PromptTooLong": (400, "context_length_exceeded"),
    "QueueFull": (429, "queue_full"),
    "Draining": (503, "unavailable"),
    "NotReady": (503, "unavailable"),
    "EngineFailure": (500, "internal_error"),
}


def from_exception(e: BaseException, param: str | None = None) -> ApiError:
    """The ApiError for any exception raised while serving a request.

    Engine and chat exceptions carry ``param`` (the request field at fault) and, for queue and
    loading errors, ``retry_after_s``; their message is shown as it is. ``param`` names the field for
    an exception that names none (the message then starts with it). Anything else is a 500 whose
    message names the exception type (the traceback goes to the log).
    """
    if isinstance(e, ApiError):
        return e
    for cls in type(e).__mro__:
        hit = _BY_CLASS.get(cls.__name__)
        if hit is None:
            continue
        status, code = hit
        message = str(e)
        if getattr(e, "param", None):
            param = e.param
        elif param is not None:
            message = f"{param}: {message}"
        retry = getattr(e, "retry_after_s", None)
        if code == "context_length_exceeded" and hasattr(e, "n_prompt") and hasattr(e, "n_ctx"):
            return context_exceeded(int(e.n_prompt), int(e.n_ctx))
        if status == 429:
            return overloaded(int(retry or 1), int(getattr(e, "waiting", 0) or 0))
        if status == 503:
            return unavailable(str(e), retry_after_s=retry)
        if status == 500:
            log.error("engine failure: %s", e)
            return internal(str(e))
        return ApiError(status, message, param=param, code=code)
    log.error("unexpected error: %s: %s", type(e).__name__, e, exc_info=e)
    return internal(f"internal error: {type(e).__name__}")
