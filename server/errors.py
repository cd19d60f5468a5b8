"""ApiError: every failure a client sees, with OpenAI's error body and the HTTP status."""

from __future__ import annotations

from typing import Any


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
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


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


def internal(message: str) -> ApiError:
    return ApiError(500, message, type="server_error", code="internal_error")
