"""Several hosts (docs/architecture.md, decision 7: llama.cpp's RPC backend): llama-vq-server serves part of the
layers on another host's `rpc-server` (`--rpc host:port -ngl N`), q8_0 K / q4_0 V, flash attention off.

The other host is a network namespace of its own, joined to this one by a veth pair: the rpc-server listens on
the namespace's address and reaches nothing else, llama-vq-server connects to it over the pair as it would over
a network. That needs root and `ip` (iproute2); CI has both (a fresh machine, the tests run as root), so CI runs
this form. Elsewhere (no root, or a container that refuses `ip netns add`) the rpc-server runs on 127.0.0.1, and
the reason is printed: the same RPC traffic over the loopback, only not across an interface.

- The remote layers give the local run's greedy text, exactly: the same build runs the same arithmetic on both
  sides at the same thread count, so tokens and their log-probabilities are equal bit for bit (measured: 3 prompts
  x 64 tokens, with 12 and with all 30 layers remote, every log-probability difference 0.0).
- Our kernels run on the remote side: the rpc-server, started with LLAMA_VQ_CPU_OP_LOG=1, writes the line of the
  first run of our quantized OUT_PROD (V*softmax(KQ) from the q4_0 V cache) and of the short-row K*Q (q8_0 K).
- An rpc-server that dies mid-request (SIGKILL) fails that request with an error, the server stays up (/health
  answers), and every following request gets llama-server's error ("Compute error.", 500): the layers and cache
  that lived on that host are gone until llama-vq-server restarts (patch 0019-rpc-lost-server-fails-its-graphs;
  without it, ggml's RPC client aborts the whole process).
- A host cut off without a word (its link down: no FIN, no RST) fails the request once the client's sockets give
  the peer up, 30 s without an acknowledgement (patch 0019-rpc-lost-server-fails-its-graphs; without it, the
  request waits forever). Needs the
  namespace (the loopback cannot be cut): skipped, with the reason, without it; ~40 s.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from server_support import running, sse_events
from skip_support import skip_platform_limit

CACHE = ["-ctk", "q8_0", "-ctv", "q4_0", "-fa", "off"]
# local and remote compute on one thread each: equal thread counts give equal arithmetic (and the 2-core CI
# machine runs both processes at once)
FLAGS = [*CACHE, "-t", "1", "-np", "1"]
REMOTE_LAYERS = "12"  # of SmolLM2's 30: the last 12 and their KV cache on the other host
RPC_PORT = 50052
START_DEADLINE_S = 30.0


@dataclass
class RemoteHost:
    address: str
    how: str  # "netns" or "loopback"
    run: list[str]  # the prefix that runs a command on that host
    link: str = ""  # this side's end of the veth pair (netns only)


def _netns_host(tag: str) -> tuple[RemoteHost | None, str, list[list[str]]]:
    """A network namespace joined by a veth pair: (host, "", teardown commands), or (None, why not, [])."""
    if os.geteuid() != 0:
        return None, "not root", []
    if shutil.which("ip") is None:
        return None, "no `ip` (iproute2)", []
    ns, a, b = f"lvq-rpc-{tag}", f"lvq{tag}a", f"lvq{tag}b"
    # a /30 of its own per test process (10.213.0.0/16), so that concurrent runs on one machine do not collide
    k = int(tag) % 16384
    prefix, last = f"10.213.{k >> 6}.", (k & 63) * 4
    here, there = prefix + str(last + 1), prefix + str(last + 2)
    r = subprocess.run(["ip", "netns", "add", ns], capture_output=True, text=True)
    if r.returncode != 0:
        return None, f"`ip netns add` refused: {r.stderr.strip()}", []
    teardown = [["ip", "netns", "del", ns], ["ip", "link", "del", a]]
    steps = [
        ["ip", "link", "add", a, "type", "veth", "peer", "name", b],
        ["ip", "link", "set", b, "netns", ns],
        ["ip", "addr", "add", f"{here}/30", "dev", a],
        ["ip", "link", "set", a, "up"],
        ["ip", "-n", ns, "addr", "add", f"{there}/30", "dev", b],
        ["ip", "-n", ns, "link", "set", b, "up"],
        ["ip", "-n", ns, "link", "set", "lo", "up"],
    ]
    for cmd in steps:
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            for t in teardown:
                subprocess.run(t, capture_output=True)
            return None, f"`{' '.join(cmd)}` failed: {r.stderr.strip()}", []
    return RemoteHost(there, "netns", ["ip", "netns", "exec", ns], a), "", teardown


@pytest.fixture(scope="module")
def remote_host() -> Iterator[RemoteHost]:
    host, why, teardown = _netns_host(str(os.getpid()))
    if host is None:
        print(f"rpc tests: the rpc-server runs on 127.0.0.1, not in a network namespace: {why}")
        host = RemoteHost("127.0.0.1", "loopback", [])
    else:
        print(f"rpc tests: the rpc-server runs in a network namespace at {host.address} (veth pair)")
    try:
        yield host
    finally:
        for t in teardown:
            subprocess.run(t, capture_output=True)


@pytest.fixture(scope="module")
def rpc_server_bin() -> Path:
    from llama_vq._cdll import BIN_DIR

    tool = BIN_DIR / "ggml-rpc-server"
    if not tool.exists():
        pytest.fail(f"{tool} is missing: the test suite builds llama-vq with LLAMA_VQ_BUILD_TOOLS=ON")
    return tool


def _wait_listening(proc: subprocess.Popen, address: str, port: int, log: Path) -> None:
    """Until a TCP connection to address:port succeeds (rpc-server then serves the next client); fails with the
    log if the process exits first or the deadline passes."""
    end = time.monotonic() + START_DEADLINE_S
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"rpc-server exited with {proc.returncode}:\n{log.read_text(errors='replace')}")
        try:
            socket.create_connection((address, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)  # poll interval against the deadline
    raise TimeoutError(f"rpc-server not listening after {START_DEADLINE_S} s:\n{log.read_text(errors='replace')}")


@contextmanager
def rpc_server(host: RemoteHost, tool: Path, log_dir: Path) -> Iterator[tuple[subprocess.Popen, Path]]:
    """ggml-rpc-server on the remote host (its CPU device, one thread), our kernels' first runs logged."""
    log = log_dir / "rpc-server.log"
    with log.open("wb") as f:
        proc = subprocess.Popen(
            [*host.run, str(tool), "-H", host.address, "-p", str(RPC_PORT), "-t", "1"],
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**os.environ, "LLAMA_VQ_CPU_OP_LOG": "1"},
        )
    try:
        _wait_listening(proc, host.address, RPC_PORT, log)
        yield proc, log
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


