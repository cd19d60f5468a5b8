"""The server processes the serving benchmarks start (serve_bench.py, spec_replay.py): a free 127.0.0.1 port,
readiness polled on GET /health against a deadline, and serve_bench's Server (ours or llama-server, with a snapshot of
its slots and counters for a stalled run)."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(proc: subprocess.Popen, url: str, deadline_s: float, what: str) -> None:
    """Until GET url/health answers 200; RuntimeError if the process exits first, TimeoutError after deadline_s."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}: {what}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)  # the polling interval against the deadline
    raise TimeoutError(f"not ready after {deadline_s} s: {what}")


class Server:
    """One server process (ours or llama-server) on a free port; polled on /health until ready."""

    def __init__(self, kind: str, cmd: list[str], log: Path) -> None:
        self.kind = kind
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self._snap_lock = threading.Lock()
        self._snapped = False
        full = [*cmd, "--host", "127.0.0.1", "--port", str(self.port)]
        self._f = log.open("ab")
        self._f.write(f"$ {shlex.join(full)}\n".encode())
        self._f.flush()
        # Python's fault handler in our server: stop(dump=True) gets every thread's stack into the log
        env = dict(os.environ, PYTHONFAULTHANDLER="1")
        self.proc = subprocess.Popen(full, stdout=self._f, stderr=subprocess.STDOUT, env=env)
        wait_healthy(self.proc, self.url, 600, f"{kind}; see {log}")

    def snapshot(self) -> None:
        """Into the log, once: GET /slots twice, 2 s apart (does anything still move?), and the decode counters."""
        with self._snap_lock:
            if self._snapped:
                return
            self._snapped = True
        for i in range(2):
            try:
                slots = httpx.get(self.url + "/slots", timeout=5).text
                metrics = httpx.get(self.url + "/metrics", timeout=5).text
            except httpx.HTTPError as e:
                slots, metrics = f"{type(e).__name__}: {e}", ""
            names = ("n_decode_total", "tokens_predicted_total", "requests_processing", "requests_deferred")
            keep = [m for m in metrics.splitlines() if m.startswith(tuple("llamacpp:" + n for n in names))]
            text = "\n".join([f"--- snapshot {i} at {time.strftime('%H:%M:%S')}: /slots {slots}", *keep, ""])
            self._f.write(text.encode())
            self._f.flush()
            if i == 0:
                time.sleep(2)

    def stop(self, dump: bool = False) -> None:
        """SIGTERM; with ``dump`` (requests failed) SIGABRT first, which makes our server write the stacks of
        all its threads into its log (llama-server just exits)."""
        if dump and self.proc.poll() is None:
            self.snapshot()
            self.proc.send_signal(signal.SIGABRT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._f.close()
