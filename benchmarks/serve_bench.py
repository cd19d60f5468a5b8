#!/usr/bin/env python3
"""llama-vq-server against llama.cpp's own llama-server (built from the same patched tree), side by side.

    python benchmarks/serve_bench.py build --llama-vq                    # llama-server, once (nice'd):
        # llama.cpp's llama-server target of our own CMake project in build/server-bench, beside the pip build
        # dir, with its compilers and flags: every object but the server's is a ccache hit
    python benchmarks/serve_bench.py build --dir build-server            # or standalone from the patched tree
    python benchmarks/serve_bench.py throughput --llama-server build/server-bench/bin/llama-server \\
        --model M.gguf --out bench-out [--clients 1,2,4,8] [--rounds 3] [--threads all] [--extra ARGS]
    python benchmarks/serve_bench.py agent --model mimo.gguf --state-dir DIR --out bench-out \\
        [--llama-server BIN]
    python benchmarks/serve_bench.py summary RUN.json [RUN.json ...]   # medians over runs and rounds
    python benchmarks/serve_bench.py latency --model M.gguf --llama-server BIN [--rounds 3]

throughput: both servers up at once with the same flags (-np = the largest client count, q8_0 K / q4_0 V, flash
attention off, -t = every core by default), then --rounds rounds; in each, N concurrent streaming clients each
send --requests completions of --max-tokens tokens to one server while the other idles, for every client count
and server in turn (the servers' order reversed every other round). Per row: aggregate generated tok/s
(completion tokens of all requests / wall time), TTFT p50/p99 (request sent -> first streamed text), the
server's RSS, and its compute threads (the -t threads that used the most CPU in the round, from
/proc/PID/task/*): voluntary context switches per generated token each, and the share of the wall time they ran;
and the CPU seconds of the machine's other processes meanwhile (a disturbed row shows).
Then the ratio llama-vq-server / llama-server per client count, as the median of the rounds' paired ratios (a
round in which other processes used more than 3 % of the machine is left out, and counted).

agent: a 20-turn agent conversation replayed against a sliding-window model (the MiMo-shaped synthetic
model: tools/synth_models.py mimo OUT --preset tiny here, attn on a GPU): a long system prompt, then per
turn a long forced answer ("thinking", past the SWA cache's cells), after which the history holds the
assistant turn re-rendered (thinking stripped, tool arguments re-serialized), a tool result and the next
user message, as agent clients send it. Reports cached_tokens / prompt_tokens per turn; turns
--restart-at.. run after a restart of the server with --state-dir.

Writes throughput.json / agent.json / latency.json and the .md of each into --out. The GPU machine runs the same
commands with --extra '-ngl 999' (and a GPU-built llama-server): `benchmarks/gpu.sh serving`, and
benchmarks/cpu_experts.sh for the MiMo shape with its routed experts on the CPU.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_build import cmd_build  # noqa: E402  (the build subcommand lives beside this file)
from serve_process import (  # noqa: E402  (the server processes)
    Server,
    compute_threads,
    machine_busy_s,
    ours_cmd,
    process_cpu_s,
)
from serve_report import DISTURBED, markdown, summary  # noqa: E402  (the tables)


def server_cmd(kind: str, args: argparse.Namespace, n_parallel: int, extra: list[str]) -> list[str]:
    common = [
        "-m",
        str(args.model),
        "-c",
        str(args.ctx),
        "-np",
        str(n_parallel),
        "-ctk",
        args.ctk,
        "-ctv",
        args.ctv,
        "-fa",
        args.fa,
        "-t",
        str(args.threads),
        *extra,
    ]
    # the same flags for both: llama-vq-server parses them with llama-server's own parser
    if kind == "ours":
        return [*ours_cmd(args.python or sys.executable), *common, "--no-webui"]
    return [str(args.llama_server), *common, "--no-webui"]


# ---- throughput ------------------------------------------------------------------------------------

from serve_prompts import PROMPTS, client_context  # noqa: E402

# seconds a request may take before it counts as failed (--request-timeout): its total time, not only the time
# without a byte, since our server sends `: keepalive` every 5 s while a request makes no progress
REQUEST_TIMEOUT = 600.0


def ON_STALL() -> None:  # noqa: N802  (a hook: the running server's snapshot replaces it)
    """Called by the first request over REQUEST_TIMEOUT."""


def one_stream(url: str, prompt: str, max_tokens: int) -> dict[str, float]:
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.monotonic()
    ttft = None
    n = 0
    chunks = keepalives = 0
    with httpx.Client(timeout=REQUEST_TIMEOUT) as c, c.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if time.monotonic() - t0 > REQUEST_TIMEOUT:
                ON_STALL()  # while this stream is still open: a closed one is cancelled by the server
                raise TimeoutError(
                    f"not done after {REQUEST_TIMEOUT:.0f} s: {chunks} data chunks, {keepalives} keepalives"
                )
            keepalives += line.startswith(": keepalive")
            if not line.startswith("data: {"):
                continue
            chunks += 1
            ev = json.loads(line[6:])
            if ttft is None and any(ch.get("text") for ch in ev.get("choices") or []):
                ttft = time.monotonic() - t0
            if ev.get("usage"):
                n = ev["usage"]["completion_tokens"]
            elif ev.get("timings"):
                n = n or int(ev["timings"].get("predicted_n", 0))
    return {"ttft": ttft if ttft is not None else time.monotonic() - t0, "tokens": n, "seconds": time.monotonic() - t0}


def run_clients(url: str, clients: int, requests: int, max_tokens: int, context_words: int = 0) -> dict[str, Any]:
    jobs = [
        (client_context(c, context_words) + PROMPTS[(c * requests + i) % len(PROMPTS)] + f" ({c}.{i})", max_tokens)
        for c in range(clients)
        for i in range(requests)
    ]
    t0 = time.monotonic()

    def client(c: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for i in range(requests):
            try:
                out.append(one_stream(url, *jobs[c * requests + i]))
            except Exception as e:  # noqa: BLE001 (a stalled or failed request is counted, not fatal)
                out.append({"error": f"{type(e).__name__}: {e}"})
        return out

    with cf.ThreadPoolExecutor(clients) as pool:
        every = [r for rs in pool.map(client, range(clients)) for r in rs]
    wall = time.monotonic() - t0
    results = [r for r in every if "error" not in r] or [{"ttft": float("nan"), "tokens": 0}]
    ttfts = sorted(r["ttft"] for r in results)
    tokens = sum(r["tokens"] for r in results)
    return {
        "clients": clients,
        "failed": len(every) - sum("error" not in r for r in every),
        "errors": sorted({r["error"] for r in every if "error" in r})[:3],
        "requests": len(results),
        "tokens": tokens,
        "wall_s": wall,
        "tok_s": tokens / wall,
        "ttft_p50_s": statistics.median(ttfts),
        "ttft_p99_s": ttfts[min(len(ttfts) - 1, int(round(0.99 * (len(ttfts) - 1))))],
    }


def start_spies(srv: Server, args: argparse.Namespace, n: int) -> list[subprocess.Popen]:
    """With --spy-clients n: py-spy on our server for --spy-seconds of that round, twice at once: every thread's
    samples, idle ones included (spy-N-all.txt), and only the GIL holder's (spy-N-gil.txt); spy_summary.py reads
    them (a Python frame sampled but not holding the GIL is a wait for it, or a call into C)."""
    exe = shutil.which("py-spy") or os.environ.get("PY_SPY", "")
    if n != args.spy_clients or not exe or not os.path.exists(exe):
        return []
    base = [
        exe,
        "record",
        "--pid",
        str(srv.proc.pid),
        "--duration",
        str(args.spy_seconds),
        "--rate",
        "500",
        "--threads",
        "--nonblocking",
        "--format",
        "raw",
    ]
    return [
        subprocess.Popen(
            [*base, "--idle", "-o", str(args.out / f"spy-{n}-all.txt")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
        subprocess.Popen(
            [*base, "--gil", "-o", str(args.out / f"spy-{n}-gil.txt")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
    ]


def _threads_arg(value: str) -> int:
    """--threads: a number, or "all" (every core this process may run on, as an operator gives -t)."""
    return len(os.sched_getaffinity(0)) if value == "all" else int(value)


def measure_round(servers: dict[str, Server], kind: str, n: int, rnd: int, args: argparse.Namespace,
                  label: str) -> dict[str, Any]:
    """One round of n streaming clients against servers[kind], the other servers idle: the clients' figures, the
    server's memory, what its compute threads did (serve_process.compute_threads) and the CPU seconds the idle
    servers used meanwhile (they share the cores: an idle server that spins would slow the measured one)."""
    global ON_STALL
    srv = servers[kind]
    ON_STALL = srv.snapshot if kind == "ours" else (lambda: None)
    spies = start_spies(srv, args, n) if kind == "ours" and rnd == 0 else []
    cpu0 = {k: process_cpu_s(s.proc.pid) for k, s in servers.items()}
    machine0, own0 = machine_busy_s(), time.process_time()
    before = srv.threads()
    res = run_clients(srv.url, n, args.requests, args.max_tokens, args.context_words)
    after = srv.threads()
    cpu = {k: process_cpu_s(servers[k].proc.pid) - v for k, v in cpu0.items()}
    row = {"server": kind, "label": label, "round": rnd, **res}
    row.update(compute_threads(before, after, args.threads, res["wall_s"], res["tokens"]))
    row["idle_servers_cpu_s"] = sum(v for k, v in cpu.items() if k != kind)
    # what else ran on the machine meanwhile (another process's build): CPU seconds of neither the servers nor
    # this process (the clients), a row to distrust when it is a fair share of threads x wall
    row["others_cpu_s"] = machine_busy_s() - machine0 - sum(cpu.values()) - (time.process_time() - own0)
    row.update({f"{k}_mib": v for k, v in srv.memory_mib().items()})
    for sp in spies:
        sp.wait()
    print(
        f"[throughput] round {rnd} {kind:12s} clients {n}: {row['tok_s']:.1f} tok/s, TTFT p50 "
        f"{row['ttft_p50_s'] * 1e3:.0f} ms p99 {row['ttft_p99_s'] * 1e3:.0f} ms, "
        f"RSS {row.get('vmrss_mib', 0):.0f} MiB (peak {row.get('vmhwm_mib', 0):.0f}), "
        f"{args.threads} compute threads {row['busy'] * 100:.0f} % busy, "
        f"{row['vcsw_per_token']:.2f} voluntary switches per token each; "
        f"other processes {row['others_cpu_s']:.1f} CPU s"
        + (f", {row['failed']} FAILED: {row['errors']}" if row["failed"] else ""),
        flush=True,
    )
    return row


def wait_quiet(servers: dict[str, Server], limit_s: float) -> float:
    """On a shared machine: until the other processes (neither the servers nor this one) used at most DISTURBED of
    the machine's CPUs over 3 s, for at most limit_s seconds; the seconds waited."""
    t0 = time.monotonic()
    n_cpus = os.cpu_count() or 1
    while True:
        m0, own0 = machine_busy_s(), time.process_time()
        cpu0 = sum(process_cpu_s(s.proc.pid) for s in servers.values())
        time.sleep(3)  # the sampling window
        cpu = sum(process_cpu_s(s.proc.pid) for s in servers.values()) - cpu0
        others = machine_busy_s() - m0 - cpu - (time.process_time() - own0)
        waited = time.monotonic() - t0
        if others <= DISTURBED * n_cpus * 3 or waited >= limit_s:
            return waited


