"""The gfx90a build of tests/packaging/test_hip_build.py, started in the background before the test needs it.

Provisioning the HIP chroot and compiling for gfx90a (scripts/hip-toolchain.sh build) is a third of a fresh 2-core
CI run's CPU, and none of it needs the rest of the suite. It runs at nice 19, so that it takes the cores only while
the set-up and the tests leave them idle: scripts/run.sh test starts it beside the set-up when it runs the whole suite
(`python tests/support/hip_build_support.py start DIR`, DIR in $LLAMA_VQ_HIP_BUILD_DIR), else conftest.py starts it once
collection has selected the build test. The test waits for it and asserts on what it built, exactly as when it ran
the build itself. The tests that measure speed or latency (marker `timing`) run after it, on a quiet machine.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "hip-toolchain.sh"
BUILD_TEST = "test_hip_build.py::test_hip_build_for_gfx90a_links_libggml_hip_the_server_engine_and_test_backend_ops"
TIMEOUT_S = 80 * 60
DIR_ENV = "LLAMA_VQ_HIP_BUILD_DIR"  # a build that scripts/run.sh started: its folder


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
    # the ROCm image's build: backends as modules, so that the llama-vq-hip wheel comes from this one compile
    env["LLAMA_VQ_BACKEND_DL"] = "ON"
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


def start(folder: Path, nice: int) -> None:
    """scripts/hip-toolchain.sh build, detached, at `nice`: its stdout, stderr, exit status, process group, start and
    end times as files in `folder` (out, err, rc, pgid, t0, t1; scripts/run.sh test prints the build's time from
    them)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("out", "err", "rc", "pgid", "t0", "t1"):
        (folder / name).unlink(missing_ok=True)
    (folder / "t0").write_text(repr(time.time()))
    f = {k: shlex.quote(str(folder / k)) for k in ("out", "err", "rc", "t1")}
    script = (
        f"nice -n {nice} bash {shlex.quote(str(SCRIPT))} build >{f['out']} 2>{f['err']}; "
        f"rc=$?; date +%s.%N >{f['t1']}; echo $rc >{f['rc']}"
    )
    proc = subprocess.Popen(
        ["sh", "-c", script],
        env=build_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: stop() ends the script and its compilers together
    )
    (folder / "pgid").write_text(str(proc.pid))
    _procs[folder] = proc


def wait(folder: Path) -> Result:
    t0 = float((folder / "t0").read_text())
    w0 = time.time()
    while not _read(folder / "rc").strip() and time.time() - t0 < TIMEOUT_S:
        time.sleep(1)  # the build runs for minutes; its exit status is a file
    rc = _read(folder / "rc").strip()
    if not rc:
        stop(folder)
        return Result(-1, _read(folder / "out"), _read(folder / "err") + "\ntimed out", time.time() - t0, 0.0)
    now = time.time()
    return Result(int(rc), _read(folder / "out"), _read(folder / "err"), now - t0, now - w0)


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def stop(folder: Path) -> None:
    """End a build that is still running (a session that ends before its test)."""
    if not (folder / "pgid").exists() or _read(folder / "rc").strip():
        return
    pgid, proc = int((folder / "pgid").read_text()), _procs.get(folder)
    for sig, grace_s in ((signal.SIGTERM, 60), (signal.SIGKILL, 10)):  # TERM: the script's EXIT trap unmounts
        deadline = time.monotonic() + grace_s
        try:
            os.killpg(pgid, sig)
            while time.monotonic() < deadline:
                if proc is not None:
                    proc.poll()  # reap our own child: a zombie would keep the group alive
                os.killpg(pgid, 0)
                time.sleep(0.1)
        except ProcessLookupError:
            return


_procs: dict[Path, subprocess.Popen] = {}
_folder: Path | None = None  # the build this session waits for, and stops if the session ends first
_adopted = False  # _folder is scripts/run.sh's build (DIR_ENV), not one this process started


def start_in_background(adopt_only: bool = False) -> None:
    """For a session that selected the build test: adopt scripts/run.sh's build (DIR_ENV), or start one (not with
    adopt_only: a pytest-xdist worker, where every worker collects the build test and one runs it; result() starts
    the build there)."""
    global _folder, _adopted
    if _folder is not None or skip_reason() is not None:
        return
    env = os.environ.get(DIR_ENV)
    if env and (Path(env) / "pgid").exists():
        _folder, _adopted = Path(env), True
    elif not adopt_only:
        _folder = Path(tempfile.mkdtemp(prefix="llama-vq-hip-build-"))
        start(_folder, nice=19)


def result() -> Result:
    """The build's outcome: the background one's when there is one, else a build run now (nice 5)."""
    global _folder
    if _folder is None:
        _folder = Path(tempfile.mkdtemp(prefix="llama-vq-hip-build-"))
        start(_folder, nice=5)
    return wait(_folder)


def stop_session_build(keep_adopted: bool = False) -> None:
    """End this session's build if it still runs; keep_adopted leaves scripts/run.sh's build to the process that
    owns the session (pytest-xdist's controller: stop_run_sh_build), as a worker that finishes first must not end
    the build another worker is waiting for."""
    if _folder is not None and not (keep_adopted and _adopted):
        stop(_folder)


def stop_run_sh_build() -> None:
    env = os.environ.get(DIR_ENV)
    if env:
        stop(Path(env))


if __name__ == "__main__":
    # scripts/run.sh test: `python tests/support/hip_build_support.py start DIR` (nothing where the machine
    # cannot build)
    if len(sys.argv) == 3 and sys.argv[1] == "start":
        reason = skip_reason()
        if reason:
            print(f"llama-vq: no background HIP build: {reason}", file=sys.stderr)
        else:
            start(Path(sys.argv[2]), nice=19)
    else:
        sys.exit("usage: python tests/support/hip_build_support.py start DIR")
