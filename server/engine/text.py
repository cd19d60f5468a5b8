"""The text side of generation (pure Python): incremental UTF-8 decoding of token pieces, with stop
strings never emitted and held back while partly matched at the end of the text."""

from __future__ import annotations

import codecs


class TextStream:
    """Generated tokens -> text pieces, never emitting a stop string nor the start of one.

    ``push(token, piece)`` returns (text to emit, token ids it covers, stop word or None).
    ``flush()`` returns what is held back at the end (a partial stop match that never completed).
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._dec = codecs.getincrementaldecoder("utf-8")("replace")
        self._pending = ""
        self._ids: list[int] = []

    def push(self, token: int, piece: bytes) -> tuple[str, tuple[int, ...], str | None]:
        self._ids.append(token)
        self._pending += self._dec.decode(piece)
        for stop in self.stops:  # the earliest complete stop string ends the text
            i = self._pending.find(stop)
            if i >= 0:
                text, ids = self._pending[:i], tuple(self._ids)
                self._pending, self._ids = "", []
                return text, ids, stop
        hold = self._partial_len()
        cut = len(self._pending) - hold
        if cut <= 0:
            return "", (), None
        text, self._pending = self._pending[:cut], self._pending[cut:]
        ids, self._ids = tuple(self._ids), []
        return text, ids, None

    def _partial_len(self) -> int:
        """Length of the longest suffix of the pending text that starts some stop string."""
        best = 0
        p = self._pending
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(p)), best, -1):
                if p.endswith(stop[:k]):
                    best = k
                    break
        return best

    def flush(self) -> tuple[str, tuple[int, ...]]:
        text = self._pending + self._dec.decode(b"", final=True)
        ids = tuple(self._ids)
        self._pending, self._ids = "", []
        return text, ids
