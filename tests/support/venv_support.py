"""A fresh virtual environment for the tests that install llama-vq as users do, with the suite's pip in it.

`python -m venv` seeds a venv with the pip that the interpreter bundles (ensurepip's). On the CI VM that pip (23.2.1,
Python 3.11's) fails to verify the TLS certificate of https://pypi.org and retries each requirement five times before
it takes the package from the local indexes, minutes for one install (docs/build.md); the suite's own pip, the one
scripts/run.sh installs in .venv, does not. So the venv is made without pip and the suite's pip installs its own
version into it (`pip --python`): the installs a test then runs with the venv's pip resolve as the set-up's did. What
they install, and from where, is unchanged.
"""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path


def fresh_venv(path: Path) -> Path:
    """A new venv at `path` holding only the suite's version of pip; returns its python. Fails with pip's output."""
    py = path / "bin" / "python"
    pip = f"pip=={metadata.version('pip')}"
    for cmd in (
        [sys.executable, "-m", "venv", "--without-pip", path],
        [sys.executable, "-m", "pip", "--python", py, "install", "-q", pip],
    ):
        r = subprocess.run([str(c) for c in cmd], cwd=path.parent, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"{cmd} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return py
