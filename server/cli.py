"""``llama-vq-server``: parse and check the configuration, then serve until SIGTERM/SIGINT.

Exit status: 0 after a clean shutdown (SIGTERM drains: in-flight and queued requests finish, new
ones get 503); 2 for a bad configuration value (before the model loads); 1 when the model cannot be
loaded or an address cannot be listened on (the message names the address, port and reason; the
sockets are bound before the model loads, so this fails fast).
"""

from __future__ import annotations

import logging
import signal
import socket
import sys
from collections.abc import Sequence
from types import FrameType

import uvicorn

from .engine import Engine


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def main(argv: Sequence[str] | None = None) -> int:
    from .settings import (
        SettingsError,
        build_parser,
        check_against_model,
        parse_settings,
        resolve_model,
    )

    parser = build_parser()
    try:
        settings = parse_settings(argv, parser=parser)
    except SettingsError as e:
        parser.error(str(e))  # exit 2
    _configure_logging(settings.log_level)
    log = logging.getLogger("llama_vq.server")

    try:
        import llama_vq
    except ImportError as e:
        print(f"llama-vq-server: error: {e}", file=sys.stderr)
        return 1
    try:
        model = resolve_model(settings)
    except llama_vq.DefaultModelError as e:
        print(
            f"llama-vq-server: error: no --model given and the default model is unavailable: {e}",
            file=sys.stderr,
        )
        return 1
    try:
        check_against_model(settings, model)
    except SettingsError as e:
        parser.error(str(e))

    from .app import create_app
    from .auth import warn_if_exposed
    from .metrics import Metrics

    try:
        sockets = bind_sockets(settings.hosts, settings.port)
    except BindError as e:
        print(f"llama-vq-server: error: {e}", file=sys.stderr)
        return 1
    warn_if_exposed(settings.host, settings.loopback, bool(settings.api_keys))
    metrics = Metrics()
    server: _DrainingServer | None = None

    def fatal(e: BaseException) -> None:
        if server is not None:
            server.should_exit = True

    engine = Engine(settings, metrics, model, on_fatal=fatal)
    app = create_app(settings, engine, metrics)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        lifespan="on",
        timeout_keep_alive=30,
        log_config=None,
    )
    server = _DrainingServer(config, engine)
    log.info(
        "llama-vq-server %s: model %s on http://%s:%d (loading in the background; GET /health "
        "says when ready)",
        llama_vq.__version__,
        model,
        settings.host,
        settings.port,
    )
    server.run(sockets=sockets)
    if engine.load_error is not None:
        e = engine.load_error
        print(f"llama-vq-server: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, ValueError) else 1
    if not server.started:
        return 1
    log.info("shut down cleanly")
    return 0


class BindError(OSError):
    """An address that cannot be listened on; the message says which and why."""


def bind_sockets(hosts: Sequence[str], port: int) -> list[socket.socket]:
    """A listening TCP socket per host (first address it resolves to), or BindError.

    With several hosts an IPv6 socket is IPv6-only, so that '::' and '0.0.0.0' can be listed together.
    """
    out: list[socket.socket] = []
    try:
        for host in hosts:
            try:
                infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            except socket.gaierror as e:
                raise BindError(f"cannot listen on {host!r} port {port}: cannot resolve it ({e.strerror})") from None
            family, kind, proto, _, addr = infos[0]
            sock = socket.socket(family, kind, proto)
            out.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and len(hosts) > 1:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(addr)
                sock.listen(2048)
            except OSError as e:
                raise BindError(f"cannot listen on {host} port {port}: {e.strerror or e}") from None
            sock.set_inheritable(True)
    except BindError:
        for sock in out:
            sock.close()
        raise
    return out


class _DrainingServer(uvicorn.Server):
    """uvicorn.Server whose signal handler also starts the engine's drain, and which does not
    re-raise the signal after the graceful shutdown (uvicorn's default, ending the process)."""

    def __init__(self, config: uvicorn.Config, engine: Engine) -> None:
        super().__init__(config)
        self.engine = engine

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        logging.getLogger("llama_vq.server").info(
            "%s: finishing in-flight requests, refusing new ones", signal.Signals(sig).name
        )
        self.engine.begin_drain()
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        else:
            self.should_exit = True


if __name__ == "__main__":
    sys.exit(main())
