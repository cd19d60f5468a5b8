"""An HTTP request -> one of llama-server's route handlers in the engine -> the HTTP answer, streamed.

Every handler runs on the worker threads (workers.py): it returns when it has answered (for a completion that is
not streamed, when the generation is done) or, for a stream, with its headers; a C++ thread of the call then writes
the stream's bytes to a socket that the event loop reads (_open_stream). The event loop only awaits, and watches two
things meanwhile:

- the client: when it disconnects, streamed or not, the call is cancelled (llama-server's should_stop, with the
  waiting handler woken at once, patch 0021-server-wake-waiting-handlers); the native request is freed once its
  handler has returned (a stream's thread is joined), which cancels its tasks, and the task loop frees the slot at
  its next iteration;
- the server's drain (`close()`, at the end of --drain-timeout): an answer not yet begun gets a 503, an open stream
  a final error event in its API's shape (sse.py) and a proper end of its body; then the call is cancelled too.

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
from collections.abc import Callable

from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from . import chat_requests, sse
from .engine import Call, Engine, EngineError, Route
from .metrics import Metrics
from .responses import asgi_headers, error_body, send_json
from .workers import Workers

log = logging.getLogger(__name__)

SHUTTING_DOWN = "the server is shutting down"
STREAM_READ = 1 << 16  # bytes of a stream read at once at most, and buffered before its writer waits


def wants_stream(body: bytes) -> bool:
    """Whether a JSON body asks for a stream (the answer a handler gives to it is then SSE)."""
    if b'"stream"' not in body:
        return False
    try:
        doc = json.loads(body)
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("stream") is True


class Bridge:
    """`appendix`: by route path, what the front end appends to the engine's 200 body (/metrics: its own)."""

    def __init__(
        self,
        engine: Engine,
        workers: Workers,
        metrics: Metrics,
        keepalive: float,
        prefix: str = "",
        appendix: dict[str, Callable[[], bytes]] | None = None,
    ) -> None:
        self.engine = engine
        self.workers = workers
        self.metrics = metrics
        self.keepalive = keepalive
        self.prefix = prefix
        self.appendix = appendix or {}
        self.closing = asyncio.Event()

    def close(self) -> None:
        """End every answer in flight now (the drain is over): 503 or a final SSE error event."""
        self.closing.set()

    async def serve(self, request: Request, route: Route) -> Response:
        body = await request.body()
        params = dict(request.query_params)
        params.update({k: str(v) for k, v in request.path_params.items()})
        headers = {k.lower(): v for k, v in request.headers.items()}
        files: list[tuple[str, str, str, bytes]] = []
        if headers.get("content-type", "").startswith("multipart/form-data"):
            try:
                body, files = await _form_as_json(request)
            except MultiPartException as e:
                return EngineResponse.error(400, f"invalid multipart form: {e.message}", "invalid_request_error")
        path = request.url.path
        if self.prefix and path.startswith(self.prefix):
            path = path[len(self.prefix) :] or "/"
        try:
            body = chat_requests.adapt(route.path, body)
        except chat_requests.RequestError as e:
            return EngineResponse.error(400, str(e), "invalid_request_error")
        query = request.url.query
        try:
            call = await asyncio.get_running_loop().run_in_executor(
                self.workers.control, lambda: self.engine.call(route, path, query, params, headers, body)
            )
        except EngineError as e:
            return EngineResponse.error(500, str(e), "server_error")
        for field, name, ctype, data in files:
            call.add_file(field, name, ctype, data)
        return EngineResponse(self, route, call, wants_stream(body))


async def _form_as_json(request: Request) -> tuple[bytes, list[tuple[str, str, str, bytes]]]:
    """A multipart form as llama-server turns it: text fields -> one JSON object (repeated keys -> arrays), files
    apart."""
    form = await request.form()
    fields: dict = {}
    files = []
    for key, value in form.multi_items():
        if isinstance(value, UploadFile):
            files.append((key, value.filename or "", value.content_type or "", await value.read()))
        elif key in fields:
            fields[key] = (fields[key] if isinstance(fields[key], list) else [fields[key]]) + [value]
        else:
            fields[key] = value
    return json.dumps(fields).encode(), files


class _Ended(Exception):
    """The answer must end before the engine's: the client left or the server is closing."""