def cmd_throughput(args: argparse.Namespace) -> dict[str, Any]:
    """Every server up at once (the same flags), then --rounds rounds: in each, every client count against each
    server in turn, the order of the servers reversed every other round, so that a drift of the machine (another
    process's build, a clock change) reaches both alike and each ratio pairs two runs seconds apart."""
    counts = [int(x) for x in args.clients.split(",")]
    kinds = ["ours"] + (["llama-server"] if args.llama_server else [])
    if args.only_llama_server:
        if not args.llama_server:
            raise SystemExit("--only-llama-server needs --llama-server")
        kinds = ["llama-server"]
    out: dict[str, Any] = {"label": args.label, "threads": args.threads, "rounds": args.rounds, "rows": []}
    servers: dict[str, Server] = {}
    try:
        for kind in kinds:
            cmd = server_cmd(kind, args, max(counts), shlex.split(args.extra))
            servers[kind] = Server(kind, cmd, args.out / f"{kind}.log")
        for kind, srv in servers.items():
            # warm-up, not recorded: one request per client at the largest count, so that the first round does not
            # pay for the first graphs and for faulting in the weights (experts a short prompt never routes to)
            w = run_clients(srv.url, max(counts), 1, args.max_tokens, args.context_words)
            print(f"[throughput] warm-up {kind}: {w['tok_s']:.1f} tok/s", flush=True)
        for rnd in range(args.rounds):
            for n in counts:
                if args.wait_quiet > 0:
                    waited = wait_quiet(servers, args.wait_quiet)
                    if waited > 3.5:
                        print(f"[throughput] waited {waited:.0f} s for the other processes to quieten", flush=True)
                for kind in kinds if rnd % 2 == 0 else kinds[::-1]:
                    label = args.label if args.label and len(kinds) == 1 else kind
                    out["rows"].append(measure_round(servers, kind, n, rnd, args, label))
                    # the rows so far, should the run be cut short
                    (args.out / "throughput.partial.json").write_text(json.dumps(out, indent=1))
    finally:
        for kind, srv in servers.items():
            srv.stop(dump=any(r.get("failed") for r in out["rows"] if r["server"] == kind))
    return out


