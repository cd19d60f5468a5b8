"""The probe matrix: what llama-vq-server and llama-server (built from the same tree, same flags) answer
to a careless or hostile client. One server per run; `report` prints the two runs side by side.

    python benchmarks/server_probe.py run --server ours > ours.json
    python benchmarks/server_probe.py run --server /path/to/llama-server > llama-server.json
    python benchmarks/server_probe.py report ours.json llama-server.json

Flags of both: SmolLM2 (the embedded model), -c 2048 -np 4 -ctk q8_0 -ctv q4_0 -fa off -t 1, --slots, --metrics,
--ignore-eos (every generation runs to its max_tokens), an API key, --slot-save-path. The SIGTERM probe runs last
(it stops the server).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_process import free_port  # noqa: E402

KEY = "probe-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
FLAGS = ["-c", "2048", "-np", "4", "-ctk", "q8_0", "-ctv", "q4_0", "-fa", "off", "-t", "1", "--slots", "--metrics",
         "--ignore-eos", "--api-key", KEY]
CHAT = [{"role": "user", "content": "Count from one to one thousand."}]
CLIENT_ERRORS = {  # class -> [(path, raw body)]
    "parse": [("/v1/chat/completions", b'{"messages": [{"role": "user", "cont'), ("/v1/chat/completions", b""),
              ("/tokenize", b'{"content": "\xff\xfe"}'), ("/tokenize", b'{"content": "\\ud800"}'),
              ("/completion", b'{"prompt": "x", "temperature": 1e999}')],
    "type": [("/detokenize", b'{"tokens": ["a", 5]}'),
             ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "Hi"}], "reasoning_format": 5}')],
    "missing field": [("/v1/chat/completions", b'{"messages": [{"content": "Hi"}]}'),
                      ("/v1/messages", b'{"max_tokens": 2}'), ("/slots/0?action=restore", b"{}")],
    "unsupported content": [("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}).encode())],
    "unknown slot id": [("/slots/999?action=save", b'{"filename": "x.bin"}')],
    "token out of range": [("/detokenize", b'{"tokens": [999999999]}')],
}


def _p(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


def probe_health_under_load(url: str, n: int, stream: bool) -> dict:
    body = {"messages": CHAT, "max_tokens": 32, "ignore_eos": True, "stream": stream}

    def one(_: int) -> int:
        with httpx.Client(timeout=600, headers=AUTH) as c, c.stream("POST", url + "/v1/chat/completions",
                                                                    json=body) as r:
            r.read()
            return r.status_code

    times: list[float] = []
    with cf.ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(one, i) for i in range(n)]
        time.sleep(2.0)  # the requests reach the server
        with httpx.Client(timeout=60) as c:
            while sum(f.done() for f in futures) < n // 2:
                t0 = time.perf_counter()
                c.get(url + "/health")
                times.append(time.perf_counter() - t0)
                time.sleep(0.05)
        ok = sum(f.result() == 200 for f in futures)
    return {"n": n, "stream": stream, "probes": len(times), "p50_ms": statistics.median(times) * 1e3,
            "p99_ms": _p(times, 0.99) * 1e3, "max_ms": max(times) * 1e3, "ok": ok}


def probe_disconnect(url: str, stream: bool) -> dict:
    """4 clients ask 400 tokens with ignore_eos and give up after 1.5 s: how long the slots stay busy after."""
    body = {"messages": CHAT, "max_tokens": 400, "ignore_eos": True, "stream": stream}

    def one(_: int) -> None:
        try:
            with httpx.Client(timeout=1.5, headers=AUTH) as c, c.stream("POST", url + "/v1/chat/completions",
                                                                        json=body) as r:
                for _line in r.iter_lines():
                    pass
        except httpx.HTTPError:
            pass

    with cf.ThreadPoolExecutor(4) as pool:
        list(pool.map(one, range(4)))
    t_gone = time.monotonic()
    while any(s["is_processing"] for s in httpx.get(url + "/slots", headers=AUTH, timeout=60).json()):
        time.sleep(0.02)
    return {"stream": stream, "busy_after_s": time.monotonic() - t_gone}


def probe_client_errors(url: str) -> dict:
    out = {}
    for cls, cases in CLIENT_ERRORS.items():
        out[cls] = [httpx.post(url + path, content=raw, headers={**AUTH, "content-type": "application/json"},
                               timeout=60).status_code for path, raw in cases]
    return out


def probe_http(url: str) -> dict:
    form = b'--b\r\nContent-Disposition: form-data; name="prompt"\r\n\r\nHi\r\n--b--\r\n'
    mp = {**AUTH, "content-type": "multipart/form-data; boundary=b"}
    wav = {"file": ("a.wav", b"RIFF0000WAVE", "audio/wav")}
    return {
        "multipart /completion": httpx.post(url + "/completion", content=form, headers=mp, timeout=60).status_code,
        "multipart audio": httpx.post(url + "/v1/audio/transcriptions", files=wav, headers=AUTH,
                                      timeout=60).status_code,
        "/openapi.json without key": httpx.get(url + "/openapi.json", timeout=10).status_code,
        "duplicate Authorization, valid first": httpx.get(url + "/v1/models", headers=[
            ("Authorization", f"Bearer {KEY}"), ("Authorization", "Bearer nope")], timeout=10).status_code,
        "duplicate Authorization, valid last": httpx.get(url + "/v1/models", headers=[
            ("Authorization", "Bearer nope"), ("Authorization", f"Bearer {KEY}")], timeout=10).status_code,
        "HEAD /health": httpx.head(url + "/health", timeout=10).status_code,
        "OPTIONS /health, no Origin": httpx.request("OPTIONS", url + "/health", timeout=10).status_code,
    }


def probe_sigterm(proc: subprocess.Popen, url: str, log: Path) -> dict:
    """Two streams open (OpenAI chat, Anthropic messages), SIGTERM: how each stream ends, the exit, the log."""
    streams = {"openai": ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 1500, "ignore_eos": True,
                                                   "stream": True}),
               "anthropic": ("/v1/messages", {"messages": CHAT, "max_tokens": 1500, "stream": True})}

    def read(path: str, body: dict) -> str:
        lines = []
        try:
            with httpx.Client(timeout=60, headers=AUTH) as c, c.stream("POST", url + path, json=body) as r:
                for line in r.iter_lines():
                    lines.append(line)
        except httpx.HTTPError as e:
            return f"cut ({type(e).__name__}) after {len(lines)} lines"
        last = [ln for ln in lines if ln.startswith(("data:", "event:"))][-2:]
        return "whole body, ends " + " | ".join(ln[:60] for ln in last)

    with cf.ThreadPoolExecutor(2) as pool:
        futures = {k: pool.submit(read, *v) for k, v in streams.items()}
        time.sleep(3.0)  # both streams under way
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        ends = {k: f.result() for k, f in futures.items()}
        rc = proc.wait(timeout=60)
    text = log.read_text(errors="replace")
    return {"exit_s": time.monotonic() - t0, "rc": rc, "streams": ends, "tracebacks": text.count("Traceback")}


def run(server: str, model: str) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    work = Path(tempfile.mkdtemp(prefix="probe-"))
    cmd = ([sys.executable, "-m", "llama_vq.server.cli"] if server == "ours" else [server])
    cmd += ["-m", model, "--port", str(port), *FLAGS, "--slot-save-path", str(work) + "/"]
    log = work / "server.log"
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=work)
    try:
        end = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < end, log.read_text()[-2000:]
            time.sleep(0.1)
        shown = ["python", *cmd[1:]] if server == "ours" else cmd
        out = {"server": server, "command": " ".join(shown)}
        out["health_under_load"] = [probe_health_under_load(url, 72, False), probe_health_under_load(url, 72, True)]
        out["disconnect"] = [probe_disconnect(url, False), probe_disconnect(url, True)]
        out["client_errors"] = probe_client_errors(url)
        out["http"] = probe_http(url)
        out["sigterm"] = probe_sigterm(proc, url, log)
        return out
    finally:
        if proc.poll() is None:
            proc.kill()


def report(a: dict, b: dict) -> str:
    rows = [("probe", "llama-vq-server", "llama-server")]
    for i, what in enumerate(("72 non-streamed", "72 streams")):
        x, y = a["health_under_load"][i], b["health_under_load"][i]
        rows.append((f"/health with {what} (p50 / p99 / max ms)",
                     *(f"{h['p50_ms']:.1f} / {h['p99_ms']:.1f} / {h['max_ms']:.0f}" for h in (x, y))))
    for i, what in enumerate(("non-streamed", "streamed")):
        rows.append((f"slots busy after 4 {what} clients left (s)",
                     *(f"{r['disconnect'][i]['busy_after_s']:.2f}" for r in (a, b))))
    for cls in a["client_errors"]:
        rows.append((f"client error: {cls}", *(" ".join(map(str, r["client_errors"][cls])) for r in (a, b))))
    for k in a["http"]:
        rows.append((k, str(a["http"][k]), str(b["http"][k])))
    for r in (a, b):
        r["sigterm"]["summary"] = f"exit {r['sigterm']['rc']} in {r['sigterm']['exit_s']:.1f} s, " \
                                  f"{r['sigterm']['tracebacks']} tracebacks"
    rows.append(("SIGTERM with 2 streams open", a["sigterm"]["summary"], b["sigterm"]["summary"]))
    for k in a["sigterm"]["streams"]:
        rows.append((f"SIGTERM: the {k} stream", a["sigterm"]["streams"][k], b["sigterm"]["streams"][k]))
    return "\n".join("| " + " | ".join(r) + " |" + ("\n|---|---|---|" if i == 0 else "") for i, r in enumerate(rows))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--server", required=True, help="'ours' or a llama-server binary")
    r.add_argument("--model", default=None)
    p = sub.add_parser("report")
    p.add_argument("ours", type=Path)
    p.add_argument("theirs", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "run":
        if args.model is None:
            import llama_vq

            args.model = str(llama_vq.default_model_path())
        print(json.dumps(run(args.server, args.model), indent=1))
    else:
        print(report(json.loads(args.ours.read_text()), json.loads(args.theirs.read_text())))
    return 0


if __name__ == "__main__":
    os.environ.pop("LLAMA_API_KEY", None)
    raise SystemExit(main())