PROMPTS = ["Once upon a time", "The history of the printing press", "def quicksort(items):"]


def _greedy(url: str, prompt: str, n: int = 48) -> tuple[list[int], list[float]]:
    r = httpx.post(
        url + "/completion",
        timeout=300,
        json={"prompt": prompt, "n_predict": n, "temperature": 0, "n_probs": 1, "ignore_eos": True},
    )
    r.raise_for_status()
    probs = r.json()["completion_probabilities"]
    assert len(probs) == n
    return [p["id"] for p in probs], [p["logprob"] for p in probs]


@pytest.mark.slow
def test_layers_on_another_host_give_the_local_greedy_text_and_run_our_kernels_there(
    smollm2_path, remote_host, rpc_server_bin, tmp_path
):
    with running(smollm2_path, *FLAGS, log_dir=tmp_path / "local") as srv:
        local = [_greedy(srv.url, p) for p in PROMPTS]
    with rpc_server(remote_host, rpc_server_bin, tmp_path) as (_, rpc_log):
        endpoint = f"{remote_host.address}:{RPC_PORT}"
        with running(
            smollm2_path, *FLAGS, "--rpc", endpoint, "-ngl", REMOTE_LAYERS, log_dir=tmp_path / "remote"
        ) as srv:
            remote = [_greedy(srv.url, p) for p in PROMPTS]
        remote_log = rpc_log.read_text(errors="replace")
    # the remote side computed with our kernels: the quantized V cache's OUT_PROD and the short-row K*Q
    assert "llama-vq: CPU kernel ran: out_prod q4_0" in remote_log, remote_log[-3000:]
    assert "llama-vq: CPU kernel ran: kq_short q8_0" in remote_log, remote_log[-3000:]
    # the same build, arithmetic and thread count on both sides: equal tokens and log-probabilities, bit for bit
    for p, (lt, lp), (rt, rp) in zip(PROMPTS, local, remote, strict=True):
        assert rt == lt, f"{p!r}: remote tokens {rt} != local {lt}"
        worst = max(abs(a - b) for a, b in zip(lp, rp, strict=True))
        assert rp == lp, f"{p!r}: log-probabilities differ by up to {worst:.3g}"


