"""Run a Python snippet against the same llama_vq as the test process, in a child process.

For native switches read once per process (environment variables of our patches), a test runs the same snippet
twice with different environments and compares what each prints.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path


def run_script_with_log(
    script: str, args: list[str], env: dict[str, str], cwd: Path, timeout: float = 300
) -> tuple[str, str]:
    """The last line the snippet prints, and its stderr (llama.cpp's log, the run counters our native code prints
    at exit); it imports the llama_vq this process imported (installed or checkout)."""
    import llama_vq

    full = dict(os.environ, **env)
    full["PYTHONPATH"] = os.pathsep.join([str(Path(llama_vq.__file__).parent.parent), full.get("PYTHONPATH", "")])
    r = subprocess.run(
        [sys.executable, "-c", script, *args], env=full, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.strip().splitlines()[-1], r.stderr


def run_script(script: str, args: list[str], env: dict[str, str], cwd: Path, timeout: float = 300) -> str:
    """The last line the snippet prints (run_script_with_log without the log)."""
    return run_script_with_log(script, args, env, cwd, timeout)[0]


def run_counter(log: str, line: str, name: str) -> int:
    """A counter from a stats line our native code printed at exit (``llama-vq: <line>: name=N ...``); fails the
    test when the line is missing, so that a build without the counter cannot pass as "ran zero times"."""
    m = re.search(rf"^llama-vq: {re.escape(line)}:.*\b{re.escape(name)}=(\d+)", log, re.MULTILINE)
    assert m, f"no `llama-vq: {line}: {name}=N` line in the log:\n{log[-2000:]}"
    return int(m.group(1))
