"""What a streaming client sees from llama-vq-server: time to the SSE headers, to the first keepalive,
to the first content; and the cost of a forced tool call (grammar) against free text.

    python benchmarks/serving_latency.py [--model PATH] [--prompt-words N] [server flags ...]

Starts a server on a free 127.0.0.1 port (default: the embedded SmolLM2-135M), prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}}}]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stream(url: str, body: dict) -> dict:
    t0 = time.monotonic()
    out: dict = {"keepalives": 0}
    with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}, timeout=600) as r:
        out["headers_s"] = time.monotonic() - t0
        for line in r.iter_lines():
            now = time.monotonic() - t0
            if line == ": keepalive":
                out["keepalives"] += 1
                out.setdefault("first_keepalive_s", now)
            elif line.startswith("data: {") and '"content": "' in line and '"content": ""' not in line:
                out.setdefault("first_content_s", now)
    out["total_s"] = time.monotonic() - t0
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model")
    p.add_argument("--prompt-words", type=int, default=600)
    args, flags = p.parse_known_args()
    if args.model is None:
        import llama_vq

        args.model = str(llama_vq.default_model_path())
    port = _port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "-m", args.model, "--port", str(port), *flags],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=Path(__file__).parent)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        words = " ".join(["word"] * args.prompt_words)
        long = _stream(url, {"messages": [{"role": "user", "content": words}], "max_tokens": 4})
        ask = [{"role": "user", "content": "Weather in Paris?"}]
        t0 = time.monotonic()
        tool = httpx.post(url + "/v1/chat/completions", timeout=600, json={
            "messages": ask, "tools": TOOLS, "tool_choice": "required", "max_tokens": 64, "temperature": 0}).json()
        tool_s = time.monotonic() - t0
        t0 = time.monotonic()
        free = httpx.post(url + "/v1/chat/completions", timeout=600, json={
            "messages": ask, "max_tokens": 64, "temperature": 0}).json()
        free_s = time.monotonic() - t0
        print(json.dumps({
            "long_prompt_stream": {k: round(v, 3) if isinstance(v, float) else v for k, v in long.items()},
            "tool_required": {"s": round(tool_s, 3), "completion_tokens": tool["usage"]["completion_tokens"],
                              "finish_reason": tool["choices"][0]["finish_reason"]},
            "free_text": {"s": round(free_s, 3), "completion_tokens": free["usage"]["completion_tokens"]},
            "flags": flags,
        }))
    finally:
        proc.terminate()
        proc.wait(60)


if __name__ == "__main__":
    main()
