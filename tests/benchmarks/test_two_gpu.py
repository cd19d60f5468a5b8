"""benchmarks/two_gpu.py, the runner of the two-GPU layer split (two GPUs of one host), exercised on the CPU: its
judging and parsing on recorded data, and its dry run, where two local ggml-rpc-server processes are the two devices
of a layer split, so that its first GPU run does not fail on its logic.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "benchmarks" / "two_gpu.py"
sys.path.insert(0, str(ROOT / "benchmarks"))
from two_gpu_report import Step, compare, parse_devices, parse_log, verdict  # noqa: E402

# ------------------------------------------------------------------------------------------------ the runner's logic


def _steps(*rows: tuple[int, float, int, float]) -> list[Step]:
    return [Step(a, [(a, la), (b, lb)]) for a, la, b, lb in rows]


def test_agreement_is_judged_against_the_floor():
    ref = [_steps((1, -0.5, 2, -0.9), (3, -0.2, 4, -2.0), (5, -1.0, 6, -1.02))]
    floor = compare(ref, [_steps((1, -0.52, 2, -0.9), (3, -0.2, 4, -2.0), (5, -1.0, 6, -1.02))])
    assert floor.identical and floor.max_move == pytest.approx(0.02) and floor.max_move_chosen == pytest.approx(0.02)
    assert verdict(compare(ref, ref), floor) == (True, "identical")
    # the texts part where the reference's top two were 0.02 apart: a near-tie the floor's moves can flip
    tie = compare(ref, [_steps((1, -0.5, 2, -0.9), (3, -0.2, 4, -2.0), (6, -1.0, 5, -1.01))])
    ok, why = verdict(tie, floor)
    assert ok and not tie.identical and tie.same == 2 and "near-tie" in why
    # they part where the reference decided by 1.8: beyond the floor
    wide = compare(ref, [_steps((1, -0.5, 2, -0.9), (4, -0.3, 3, -0.4), (5, -1.0, 6, -1.02))])
    assert verdict(wide, floor)[0] is False and wide.divergences[0]["step"] == 1
    # the same texts, moved more than the floor: judged unless the runs decoded in other batches
    moved = compare(ref, [_steps((1, -0.8, 2, -0.9), (3, -0.2, 4, -2.0), (5, -1.0, 6, -1.02))])
    assert moved.identical and verdict(moved, floor)[0] is False
    assert verdict(moved, floor, judge_moves=False)[0] is True
    assert verdict(tie, None)[0] is False  # no floor: identical or not


def test_buffers_and_facts_are_read_per_device_from_llama_cpp_lines():
    log = "\n".join(
        [
            "load_tensors:        CUDA0 model buffer size =  3000.50 MiB",
            "load_tensors:        CUDA1 model buffer size =  3100.25 MiB",
            "llama_context: flash_attn            = auto",
            "llama_context: attn_scratch          = 256 MiB",
            "llama_kv_cache:      CUDA0 KV buffer size =   100.00 MiB",
            "llama_kv_cache:      CUDA1 KV buffer size =    90.00 MiB",
            "llama_kv_cache:      CUDA0 KV buffer size =    12.50 MiB",  # the sliding-window layers' cache
            "llama_context: pipeline parallelism enabled",
            "sched_reserve:      CUDA0 compute buffer size =   400.00 MiB",
            "sched_reserve:      CUDA1 compute buffer size =   420.00 MiB",
            "sched_reserve:  CUDA_Host compute buffer size =    40.00 MiB",
            "llama_context: prefill mode: flash attention for batches of more than 8 tokens per sequence, "
            "decode batches without it",
            "llama-vq: attention fusions run: attn=96 rotated=96 tail=0 tail_rotated=0 mma=0",
        ]
    )
    got = parse_log(log)
    assert got["devices"] == {
        "CUDA0": {"model": 3000.5, "kv": 112.5, "compute": 400.0},
        "CUDA1": {"model": 3100.25, "kv": 90.0, "compute": 420.0},
        "CUDA_Host": {"compute": 40.0},
    }
    assert got["flash_attn"] == "auto" and got["attn_scratch_mib"] == "256"
    assert got["mode"].startswith("prefill mode") and got["pipeline_parallel"]
    assert got["attn_fusions"].startswith("attn=96")
    listing = "Available devices:\n  CUDA0: NVIDIA H200 (143 GiB, 142 GiB free)\n  CUDA1: NVIDIA H200 (143 GiB)\n"
    assert parse_devices(listing) == ["CUDA0: NVIDIA H200 (143 GiB, 142 GiB free)", "CUDA1: NVIDIA H200 (143 GiB)"]
    assert parse_devices("Available devices:\n  (none)\n") == []


# ------------------------------------------------------------------------------------------------ the dry run


def _dry_run(mimo_path: Path, out: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    from llama_vq._cdll import BIN_DIR

    for tool in ("llama-bench", "ggml-rpc-server"):
        if not (BIN_DIR / tool).exists():
            pytest.skip(f"built without the tools (LLAMA_VQ_BUILD_TOOLS=ON): no {tool}")
    r = subprocess.run(
        [
            sys.executable,
            str(RUNNER),
            "--bin",
            str(BIN_DIR),
            "--model",
            str(mimo_path),
            "--out",
            str(out),
            "--engine",
            "vq",
            "--py",
            sys.executable,
            "--dry-run",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "OUT")},
    )
    assert (out / "two_gpu.md").exists(), r.stdout[-3000:] + r.stderr[-3000:]
    return r, json.loads((out / "two_gpu.json").read_text())


def _leaves_what_comes_back(out: Path) -> None:
    # what a GPU call brings back: at most 8 files, none deeper than OUT/a/b/file
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == ["logs.tar.xz", "two_gpu.json", "two_gpu.log", "two_gpu.md"]
    with tarfile.open(out / "logs.tar.xz") as t:
        assert any(n.endswith(".log") for n in t.getnames())


@pytest.mark.slow
def test_dry_run_splits_the_layers_over_two_rpc_devices(mimo_path, tmp_path):
    out = tmp_path / "out"
    r, doc = _dry_run(mimo_path, out, "--rpc", "2", "--bench-parts", "main,cpumoe,hip")
    assert r.returncode == 0, (out / "two_gpu.md").read_text()
    _leaves_what_comes_back(out)
    assert len(doc["devices"]) == 2 and not doc["skipped"]
    runs = doc["runs"]
    assert set(runs) == {
        "f16-fa-on-1",
        "f16-fa-off-1",
        "off-1",
        "off-2",
        "default-1",
        "default-2",
        "cpumoe-off-1",
        "cpumoe-off-2",
        "hip-off-1",
        "hip-off-2",
    }
    for name, run in runs.items():
        kv = {d: b["kv"] for d, b in run["log"]["devices"].items() if b.get("kv")}
        # the split puts part of the KV cache (and a compute buffer) on each device; one device holds all of it
        assert len(kv) == (2 if name.endswith("-2") else 1), (name, run["log"]["devices"])
        if run.get("speed"):
            assert run["speed"]["reused"] == "yes" and run["speed"]["depth_prompt_n"] == doc["params"]["pp"], name
            assert all(run["speed"][k] > 0 for k in ("pp_d0", "tg_d0", "fill", "pp_depth", "tg_depth")), name
    one = sum(b.get("kv", 0) for b in runs["off-1"]["log"]["devices"].values())
    two = sum(b.get("kv", 0) for b in runs["off-2"]["log"]["devices"].values())
    assert two == pytest.approx(one, abs=0.05)  # the same cache, divided
    assert runs["off-2"]["log"]["flash_attn"] == "disabled" and runs["default-2"]["log"]["mode"].startswith("prefill")
    for pair in ("off", "default", "cpumoe-off", "hip-off"):
        assert doc["agreement"][f"{pair}: 1 device -> 2 devices"]["ok"] == "yes"
    assert {(b["group"], b["split_mode"]) for b in doc["bench"]} == {
        (g, s) for g in ("main", "cpumoe", "hip") for s in ("none", "layer")
    }
    checks = {c["check"]: c["ok"] for c in doc["server"]}
    assert all(checks.values()) and len(checks) == 8, checks
    assert "-sm row refused by llama-vq-server" in checks


@pytest.mark.slow
def test_dry_run_with_fewer_than_two_devices_runs_the_one_device_half(mimo_path, tmp_path):
    out = tmp_path / "out"
    r, doc = _dry_run(mimo_path, out, "--parts", "floor,main,server")
    assert r.returncode == 0, (out / "two_gpu.md").read_text()
    _leaves_what_comes_back(out)
    assert doc["devices"] == [] and any("the layer split needs two" in n for n in doc["notes"])
    assert set(doc["runs"]) == {"f16-fa-on-1", "f16-fa-off-1", "off-1", "default-1"}
    assert {b["split_mode"] for b in doc["bench"]} == {"none"}
    checks = {c["check"]: c["ok"] for c in doc["server"]}
    assert all(checks.values()) and "llama-vq-server starts on 1 device(s) (-sm none -mg 0)" in checks
