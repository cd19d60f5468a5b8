"""The prompt cache on disk across restarts (--state-dir) of a real llama-vq-server, SmolLM2 and a MiMo-shaped model.

A server stopped with SIGTERM saves its slots (llama-server's slot save, with the SWA checkpoints of patch
0016-server-slot-save-keeps-checkpoints) and a sidecar with their sha256 and identity; started again with the same
flags it restores them before /health turns 200, so the next request that extends a prompt served before the stop
finds it cached (`timings.cache_n`). Greedy text after a restore must equal a fresh server's: the restored KV bytes
are the ones a fresh run computes. A damaged file, or one written for another configuration, is deleted and never
loaded.

CPU cost: about 9 short server runs and generations of <= 16 tokens; ~40-60 s on 2 cores.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from server_support import ServerProcess

pytestmark = pytest.mark.slow

PROMPT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined movable metal type, oil-based ink and a wooden screw press. Within fifty years"
)
MORE = " printing shops had opened in more than two hundred European cities, and"
FLAGS = ("-np", "1", "-ctv", "q4_0", "-fa", "off")


def _complete(s: ServerProcess, prompt: str, n: int = 12) -> dict:
    r = httpx.post(
        s.url + "/completion",
        timeout=120,
        json={"prompt": prompt, "n_predict": n, "temperature": 0, "cache_prompt": True},
    )
    assert r.status_code == 200, r.text
    return r.json()


def _serve_once(model: Path, state: Path, log_dir: Path, *prompts: str, flags: tuple[str, ...] = FLAGS) -> list[dict]:
    """Start, answer the prompts in order, SIGTERM; the answers. The stop must be clean (exit 0)."""
    s = ServerProcess(model, *flags, "--state-dir", str(state), log_dir=log_dir)
    try:
        s.wait_ready()
        out = [_complete(s, p) for p in prompts]
    finally:
        rc = s.terminate()
    assert rc == 0, s.log_path.read_text(errors="replace")[-3000:]
    return out


def test_restart_restores_the_slot_and_reuses_its_prompt(smollm2_path, tmp_path):
    state = tmp_path / "state"
    (first,) = _serve_once(smollm2_path, state, tmp_path / "a", PROMPT)
    assert first["timings"]["cache_n"] == 0
    files = sorted(p.name for p in state.iterdir())
    assert files == ["slot-0.bin", "slot-0.bin.checkpoints", "slot-0.json"], files
    side = json.loads((state / "slot-0.json").read_text())
    assert side["n_tokens"] >= first["tokens_evaluated"], side  # the prompt and what was generated after it
    assert set(side["files"]) == {"slot-0.bin", "slot-0.bin.checkpoints"}

    (after,) = _serve_once(smollm2_path, state, tmp_path / "b", PROMPT + MORE)
    (fresh,) = _serve_once(smollm2_path, tmp_path / "fresh-state", tmp_path / "c", PROMPT + MORE)
    # everything of PROMPT was cached after the restart, and only that part: the rest was evaluated
    assert after["timings"]["cache_n"] >= first["tokens_evaluated"] - 1, after["timings"]
    assert fresh["timings"]["cache_n"] == 0
    assert after["content"] == fresh["content"]


def test_a_damaged_state_file_is_deleted_not_loaded(smollm2_path, tmp_path):
    state = tmp_path / "state"
    _serve_once(smollm2_path, state, tmp_path / "a", PROMPT)
    data = bytearray((state / "slot-0.bin").read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte: the size still matches, the sha256 does not
    (state / "slot-0.bin").write_bytes(bytes(data))
    s = ServerProcess(smollm2_path, *FLAGS, "--state-dir", str(state), log_dir=tmp_path / "b")
    try:
        s.wait_ready()
        assert "sha256 mismatch" in s.log()
        assert not (state / "slot-0.json").exists()
        again = _complete(s, PROMPT + MORE)
        assert again["timings"]["cache_n"] == 0
    finally:
        s.terminate()


def test_a_state_written_for_other_cache_types_is_not_loaded(smollm2_path, tmp_path):
    state = tmp_path / "state"
    _serve_once(smollm2_path, state, tmp_path / "a", PROMPT)
    s = ServerProcess(
        smollm2_path, "-np", "1", "-ctv", "q8_0", "-fa", "off", "--state-dir", str(state), log_dir=tmp_path / "b"
    )
    try:
        s.wait_ready()
        assert "written by another model, build or cache configuration" in s.log()
        assert _complete(s, PROMPT + MORE)["timings"]["cache_n"] == 0
    finally:
        s.terminate()


def test_an_empty_slot_leaves_no_file_and_the_budget_is_kept(smollm2_path, tmp_path):
    state = tmp_path / "state"
    _serve_once(smollm2_path, state, tmp_path / "a")  # nothing served: nothing saved
    assert not list(state.glob("slot-*"))
    # a budget smaller than one slot's state: the file is written, then deleted at once
    s = ServerProcess(smollm2_path, *FLAGS, "--state-dir", str(state), "--state-budget", "1K", log_dir=tmp_path / "b")
    try:
        s.wait_ready()
        _complete(s, PROMPT)
    finally:
        assert s.terminate() == 0
    assert not list(state.glob("slot-*")), list(state.iterdir())


def test_sliding_window_model_reuses_a_rerendered_history_after_a_restart(mimo_path, tmp_path):
    """MiMo-shaped (SWA window 32): the next prompt drops the end of the previous answer, as an agent's re-rendered
    history does; only a checkpoint before the divergence lets the SWA layers resume, and it must survive the restart
    (patch 0016-server-slot-save-keeps-checkpoints)."""
    state = tmp_path / "state"
    head = PROMPT * 3
    flags = ("-np", "1", "-ctk", "q8_0", "-ctv", "q4_0", "-fa", "off", "--ctx-checkpoints", "8")
    (first,) = _serve_once(mimo_path, state, tmp_path / "a", head, flags=flags)
    # a different continuation than the model's own 12 tokens: the prompt diverges right after `head`
    (after,) = _serve_once(mimo_path, state, tmp_path / "b", head + MORE, flags=flags)
    assert after["timings"]["cache_n"] >= 0.8 * first["tokens_evaluated"], (first["tokens_evaluated"], after["timings"])
