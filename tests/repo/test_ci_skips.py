"""In CI (LLAMA_VQ_CI=1, set by .ci/run) a skip fails unless its reason is a platform limit
(tests/support/skip_support.py): a HIP compile or a kernel emulation that cannot run must not pass CI as a skip. Run on
a throwaway suite with tests/conftest.py, in a child pytest."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

SUITE = """
import pytest
from skip_support import skip_platform_limit

def test_skips_without_a_platform_limit():
    pytest.skip("no root for the HIP chroot")

def test_skips_for_a_platform_limit():
    skip_platform_limit("x86-64 Linux only")

@pytest.mark.xfail(reason="known", strict=True)
def test_expected_failure():
    assert False
"""


def _run(tmp_path: Path, ci: str | None) -> dict[str, int]:
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    for name in ("skip_support.py", "hip_build_support.py"):
        shutil.copy(TESTS / "support" / name, tmp_path / name)
    (tmp_path / "test_suite.py").write_text(SUITE)
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_VQ_CI"}
    if ci is not None:
        env["LLAMA_VQ_CI"] = ci
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_suite.py"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|xfailed|error)", r.stdout)}
    return counts | {"stdout": r.stdout}  # type: ignore[dict-item]


def test_in_ci_a_skip_without_a_platform_limit_fails(tmp_path):
    r = _run(tmp_path, "1")
    assert (r.get("failed"), r.get("skipped"), r.get("xfailed")) == (1, 1, 1), r["stdout"]
    assert "not a platform limit: no root for the HIP chroot" in r["stdout"], r["stdout"]


def test_outside_ci_every_skip_is_a_skip(tmp_path):
    r = _run(tmp_path, None)
    assert (r.get("failed"), r.get("skipped"), r.get("xfailed")) == (None, 2, 1), r["stdout"]
