"""Processes and HTTP for benchmarks/two_gpu.py, standard library only (the GPU machine's own python3 runs it): a
server on a free 127.0.0.1 port polled on GET /health against a deadline, JSON and SSE requests, a stop by SIGTERM."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

START_TIMEOUT_S = 300  # a 6 GiB model onto two GPUs; seconds on an H200 host
REQUEST_TIMEOUT_S = 600  # a 64K-token prompt without flash attention


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], env: dict[str, str], log: Path, cwd: Path,
          expect_exit: bool = False) -> tuple[subprocess.Popen, str]:
    """``cmd`` plus --host/--port, ready (GET /health 200) or, with ``expect_exit``, exited; else RuntimeError with the
    log's last lines."""
    port = free_port()
    cmd = [*cmd, "--host", "127.0.0.1", "--port", str(port)]
    with log.open("ab") as f:
        f.write(f"$ {' '.join(cmd)}\n".encode())
        f.flush()
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=str(cwd))
    url = f"http://127.0.0.1:{port}"
    end = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < end:
        if p.poll() is not None:
            if expect_exit:
                return p, url
            raise RuntimeError(f"exited with {p.returncode}: {tail(log)}")
        try:
            if request("GET", url + "/health", timeout=2)[0] == 200:
                return p, url
        except OSError:
            pass
        time.sleep(0.1)  # polling interval against the deadline
    stop(p)
    raise RuntimeError(f"not ready after {START_TIMEOUT_S} s: {tail(log)}")


def wait_port(port: int, proc: subprocess.Popen, deadline_s: float = 30) -> None:
    """Until something listens on 127.0.0.1:port (ggml-rpc-server has no health route)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the process for port {port} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)  # polling interval against the deadline
    raise RuntimeError(f"nothing listens on port {port} after {deadline_s} s")


def request(method: str, url: str, body: Any = None, timeout: float = REQUEST_TIMEOUT_S) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    rq = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(rq, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def post_json(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST a JSON body, the JSON answer; RuntimeError unless 200."""
    status, raw = request("POST", url, body)
    if status != 200:
        raise RuntimeError(f"{url}: {status} {raw[:300]!r}")
    return json.loads(raw)


def completion(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST /completion (llama-server's own route, with its timings and n_probs)."""
    return post_json(url + "/completion", body)


def stream(url: str, body: dict[str, Any]) -> list[str]:
    """The non-empty lines of a streamed (SSE) answer."""
    host, _, path = url.removeprefix("http://").partition("/")
    c = http.client.HTTPConnection(host, timeout=REQUEST_TIMEOUT_S)
    c.request("POST", "/" + path, json.dumps(body), {"Content-Type": "application/json"})
    lines = [x.decode().rstrip("\r\n") for x in c.getresponse()]
    c.close()
    return [x for x in lines if x]


def stop(p: subprocess.Popen) -> None:
    """SIGTERM (servers drain and save their state), then SIGKILL after 60 s."""
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def tail(path: Path, n: int = 3) -> str:
    lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()]
    return " | ".join(lines[-n:])


def grep_int(text: str, before: str, after: str) -> int:
    """The integer between ``before`` and ``after`` on the first line holding both; 0 if none."""
    for line in text.splitlines():
        i, j = line.find(before), line.find(after)
        if i >= 0 and j > i:
            try:
                return int(line[i + len(before):j])
            except ValueError:
                pass
    return 0