# ---- the front end's own latency --------------------------------------------------------------------

def cmd_latency(args: argparse.Namespace) -> dict[str, Any]:
    """Both servers up at once; in rounds, each in turn: GET /health on one kept-alive connection (the HTTP
    stack's cost per request) and short streamed completions (time to the first token), medians per round."""
    kinds = ["ours", "llama-server"]
    servers = {k: Server(k, server_cmd(k, args, 2, shlex.split(args.extra)), args.out / f"latency-{k}.log")
               for k in kinds}
    rows = []
    try:
        for rnd in range(args.rounds):
            for kind, srv in servers.items():
                with httpx.Client(timeout=60) as c:
                    health = []
                    for _ in range(30):
                        t0 = time.perf_counter()
                        c.get(srv.url + "/health").raise_for_status()
                        health.append(time.perf_counter() - t0)
                ttft = [one_stream(srv.url, PROMPTS[i % len(PROMPTS)], 2)["ttft"] for i in range(args.requests)]
                row = {"server": kind, "round": rnd, "health_p50_ms": statistics.median(health) * 1e3,
                       "ttft_p50_ms": statistics.median(ttft) * 1e3}
                print(f"[latency] round {rnd} {kind:12s} /health p50 {row['health_p50_ms']:.2f} ms, "
                      f"TTFT p50 {row['ttft_p50_ms']:.1f} ms", flush=True)
                rows.append(row)
    finally:
        for srv in servers.values():
            srv.stop()
    return {"latency": rows}


