"""The prompt cache on disk across restarts (--state-dir, --state-budget), with llama-server's slot save/restore.

When the server stops (after draining), each slot's KV state (its tokens, the KV cells, SWA layers included) is
saved with llama-server's own `POST /slots/{id}?action=save` into the state directory, and a sidecar records the
file's sha256, size and the identity of what wrote it (model file, llama-server arguments that shape the cache,
llama-vq build). When the server starts, each slot whose file and sidecar match is restored with
`?action=restore` before the server reports ready, so the first request of a conversation that was running
before the restart reuses its prompt (llama-server assigns a request to the slot with the longest common
prefix). A file whose checksum or identity does not match is deleted, never loaded. Beyond --state-budget the
oldest files go. Limits: only what the slots hold at the stop survives (llama-server's RAM prompt cache,
--cache-ram, does not), a slot's SWA checkpoints are not in its file (a restored conversation reuses its prompt
when the next prompt extends it, as agent and chat turns do), and a process killed without a drain saves nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from .engine import Engine, Route

log = logging.getLogger(__name__)

FORMAT = 1
_SLOT_ROUTE = Route("POST", "/slots/:id_slot")
# llama-server arguments that do not change what a saved state means (network, auth, logging, sampling defaults)
_NEUTRAL_FLAGS = {
    "--host",
    "--port",
    "--api-key",
    "--api-key-file",
    "--timeout",
    "-to",
    "--threads-http",
    "--log-file",
    "--metrics",
    "--slots",
    "--no-slots",
    "--props",
    "--cors-origins",
    "--cors-methods",
    "--cors-headers",
    "--sleep-idle-seconds",
    "-v",
    "--verbose",
    "--log-verbosity",
    "-lv",
    "--slot-save-path",
    "-t",
    "--threads",
    "-tb",
    "--threads-batch",
}


def identity(model_path: str, llama_argv: list[str], build: dict[str, Any]) -> str:
    """A hash of what a state file depends on: the model file, the cache-shaping arguments, the native build."""
    st = os.stat(model_path)
    args: list[str] = []
    skip = False
    for a in llama_argv:
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in _NEUTRAL_FLAGS:
            skip = "=" not in a and name not in ("-v", "--verbose", "--metrics", "--slots", "--no-slots", "--props")
            continue
        args.append(a)
    doc = {
        "format": FORMAT,
        "model": [os.path.abspath(model_path), st.st_size, st.st_mtime_ns],
        "args": args,
        "build": build,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


class StateDir:
    def __init__(self, root: Path, budget: int, ident: str, n_slots: int) -> None:
        self.root = root
        self.budget = budget
        self.ident = ident
        self.n_slots = n_slots
        root.mkdir(parents=True, exist_ok=True)

    def file_name(self, slot: int) -> str:
        return f"slot-{slot}.bin"

    def _sidecar(self, slot: int) -> Path:
        return self.root / f"slot-{slot}.json"

    def _slot_action(self, engine: Engine, slot: int, action: str) -> tuple[int, dict]:
        body = json.dumps({"filename": self.file_name(slot)}).encode()
        call = engine.call(
            _SLOT_ROUTE,
            f"/slots/{slot}",
            f"action={action}",
            {"id_slot": str(slot), "action": action},
            {"content-type": "application/json"},
            body,
        )
        try:
            head = call.run()
            raw = call.body()
        finally:
            call.close()
        try:
            doc = json.loads(raw) if raw else {}
        except ValueError:
            doc = {"raw": raw.decode("utf-8", "replace")}
        return head.status, doc

    def restore(self, engine: Engine) -> int:
        """Restore every slot whose file is intact and ours; returns the number of tokens restored."""
        total = 0
        for slot in range(self.n_slots):
            path, side = self.root / self.file_name(slot), self._sidecar(slot)
            if not path.exists():
                continue
            why = self._check(path, side)
            if why:
                log.warning("state dir: %s not restored (%s); deleting it", path.name, why)
                self._delete(slot)
                continue
            status, doc = self._slot_action(engine, slot, "restore")
            if status != 200:
                log.warning("state dir: slot %d not restored: %s", slot, doc)
                continue
            n = int(doc.get("n_restored", 0))
            total += n
            log.info("state dir: slot %d restored, %d tokens", slot, n)
        return total

    def _files(self, slot: int) -> list[Path]:
        """The slot's state file and llama-server's checkpoint file beside it (patch
        0016-server-slot-save-keeps-checkpoints)."""
        path = self.root / self.file_name(slot)
        return [path, path.with_name(path.name + ".checkpoints")]

    def _delete(self, slot: int) -> None:
        for p in [*self._files(slot), self._sidecar(slot)]:
            p.unlink(missing_ok=True)

    def _check(self, path: Path, side: Path) -> str | None:
        try:
            meta = json.loads(side.read_text())
        except (OSError, ValueError):
            return "no readable sidecar"
        if meta.get("identity") != self.ident:
            return "written by another model, build or cache configuration"
        for f in self._files(int(path.stem.split("-")[1])):
            want = meta.get("files", {}).get(f.name)
            if want is None:
                continue
            if not f.exists() or want["size"] != f.stat().st_size:
                return f"{f.name}: size differs from its sidecar"
            if want["sha256"] != _sha256(f):
                return f"{f.name}: sha256 mismatch"
        return None

    def save(self, engine: Engine, deadline: float) -> int:
        """Save each slot that holds a prompt, until the deadline (time.monotonic()); returns slots saved."""
        saved = 0
        for slot in range(self.n_slots):
            if time.monotonic() >= deadline:
                log.warning("state dir: out of time, slots %d.. not saved", slot)
                break
            side = self._sidecar(slot)
            status, doc = self._slot_action(engine, slot, "save")
            if status != 200:
                log.warning("state dir: slot %d not saved: %s", slot, doc)
                continue
            if not int(doc.get("n_saved", 0)):  # an empty slot: nothing of it survives
                self._delete(slot)
                continue
            files = {f.name: {"size": f.stat().st_size, "sha256": _sha256(f)} for f in self._files(slot) if f.exists()}
            side.write_text(
                json.dumps(
                    {
                        "identity": self.ident,
                        "files": files,
                        "n_tokens": int(doc.get("n_saved", 0)),
                        "saved_at": time.time(),
                    }
                )
            )
            saved += 1
        self._enforce_budget()
        return saved

    def _enforce_budget(self) -> None:
        slots = sorted(
            (int(p.stem.split("-")[1]) for p in self.root.glob("slot-*.bin")),
            key=lambda s: self._files(s)[0].stat().st_mtime,
        )

        def size(slot: int) -> int:
            return sum(f.stat().st_size for f in self._files(slot) if f.exists())

        total = sum(size(s) for s in slots)
        while slots and self.budget > 0 and total > self.budget:
            old = slots.pop(0)
            total -= size(old)
            log.info("state dir: slot %d's files deleted (over --state-budget)", old)
            self._delete(old)
