"""An HTTP request -> one of llama-server's route handlers in the engine -> the HTTP answer, streamed.

Every engine call runs on the bridge's worker threads: the handler (which, for a completion that is not
streamed, returns when it is done) and each `next` of a stream (which blocks until the next chunk). The event
loop only awaits them, and watches the client: when it disconnects, the call is cancelled (llama-server's
should_stop), which frees the task's slot, and the native request is freed once its worker has returned.

While a streamed request's prompt is processed, llama-server sends nothing until the first token; here an SSE
comment goes out every --sse-keepalive seconds instead, so that clients and proxies keep the connection. Once
that has begun, an error the handler answers arrives as an SSE error event (status 200 was already sent).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import json
import logging
import time

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from .engine import Call, Engine, EngineError, Head, Route
from .metrics import Metrics
from .security import error_body, send_json

log = logging.getLogger("llama_vq.server")

KEEPALIVE = b": keepalive\n\n"


def _close_when_done(pending: cf.Future | None, call: Call) -> None:
    """On a worker: wait for the call's last native step, then free it (never while a step is in flight)."""
    if pending is not None:
        try:
            pending.result()
        except Exception:  # noqa: BLE001  (the step's own error was reported where it was awaited)
            pass
    call.close()


def wants_stream(body: bytes) -> bool:
    """Whether a JSON body asks for a stream (the answer a handler gives to it is then SSE)."""
    if b'"stream"' not in body:
        return False
    try:
        doc = json.loads(body)
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("stream") is True


def _sse_error(route: Route, body: bytes) -> bytes:
    if route.path == "/v1/messages":
        return b"event: error\ndata: " + body + b"\n\n"
    return b"data: " + body + b"\n\n"


class Bridge:
    def __init__(
        self, engine: Engine, executor: cf.ThreadPoolExecutor, metrics: Metrics, keepalive: float, prefix: str = ""
    ) -> None:
        self.engine = engine
        self.executor = executor
        self.metrics = metrics
        self.keepalive = keepalive
        self.prefix = prefix

    async def _request_call(self, request: Request, route: Route) -> Call:
        body = await request.body()
        params = dict(request.query_params)
        params.update({k: str(v) for k, v in request.path_params.items()})
        headers = {k.lower(): v for k, v in request.headers.items()}
        files: list[tuple[str, str, str, bytes]] = []
        if headers.get("content-type", "").startswith("multipart/form-data"):
            body, files = await _form_as_json(request)
        path = request.url.path
        if self.prefix and path.startswith(self.prefix):
            path = path[len(self.prefix) :] or "/"
        call = await asyncio.get_running_loop().run_in_executor(
            self.executor, lambda: self.engine.call(route, path, request.url.query, params, headers, body)
        )
        for field, name, ctype, data in files:
            call.add_file(field, name, ctype, data)
        return call

    async def serve(self, request: Request, route: Route) -> EngineResponse:
        try:
            call = await self._request_call(request, route)
        except EngineError as e:
            return EngineResponse.error(500, str(e), "server_error")
        except _FormError as e:
            return EngineResponse.error(e.status, str(e), "invalid_request_error")
        stream = wants_stream(getattr(request, "_body", b""))
        return EngineResponse(self, route, call, stream)


