#!/usr/bin/env python3
"""Code-editing replay for n-gram self-speculation: how much faster greedy decoding gets when the answer copies
the prompt.

    python benchmarks/spec_replay.py replay --url http://127.0.0.1:8080 [--tasks 6] [--max-tokens 1024]
    python benchmarks/spec_replay.py compare --server "llama-vq-server" --model M.gguf \\
        [--spec "--spec-type ngram-simple --spec-draft-n-max 64"] [--extra "-t 2 -c 4096"] [--out DIR]

replay: sends the tasks of benchmarks/spec_prompts.py (a code file and an edit; the answer is the whole edited
file) one after another to BASE/v1/chat/completions, greedy (temperature 0), not streamed. Reports per task and
in total: completion tokens / wall time of the request, the server's own ``timings`` where it sends them
(predicted_per_second, draft_n, draft_n_accepted) and the acceptance rate draft_n_accepted / draft_n.

compare: starts the server command twice, one after the other, with the same flags (the model, a free port,
--extra), the second time with --spec added; replays against each and prints the two side by side with the
ratio speculative / plain, and whether the answers are the same text. The server command is split like a shell
would (``--server "llama-vq-server"``, ``--server /path/to/llama-server``, ``--server "python -m server.cli"``):
it must take llama-server's ``--model``, ``--host`` and ``--port``. Writes results.json into --out.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_process import free_port, wait_healthy  # noqa: E402
from spec_prompts import EDITS, messages  # noqa: E402

DEFAULT_SPEC = "--spec-type ngram-simple --spec-draft-n-max 64"

# ---- one replay ----------------------------------------------------------------------------------------------


def chat(client: httpx.Client, url: str, msgs: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    """One greedy, non-streamed chat completion; its answer, token count, wall time and server timings."""
    body = {"messages": msgs, "temperature": 0.0, "max_tokens": max_tokens, "seed": 0, "stream": False}
    t0 = time.perf_counter()
    r = client.post(url.rstrip("/") + "/v1/chat/completions", json=body)
    wall = time.perf_counter() - t0
    r.raise_for_status()
    data = r.json()
    text = data["choices"][0]["message"].get("content") or ""
    return {
        "completion_tokens": int(data.get("usage", {}).get("completion_tokens", 0)),
        "wall_s": wall,
        "timings": data.get("timings") or {},
        "finish_reason": data["choices"][0].get("finish_reason"),
        "text": text,
    }


def summarize(tasks: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals over a replay: tok/s by wall time and by the server's timings, drafted and accepted tokens."""
    toks = sum(t["completion_tokens"] for t in tasks)
    wall = sum(t["wall_s"] for t in tasks)
    out: dict[str, Any] = {"completion_tokens": toks, "wall_s": wall, "tok_s": toks / wall if wall else 0.0}
    timed = [t["timings"] for t in tasks if t["timings"].get("predicted_ms")]
    if timed:
        n = sum(x.get("predicted_n", 0) for x in timed)
        ms = sum(x["predicted_ms"] for x in timed)
        out["predicted_per_second"] = 1000.0 * n / ms if ms else 0.0
    if any("draft_n" in t["timings"] for t in tasks):
        drafted = sum(t["timings"].get("draft_n", 0) for t in tasks)
        accepted = sum(t["timings"].get("draft_n_accepted", 0) for t in tasks)
        out.update(draft_n=drafted, draft_n_accepted=accepted, acceptance=accepted / drafted if drafted else 0.0)
    return out


