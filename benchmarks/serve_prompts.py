"""The throughput prompts of serve_bench.py, and the long per-client history of its --context-words."""

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