# ---- agent replay ----------------------------------------------------------------------------------

SYSTEM = "You are a coding agent. Tools: read_file(path), write_file(path, content), run(cmd). " + " ".join(
    f"Rule {i}: keep changes small, explain each step, and check the result of every tool call." for i in range(120)
)


def _force_long(n_tokens: int) -> dict[str, Any]:
    """A schema no answer of n_tokens tokens can complete, so that max_tokens ends every answer. llama.cpp's
    grammar parser refuses repetition counts over 2000 (a string of minLength 6000 is a 400), so: n_tokens
    strings of at least 100 characters each."""
    item = {"type": "string", "minLength": 100}
    schema = {"type": "array", "items": item, "minItems": min(n_tokens, 1900)}
    return {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}


def agent_turn(url: str, messages: list[dict[str, Any]], think_tokens: int) -> dict[str, Any]:
    body = {
        "messages": messages,
        "max_tokens": think_tokens,
        "temperature": 0,
        "response_format": _force_long(think_tokens),
    }
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=1800)
    if r.status_code != 200:
        raise RuntimeError(f"chat completion failed: HTTP {r.status_code}: {r.text[:2000]}")
    j = r.json()
    u = j["usage"]
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached is None:
        cached = int((j.get("timings") or {}).get("cache_n", 0))
    return {"prompt_tokens": u["prompt_tokens"], "cached_tokens": cached, "completion_tokens": u["completion_tokens"]}


