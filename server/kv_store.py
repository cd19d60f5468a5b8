"""KV state files on disk: format, index by token prefix, LRU eviction under a byte budget.

Why not llama_cpp.LlamaDiskCache: it pickles (unpickling a corrupt or foreign file can crash or run
code), keys states by tokens only (a state of another model or cache type would be loaded), pops an
entry on read, evicts in insertion order, and its LlamaState carries the full logits array
(n_batch x n_vocab floats, ~100 MB for a 50K vocabulary) next to the KV cache. We reuse llama.cpp's
own per-sequence state serialization (llama_state_seq_get_data / set_data, called by the engine) and
keep only the file handling here. No model access in this module.

File layout (little endian)::

    MAGIC (16 bytes) | u32 header length | header JSON | n_tokens x int32 | payload

The header holds the identity (model fingerprint, cache types, flash attention, llama.cpp build and
patches), token count, payload length and sha256 of tokens and payload, and ``meta`` (format 2: how the
engine splits the payload: the sequence state, its oldest cached position, and the SWA checkpoints
that follow it). A file whose magic, header, identity, length or checksums do not match is skipped
with a warning and never loaded.

Writes go to ``.<name>.<pid>.tmp`` and are renamed into place, so a file is complete or absent; the
temporary files of a process that died mid-write (SIGKILL) are deleted when the store opens.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("llama_vq.server.kv_store")

MAGIC = b"LLAMA-VQ-KVSTATE"
FORMAT = 2
SUFFIX = ".kvstate"
_HEADER_MAX = 1 << 20


class StateFileError(Exception):
    """A state file that must not be loaded; the message says why."""


@dataclass
class Entry:
    path: Path
    tokens: np.ndarray  # int32
    size: int
    last_used: float
    meta: dict[str, Any] = field(default_factory=dict)


def fingerprint_model(path: Path, extra: str = "") -> str:
    """Cheap identity of a GGUF file: size + first and last MiB (metadata and the last tensor)."""
    h = hashlib.sha256()
    size = path.stat().st_size
    h.update(str(size).encode())
    with path.open("rb") as f:
        h.update(f.read(1 << 20))
        if size > 2 << 20:
            f.seek(size - (1 << 20))
            h.update(f.read(1 << 20))
    h.update(extra.encode())
    return h.hexdigest()


def cache_types_identity(
    type_k: str, type_v: str, type_k_swa: str | None = None, type_v_swa: str | None = None
) -> dict[str, str]:
    """The cache-type keys of a state file's identity.

    The sliding-window layers' types of an iSWA model are recorded (``type_k_swa``/``type_v_swa``)
    whenever they differ from the full layers' (both, even if only one differs); when they are the
    same, type_k/type_v describe every layer and the keys are left out, so that files written before
    per-layer types existed keep matching.
    """
    ident = {"type_k": type_k, "type_v": type_v}
    k_swa = type_k if type_k_swa is None else type_k_swa
    v_swa = type_v if type_v_swa is None else type_v_swa
    if (k_swa, v_swa) != (type_k, type_v):
        ident["type_k_swa"] = k_swa
        ident["type_v_swa"] = v_swa
    return ident


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def _file_name(identity_hash: str, tokens: np.ndarray) -> str:
    h = hashlib.sha256(identity_hash.encode())
    h.update(tokens.astype("<i4").tobytes())
    return h.hexdigest()[:40] + SUFFIX


def _canonical(identity: dict[str, Any]) -> str:
    return json.dumps(identity, sort_keys=True, separators=(",", ":"))


def encode(
    identity: dict[str, Any],
    tokens: np.ndarray,
    payload: bytes | memoryview,
    meta: dict[str, Any] | None = None,
) -> tuple[bytes, bytes | memoryview]:
    """(prefix, payload): the file is prefix + payload (kept apart to avoid copying the payload)."""
    tok = np.asarray(tokens, dtype="<i4").tobytes()
    header = {
        "format": FORMAT,
        "identity": identity,
        "n_tokens": len(tokens),
        "payload_bytes": len(payload),
        "tokens_sha256": hashlib.sha256(tok).hexdigest(),
        "payload_sha256": hashlib.sha256(payload).hexdigest(),
        "created": time.time(),
        "meta": meta or {},
    }
    hb = json.dumps(header, sort_keys=True).encode()
    return MAGIC + len(hb).to_bytes(4, "little") + hb + tok, payload


def read_header(path: Path, identity: dict[str, Any]) -> tuple[dict[str, Any], np.ndarray, int]:
    """Header, tokens and payload offset of a state file; StateFileError if it must be skipped."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            if f.read(len(MAGIC)) != MAGIC:
                raise StateFileError("not a llama-vq KV state file (bad magic)")
            hlen = int.from_bytes(f.read(4), "little")
            if not 0 < hlen <= _HEADER_MAX:
                raise StateFileError("corrupt header length")
            try:
                header = json.loads(f.read(hlen))
            except (ValueError, UnicodeDecodeError):
                raise StateFileError("corrupt header") from None
            if not isinstance(header, dict) or header.get("format") != FORMAT:
                raise StateFileError(
                    f"unknown format {header.get('format') if isinstance(header, dict) else '?'}"
                )
            if header.get("identity") != identity:
                raise StateFileError(
                    f"written for another model or configuration: {header.get('identity')}"
                )
            n = header["n_tokens"]
            payload_bytes = header["payload_bytes"]
            offset = len(MAGIC) + 4 + hlen + 4 * n
            if size != offset + payload_bytes:
                raise StateFileError(
                    f"truncated or padded: {size} bytes, header says {offset + payload_bytes}"
                )
            tok = f.read(4 * n)
            if hashlib.sha256(tok).hexdigest() != header["tokens_sha256"]:
                raise StateFileError("token checksum mismatch")
    except OSError as e:
        raise StateFileError(f"unreadable: {e}") from None
    except (KeyError, TypeError) as e:
        raise StateFileError(f"incomplete header: {e}") from None
    return header, np.frombuffer(tok, dtype="<i4").astype(np.int32), offset


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class KVStore:
    """An index of state files in one directory, for one identity; writes happen on a thread.

    ``on_event(kind, n)``: kind is "save", "reject" or "evict" (metrics hook).
    """

    def __init__(
        self,
        directory: Path,
        identity: dict[str, Any],
        budget_bytes: int,
        on_event: Callable[[str, int], None] | None = None,
    ) -> None:
        self.dir = directory
        self.identity = identity
        self.identity_hash = hashlib.sha256(_canonical(identity).encode()).hexdigest()
        self.budget = budget_bytes
        self._on_event = on_event or (lambda kind, n: None)
        self._lock = threading.Lock()
        self._entries: dict[Path, Entry] = {}
        self._writes: queue.Queue[tuple[Any, ...] | None] = queue.Queue()
        self._writer = threading.Thread(
            target=self._write_loop, name="kv-state-writer", daemon=True
        )
        self._scan()
        self._writer.start()

    # ---- index --------------------------------------------------------------------------------

    def _remove_stale_tmp(self) -> None:
        """Delete temporary files of writers that no longer run (a SIGKILL mid-write)."""
        for tmp in self.dir.glob("." + "*" + SUFFIX + ".*.tmp"):
            try:
                pid = int(tmp.name.rsplit(".", 2)[-2])
            except ValueError:
                continue
            if pid != os.getpid() and _alive(pid):
                continue  # another live server's write in progress
            try:
                tmp.unlink()
                log.info("removed %s, left by an interrupted write", tmp.name)
            except OSError as e:
                log.warning("could not remove stale %s: %s", tmp.name, e)

    def _scan(self) -> None:
        self._remove_stale_tmp()
        foreign = 0
        for path in sorted(self.dir.glob("*" + SUFFIX)):
            try:
                header, tokens, _ = read_header(path, self.identity)
            except StateFileError as e:
                if "another model" in str(e):
                    foreign += 1
                    continue
                log.warning("skipping KV state file %s: %s", path.name, e)
                self._on_event("reject", 1)
                continue
            st = path.stat()
            meta = header.get("meta")
            meta = meta if isinstance(meta, dict) else {}
            self._entries[path] = Entry(path, tokens, st.st_size, st.st_mtime, meta)
        if foreign:
            log.info(
                "%d KV state files in %s belong to another model or configuration: left alone",
                foreign,
                self.dir,
            )
        log.info(
            "KV state store %s: %d files, %.1f MiB for this model (budget %.1f MiB)",
            self.dir,
            len(self._entries),
            self.total_bytes / 2**20,
            self.budget / 2**20,
        )
        self._evict()

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return sum(e.size for e in self._entries.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def sizes(self) -> list[tuple[int, int]]:
        """(n_tokens, bytes) of every file, for reports."""
        with self._lock:
            return [(len(e.tokens), e.size) for e in self._entries.values()]

    def lookup(
        self,
        tokens: Sequence[int] | np.ndarray,
        *,
        better_than: int,
        prefix_only: bool = False,
        usable: Callable[[Entry, int], int] | None = None,
    ) -> tuple[Entry, int] | None:
        """The entry serving the longest prefix of ``tokens`` (longer than ``better_than``).

        prefix_only: the whole stored sequence must be a prefix of ``tokens``. usable(entry, n_common)
        -> how many of the shared tokens the entry can really give (sliding-window models: the window
        before the cut, or a checkpoint); the result's count is then that number.
        """
        want = np.asarray(tokens, dtype=np.int32)
        best: tuple[Entry, int] | None = None
        with self._lock:
            entries = list(self._entries.values())
        for e in entries:
            n = common_prefix(e.tokens, want)
            if prefix_only and n != len(e.tokens):
                continue
            if usable is not None:
                n = usable(e, n)
            if n > better_than and (best is None or n > best[1]):
                best = (e, n)
        return best

    def load(self, entry: Entry) -> bytearray:
        """The payload of an entry, verified; StateFileError (and the entry dropped) otherwise."""
        try:
            header, tokens, offset = read_header(entry.path, self.identity)
            if not np.array_equal(tokens, entry.tokens):
                raise StateFileError("tokens changed since the index was built")
            payload = bytearray(header["payload_bytes"])
            with entry.path.open("rb") as f:
                f.seek(offset)
                if f.readinto(payload) != len(payload):
                    raise StateFileError("truncated payload")
            if hashlib.sha256(payload).hexdigest() != header["payload_sha256"]:
                raise StateFileError("payload checksum mismatch")
        except StateFileError as e:
            self.reject(entry, str(e))
            raise
        self.touch(entry)
        return payload

    def reject(self, entry: Entry, why: str) -> None:
        log.warning("skipping KV state file %s: %s; recomputing", entry.path.name, why)
        self._on_event("reject", 1)
        with self._lock:
            self._entries.pop(entry.path, None)

    def touch(self, entry: Entry) -> None:
        now = time.time()
        entry.last_used = now
        try:
            os.utime(entry.path, (now, now))
        except OSError:
            pass

    def has(self, tokens: np.ndarray) -> Entry | None:
        path = self.dir / _file_name(self.identity_hash, np.asarray(tokens, dtype=np.int32))
        with self._lock:
            return self._entries.get(path)

    # ---- writes -------------------------------------------------------------------------------

    def save(
        self,
        tokens: Sequence[int] | np.ndarray,
        payload: bytes | memoryview,
        *,
        supersede: bool,
        meta: dict[str, Any] | None = None,
    ) -> None:
        """Queue a state for writing (returns at once); same tokens replace the older file.

        supersede: once written, delete entries whose tokens are a strict prefix of these (a longer
        state serves every prompt a shorter one would, when the cache can be truncated back).
        """
        toks = np.array(tokens, dtype=np.int32)
        path = self.dir / _file_name(self.identity_hash, toks)
        self._writes.put((path, toks, payload, supersede, meta or {}))

    def flush(self, timeout: float | None = None) -> None:
        """Wait until queued writes are on disk (at most ``timeout`` seconds)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._writes.unfinished_tasks:
            if deadline is not None and time.monotonic() > deadline:
                return
            time.sleep(0.01)

    def close(self, timeout: float = 2.0) -> bool:
        """Stop the writer after the queued writes, waiting at most ``timeout`` seconds.

        True when everything queued is on disk. Past the deadline the writer (a daemon thread) is
        abandoned: a write it was doing stays in its temporary file, never under the final name,
        and the next start deletes it.
        """
        self._writes.put(None)
        self._writer.join(timeout=timeout)
        return not self._writer.is_alive()

    def _write_loop(self) -> None:
        while True:
            item = self._writes.get()
            try:
                if item is None:
                    return
                self._write(*item)
            except Exception:  # noqa: BLE001 (a failed write must not kill the writer)
                log.exception("writing a KV state file failed")
            finally:
                self._writes.task_done()

    def _write(
        self,
        path: Path,
        tokens: np.ndarray,
        payload: bytes | memoryview,
        supersede: bool,
        meta: dict[str, Any],
    ) -> None:
        prefix, payload = encode(self.identity, tokens, payload, meta)
        size = len(prefix) + len(payload)
        if size > self.budget:
            log.warning(
                "KV state of %d tokens is %d bytes, more than --state-budget %d: not kept",
                len(tokens),
                size,
                self.budget,
            )
            return
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with tmp.open("wb") as f:
                f.write(prefix)
                f.write(payload)
            os.replace(tmp, path)
        except OSError as e:
            log.warning("could not write KV state file %s: %s", path.name, e)
            tmp.unlink(missing_ok=True)
            return
        now = time.time()
        with self._lock:
            self._entries[path] = Entry(path, tokens, size, now, meta)
        self._on_event("save", 1)
        log.info("saved KV state: %d tokens, %d bytes -> %s", len(tokens), size, path.name)
        if supersede:
            self._discard_prefixes_of(tokens)
        self._evict()

    def _evict(self) -> None:
        with self._lock:
            victims = []
            total = sum(e.size for e in self._entries.values())
            for e in sorted(self._entries.values(), key=lambda e: e.last_used):
                if total <= self.budget:
                    break
                victims.append(e)
                total -= e.size
                del self._entries[e.path]
        for e in victims:
            try:
                e.path.unlink()
            except OSError as err:
                log.warning("could not delete KV state file %s: %s", e.path.name, err)
            log.info(
                "evicted KV state file %s (%d bytes, least recently used)", e.path.name, e.size
            )
            self._on_event("evict", 1)

    def _discard_prefixes_of(self, tokens: np.ndarray) -> None:
        """Delete entries whose whole token sequence is a strict prefix of ``tokens``."""
        with self._lock:
            old = [
                e
                for e in self._entries.values()
                if len(e.tokens) < len(tokens) and common_prefix(e.tokens, tokens) == len(e.tokens)
            ]
            for e in old:
                del self._entries[e.path]
        for e in old:
            try:
                e.path.unlink()
            except OSError:
                pass
