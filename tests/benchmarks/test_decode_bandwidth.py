"""benchmarks/decode_bandwidth.py, the effective bandwidth of decode attention from llama-bench's tg rows (what
benchmarks/mi210.sh step 3 and benchmarks/gpu.sh decode-bandwidth print), on rows measured on an H100
(benchmarks/RESULTS.md, "Decode attention's two forms and its effective bandwidth, H100")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "benchmarks" / "decode_bandwidth.py"
sys.path.insert(0, str(ROOT / "benchmarks"))
from decode_bandwidth import bandwidth_rows, kv_bytes  # noqa: E402


def _tg(model: str, config: str, k: str, v: str, depth: int, ts: float) -> dict:
    return {"model": model, "config": config, "type_k": k, "type_v": v, "n_depth": depth, "n_gen": 64, "n_prompt": 0,
            "avg_ts": ts}  # fmt: skip


H100 = [
    _tg("mimo", "default", "q8_0", "q4_1", 0, 200.87),
    _tg("mimo", "default", "q8_0", "q4_1", 65536, 173.38),
    _tg("mimo", "fa on", "f16", "f16", 0, 219.97),
    _tg("mimo", "fa on", "f16", "f16", 65536, 192.39),
    _tg("llama8b", "default", "q4_0", "q4_0", 32768, 187.86),  # no depth-0 row: no figure
    dict(_tg("mimo", "default", "q8_0", "q4_1", 0, 5000.0), n_gen=0, n_prompt=512),  # a prompt row: not decode
]


def test_kv_bytes_are_the_full_layers_blocks_at_the_depth():
    # MiMo's 8 full-attention layers x 4 KV heads: q8_0 K 192 = 204 bytes, q4_1 V 128 = 80 bytes a cell and head
    assert kv_bytes("mimo", "q8_0", "q4_1", 65536) == 8 * 4 * 65536 * (204 + 80)
    assert kv_bytes("llama8b", "f16", "f16", 1000) == 32 * 8 * 1000 * (256 + 256)


def test_bandwidth_is_the_step_time_the_depth_adds_over_the_bytes_read():
    got = {(b["config"], b["depth"]): b for b in bandwidth_rows(H100)}
    assert set(got) == {("default", 65536), ("fa on", 65536)}
    ours, fa = got[("default", 65536)], got[("fa on", 65536)]
    # 1/173.38 - 1/200.87 s = 0.789 ms for 595 MB: 0.75 TB/s; flash attention reading f16: 0.652 ms for 1.34 GB
    assert ours["added_ms"] == pytest.approx(0.789, abs=0.001)
    assert ours["tbs"] == pytest.approx(0.754, abs=0.005)
    assert fa["tbs"] == pytest.approx(2.06, abs=0.01)


def test_the_command_prints_the_table_with_the_share_of_peak(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in H100))
    p = subprocess.run([sys.executable, str(RUNNER), str(rows), "--peak-tbs", "3.35"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "| mimo | default | q8_0/q4_1 | 65536 | 0.789 | 0.75 | 23% |" in p.stdout, p.stdout