def _rerendered_assistant(turn: int) -> dict[str, Any]:
    """What an agent client sends back for its last turn: thinking stripped, the tool call's
    arguments re-serialized (compact JSON, keys sorted), never the generated text."""
    args = {"path": f"src/module_{turn}.py", "lines": [1, 80]}
    call = {
        "id": f"call_{turn}",
        "type": "function",
        "function": {"name": "read_file", "arguments": json.dumps(args, sort_keys=True, separators=(",", ":"))},
    }
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def _tool_result(turn: int) -> str:
    return "\n".join(f"{i:4d}  def function_{turn}_{i}(x): return x * {i} + {turn}" for i in range(12))


def cmd_agent(args: argparse.Namespace) -> dict[str, Any]:
    kinds = ["ours"] + (["llama-server"] if args.llama_server else [])
    out: dict[str, Any] = {"turns": []}
    for kind in kinds:
        state = args.state_dir / kind
        if state.exists():
            shutil.rmtree(state)
        state.mkdir(parents=True)
        extra = shlex.split(args.extra)
        if kind == "ours":
            extra += ["--state-dir", str(state)]
        else:
            extra += ["--slot-save-path", str(state)]
        cmd = server_cmd(kind, args, args.parallel, extra)
        srv = Server(kind, cmd, args.out / f"agent-{kind}.log")
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Fix the failing test in src/."},
        ]
        try:
            for turn in range(1, args.turns + 1):
                restarted = turn == args.restart_at
                if restarted:
                    srv.stop()
                    srv = Server(kind, cmd, args.out / f"agent-{kind}.log")
                r = agent_turn(srv.url, messages, args.think_tokens)
                r.update(
                    server=kind,
                    turn=turn,
                    after_restart=turn >= args.restart_at > 0,
                    ratio=r["cached_tokens"] / r["prompt_tokens"],
                )
                print(
                    f"[agent] {kind:12s} turn {turn:2d}{' (restart)' if restarted else '':10s} prompt "
                    f"{r['prompt_tokens']:6d} cached {r['cached_tokens']:6d} ratio {r['ratio']:.3f}",
                    flush=True,
                )
                out["turns"].append(r)
                messages += [
                    _rerendered_assistant(turn),
                    {"role": "tool", "tool_call_id": f"call_{turn}", "content": _tool_result(turn)},
                    {"role": "user", "content": f"Step {turn} done. Continue with the next file."},
                ]
        finally:
            srv.stop()
    return out


