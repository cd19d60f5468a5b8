"""The engine: llama-server's server-context in libllama-vq-server (native/server), bound with ctypes.

Every call that can block (load, the task loop, a handler, a stream's next chunk) releases the GIL (ctypes
does for a CDLL) and is meant for a worker thread; nothing here runs on the event loop.
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import json
import socket
import threading
from dataclasses import dataclass
from typing import Any

import llama_vq  # noqa: F401  (binds llama_cpp to llama_vq's libraries first)
from llama_vq import _cdll


class EngineError(RuntimeError):
    """The engine could not be created or loaded; the message says why."""


_c = ctypes
_p, _sz = _c.c_void_p, _c.c_size_t
# c_void_p results that are our malloc'd strings are freed by _take()
SERVER = _cdll.Library(
    "llama-vq-server",
    {
        "llama_vq_server_abi_version": ([], _c.c_int),
        "llama_vq_server_create": ([_c.c_int, _c.POINTER(_c.c_char_p), _c.POINTER(_p)], _p),
        "llama_vq_server_params": ([_p], _p),
        "llama_vq_server_routes": ([_p], _p),
        "llama_vq_server_set_swa_cache_types": ([_p, _c.c_int, _c.c_int], None),
        "llama_vq_server_set_attn_choice": ([_p, _c.c_char_p], None),
        "llama_vq_server_load": ([_p], _c.c_int),
        "llama_vq_server_state": ([_p], _p),
        "llama_vq_server_kv_cache": ([_p], _p),
        "llama_vq_server_run": ([_p], None),
        "llama_vq_server_terminate": ([_p], None),
        "llama_vq_server_stop_tools": ([_p], None),
        "llama_vq_server_free": ([_p], None),
        "llama_vq_server_call_new": ([_p, _c.c_char_p, _c.c_char_p, _c.c_char_p, _c.c_char_p, _sz, _c.POINTER(_p)], _p),
        "llama_vq_server_call_add_file": ([_p, _c.c_char_p, _c.c_char_p, _c.c_char_p, _c.c_char_p, _sz], None),
        "llama_vq_server_call_run": ([_p], _c.c_int),
        "llama_vq_server_call_head": ([_p], _c.c_char_p),
        "llama_vq_server_call_body": ([_p, _c.POINTER(_p), _c.POINTER(_sz)], None),
        "llama_vq_server_call_stream_fd": ([_p], _c.c_int),
        "llama_vq_server_call_cancel": ([_p], None),
        "llama_vq_server_call_free": ([_p], None),
        "llama_vq_server_string_free": ([_p], None),
    },
    abi_function="llama_vq_server_abi_version",
    abi_version=4,
    error=EngineError,
)


def _native() -> ctypes.CDLL:
    return _cdll.load(SERVER)


def _take(ptr: int | None) -> Any:
    """Decode and free a JSON string the library allocated (None for NULL)."""
    return _cdll.take_json(_native(), "llama_vq_server_string_free", ptr)


def _error_message(err: ctypes.c_void_p, default: str) -> str:
    doc = _take(err.value)
    if isinstance(doc, dict):
        return str(doc.get("error", {}).get("message", default))
    return default


@dataclass(frozen=True)
class Route:
    method: str  # GET, POST or DELETE
    path: str  # llama-server's form: "/slots/:id_slot"


@dataclass
class Head:
    status: int
    content_type: str
    headers: dict[str, str]
    stream: bool


class Call:
    """One request to one route handler. Use from a worker thread: run(), then body() or stream_socket();
    cancel() from any thread; close() exactly once (frees the native request), after the stream's socket."""

    def __init__(
        self,
        engine: Engine,
        route: Route,
        path: str,
        query_string: str,
        params: dict[str, str],
        headers: dict[str, str],
        body: bytes,
    ) -> None:
        lib = _native()
        req = json.dumps({"path": path, "query_string": query_string, "params": params, "headers": headers})
        err = ctypes.c_void_p()
        self._h = lib.llama_vq_server_call_new(
            engine._h, route.method.encode(), route.path.encode(), req.encode(), body, len(body), ctypes.byref(err)
        )
        if not self._h:
            raise EngineError(_error_message(err, f"no route {route.method} {route.path}"))
        self._lock = threading.Lock()
        self._closed = False

    def add_file(self, field: str, filename: str, content_type: str, data: bytes) -> None:
        _native().llama_vq_server_call_add_file(
            self._h, field.encode(), filename.encode(), content_type.encode(), data, len(data)
        )

    def run(self) -> Head:
        lib = _native()
        lib.llama_vq_server_call_run(self._h)
        head = json.loads(lib.llama_vq_server_call_head(self._h).decode("utf-8", "replace"))
        return Head(int(head["status"]), str(head["content_type"]), dict(head["headers"]), bool(head["stream"]))

    def body(self) -> bytes:
        data, size = ctypes.c_void_p(), ctypes.c_size_t()
        _native().llama_vq_server_call_body(self._h, ctypes.byref(data), ctypes.byref(size))
        return ctypes.string_at(data.value, size.value) if size.value and data.value else b""

    def stream_socket(self) -> socket.socket:
        """After run(), a stream's bytes as the engine makes them, until end of file: a socket that a thread of the
        call writes (llama_vq_server_call_stream_fd). Close it before close()."""
        fd = _native().llama_vq_server_call_stream_fd(self._h)
        if fd < 0:
            raise EngineError("the engine could not open the stream: not a stream, or no socket to be had")
        return socket.socket(fileno=fd)

    def cancel(self) -> None:
        with self._lock:
            if not self._closed:
                _native().llama_vq_server_call_cancel(self._h)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        _native().llama_vq_server_call_free(self._h)