@pytest.mark.slow
def test_a_remote_host_that_dies_mid_request_fails_the_request_and_the_server_stays_up(
    smollm2_path, remote_host, rpc_server_bin, tmp_path
):
    n_predict, kill_after = 2000, 16
    with rpc_server(remote_host, rpc_server_bin, tmp_path) as (rpc, _):
        endpoint = f"{remote_host.address}:{RPC_PORT}"
        with running(
            smollm2_path, *FLAGS, "--rpc", endpoint, "-ngl", REMOTE_LAYERS, log_dir=tmp_path / "remote"
        ) as srv:
            lines = []
            body = {
                "prompt": "Once upon a time",
                "n_predict": n_predict,
                "ignore_eos": True,
                "temperature": 0,
                "stream": True,
            }
            with httpx.stream("POST", srv.url + "/completion", json=body, timeout=120) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    lines.append(line)
                    if sum(ln.startswith("data: ") for ln in lines) == kill_after:
                        rpc.send_signal(signal.SIGKILL)  # the host goes away mid-request
            events = sse_events(lines)
            tokens = [e for e in events if isinstance(e, dict) and "content" in e]
            # the stream ends with llama-server's error, long before n_predict tokens
            assert events and isinstance(events[-1], dict) and "error" in events[-1], lines[-5:]
            assert events[-1]["error"]["code"] == 500
            assert kill_after - 1 <= len(tokens) < kill_after + 8, len(tokens)

            assert srv.proc.poll() is None, srv.log()[-3000:]
            assert httpx.get(srv.url + "/health", timeout=10).status_code == 200
            # what follows fails at once with the same error, in both forms, and the server stays up
            r = httpx.post(srv.url + "/completion", json={"prompt": "Hello", "n_predict": 8}, timeout=60)
            assert r.status_code == 500 and r.json()["error"]["message"] == "Compute error.", r.text
            r = httpx.post(
                srv.url + "/v1/chat/completions",
                timeout=60,
                json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "stream": True},
            )
            assert [e["error"]["message"] for e in sse_events(r.text.splitlines())] == ["Compute error."], r.text
            assert srv.proc.poll() is None
            log = srv.log()
    # the server's log names the host that went away
    assert f"RPC server {endpoint} crashed, went away or returned a malformed response" in log, log[-3000:]


@pytest.mark.slow
@pytest.mark.timing
def test_a_remote_host_cut_off_without_a_word_fails_the_request_within_the_dead_peer_timeout(
    smollm2_path, remote_host, rpc_server_bin, tmp_path
):
    if remote_host.how != "netns":
        skip_platform_limit("cutting a host's link needs a network namespace (root, iproute2), unavailable here")
    # 0019-rpc-lost-server-fails-its-graphs's TCP_USER_TIMEOUT, and keepalive after a third of it idle + 4 probes a
    # sixth apart: LLAMA_VQ_RPC_DEAD_PEER_S, 30 s by default, 6 here so that the wait costs the suite 6 s
    dead_peer_s = 6
    with rpc_server(remote_host, rpc_server_bin, tmp_path) as _:
        endpoint = f"{remote_host.address}:{RPC_PORT}"
        with running(
            smollm2_path,
            *FLAGS,
            "--rpc",
            endpoint,
            "-ngl",
            REMOTE_LAYERS,
            log_dir=tmp_path / "remote",
            env={"LLAMA_VQ_RPC_DEAD_PEER_S": str(dead_peer_s)},
        ) as srv:
            lines: list[str] = []
            body = {
                "prompt": "Once upon a time",
                "n_predict": 4000,
                "ignore_eos": True,
                "temperature": 0,
                "stream": True,
            }
            cut_at = None
            try:
                with httpx.stream("POST", srv.url + "/completion", json=body, timeout=3 * dead_peer_s) as r:
                    for line in r.iter_lines():
                        lines.append(line)
                        if cut_at is None and sum(ln.startswith("data: ") for ln in lines) == 8:
                            subprocess.run(["ip", "link", "set", remote_host.link, "down"], check=True)
                            cut_at = time.monotonic()
                waited = time.monotonic() - cut_at
            finally:
                subprocess.run(["ip", "link", "set", remote_host.link, "up"], capture_output=True)
            events = sse_events(lines)
            assert events and isinstance(events[-1], dict) and "error" in events[-1], lines[-5:]
            # given up by the dead-peer timeout, not by the client's read timeout (3x it)
            assert waited < 2 * dead_peer_s, f"the request failed {waited:.0f} s after the cut"
            assert srv.proc.poll() is None, srv.log()[-3000:]
            assert httpx.get(srv.url + "/health", timeout=10).status_code == 200
            r = httpx.post(srv.url + "/completion", json={"prompt": "Hello", "n_predict": 8}, timeout=60)
            assert r.status_code == 500 and r.json()["error"]["message"] == "Compute error.", r.text
            print(f"cut off: the request failed {waited:.1f} s after the link went down")