class _Writer:
    """The ASGI side of one answer: whether it has begun, and how many SSE events it has sent."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.started = False
        self.status = 200
        self.n_events = 0

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.started, self.status = True, status
        await self.send({"type": "http.response.start", "status": status, "headers": headers})

    async def body(self, data: bytes, more: bool) -> None:
        self.n_events += sse.count_events(data)
        await self.send({"type": "http.response.body", "body": data, "more_body": more})

    async def keepalive(self) -> None:
        if not self.started:
            await self.start(
                200,
                [
                    (b"content-type", b"text/event-stream"),
                    (b"cache-control", b"no-cache"),
                    (b"x-accel-buffering", b"no"),
                ],
            )
        await self.send({"type": "http.response.body", "body": sse.KEEPALIVE, "more_body": True})


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
        pool = b.workers.for_route(route)
        out = _Writer(send)
        gone = asyncio.ensure_future(_wait_disconnect(receive))
        closing = asyncio.ensure_future(b.closing.wait())
        pending: cf.Future | None = None
        stream: asyncio.StreamWriter | None = None
        t0 = time.perf_counter()
        in_flight = b.metrics.in_flight if route.path != "/metrics" else None  # a scrape does not count itself
        if in_flight is not None:
            in_flight.inc()

        async def step(fn: Callable, keepalive: bool):  # noqa: ANN202
            """fn() on a worker; SSE keep-alives while it runs when asked; _Ended if the answer must end first."""
            nonlocal pending
            pending = pool.submit(fn)
            await _keepalives_until(
                asyncio.wrap_future(pending), (gone, closing), b.keepalive if keepalive else 0, out, b.metrics
            )
            result, pending = pending.result(), None
            return result

        try:
            head = await step(call.run, self.stream)
            if not head.stream:
                body = call.body()
                if head.status == 200 and route.path in b.appendix:
                    body += b"\n" + b.appendix[route.path]()
                if out.started:  # keep-alives opened a stream: the handler's error goes as an SSE event
                    await out.body(sse.engine_error(route.path, body), False)
                else:
                    await out.start(head.status, asgi_headers(head.content_type, head.headers, len(body)))
                    await out.body(body, False)
            else:
                if not out.started:
                    await out.start(head.status, asgi_headers(head.content_type, head.headers, None))
                # the handler returned at once with the headers; a thread of the call now writes the stream's bytes
                # to a socket as the engine makes them, and the loop reads them (_open_stream)
                try:
                    reader, stream = await _open_stream(call)
                except EngineError as e:
                    await out.body(sse.final_error(route.path, str(e), out.n_events), False)
                    b.metrics.requests.labels(scope["method"], route.path, str(out.status)).inc()
                    return
                for watched in (gone, closing):
                    watched.add_done_callback(lambda _f: reader.set_exception(_Ended()))
                first = True
                while True:
                    # the prompt is processed while the stream waits for its first bytes: keep the connection alive
                    chunk = await _read(reader, b.keepalive if first else 0, out, b.metrics)
                    if not chunk:
                        await out.body(b"", False)
                        break
                    if first:
                        b.metrics.ttfb.labels(route.path).observe(time.perf_counter() - t0)
                        first = False
                    await out.body(chunk, True)
            b.metrics.requests.labels(scope["method"], route.path, str(out.status)).inc()
        except _Ended:
            if gone.done():
                b.metrics.disconnects.inc()
            elif not out.started:
                await send_json(send, 503, error_body(503, SHUTTING_DOWN, "unavailable_error"))
                b.metrics.requests.labels(scope["method"], route.path, "503").inc()
            else:
                await out.body(sse.final_error(route.path, SHUTTING_DOWN, out.n_events), False)
                b.metrics.requests.labels(scope["method"], route.path, str(out.status)).inc()
        finally:
            if in_flight is not None:
                in_flight.dec()
            gone.cancel()
            closing.cancel()
            if stream is not None:
                stream.close()  # before the call: its thread then stops writing (call_free joins it)
            _release(b.workers, call, pending)
            b.metrics.latency.labels(route.path).observe(time.perf_counter() - t0)


async def _open_stream(call: Call) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A stream's bytes, read on the event loop as a thread of the call writes them (llama-server's HTTP thread
    writes its client's socket the same way). Per token that is one wake-up of that thread, in C++, and one of the
    loop: with `-t` = every core, the front end's work per token runs on the cores the compute threads use
    (docs/server.md, "Workers"). Bytes that arrive while the loop is busy go out in one write."""
    return await asyncio.open_connection(sock=call.stream_socket(), limit=STREAM_READ)


async def _read(reader: asyncio.StreamReader, keepalive: float, out: _Writer, metrics: Metrics) -> bytes:
    """The stream's next bytes (b"" at its end); SSE keep-alives every `keepalive` seconds while none come, if > 0;
    _Ended (set on the reader) if the answer must end first."""
    if keepalive <= 0:
        return await reader.read(STREAM_READ)
    pending = asyncio.ensure_future(reader.read(STREAM_READ))
    try:
        await _keepalives_until(pending, (), keepalive, out, metrics)
    finally:
        if not pending.done():
            pending.cancel()
    return pending.result()


async def _keepalives_until(
    fut: asyncio.Future, watched: tuple[asyncio.Future, ...], keepalive: float, out: _Writer, metrics: Metrics
) -> None:
    """Wait for `fut`, an SSE keep-alive every `keepalive` seconds meanwhile (if > 0); _Ended if one of `watched`
    (the client gone, the drain over) ends first."""
    timeout = keepalive if keepalive > 0 else None
    while True:
        done, _ = await asyncio.wait({fut, *watched}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if any(w in done for w in watched):
            raise _Ended
        if fut in done:
            return
        await out.keepalive()
        metrics.keepalives.inc()


def _release(workers: Workers, call: Call, pending: cf.Future | None) -> None:
    """Free the native call, never while one of its steps runs: a step still running is cancelled (its handler
    returns at once) and the call freed when it has returned; freeing cancels the call's tasks in the engine."""
    if pending is not None and not pending.cancel() and not pending.done():  # (cancel(): still queued, never ran)
        call.cancel()
        pending.add_done_callback(lambda _f: call.close())
        return
    workers.control.submit(call.close)


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return
