"""Helpers for the server tests: a real ``llama-vq-server`` process on a free 127.0.0.1 port.

Readiness is polled on /health against a deadline (no sleeps); the process log goes to a file the
tests read (warnings about state files, the exposed-address warning).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

START_DEADLINE_S = 120.0  # model load on a busy 2-core CI machine; normally ~2 s


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``python -m llama_vq.server.cli`` (the installed llama-vq-server) with llama-server's and llama-vq's flags;
    ``url``, ``log()``, ``stop()``. Defaults: --ctx-size 1024 and --threads 1 (a flag given later wins: llama.cpp's
    parser keeps the last value)."""

    def __init__(
        self,
        model: Path | None,
        *flags: str,
        log_dir: Path,
        env: dict[str, str] | None = None,
        api_key: str | None = None,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"server-{self.port}.log"
        self._log = self.log_path.open("wb")
        cmd = [
            sys.executable,
            "-m",
            "llama_vq.server.cli",
            *(["--model", str(model)] if model is not None else []),  # None: the embedded default model
            "--port",
            str(self.port),
            "--ctx-size",
            "1024",
            "--threads",
            "1",
            *flags,
        ]
        full_env = {**os.environ, **(env or {})}
        if api_key is None:
            full_env.pop("LLAMA_API_KEY", None)
        # Run from a neutral directory: the installed packages are under test, not the checkout's.
        cwd = os.environ.get("LLAMA_VQ_TEST_SERVER_CWD") or str(log_dir)
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=full_env, cwd=cwd)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, deadline_s: float = START_DEADLINE_S) -> dict[str, Any]:
        """Poll GET /health until 200; fail with the log if the process dies or time runs out."""
        end = time.monotonic() + deadline_s
        last = None
        with httpx.Client(timeout=5) as c:
            while time.monotonic() < end:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
                try:
                    r = c.get(self.url + "/health")
                    last = r.status_code
                    if r.status_code == 200:
                        return r.json()
                except httpx.TransportError:
                    pass
                time.sleep(0.05)  # poll interval, not a readiness guess
        raise TimeoutError(f"server not ready after {deadline_s} s (last status {last}):\n{self.log()}")

    def metrics(self) -> dict[str, float]:
        r = httpx.get(self.url + "/metrics", headers=self.headers(), timeout=10)
        r.raise_for_status()
        return parse_metrics(r.text)

    def wait_metric(self, name: str, predicate, deadline_s: float = 30.0) -> float:  # noqa: ANN001
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            v = self.metrics().get(name, 0.0)
            if predicate(v):
                return v
            time.sleep(0.02)
        raise TimeoutError(f"{name} did not reach the expected value; last {self.metrics().get(name)}")

    def terminate(self) -> int:
        """SIGTERM and wait; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        finally:
            self._log.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


@contextmanager
def running(model: Path | None, *args: str, **kw: Any) -> Iterator[ServerProcess]:
    """A started and ready server for a fixture's lifetime; stopped after, also when the start fails."""
    s = ServerProcess(model, *args, **kw)
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


def openai_client(srv: ServerProcess) -> Any:
    """The openai client on ``srv``'s /v1, without retries (a retry would hide a failed request)."""
    import openai

    return openai.OpenAI(base_url=srv.url + "/v1", api_key="not-needed", max_retries=0, timeout=120)


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {'name{labels}': value} plus label-free totals per name."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            raise AssertionError(f"not Prometheus text: {line!r}")
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        out[name + labels] = value
        if labels:
            out[name] = out.get(name, 0.0) + value
    return out


def sse_events(lines) -> list[Any]:  # noqa: ANN001
    """Parse 'data: ...' lines of an SSE stream; '[DONE]' is returned as the string."""
    out = []
    for line in lines:
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


# A JSON-schema grammar that forbids ending before `n` characters: generation that cannot stop
# early, for tests that need a request to keep running (disconnect, queue, drain). llama.cpp's grammar
# parser refuses a repetition above 2000 (char{4000,}), so the length is spread over required
# properties of at most 1000 characters each.
def long_string_format(n: int) -> dict[str, Any]:
    parts = [min(1000, n - i) for i in range(0, n, 1000)]
    props = {f"p{i}": {"type": "string", "minLength": k} for i, k in enumerate(parts)}
    return {
        "type": "json_schema",
        "json_schema": {
            "name": "long",
            "schema": {"type": "object", "properties": props, "required": list(props), "additionalProperties": False},
        },
    }
