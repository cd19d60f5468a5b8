"""Run a Python snippet against the same llama_vq as the test process, in a child process.

For native switches read once per process (environment variables of our patches), a test runs the same snippet
twice with different environments and compares what each prints.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_script(script: str, args: list[str], env: dict[str, str], cwd: Path, timeout: float = 300) -> str:
    """The last line the snippet prints; it imports the llama_vq this process imported (installed or checkout)."""
    import llama_vq

    full = dict(os.environ, **env)
    full["PYTHONPATH"] = os.pathsep.join([str(Path(llama_vq.__file__).parent.parent), full.get("PYTHONPATH", "")])
    r = subprocess.run(
        [sys.executable, "-c", script, *args], env=full, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.strip().splitlines()[-1]
