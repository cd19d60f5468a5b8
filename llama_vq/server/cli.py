"""`llama-vq-server`: llama-server's command line, llama-vq's flags, then serve.

Order of events: the command line is parsed (ours, then llama-server's by llama.cpp's own parser); the sockets
are bound (so a port in use fails at once, and /health answers 503 while loading); the model loads on a worker
thread; the task loop starts on its own thread; slots saved in --state-dir are restored; then the server is
ready. On SIGTERM or SIGINT: no new connections, running requests get --drain-timeout seconds to finish; then each
answer still open ends cleanly (a 503, or a final SSE error event in its API's shape and the end of its body) and
its task is cancelled; slots are saved to --state-dir in what is left of llama-swap's 5 s, the engine stops.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Coroutine
from typing import Any

import uvicorn

from .app import create_app
from .engine import Engine, EngineError
from .kv_line import attention_lines, kv_cache_line, resolve_attn_choice
from .metrics import Metrics
from .middleware import Readiness
from .options import OptionError, help_text, split_argv
from .settings import Settings
from .state_dir import StateDir, identity
from .workers import Workers

log = logging.getLogger(__name__)
SIGTERM_BUDGET = 5.0  # llama-swap's stop timeout, seconds
CLOSE_GRACE = 1.0  # seconds uvicorn waits, after the drain, for the answers the bridge has ended to be sent


def _bind(host: str, port: int, v6only: bool = False) -> socket.socket:
    if host.endswith(".sock"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.path.exists(host):
            os.unlink(host)
        sock.bind(host)
    else:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # proto given explicitly: asyncio turns Nagle off (TCP_NODELAY) only on sockets whose proto is IPPROTO_TCP,
        # and accepted sockets take the listener's; with proto 0, every answer on a kept-alive connection after
        # the first waited ~40 ms for the client's delayed ACK
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and v6only:  # with several addresses, [::] must not also claim 0.0.0.0
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))
    sock.listen(2048)
    # not inheritable (Python's default): a process the engine starts (an MCP server, a tool) must not keep the
    # port open after this server has stopped
    return sock


def _is_loopback(host: str) -> bool:
    if host in ("localhost",) or host.endswith(".sock"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def serve(engine: Engine, settings: Settings, state: StateDir | None, socks: list[socket.socket]) -> int:
    metrics = Metrics()
    workers = Workers()
    readiness = Readiness(engine)
    app = create_app(settings, engine, metrics, workers, readiness)
    bridge = app.state.bridge
    config = uvicorn.Config(
        app,
        log_level="warning",
        # h11 sends header names as the application spells them, as llama-server does (Access-Control-Allow-Origin,
        # Process-Start-Time-Unix: clients that look them up case-sensitively, llama-server's own tests among them,
        # find them); uvicorn's httptools protocol, picked by default where installed, lowercases them
        http="h11",
        # a backstop only: at the end of the drain the bridge ends every answer itself (bridge.close)
        timeout_graceful_shutdown=settings.drain_timeout + CLOSE_GRACE,  # type: ignore[arg-type]  # a float works
        timeout_keep_alive=30,
        access_log=False,
        lifespan="off",
    )
    server = uvicorn.Server(config)
    loop = asyncio.get_running_loop()
    stop_at: list[float] = []

    async def load() -> None:
        try:
            engine.set_swa_cache_types(settings.cache_type_k_swa, settings.cache_type_v_swa)
            # -fa auto: the mode measured on this device (cached after the first start), tried first by the
            # native auto (attn_choice.py); before the engine creates its context
            choice = await loop.run_in_executor(None, resolve_attn_choice, engine.params)
            if choice is not None:
                engine.set_attn_choice(choice)
            await asyncio.wrap_future(engine.start())
        except EngineError as e:
            log.error("%s", e)
            server.should_exit = True
            return
        if state is not None:
            n = await loop.run_in_executor(workers.generation, state.restore, engine)
            if n:
                log.info("state dir: %d tokens of earlier prompts restored", n)
        kv = engine.kv_cache()
        if kv is not None:  # before /health turns 200: a client that sees it ready can read the line
            log.info("%s", kv_cache_line(kv))
            for line in attention_lines(kv, choice):
                log.info("%s", line)
        readiness.set()
        log.info("model loaded; serving on %s", _where(settings))

    loader = asyncio.ensure_future(load())

    def handle_exit(sig, frame) -> None:  # noqa: ANN001
        # uvicorn's own handler also records the signal and raises it again once it has stopped, which would kill
        # the process before the state dir is saved; a second SIGINT forces the exit, as with uvicorn
        if not stop_at:
            stop_at.append(time.monotonic())
            # as llama-server, the MCP servers stop first: a tool call waiting for one ends now, not at its timeout
            engine.stop_tools()
            # running requests get --drain-timeout seconds; then the bridge ends what is left, cleanly
            loop.call_soon_threadsafe(loop.call_later, settings.drain_timeout, bridge.close)
        if server.should_exit and sig == signal.SIGINT:
            server.force_exit = True
        server.should_exit = True

    server.handle_exit = handle_exit  # type: ignore[method-assign]
    await server.serve(sockets=socks)
    t_stop = stop_at[0] if stop_at else time.monotonic()

    if not readiness.loaded:
        loader.cancel()
        failed = engine.state().get("state") == "failed"
        log.info("stopped before the model was ready")
        workers.shutdown()
        return 1 if failed else 0
    if state is not None:
        deadline = t_stop + SIGTERM_BUDGET - 0.75
        saved = await loop.run_in_executor(workers.generation, state.save, engine, deadline)
        log.info("state dir: %d slots saved", saved)
    await loop.run_in_executor(workers.generation, engine.terminate, 2.0)
    workers.shutdown()
    log.info("stopped in %.2f s", time.monotonic() - t_stop)
    return 0


def _names_model(argv: list[str]) -> bool:
    """Whether llama-server's arguments (or its LLAMA_ARG_* variables) name a model to serve."""
    flags = ("-m", "--model", "-mu", "--model-url", "-hf", "-hfr", "--hf-repo", "-dr", "--docker-repo")
    if any(a.split("=", 1)[0] in flags for a in argv):
        return True
    return any(os.environ.get(v) for v in ("LLAMA_ARG_MODEL", "LLAMA_ARG_MODEL_URL", "LLAMA_ARG_HF_REPO"))


