"""The gfx90a build of tests/test_hip_build.py, started in the background when the session starts.

Provisioning the HIP chroot and compiling for gfx90a (scripts/hip-toolchain.sh build) is a third of a fresh 2-core
CI run's CPU, and none of it needs the rest of the suite. conftest.py starts it once collection has selected the
build test (and the machine can run it: root, Debian tools), at nice 19, so that it takes the cores only while the
tests leave them idle; the test then waits for it and asserts on what it built, exactly as when it ran the build
itself. The tests that measure speed or latency (marker `timing`) run after it, on a quiet machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "hip-toolchain.sh"
BUILD_TEST = "test_hip_build.py::test_hip_build_for_gfx90a_links_libggml_hip_the_server_engine_and_test_backend_ops"
TIMEOUT_S = 80 * 60


def skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "the HIP toolchain chroot needs root (debootstrap, chroot, bind mounts); CI runs as root"
    if not shutil.which("apt-get") and not shutil.which("debootstrap"):
        return "no debootstrap and no apt-get to install it: not a Debian-family machine"
    return None


def build_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GPU_TARGETS", "gfx90a")
    env["LLAMA_VQ_BUILD_TOOLS"] = "ON"
    env["LLAMA_VQ_TOOLS"] = "test-backend-ops"  # the tool the report checks; the CPU build has the others
    if env.get("LLAMA_VQ_HIP_FA", "OFF").upper() != "ON":
        env["CMAKE_ARGS"] = (env.get("CMAKE_ARGS", "") + " -DGGML_CUDA_FA=OFF").strip()
    return env


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    took_s: float  # from the start of the build
    waited_s: float  # of which the test waited


class _Build:
    def __init__(self, nice: int) -> None:
        self.env = build_env()
        self.t0 = time.monotonic()
        self.out = tempfile.TemporaryFile(mode="w+")
        self.err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            ["nice", "-n", str(nice), "bash", str(SCRIPT), "build"],
            env=self.env,
            stdout=self.out,
            stderr=self.err,
            text=True,
            start_new_session=True,  # stop() ends the script and its compilers together
        )

    def wait(self) -> Result:
        w0 = time.monotonic()
        try:
            rc = self.proc.wait(timeout=max(1.0, TIMEOUT_S - (w0 - self.t0)))
        except subprocess.TimeoutExpired:
            self.stop()
            rc = -1
        took, waited = time.monotonic() - self.t0, time.monotonic() - w0
        self.out.seek(0)
        self.err.seek(0)
        return Result(rc, self.out.read(), self.err.read(), took, waited)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)  # the script's EXIT trap unmounts what it mounted
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()


_build: _Build | None = None


def start_in_background() -> None:
    global _build
    if _build is None and skip_reason() is None:
        _build = _Build(nice=19)


def result() -> Result:
    """The build's outcome: the background one's when the session started it, else a build run now (nice 5)."""
    global _build
    if _build is None:
        _build = _Build(nice=5)
    return _build.wait()


def stop() -> None:
    if _build is not None:
        _build.stop()
