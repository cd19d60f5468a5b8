"""The code-editing replay of benchmarks/spec_replay.py: a code file and edits whose answer is the whole file again.

Every task asks for the complete edited file, so most of the answer copies the prompt: the case n-gram
self-speculation (``--spec-type ngram-*``) drafts well. The file is fixed here (not read from the repo) so that
runs stay comparable across commits.
"""

from __future__ import annotations

CODE = '''\
import time
from collections import OrderedDict


class LRUCache:
    """A least-recently-used cache with an optional time-to-live per entry."""

    def __init__(self, capacity=128, ttl=None):
        self.capacity = capacity
        self.ttl = ttl
        self._data = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key, default=None):
        item = self._data.get(key)
        if item is None:
            self.misses += 1
            return default
        value, stamp = item
        if self.ttl is not None and time.monotonic() - stamp > self.ttl:
            del self._data[key]
            self.misses += 1
            return default
        self._data.move_to_end(key)
        self.hits += 1
        return value

    def put(self, key, value):
        self._data[key] = (value, time.monotonic())
        self._data.move_to_end(key)
        while len(self._data) > self.capacity:
            self._data.popitem(last=False)

    def stats(self):
        total = self.hits + self.misses
        ratio = self.hits / total if total else 0.0
        return "hits=%d misses=%d ratio=%.2f" % (self.hits, self.misses, ratio)


def parse_line(line):
    key, _, value = line.partition("=")
    return key.strip(), value.strip()


def load_config(path, cache):
    with open(path) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                key, value = parse_line(line)
                cache.put(key, value)
    return cache
'''

SYSTEM = "You are a careful coding assistant. You edit code exactly as asked and change nothing else."

_ASK = "Reply with the complete updated file in one ```python code block and nothing else.\n\n```python\n{code}```"

EDITS = [
    "Rename the class `LRUCache` to `BoundedCache`.",
    "Change the default capacity from 128 to 256.",
    "Make `stats` use an f-string instead of % formatting.",
    "Add type hints to `parse_line` (it takes a str and returns a tuple of two str).",
    "Rename the method `put` to `set`.",
    "In `load_config`, also skip lines that start with `;`.",
]


def messages(edit: str, code: str = CODE) -> list[dict[str, str]]:
    """The chat of one task: the system prompt, then the edit and the file."""
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": edit + " " + _ASK.format(code=code)},
    ]