# ---- report ------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build llama-server from the patched tree")
    b.add_argument("--dir", type=Path, default=Path("build-server"))
    b.add_argument("--backend", choices=("cpu", "cuda"), default="cpu")
    b.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2)))
    b.add_argument("--cmake-args", default="", help="e.g. the GGML_* flags of the llama-vq build, for ccache hits")
    b.add_argument("--src", type=Path, help="an exported patched tree (e.g. the llama-vq build's own)")
    b.add_argument("--llama-vq", action="store_true", help="through our CMake project (ccache hits; see above)")
    for name in ("throughput", "agent", "latency"):
        q = sub.add_parser(name)
        q.add_argument("--model", type=Path, required=True)
        q.add_argument("--llama-server", type=Path, help="also run llama.cpp's llama-server (same flags)")
        q.add_argument("--out", type=Path, default=Path("serve-bench-out"))
        q.add_argument("--threads", type=_threads_arg, default="all",
                       help="both servers' -t: a number or 'all' (default: every core this process may use)")
        q.add_argument("--ctk", default="q8_0")
        q.add_argument("--ctv", default="q4_0")
        q.add_argument("--fa", default="off")
        q.add_argument("--extra", default="", help="more flags for both servers, e.g. '-ngl 999'")
        q.add_argument("--python", help="the interpreter that runs llama-vq-server (default: this one)")
        q.add_argument("--request-timeout", type=float, default=600.0, help="seconds a request may take: failed")
    t = sub.choices["throughput"]
    t.add_argument("--clients", default="1,2,4,8")
    t.add_argument("--requests", type=int, default=3, help="per client")
    t.add_argument("--max-tokens", type=int, default=64)
    t.add_argument("--ctx", type=int, default=4096)
    t.add_argument(
        "--context-words",
        type=int,
        default=0,
        help="a long history of N words of its own before each client's prompts (--ctx must hold them)",
    )
    t.add_argument("--spy-clients", type=int, default=0, help="py-spy our server during this round (PATH or PY_SPY)")
    t.add_argument("--spy-seconds", type=int, default=6)
    t.add_argument("--only-llama-server", action="store_true", help="llama-server alone (needs --llama-server)")
    t.add_argument("--label", default="", help="the rows' name in `summary` (default: the server)")
    t.add_argument("--rounds", type=int, default=1, help="rounds of every client count on every server (medians)")
    t.add_argument("--wait-quiet", type=float, default=0, metavar="S",
                   help="a shared machine: before each client count of a round, wait up to S s for the other "
                   "processes to use at most 3 %% of the CPUs (the rows still record what they used)")
    m = sub.add_parser("summary", help="medians over several throughput runs")
    m.add_argument("files", nargs="+", type=Path, help="throughput.json files (one per run) or matrix.json files")
    m.add_argument("--ratio-clients", type=int, default=4)
    la = sub.choices["latency"]
    la.add_argument("--rounds", type=int, default=3)
    la.add_argument("--requests", type=int, default=10, help="streamed 2-token completions per server and round")
    la.add_argument("--ctx", type=int, default=2048)
    a = sub.choices["agent"]
    a.add_argument("--state-dir", type=Path, default=Path("serve-bench-state"))
    a.add_argument("--turns", type=int, default=20)
    a.add_argument("--restart-at", type=int, default=11, help="restart the server before this turn (0: never)")
    a.add_argument("--think-tokens", type=int, default=300)
    a.add_argument("--parallel", type=int, default=4)
    a.add_argument("--ctx", type=int, default=16384)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "build":
        res = cmd_build(args)
        print(json.dumps(res))
        return 0
    if args.cmd == "summary":
        runs: list[dict[str, Any]] = []
        for f in args.files:  # a throughput.json, or a list of them in one file
            d = json.loads(f.read_text())
            runs += d if isinstance(d, list) else [d]
        print(summary(runs, args.ratio_clients))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    global REQUEST_TIMEOUT
    REQUEST_TIMEOUT = args.request_timeout
    res = {
        "command": shlex.join(sys.argv),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": os.uname().nodename,
        "cpus": os.cpu_count(),
    }
    run = {"throughput": cmd_throughput, "agent": cmd_agent, "latency": cmd_latency}[args.cmd]
    res.update(run(args))
    (args.out / f"{args.cmd}.json").write_text(json.dumps(res, indent=1))
    (args.out / f"{args.cmd}.md").write_text(markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
