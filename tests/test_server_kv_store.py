"""KV state files without a model: format checks, prefix lookup, LRU eviction under a budget."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from server.kv_store import SUFFIX, KVStore, StateFileError, read_header

ID = {
    "model": "abc",
    "type_k": "f16",
    "type_v": "q4_0",
    "flash_attn": False,
    "llama_cpp": "x",
    "patches": [],
}


def _store(d: Path, budget: int = 1 << 20, identity=ID) -> KVStore:
    return KVStore(d, identity, budget)


def _save(store: KVStore, tokens, payload: bytes, supersede: bool = False) -> None:
    store.save(np.array(tokens, np.int32), payload, supersede=supersede)
    store.flush()


def test_saved_state_reloads_after_restart_with_identical_payload(tmp_path):
    s = _store(tmp_path)
    _save(s, [1, 2, 3, 4], b"kv-bytes" * 10)
    s.close()
    s2 = _store(tmp_path)
    found = s2.lookup([1, 2, 3, 4, 5], better_than=0, prefix_only=True)
    assert found is not None and found[1] == 4
    assert bytes(s2.load(found[0])) == b"kv-bytes" * 10


def test_lookup_prefers_the_longest_shared_prefix_and_respects_prefix_only(tmp_path):
    s = _store(tmp_path)
    _save(s, [1, 2, 3], b"a")
    _save(s, [1, 2, 3, 4, 9, 9], b"b")
    entry, n = s.lookup([1, 2, 3, 4, 5], better_than=0, prefix_only=False)
    assert n == 4 and list(entry.tokens) == [1, 2, 3, 4, 9, 9]
    entry, n = s.lookup([1, 2, 3, 4, 5], better_than=0, prefix_only=True)  # SWA models
    assert n == 3 and list(entry.tokens) == [1, 2, 3]
    assert s.lookup([1, 2, 3, 4, 5], better_than=4, prefix_only=False) is None
    assert s.lookup([7, 8], better_than=0, prefix_only=False) is None


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda b: b[:-5], "truncated"),
        (lambda b: b"XXXX" + b[4:], "bad magic"),
        (lambda b: b[:-3] + bytes(x ^ 0xFF for x in b[-3:]), "payload checksum"),
        (lambda b: b[:20] + b"[" + b[21:], "corrupt header"),
        (lambda b: b[:16], "header length"),
    ],
)
def test_damaged_state_file_is_skipped_with_a_warning(tmp_path, caplog, damage, why):
    s = _store(tmp_path)
    _save(s, [5, 6, 7], b"payload-payload")
    s.close()
    (f,) = tmp_path.glob("*" + SUFFIX)
    f.write_bytes(damage(f.read_bytes()))
    caplog.set_level(logging.WARNING, "llama_vq.server.kv_store")
    s2 = _store(tmp_path)
    found = s2.lookup([5, 6, 7], better_than=0, prefix_only=True)
    if found is not None:  # damage only visible in the payload: caught on load
        with pytest.raises(StateFileError, match=why):
            s2.load(found[0])
        assert s2.lookup([5, 6, 7], better_than=0, prefix_only=True) is None
    assert any(why in r.getMessage() and "skipping" in r.getMessage() for r in caplog.records)


def test_state_of_another_model_or_cache_type_is_left_alone_and_never_matched(tmp_path):
    s = _store(tmp_path)
    _save(s, [1, 2, 3], b"x")
    s.close()
    other = dict(ID, type_v="f16")
    s2 = _store(tmp_path, identity=other)
    assert len(s2) == 0 and s2.lookup([1, 2, 3], better_than=0, prefix_only=False) is None
    (f,) = tmp_path.glob("*" + SUFFIX)
    with pytest.raises(StateFileError, match="another model or configuration"):
        read_header(f, other)
    assert f.exists()  # another server's file: not deleted


def test_least_recently_used_states_are_evicted_beyond_the_budget(tmp_path):
    s = _store(tmp_path, budget=3 * 1500)  # room for three ~1.4 KB files
    for i in range(3):
        _save(s, [i, i, i], bytes(1000))
    # Use the oldest: it becomes the most recent, so the second one is evicted next.
    oldest = s.lookup([0, 0, 0], better_than=0, prefix_only=True)[0]
    s.load(oldest)
    time.sleep(0.01)  # distinct timestamps for the LRU order (file mtimes)
    _save(s, [3, 3, 3], bytes(1000))
    kept = sorted(
        int(e.tokens[0])
        for e, _ in (
            s.lookup([i, i, i], better_than=0, prefix_only=True) or (None, 0) for i in range(4)
        )
        if e
    )
    assert kept == [0, 2, 3]
    assert s.total_bytes <= s.budget and len(list(tmp_path.glob("*" + SUFFIX))) == 3


def test_a_state_larger_than_the_whole_budget_is_not_kept(tmp_path, caplog):
    s = _store(tmp_path, budget=500)
    caplog.set_level(logging.WARNING, "llama_vq.server.kv_store")
    _save(s, [1, 2], bytes(1000))
    assert len(s) == 0 and not list(tmp_path.glob("*" + SUFFIX))
    assert "more than --state-budget" in caplog.text


def test_superseding_state_replaces_its_own_prefixes(tmp_path):
    s = _store(tmp_path)
    _save(s, [1, 2, 3], b"short")
    _save(s, [1, 2, 3, 4, 5], b"long", supersede=True)
    assert len(s) == 1
    assert s.lookup([1, 2, 3, 4, 5, 6], better_than=0, prefix_only=True)[1] == 5


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_temporary_files_of_writers_killed_mid_write_are_deleted_at_start(tmp_path):
    """A SIGKILL during a write leaves .<name>.<pid>.tmp: never loaded, and removed by the next start
    (it would otherwise sit outside --state-budget forever); a live process's write is left alone."""
    dead = tmp_path / (".deadbeef" + SUFFIX + f".{_dead_pid()}.tmp")
    dead.write_bytes(b"partial" * 1000)
    live_proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = tmp_path / (".cafe" + SUFFIX + f".{live_proc.pid}.tmp")
        live.write_bytes(b"in progress")
        s = _store(tmp_path)
        assert len(s) == 0
        assert not dead.exists()
        assert live.exists()
    finally:
        live_proc.kill()
        live_proc.wait()


def test_close_returns_within_its_timeout_even_with_writes_queued(tmp_path):
    s = _store(tmp_path, budget=1 << 30)
    for i in range(50):
        s.save(np.array([i, i], np.int32), bytes(4 << 20), supersede=False)
    t0 = time.monotonic()
    s.close(timeout=0.2)
    assert time.monotonic() - t0 < 0.2 + 0.5  # join's timeout plus scheduling slack
    for f in tmp_path.glob("*" + SUFFIX):  # whatever is under a final name is complete
        read_header(f, ID)
