"""Google Cloud Vertex AI's prediction protocol, as llama-server serves it (server-http.cpp, register_gcp_compat).

With AIP_MODE=PREDICTION in the environment: the server listens on AIP_HTTP_PORT (default 8080, over --port),
AIP_HEALTH_ROUTE (when set) answers as /health, and POST AIP_PREDICT_ROUTE (default /predict) takes
`{"instances": [...]}`, each instance a request body for one of llama-server's routes named by its
`"@requestFormat"`: a route's camelCase alias ("chatCompletions" for /v1/chat/completions, "applyTemplate" for
/apply-template) or its path. The instances run at once, none streamed; the answer is `{"predictions": [...]}`, one
route answer (its JSON, or an error body) per instance, in order.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from .engine import Call, Engine, EngineError, Route
from .responses import JSON_TYPE
from .workers import Workers

MAX_INSTANCES = 128
# llama-server registers these after the predict route: @requestFormat cannot name them
_NOT_DISPATCHED = frozenset({"/tools", "/cors-proxy"})


def request_format(path: str) -> str:
    """A route's camelCase alias: "/v1/chat/completions" -> "chatCompletions", "/slots/:id_slot" -> "slots"."""
    s = path[3:] if path.startswith("/v1") and len(path) > 3 else path
    s = s.removeprefix("/")
    out, cap = [], False
    for c in s:
        if c == ":":
            break
        if c in "/-_":
            cap = True
        else:
            out.append(c.upper() if cap else c)
            cap = False
    return "".join(out)


def _error(message: str, type_: str = "invalid_request_error", code: int = 400) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "type": type_}}


class Predictor:
    """The predict route's work: one engine call per instance, all at once on the generation threads."""

    def __init__(self, engine: Engine, workers: Workers) -> None:
        self.engine = engine
        self.workers = workers
        self.by_path: dict[str, Route] = {}  # the first route registered for a path, as llama-server's handler map
        for r in engine.routes:
            if r.path not in _NOT_DISPATCHED:
                self.by_path.setdefault(r.path, r)
        self.by_alias: dict[str, str] = {}
        for path in self.by_path:  # on a collision the first registered route wins
            self.by_alias.setdefault(request_format(path), path)

    def _one(self, instance: Any, query: str, params: dict[str, str], headers: dict[str, str], group: _Group) -> Any:
        if not isinstance(instance, dict):
            return _error("each instance must be a JSON object")
        fmt = instance.get("@requestFormat")
        if not isinstance(fmt, str):
            return _error("each instance must include a string @requestFormat")
        payload = {k: v for k, v in instance.items() if k != "@requestFormat"}
        if "stream" in payload:
            payload["stream"] = False  # the predict route does not stream
        path = self.by_alias.get(fmt) or (fmt if fmt in self.by_path else None)
        if path is None:
            return _error(f"no handler registered for @requestFormat: {fmt}")
        try:
            call = self.engine.call(self.by_path[path], path, query, params, headers, json.dumps(payload).encode())
        except EngineError as e:
            return _error(str(e), "server_error", 500)
        if not group.add(call):
            call.close()
            return _error("the client has gone", "server_error", 500)
        try:
            head = call.run()
            if head.stream:
                return _error("predict route does not support streaming responses")
            body = call.body()
        finally:
            group.discard(call)
            call.close()
        if not body:
            return None
        try:
            return json.loads(body)
        except ValueError:
            return body.decode("utf-8", "replace")

    async def predict(self, request: Request) -> Response:
        raw = await request.body()
        try:
            doc = json.loads(raw)
        except ValueError as e:
            return _answer(400, _error(str(e)))
        if not isinstance(doc, dict):
            return _answer(400, _error("request body must be a JSON object"))
        instances = doc.get("instances")
        if not isinstance(instances, list):
            return _answer(400, _error("request body must include an array field named instances"))
        if len(instances) > MAX_INSTANCES:
            return _answer(400, _error(f"instances array exceeds maximum size of {MAX_INSTANCES}"))
        query = request.url.query
        params = dict(request.query_params)
        headers = {k.lower(): v for k, v in request.headers.items()}
        loop = asyncio.get_running_loop()
        group = _Group()
        jobs = [
            loop.run_in_executor(self.workers.generation, self._one, inst, query, params, headers, group)
            for inst in instances
        ]
        gathered = asyncio.gather(*jobs)
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            waited: set[asyncio.Future[Any]] = {gathered, gone}
            await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
            if not gathered.done():  # the client left: its generations end now, their slots free
                group.cancel()
            predictions = await gathered
        finally:
            gone.cancel()
        return _answer(200, {"predictions": list(predictions)})


class _Group:
    """The engine calls of one predict request, cancelled together when its client leaves (as the bridge cancels
    one call); any thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: set[Call] = set()
        self.cancelled = False

    def add(self, call: Call) -> bool:
        with self.lock:
            if not self.cancelled:
                self.calls.add(call)
            return not self.cancelled

    def discard(self, call: Call) -> None:
        with self.lock:
            self.calls.discard(call)

    def cancel(self) -> None:
        with self.lock:
            self.cancelled = True
            calls = list(self.calls)
        for call in calls:
            call.cancel()


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone (its body was read before)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _answer(status: int, doc: Any) -> Response:
    return Response(json.dumps(doc), status, media_type=JSON_TYPE.decode())