class Engine:
    """llama-server's engine for one model, from llama-server's command line (argv without the program)."""

    def __init__(self, argv: list[str]) -> None:
        lib = _native()
        args = [b"llama-vq-server"] + [a.encode() for a in argv]
        arr = (ctypes.c_char_p * len(args))(*args)
        err = ctypes.c_void_p()
        self._h = lib.llama_vq_server_create(len(args), arr, ctypes.byref(err))
        if not self._h:
            raise EngineError(_error_message(err, "the engine could not be created"))
        self.params: dict[str, Any] = _take(lib.llama_vq_server_params(self._h))
        self.routes: list[Route] = [Route(r["method"], r["path"]) for r in _take(lib.llama_vq_server_routes(self._h))]
        self._loop: threading.Thread | None = None
        self._freed = False

    def set_swa_cache_types(self, type_k: int | None, type_v: int | None) -> None:
        _native().llama_vq_server_set_swa_cache_types(
            self._h, -1 if type_k is None else type_k, -1 if type_v is None else type_v
        )

    def set_attn_choice(self, choice: dict[str, Any]) -> None:
        """What -fa auto was resolved from (attn_choice.Choice.as_dict()): /props carries it. Before start()."""
        _native().llama_vq_server_set_attn_choice(self._h, json.dumps(choice).encode())

    def start(self) -> cf.Future[None]:
        """Load the model(s), then run the task loop, both on one thread of its own ("llama-vq-engine").

        The future resolves once loading has ended: None when the model is ready (the loop runs from then on),
        EngineError when it failed (llama.cpp's log says why; the thread has ended).

        One thread for both because every thread that computes a ggml CPU graph is an OpenMP master with a team
        of its own (n_threads - 1 workers, kept while the thread lives). The load computes graphs too (the
        warm-up, -fit's probe): loaded on another thread, that thread's idle team would stay beside the loop's,
        and once libgomp counts more threads than CPUs it throttles every barrier's spin-wait to nearly nothing,
        so with -t = the cores each of the ~200 barriers of a decoded token sleeps in the kernel.
        """
        loaded: cf.Future[None] = cf.Future()
        lib = _native()

        def main() -> None:
            if not loaded.set_running_or_notify_cancel():
                return
            if lib.llama_vq_server_load(self._h) != 0:
                loaded.set_exception(EngineError("the model could not be loaded (see the log above)"))
                return
            loaded.set_result(None)
            lib.llama_vq_server_run(self._h)

        self._loop = threading.Thread(target=main, name="llama-vq-engine", daemon=True)
        self._loop.start()
        return loaded

    def state(self) -> dict[str, Any]:
        """{"state": "created"|"loading"|"ready"|"sleeping"|"failed"|"stopped", "progress": ...}"""
        doc = _take(_native().llama_vq_server_state(self._h))
        if self._loop is not None and not self._loop.is_alive() and doc.get("state") in ("ready", "sleeping"):
            doc["state"] = "stopped"
        return doc

    def kv_cache(self) -> dict[str, Any] | None:
        """The loaded context's KV cache (types, cells, bytes, attention mode); None before the load."""
        return _take(_native().llama_vq_server_kv_cache(self._h))

    @property
    def loop_alive(self) -> bool:
        return self._loop is not None and self._loop.is_alive()

    def call(
        self,
        route: Route,
        path: str,
        query_string: str = "",
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        body: bytes = b"",
    ) -> Call:
        return Call(self, route, path, query_string, params or {}, headers or {}, body)

    def stop_tools(self) -> None:
        """Stop the MCP servers now (a tool call waiting for one returns with an error); blocks briefly."""
        _native().llama_vq_server_stop_tools(self._h)

    def terminate(self, timeout: float | None = None) -> None:
        """Stop the task loop (pending calls end as cancelled) and wait for it up to timeout seconds."""
        _native().llama_vq_server_terminate(self._h)
        if self._loop is not None:
            self._loop.join(timeout)

    def free(self) -> None:
        if not self._freed and not self.loop_alive:
            self._freed = True
            _native().llama_vq_server_free(self._h)
