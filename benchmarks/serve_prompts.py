"""The throughput prompts of serve_bench.py, shared with engine_stall.py (which runs where httpx is not
installed): the same prompts meet the same cache layout."""

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


def round_prompts(tokenize, clients: int, requests: int) -> list[list[list[int]]]:
    """Token prompts of one client round of engine_stall.py / engine_profile.py: per client, ``requests`` prompts,
    each one of PROMPTS with the client and request numbers appended (no two alike)."""
    return [[tokenize(PROMPTS[(c * requests + i) % len(PROMPTS)] + f" ({c}.{i})") for i in range(requests)]
            for c in range(clients)]