class _FormError(ValueError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def _form_as_json(request: Request) -> tuple[bytes, list[tuple[str, str, str, bytes]]]:
    """A multipart form as llama-server turns it: text fields -> one JSON object (repeated keys -> arrays), files
    apart."""
    try:
        form = await request.form()
    except AssertionError as e:  # Starlette asserts python-multipart is installed
        raise _FormError(415, f"multipart forms need the python-multipart package: {e}") from None
    fields: dict = {}
    files = []
    for key, value in form.multi_items():
        if hasattr(value, "read"):
            files.append((key, value.filename or "", value.content_type or "", await value.read()))
        elif key in fields:
            fields[key] = (fields[key] if isinstance(fields[key], list) else [fields[key]]) + [value]
        else:
            fields[key] = value
    return json.dumps(fields).encode(), files


class EngineResponse(Response):
    """An ASGI response that runs one engine call: its handler, then its body or its stream. (A Starlette Response
    only so that FastAPI passes it through; its status and headers come from the engine when it runs.)"""

    def __init__(self, bridge: Bridge | None, route: Route | None, call: Call | None, stream: bool) -> None:
        self.background = None
        self.status_code = 200
        self.bridge = bridge
        self.route = route
        self.call = call
        self.stream = stream
        self.fixed: tuple[int, bytes] | None = None

    @classmethod
    def error(cls, status: int, message: str, type_: str) -> EngineResponse:
        r = cls(None, None, None, False)
        r.fixed = (status, error_body(status, message, type_))
        return r

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.fixed is not None:
            await send_json(send, *self.fixed)
            return
        assert self.bridge is not None and self.call is not None and self.route is not None
        b, call, route = self.bridge, self.call, self.route
        loop = asyncio.get_running_loop()
        disconnected = asyncio.ensure_future(_wait_disconnect(receive))
        pending: cf.Future | None = None
        started = False
        t0 = time.perf_counter()
        b.metrics.in_flight.inc()
        try:
            pending = b.executor.submit(call.run)
            head: Head | None = None
            while head is None:
                timeout = b.keepalive if (self.stream and b.keepalive > 0) else None
                done, _ = await asyncio.wait(
                    {asyncio.wrap_future(pending), disconnected}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if disconnected in done:
                    b.metrics.disconnects.inc()
                    return
                if pending.done():
                    head = pending.result()
                    pending = None
                    break
                # the prompt is still being processed: open the stream and keep it alive
                if not started:
                    await send(
                        {
                            "type": "http.response.start",
                            "status": 200,
                            "headers": [
                                (b"content-type", b"text/event-stream"),
                                (b"cache-control", b"no-cache"),
                                (b"x-accel-buffering", b"no"),
                            ],
                        }
                    )
                    started = True
                await send({"type": "http.response.body", "body": KEEPALIVE, "more_body": True})
                b.metrics.keepalives.inc()

            if not head.stream:
                body = call.body()
                if started:
                    await send({"type": "http.response.body", "body": _sse_error(route, body) if body else b""})
                else:
                    await send(
                        {"type": "http.response.start", "status": head.status, "headers": _headers(head, len(body))}
                    )
                    await send({"type": "http.response.body", "body": body})
                b.metrics.requests.labels(scope["method"], route.path, str(head.status)).inc()
                return

            if not started:
                await send({"type": "http.response.start", "status": head.status, "headers": _headers(head, None)})
                started = True
            first = True
            more = True
            while more:
                pending = b.executor.submit(call.next)
                while True:
                    # llama-server's handler returns at once with an empty first result (the headers); the prompt
                    # is processed while the stream waits for its first chunk: keep the connection alive meanwhile
                    timeout = b.keepalive if (first and b.keepalive > 0) else None
                    done, _ = await asyncio.wait(
                        {asyncio.wrap_future(pending), disconnected}, timeout=timeout,
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                    if disconnected in done:
                        b.metrics.disconnects.inc()
                        return
                    if pending.done():
                        break
                    await send({"type": "http.response.body", "body": KEEPALIVE, "more_body": True})
                    b.metrics.keepalives.inc()
                chunk, more = pending.result()
                pending = None
                if first and chunk:
                    b.metrics.ttfb.labels(route.path).observe(time.perf_counter() - t0)
                    first = False
                if chunk or not more:
                    await send({"type": "http.response.body", "body": chunk, "more_body": more})
            b.metrics.requests.labels(scope["method"], route.path, str(head.status)).inc()
        finally:
            b.metrics.in_flight.dec()
            disconnected.cancel()
            call.cancel() if pending is not None else None
            loop.run_in_executor(b.executor, _close_when_done, pending, call)
            b.metrics.latency.labels(route.path).observe(time.perf_counter() - t0)


def _headers(head: Head, length: int | None) -> list[tuple[bytes, bytes]]:
    out = [(b"content-type", head.content_type.encode())]
    if length is not None:
        out.append((b"content-length", str(length).encode()))
    for k, v in head.headers.items():
        if k.lower() not in ("content-type", "content-length", "transfer-encoding", "connection"):
            out.append((k.encode("latin-1", "replace"), v.encode("latin-1", "replace")))
    return out


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return