def replay(url: str, n_tasks: int, max_tokens: int, api_key: str | None = None, log=print) -> dict[str, Any]:
    """Run the first ``n_tasks`` edits against ``url``; per-task results and their summary."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    tasks = []
    with httpx.Client(timeout=1800, headers=headers) as client:
        chat(client, url, [{"role": "user", "content": "Say OK."}], 4)  # warm-up, not counted
        for edit in EDITS[:n_tasks]:
            res = chat(client, url, messages(edit), max_tokens)
            res["edit"] = edit
            res["text_sha256"] = hashlib.sha256(res["text"].encode()).hexdigest()
            tasks.append(res)
            tm = res["timings"]
            drafted = f" draft {tm.get('draft_n_accepted', 0)}/{tm['draft_n']}" if "draft_n" in tm else ""
            log(
                f"  {res['completion_tokens']:5d} tok {res['wall_s']:7.2f} s "
                f"{res['completion_tokens'] / res['wall_s']:7.1f} tok/s{drafted}  {edit[:48]}"
            )
    return {"url": url, "max_tokens": max_tokens, "tasks": tasks, "summary": summarize(tasks)}


# ---- two servers, one after the other -----------------------------------------------------------------------


class Server:
    """``server_cmd --model M --host 127.0.0.1 --port P [flags]``, ready once GET /health answers 200."""

    def __init__(self, server_cmd: list[str], model: str, flags: list[str], log: Path, ready_s: float = 600) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [*server_cmd, "--model", model, "--host", "127.0.0.1", "--port", str(self.port), *flags]
        self._log = log.open("ab")
        self._log.write(f"$ {shlex.join(self.cmd)}\n".encode())
        self._log.flush()
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(self.proc, self.url, ready_s, f"see {log}")
        except (RuntimeError, TimeoutError):
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def side_by_side(base: dict[str, Any], spec: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The comparison table (text) and its figures: spec / base ratios and answers that agree."""
    b, s = base["summary"], spec["summary"]
    same = sum(x["text_sha256"] == y["text_sha256"] for x, y in zip(base["tasks"], spec["tasks"], strict=True))
    ratio = {"tok_s": s["tok_s"] / b["tok_s"] if b["tok_s"] else 0.0}
    if b.get("predicted_per_second") and s.get("predicted_per_second"):
        ratio["predicted_per_second"] = s["predicted_per_second"] / b["predicted_per_second"]
    rows = [("", "plain", "speculative", "ratio")]
    rows.append(("tok/s (wall)", f"{b['tok_s']:.1f}", f"{s['tok_s']:.1f}", f"{ratio['tok_s']:.2f}x"))
    if "predicted_per_second" in ratio:
        rows.append(
            (
                "tok/s (server timings)",
                f"{b['predicted_per_second']:.1f}",
                f"{s['predicted_per_second']:.1f}",
                f"{ratio['predicted_per_second']:.2f}x",
            )
        )
    rows.append(("completion tokens", str(b["completion_tokens"]), str(s["completion_tokens"]), ""))
    if "draft_n" in s:
        rows.append(("drafted / accepted", "", f"{s['draft_n']} / {s['draft_n_accepted']}", ""))
        rows.append(("acceptance", "", f"{s['acceptance']:.1%}", ""))
    else:
        rows.append(("drafted / accepted", "", "(no draft_n in timings)", ""))
    rows.append(("same answer", "", f"{same}/{len(base['tasks'])} tasks", ""))
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    text = "\n".join("  ".join(c.ljust(w[i]) for i, c in enumerate(r)).rstrip() for r in rows)
    return text, {"ratio": ratio, "same_answers": same, "tasks": len(base["tasks"])}


def cmd_compare(a: argparse.Namespace) -> int:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    server_cmd, extra, spec_flags = shlex.split(a.server), shlex.split(a.extra), shlex.split(a.spec)
    runs: dict[str, Any] = {}
    for name, flags in (("plain", extra), ("speculative", [*extra, *spec_flags])):
        print(f"[{name}] {shlex.join([*server_cmd, *flags])}")
        srv = Server(server_cmd, a.model, flags, out / f"server-{name}.log")
        try:
            runs[name] = replay(srv.url, a.tasks, a.max_tokens, a.api_key)
        finally:
            srv.stop()
        runs[name]["flags"] = flags
    table, figures = side_by_side(runs["plain"], runs["speculative"])
    print(table)
    result = {"server": server_cmd, "model": a.model, "extra": extra, "spec": spec_flags, **figures, "runs": runs}
    (out / "results.json").write_text(json.dumps(result, indent=1))
    print(f"[out] {out / 'results.json'}")
    return 0


def cmd_replay(a: argparse.Namespace) -> int:
    res = replay(a.url, a.tasks, a.max_tokens, a.api_key)
    s = res["summary"]
    line = f"total {s['completion_tokens']} tok in {s['wall_s']:.2f} s: {s['tok_s']:.1f} tok/s (wall)"
    if "predicted_per_second" in s:
        line += f", {s['predicted_per_second']:.1f} tok/s (server)"
    if "draft_n" in s:
        line += f", drafted {s['draft_n']}, accepted {s['draft_n_accepted']} ({s['acceptance']:.1%})"
    print(line)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("replay", help="replay the tasks against a running server")
    r.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8080")
    r.add_argument("--json", help="write the per-task results here")
    c = sub.add_parser("compare", help="start the server without and with speculation, replay against each")
    c.add_argument("--server", required=True, help='server command, e.g. "llama-vq-server" or a llama-server path')
    c.add_argument("--model", required=True)
    c.add_argument("--spec", default=DEFAULT_SPEC, help=f"flags of the speculative run (default: {DEFAULT_SPEC})")
    c.add_argument("--extra", default="", help="flags of both runs, e.g. '-t 2 -c 4096 -ctv q4_0 -fa off'")
    c.add_argument("--out", default="benchmarks/out/spec_replay")
    for p in (r, c):
        p.add_argument("--tasks", type=int, default=len(EDITS), help=f"how many edits to send (max {len(EDITS)})")
        p.add_argument("--max-tokens", type=int, default=1024)
        p.add_argument("--api-key")
    a = ap.parse_args(argv)
    return cmd_replay(a) if a.cmd == "replay" else cmd_compare(a)


if __name__ == "__main__":
    sys.exit(main())
