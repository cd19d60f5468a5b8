"""The base wheel (scripts/wheels.sh cpu), built once per test run for every file that installs it.

tests/packaging/test_wheels.py installs it alone, tests/packaging/test_hip_build.py with the HIP wheel of the gfx90a
build. pytest-xdist's workers of one run share it: the first to ask builds it under a lock, the others wait and take
it (PYTEST_XDIST_TESTRUNUID names the run). It lies under the checkout's build/, which scripts/hip-toolchain.sh's
chroot sees at the same path. LLAMA_VQ_WHEEL_DIR names a folder that already holds it (nothing is built then).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DIR = ROOT / "build" / "wheels-test"
PATTERN = "llama_vq-*manylinux*.whl"


def base_wheel() -> Path:
    given = os.environ.get("LLAMA_VQ_WHEEL_DIR")
    if given:
        (whl,) = sorted(Path(given).resolve().glob(PATTERN))
        return whl
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid-{os.getpid()}"
    DIR.mkdir(parents=True, exist_ok=True)
    with open(DIR.parent / "wheels-test.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if the build fails
        stamp = DIR / "run"
        built = sorted(DIR.glob(PATTERN))
        if len(built) == 1 and stamp.exists() and stamp.read_text() == run:
            return built[0]
        for old in DIR.glob("*.whl"):
            old.unlink()
        stamp.unlink(missing_ok=True)
        r = subprocess.run(
            ["bash", str(ROOT / "scripts" / "wheels.sh"), "cpu", str(DIR)],
            cwd=ROOT,
            env=dict(os.environ, PYTHON=sys.executable),
            capture_output=True,
            text=True,
            timeout=3600,
        )
        assert r.returncode == 0, (
            f"scripts/wheels.sh cpu failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        )
        stamp.write_text(run)
        (whl,) = sorted(DIR.glob(PATTERN))
        return whl