# the embedded default model's KV cache types when the user names none: q8_0 K / q4_0 V (2.46x smaller than f16)
EMBEDDED_CACHE_TYPES = {"k": "q8_0", "v": "q4_0"}


def _default_cache_types(argv: list[str]) -> list[str]:
    """llama-server flags for the embedded model's K and V types; none when the user set either type."""
    flags = ("-ctk", "--cache-type-k", "-ctv", "--cache-type-v")
    env = ("LLAMA_ARG_CACHE_TYPE_K", "LLAMA_ARG_CACHE_TYPE_V")
    if any(a.split("=", 1)[0] in flags for a in argv) or any(os.environ.get(v) for v in env):
        return []
    return ["-ctk", EMBEDDED_CACHE_TYPES["k"], "-ctv", EMBEDDED_CACHE_TYPES["v"]]


def _where(settings: Settings) -> str:
    if settings.host.endswith(".sock"):
        return settings.host
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    return f"http://{host}:{settings.port}{settings.api_prefix}"


def _run(main: Coroutine[Any, Any, int]) -> int:
    """The event loop: uvloop's (a dependency on Linux and macOS) where installed, else asyncio's. It halves the
    per-chunk cost of a stream on the loop, which runs on the cores the compute threads use (docs/server.md)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s llama-vq-server %(levelname)s %(message)s")
    if any(a in ("-h", "--help", "--usage") for a in argv):
        print(help_text(), flush=True)  # then llama.cpp's parser prints llama-server's flags and exits
    try:
        ours, llama_argv = split_argv(argv)
    except OptionError as e:
        print(f"llama-vq-server: {e}", file=sys.stderr)
        return 2
    if not _names_model(llama_argv):
        import llama_vq

        default = str(llama_vq.default_model_path())
        llama_argv += ["-m", default]
        # what the product is for: the embedded model's cache with a quantized V, unless the user chose the types
        # (-fa stays auto: flash attention for prompt batches on an accelerator, llama-vq's attention otherwise)
        llama_argv += _default_cache_types(llama_argv)
        log.info("no -m/--model: serving the embedded default model %s", default)
    if ours.get("state_dir") and "--slot-save-path" not in llama_argv:
        # slot files are how the state dir saves and restores (state_dir.py); llama.cpp's parser wants the folder
        state_path = os.path.expanduser(str(ours["state_dir"]))
        try:
            os.makedirs(state_path, exist_ok=True)
        except OSError as e:
            print(f"llama-vq-server: --state-dir {state_path}: {e}", file=sys.stderr)
            return 2
        llama_argv += ["--slot-save-path", state_path]
    try:
        engine = Engine(llama_argv)
        settings = Settings.build(ours, engine.params)
    except (EngineError, OptionError) as e:
        print(f"llama-vq-server: {e}", file=sys.stderr)
        return 1
    if settings.gcp.enabled:
        log.info(
            "Vertex AI prediction mode (AIP_MODE=PREDICTION): port %d (AIP_HTTP_PORT), POST %s",
            settings.port,
            settings.gcp.path_predict,
        )
    for host in settings.hosts:
        if not _is_loopback(host) and not settings.api_keys:
            log.warning("listening on %s without --api-key: anyone who can reach it can use the model", host)

    state = None
    if settings.state_dir is not None:
        import llama_vq

        info = llama_vq.build_info()
        build = {"backend": info.backend, "patches": list(info.patches), "commit": info.llama_cpp_commit}
        state = StateDir(
            settings.state_dir,
            settings.state_budget,
            identity(engine.params["model_path"], llama_argv, build),
            settings.n_parallel,
        )
    n_tcp = sum(not h.endswith(".sock") for h in settings.hosts)
    socks: list[socket.socket] = []
    for host in settings.hosts:  # --host a,b: every address, as llama-server
        try:
            socks.append(_bind(host, settings.port, v6only=n_tcp > 1))
        except OSError as e:
            print(f"llama-vq-server: cannot listen on {host}:{settings.port}: {e}", file=sys.stderr)
            return 1
    log.info("listening on %s (loading the model)", _where(settings))
    rc = _run(serve(engine, settings, state, socks))
    sys.stdout.flush()
    sys.stderr.flush()
    # the engine's threads and the model are the process's: leave without unloading what the OS frees anyway
    os._exit(rc)


if __name__ == "__main__":
    raise SystemExit(main())
