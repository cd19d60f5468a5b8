"""benchmarks/serve_bench.py, the side-by-side serving benchmark, runs end to end: `throughput` against
llama-vq-server and llama-server (built from the same tree) with the SmolLM2 model on the CPU, in rounds, writes
every row's figures (tok/s, TTFT, RSS, the compute threads' context switches and busy share) and the ratio table,
and `summary` reads what it wrote. A refactor of the benchmark's modules that breaks a path fails here.

Speed is not asserted (tests/server/test_server_threads.py compares the server's decode rate with llama-bench's); a few
seconds of generation: 2 rounds x 2 client counts x 2 servers, 16 tokens per request.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "serve_bench.py"
sys.path.insert(0, str(ROOT / "benchmarks"))
from serve_process import compute_threads  # noqa: E402

MAX_TOKENS = 16
CLIENTS = (1, 2)
ROUNDS = 2


def test_compute_threads_are_the_busiest_threads_and_switches_count_per_token_each():
    hz = os.sysconf("SC_CLK_TCK")
    before = {"1": (0, 0), "2": (0, 10), "3": (0, 0), "4": (5, 0)}
    # threads 2 and 3 computed 1 s each (one 50 switches, the other 150), 1 (the HTTP thread) 0.1 s, 5 (new) 0.2 s
    after = {"1": (hz // 10, 400), "2": (hz, 60), "3": (hz, 150), "4": (5, 0), "5": (hz // 5, 7)}
    c = compute_threads(before, after, 2, wall_s=2.0, tokens=100)
    assert c["vcsw_per_token"] == pytest.approx(1.0)  # (50 + 150) / 100 / 2 threads
    assert c["vcsw_per_token_max"] == pytest.approx(1.5)
    assert c["busy"] == pytest.approx(0.5)  # 1 s each over 2 s
    assert c["other_threads_cpu_s"] == pytest.approx((hz // 10 + hz // 5) / hz)


@pytest.mark.slow  # llama-server's first build on a fresh machine takes minutes; the benchmark itself ~10 s
def test_throughput_runs_both_servers_in_rounds_and_summary_reads_it(smollm2_path, llama_server_bin, tmp_path):
    out = tmp_path / "bench"
    cmd = [
        sys.executable,
        str(BENCH),
        "throughput",
        "--model",
        str(smollm2_path),
        "--llama-server",
        str(llama_server_bin),
        "--clients",
        ",".join(map(str, CLIENTS)),
        "--requests",
        "1",
        "--max-tokens",
        str(MAX_TOKENS),
        "--rounds",
        str(ROUNDS),
        "--threads",
        "1",
        "--ctx",
        "1024",
        "--out",
        str(out),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]

    res = json.loads((out / "throughput.json").read_text())
    rows = res["rows"]
    assert (res["threads"], res["rounds"]) == (1, ROUNDS)
    # every round runs every client count on both servers, back to back, the servers' order reversed each round
    assert [(x["round"], x["clients"], x["server"]) for x in rows] == [
        (k, n, s)
        for k in range(ROUNDS)
        for n in CLIENTS
        for s in (("ours", "llama-server") if k % 2 == 0 else ("llama-server", "ours"))
    ]
    for x in rows:
        assert x["failed"] == 0, x["errors"]
        assert 0 < x["tokens"] <= x["clients"] * MAX_TOKENS and x["tok_s"] > 0
        # the RSS columns: the process's resident memory now and at its peak
        assert 0 < x["vmrss_mib"] <= x["vmhwm_mib"]
        # the compute thread (-t 1) ran for part of the round and its switches were counted
        assert 0 < x["busy"] <= 1.05 and math.isfinite(x["vcsw_per_token"]) and x["vcsw_per_token"] >= 0
        assert x["idle_servers_cpu_s"] >= 0 and math.isfinite(x["others_cpu_s"])

    md = (out / "throughput.md").read_text().splitlines()
    head = next(i for i, ln in enumerate(md) if "ratio (median)" in ln)
    table = [[c.strip() for c in ln.split("|")[1:-1]] for ln in md[head + 2 : head + 2 + len(CLIENTS)]]
    assert [int(cells[0]) for cells in table] == list(CLIENTS), md
    for cells in table:
        # the rounds paired, less those another process disturbed (a shared machine), each with its ratio
        counted = int(cells[1].split()[0])
        left_out = int(cells[1].split("(")[1].split()[0]) if "(" in cells[1] else 0
        assert counted + left_out == ROUNDS, cells
        if counted:
            assert len(cells[4].split(", ")) == counted
            ours, theirs, median = float(cells[2]), float(cells[3]), float(cells[5].strip("*"))
            assert ours > 0 and theirs > 0 and median > 0

    s = subprocess.run(
        [sys.executable, str(BENCH), "summary", str(out / "throughput.json"), "--ratio-clients", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert s.returncode == 0, s.stderr[-3000:]
    lines = s.stdout.splitlines()
    for server in ("ours", "llama-server"):
        for n in CLIENTS:
            (row,) = [ln for ln in lines if ln.startswith(f"| {server} | {n} |")]
            assert len(row.split("|")[3].split(",")) == ROUNDS  # each round counts as a run
    for n in CLIENTS:
        assert any(ln.startswith(f"ours / llama-server at {n} clients, runs paired:") for ln in lines), s.stdout
