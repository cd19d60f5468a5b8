"""benchmarks/mi210.sh, the script an MI210 owner runs, exercised here so that its first run there does not fail on a
typo: its fidelity step end to end on the CPU build's tools (PROXY=cuda with DEV=CPU: no build, the given tools), and
its refusals. Steps 2 and 3 need a GPU to mean anything (benchmarks/RESULTS.md has them tried on an H200 with
PROXY=cuda)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "mi210.sh"


def _env(**extra: str) -> dict[str, str]:
    return dict(os.environ, PY=sys.executable, **extra)


def _bin(tmp_path: Path, bin_dir: Path) -> Path:
    """The CPU build's tools for BIN. The script asks BIN for test-backend-ops whatever the steps; steps 4 and 5 never
    run it, and scripts/run.sh test leaves it out of the CPU build (the HIP build compiles and links it): then a
    stand-in that fails if run, so that a step that starts running it fails here."""
    if (bin_dir / "test-backend-ops").exists():
        return bin_dir
    out = tmp_path / "bin"
    out.mkdir()
    for tool in bin_dir.iterdir():
        (out / tool.name).symlink_to(tool)
    stub = out / "test-backend-ops"
    stub.write_text("#!/bin/sh\necho 'test-backend-ops: not in the CPU build of the tests' >&2\nexit 1\n")
    stub.chmod(0o755)
    return out


def test_every_shell_script_parses():
    scripts = sorted([*ROOT.glob("benchmarks/**/*.sh"), *ROOT.glob("scripts/*.sh")])
    assert SCRIPT in scripts
    for s in scripts:
        r = subprocess.run(["bash", "-n", str(s)], capture_output=True, text=True)
        assert r.returncode == 0, f"{s.name}: {r.stderr}"


def test_proxy_mode_needs_the_tools_folder(tmp_path):
    env = _env(PROXY="cuda")
    env.pop("BIN", None)
    r = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode != 0
    assert "PROXY=cuda needs BIN" in r.stderr


@pytest.mark.slow
def test_fidelity_step_runs_end_to_end_on_the_cpu_tools(tmp_path):
    from llama_vq import models
    from llama_vq._cdll import BIN_DIR

    if not (BIN_DIR / "llama-perplexity").exists():
        pytest.skip("built without the tools (LLAMA_VQ_BUILD_TOOLS=ON)")
    out = tmp_path / "out"
    r = subprocess.run(
        ["bash", str(SCRIPT), str(out)],
        env=_env(
            PROXY="cuda",
            DEV="CPU",
            BIN=str(_bin(tmp_path, BIN_DIR)),
            STEPS="4",
            KL_CHUNKS="1",
            KL_MODEL=str(models.default_model_path()),
        ),
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    report = (out / "mi210.txt").read_text()
    assert r.returncode == 0, report + r.stderr[-3000:]
    for pair in ("q8_0-q8_0", "q4_0-q4_0", "q8_0-q4_1", "q8_0-q4_0"):
        assert f"{pair}-fa-off: Mean    KLD:" in report, report
    assert "done: " in report and "failures" not in report


@pytest.mark.slow
def test_two_gpu_step_runs_end_to_end_on_two_rpc_devices(tmp_path, mimo_path):
    # step 5 as a two-MI210 host runs it, on the CPU build's tools: two local ggml-rpc-server processes are the two
    # devices, the tiny MiMo-shaped model stands in for the attention-shaped one (TWO_GPU_ARGS: two_gpu.py's dry run)
    from llama_vq._cdll import BIN_DIR

    if not (BIN_DIR / "ggml-rpc-server").exists():
        pytest.skip("built without the tools (LLAMA_VQ_BUILD_TOOLS=ON)")
    models = tmp_path / "models"
    models.mkdir()
    (models / "synth-mimo.gguf").symlink_to(mimo_path)
    out = tmp_path / "out"
    r = subprocess.run(
        ["bash", str(SCRIPT), str(out)],
        env=_env(
            PROXY="cuda",
            DEV="CPU",
            BIN=str(_bin(tmp_path, BIN_DIR)),
            STEPS="5",
            MODEL_DIR=str(models),
            TWO_GPU_ARGS="--dry-run --rpc 2",
        ),
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    report = (out / "mi210.txt").read_text()
    assert r.returncode == 0, report + r.stderr[-3000:]
    assert "5. two GPUs (0,1)" in report and "| off: 1 device -> 2 devices |" in report, report
    assert "| -sm row refused by llama-vq-server | ok |" in report and "every check passed" in report
    assert "done: " in report and "failures" not in report
