"""The throughput prompts of serve_bench.py, shared with the in-process engine benchmarks (engine_stall.py,
engine_profile.py, state_read_check.py, which run where httpx is not installed): the same prompts meet the same
cache layout. Also those benchmarks' common command line."""

import argparse
from pathlib import Path

PROMPTS = [
    "Once upon a time, in a small village by the sea, there lived",
    "The history of the printing press begins in the fifteenth century, when",
    "Here is a recipe for a simple tomato soup. First,",
    "The three laws of thermodynamics can be explained simply:",
    "In the year 2150, the first colony on Mars",
    "A short guide to learning the piano as an adult:",
    "The old lighthouse keeper looked out at the storm and",
    "def quicksort(items):\n    ",
]


def client_context(client: int, words: int) -> str:
    """A long history of its own for one client (``words`` words, ~1.5 tokens each with SmolLM2's tokenizer; "" for
    0), put before each of its prompts by serve_bench.py's --context-words: every request of a client then shares a
    long prefix (its earlier turns, as a chat's), and the clients' sequences are long and distinct."""
    out: list[str] = []
    i = 0
    while len(out) < words:
        out += f"Record {client}-{i}: item {i} of ledger {client} holds {(i * 37 + client * 11) % 1000} units.".split()
        i += 1
    return " ".join(out[:words]) + "\n\n" if words > 0 else ""


def round_prompts(tokenize, clients: int, requests: int) -> list[list[list[int]]]:
    """Token prompts of one client round of engine_stall.py / engine_profile.py: per client, ``requests`` prompts,
    each one of PROMPTS with the client and request numbers appended (no two alike)."""
    return [
        [tokenize(PROMPTS[(c * requests + i) % len(PROMPTS)] + f" ({c}.{i})") for i in range(requests)]
        for c in range(clients)
    ]


def engine_arg_parser(doc: str, clients: str = "1,2,4,8", requests: bool = True) -> argparse.ArgumentParser:
    """MODEL, --flags (the server's), --clients, [--requests,] --max-tokens: what every in-process bench takes."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--flags", default="-c 4096 -np 8 -ctk q8_0 -ctv q4_0 -fa off")
    ap.add_argument("--clients", default=clients)
    if requests:
        ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    return ap
