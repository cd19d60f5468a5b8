"""Where a generation is inside its reasoning block: a lazy grammar is gated on it (pure, no llama_cpp).

llama-server (common/sampling + common/reasoning-budget at our pin) neither applies nor feeds a lazy
grammar while a reasoning block is open: a tool-call trigger inside the reasoning cannot fire, and the
trigger patterns, which rescan all text fed so far at every token, never see the reasoning. When the
block closes, the tokens that carry the end tag are replayed into the grammar (a trigger may start
there), then every token is fed again. A new start tag reopens the block.

The watch reads the generated text with special tokens rendered (``<think>`` is often one token).
"""

from __future__ import annotations

from .request import Reasoning

_SLACK = 256  # bytes kept inside a block beyond the longest end tag (bounded memory per slot)


class ReasoningWatch:
    def __init__(self, r: Reasoning) -> None:
        self.start = r.start.encode()
        self.ends = tuple(e.encode() for e in r.ends if e)
        self.inside = r.open_at_start and bool(self.ends)
        self.buf = b""  # outside: the last bytes (a start tag may span tokens); inside: the block's tail
        self.toks: list[tuple[int, int]] = []  # inside: (token, offset of its text in buf)
        self._keep = max((len(e) for e in self.ends), default=0) + _SLACK

    def push(self, token: int, piece: bytes) -> tuple[int, ...]:
        """Account for a generated token; returns the tokens to feed the grammar now (the ones carrying
        an end tag that has just closed the block), else ()."""
        if not self.inside:
            text = self.buf + piece
            at = text.find(self.start) if self.start and self.ends else -1
            if at < 0:
                self.buf = text[-(len(self.start) - 1) :] if len(self.start) > 1 else b""
                return ()
            self.inside, self.buf, self.toks = True, text[at + len(self.start) :], [(token, 0)]
            return self._closed()
        self.toks.append((token, len(self.buf)))
        self.buf += piece
        return self._closed()

    def _closed(self) -> tuple[int, ...]:
        found = [(at, e) for e in self.ends if (at := self.buf.find(e)) >= 0]
        if not found:
            self._trim()
            return ()
        at, end = min(found)
        first = max((i for i, (_, off) in enumerate(self.toks) if off <= at), default=0)
        replay = tuple(t for t, _ in self.toks[first:])
        after = self.buf[at + len(end) :]
        self.inside, self.toks = False, []
        self.buf = after[-(len(self.start) - 1) :] if len(self.start) > 1 else b""
        return replay

    def _trim(self) -> None:
        cut = len(self.buf) - self._keep
        if cut <= self._keep:
            return
        self.buf = self.buf[cut:]
        offs = [off - cut for _, off in self.toks]
        ends = offs[1:] + [len(self.buf)]
        self.toks = [(t, o) for (t, _), o, e in zip(self.toks, offs, ends, strict=True) if e > 0]
