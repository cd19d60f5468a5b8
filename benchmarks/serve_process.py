"""The server processes the serving benchmarks start (serve_bench.py, spec_replay.py): a free 127.0.0.1 port,
readiness polled on GET /health against a deadline, the command that runs llama-vq-server, and serve_bench's Server
(ours or llama-server: its memory, its threads' CPU time and context switches, a snapshot of its slots and counters
for a stalled run)."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from proc_threads import thread_counters  # noqa: E402  (tools/proc_threads.py: also the server threads' test)

# llama-vq-server as a module of the installed package: the one place that names it
SERVER_MODULE = "llama_vq.server.cli"


def ours_cmd(python: str) -> list[str]:
    """The command that runs llama-vq-server with ``python`` (llama-server's flags follow it)."""
    return [python, "-m", SERVER_MODULE]


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

    def memory_mib(self) -> dict[str, float]:
        """The process's resident memory now and at its peak (VmRSS, VmHWM), MiB: for llama-vq-server that is the
        Python front end and the engine together, for llama-server the engine alone."""
        out = {}
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key.lower()] = int(value.split()[0]) / 1024
        except OSError:
            pass
        return out

    def threads(self) -> dict[str, tuple[int, int]]:
        """Per thread of the process now: (CPU time in clock ticks, voluntary context switches)."""
        return thread_counters(self.proc.pid)

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


CLK_TCK = os.sysconf("SC_CLK_TCK")


def compute_threads(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]], n: int,
                    wall_s: float, tokens: int) -> dict[str, float]:
    """What the ``n`` compute threads (the -t threads: those that used the most CPU between the two
    thread_counters readings) did over ``wall_s`` seconds in which ``tokens`` tokens were generated: voluntary
    context switches per generated token per thread (their mean, and the largest), the share of the wall time
    they were on a CPU (mean over them), and the CPU seconds of the process's other threads (HTTP, Python)."""
    deltas = sorted(((a[0] - before.get(t, (0, 0))[0], a[1] - before.get(t, (0, 0))[1]) for t, a in after.items()),
                    reverse=True)
    top, rest = deltas[:n], deltas[n:]
    per_tok = [v / max(tokens, 1) for _, v in top]
    return {
        "vcsw_per_token": sum(per_tok) / len(top) if top else float("nan"),
        "vcsw_per_token_max": max(per_tok, default=float("nan")),
        "busy": sum(c for c, _ in top) / CLK_TCK / wall_s / len(top) if top and wall_s > 0 else float("nan"),
        "other_threads_cpu_s": sum(c for c, _ in rest) / CLK_TCK,
    }


def process_cpu_s(pid: int) -> float:
    """The process's CPU time so far (all threads, utime + stime), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy so far (every CPU: user, nice, system, irq, softirq, steal)."""
    f = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    return (f[0] + f[1] + f[2] + f[5] + f[6] + f[7]) / CLK_TCK
