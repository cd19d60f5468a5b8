"""Building and running the CPU emulations of our CUDA/HIP kernels (tests/fused_attn_emu): the kernel parts cut out of
the files the build compiles (tests/support/kernel_sources.py), one harness binary per surface (CUDA's 32-lane warps, or
gfx90a's 64-lane wavefronts with -DGGML_USE_HIP), g++ with AddressSanitizer and UBSan (or ThreadSanitizer, for the
race checks).

Each harness object is compiled once and kept in build/kernel-emu/objects under a name made of everything that decides
it (the compile command with its content-addressed sources, the harness's own files, the compiler), so that the test
files, pytest-xdist's workers and later runs share it; a lock per object makes a second asker wait for the first
compile instead of repeating it. scripts/run.sh test compiles them all in the background while the set-up's and lint's
cores are idle (`python tests/support/kernel_emu_support.py prebuild`: the builds every test file's emulation_builds()
names, at nice 10); a test that needs an object the background is still compiling raises that compile to its own
priority and waits for it. Every compile asked for is a line in build/kernel-emu/compiles.log (which, who, seconds),
which scripts/run.sh test sums in its log.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from kernel_sources import (
    SourceUnavailable,
    cut,
    exported_tree,
    for_emulation,
    ggml_src_dir,
    kernel_path,
    kernel_source,
)

ROOT = Path(__file__).resolve().parents[2]
EMU = ROOT / "tests" / "fused_attn_emu"
CACHE = ROOT / "build" / "kernel-emu"
OBJECTS = CACHE / "objects"
LOG = CACHE / "compiles.log"
SURFACES = {"cuda": 32, "hip": 64}  # surface -> warp width


def require_sources() -> None:
    """Skip (with the reason) where no tree can be exported: the pinned llama.cpp is not in vendor/."""
    try:
        exported_tree()
    except SourceUnavailable as e:
        pytest.skip(f"no exported llama.cpp tree for the kernels' sources: {e}")


def compiler() -> str:
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    return cxx


def dequantize_x8_part() -> str:
    """dequantize-x8.cuh's device part: dequantize_x8, its positions and dequantize_x8_rows (not the host launchers,
    whose <<<>>> is CUDA's)."""
    text = kernel_source("dequantize-x8.cuh")
    text = text.split('#include "convert.cuh"\n', 1)[1]
    return for_emulation(cut(text, "", "template <typename T>\nstatic void dequantize_x8_rows_cuda"))


def kernels_parts(tmp: Path, mutate: dict[str, tuple[str, str]] | None = None) -> dict[str, Path]:
    """The parts kernels_harness.cpp includes, each cut out of the file the build compiles; mutate maps a part's
    name to (old, new), a textual change that must apply exactly once (the tests that show a broken kernel fail)."""
    fwht = kernel_source("fwht-fused.cu")
    launcher = (
        "template <int N, typename idx_t, typename block_type, int qk, void (*quantize)(const float *, "
        "block_type *)>\nstatic void fwht_set_rows_launch"
    )
    parts = {
        "DEQ_INC": dequantize_x8_part(),
        "QUANT_INC": cut(
            kernel_source("cpy-utils.cuh"),
            "static __device__ __forceinline__ int best_index_int8",
            "static __device__ void cpy_blck_f32_q4_0",
        ),
        "MMVQ_INC": cut(
            kernel_source("mmvq-short.cu"), "#define MMVQ_SHORT_NTHREADS", "bool ggml_cuda_should_use_mmvq_short"
        ),
        "OUTPROD_INC": cut(
            kernel_source("out-prod-q.cu"), "#define OUT_PROD_Q_NTHREADS", "static void out_prod_q_combine_cuda"
        ),
        "FWHT_PARAMS_INC": cut(
            kernel_source("fwht-fused.cuh"), "struct fwht_rope_params", "bool ggml_cuda_rope_fwht_set_rows_supported"
        ),
        "FWHT_INC": cut(fwht, "#define FWHT_FUSED_ROWS", launcher)
        + cut(fwht, "// CONT -> reshape -> fwht", "bool ggml_cuda_cont_fwht_supported"),
    }
    # out-prod-q.cu's part file (its tensor-core kernel), found beside the parts by the cut's #include
    write_part(tmp, "out-prod-q-mma.cuh", for_emulation(kernel_source("out-prod-q-mma.cuh")))
    for name, (old, new) in (mutate or {}).items():
        assert parts[name].count(old) == 1, f"{name}: the mutation's text must occur once"
        parts[name] = parts[name].replace(old, new)
    return {name: write_part(tmp, name.lower() + ".inc", for_emulation(text)) for name, text in parts.items()}


def write_part(tmp: Path, name: str, text: str) -> Path:
    path = tmp / name
    path.write_text(text)
    return path


@dataclass(frozen=True)
class Build:
    """One harness binary: tests/fused_attn_emu/`harness` for `surface`, -D<NAME>="<path>" per incs."""

    tmp: Path
    harness: str
    surface: str
    incs: dict[str, Path]
    extra: tuple[str, ...] = ()
    sanitize: str = "address,undefined"

    @property
    def exe(self) -> Path:
        return self.tmp / f"{Path(self.harness).stem}-{self.surface}-{self.sanitize.replace(',', '-')}"

    @property
    def name(self) -> str:
        """For the compile log: the test's folder (a mutation's name) and the binary's."""
        return f"{self.tmp.name}/{self.exe.name}"

    def compile_command(self) -> tuple[list[str], Path]:
        """The compile (from the checkout's root) and the shared object it makes. Every path in the compile is relative
        to the root and its debug info maps the root to ".", so the command line is the same in every clone of the
        repository: a fresh clone on a machine whose ccache holds these compiles hits it."""
        parts, src = stable_sources(self.incs, ggml_src_dir())
        stable = src.parent.parent
        cmd = [
            compiler(),
            "-std=c++20",
            # ThreadSanitizer's runs are the longest, so at -O2; tests/kernels/test_kernel_emulation_mutations.py
            # checks that a race put back into a kernel is still reported at that level
            "-O2" if self.sanitize == "thread" else "-O1",
            "-g",
            f"-fdebug-prefix-map={ROOT}=.",
            "-pthread",
            f"-fsanitize={self.sanitize}",
            "-I",
            _rel(EMU / "include"),
            "-I",
            _rel(src.parent / "include"),
            "-I",
            _rel(src),
            "-I",
            _rel(EMU),
            "-iquote",
            _rel(stable),
        ]
        if "undefined" in self.sanitize:
            cmd.append("-fno-sanitize-recover=undefined")
        if self.surface == "hip":
            cmd.append("-DGGML_USE_HIP")
        cmd += [f'-D{k}="{v.relative_to(stable)}"' for k, v in parts.items()]  # found through -iquote
        cmd += [*self.extra, "-c", _rel(EMU / self.harness)]
        key = _digest(" ".join(cmd) + _harness_and_compiler())
        return cmd, OBJECTS / f"{Path(self.harness).stem}-{self.surface}-{self.sanitize.replace(',', '-')}-{key}.o"

    def link_command(self, obj: Path) -> list[str]:
        return [compiler(), "-pthread", f"-fsanitize={self.sanitize}", str(obj), "-o", str(self.exe)]


@functools.cache
def _harness_and_compiler() -> str:
    """What decides an object besides its command: the harness's own files (tests/fused_attn_emu, which the command
    names by path) and the compiler (its version names its headers and sanitizer runtimes)."""
    h = hashlib.sha256()
    for f in sorted(EMU.rglob("*")):
        if f.is_file() and "__pycache__" not in f.parts:
            h.update(str(f.relative_to(EMU)).encode() + b"\0" + f.read_bytes() + b"\0")
    cxx = compiler()
    h.update(cxx.encode() + subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.encode())
    return h.hexdigest()


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _digest(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()[:16]


def stable_sources(incs: dict[str, Path], ggml_src: Path) -> tuple[dict[str, Path], Path]:
    """The parts (with the files beside them that they include) and ggml's headers, copied to a folder under
    build/kernel-emu named by their content: the compile command is then the same in every run, so ccache serves a
    harness whose sources did not change (one g++ of a harness is one core for ~40-80 s). Returns the parts' copies
    and the copy of ggml/src (ggml/include beside it)."""
    files = {f"parts/{f.name}": f for d in {p.parent for p in incs.values()} for f in d.iterdir() if f.is_file()}
    files = {k: f for k, f in files.items() if f.suffix in (".inc", ".cuh", ".h")}
    for sub in ("src", "include"):
        files |= {f"ggml/{sub}/{f.name}": f for f in (ggml_src.parent / sub).glob("*.h")}
    data = {k: files[k].read_bytes() for k in sorted(files)}
    out = CACHE / _digest(b"".join(k.encode() + b"\0" + v + b"\0" for k, v in data.items()))
    for k, v in data.items():
        dst = out / k
        if not dst.exists() or dst.read_bytes() != v:
            dst.parent.mkdir(parents=True, exist_ok=True)
            # written whole, then renamed: a compile of another pytest-xdist worker reads the old file or this one
            part = dst.with_name(f".{dst.name}.{os.getpid()}")
            part.write_bytes(v)
            part.replace(dst)
    return {k: out / "parts" / v.name for k, v in incs.items()}, out / "ggml" / "src"


def build(
    tmp: Path,
    harness: str,
    surface: str,
    incs: dict[str, Path],
    extra: tuple[str, ...] = (),
    sanitize: str = "address,undefined",
) -> Path:
    return build_all([Build(tmp, harness, surface, incs, extra, sanitize)])[0]


def build_all(builds: list[Build], link: bool = True) -> list[Path]:
    """The binaries, as many compilers at once as there are CPUs (one g++ of a harness is one core for ~40-80 s; an
    object already in build/kernel-emu/objects is only linked)."""
    width = max(1, min(len(builds), os.cpu_count() or 1))
    _prune()
    commands = [b.compile_command() for b in builds]  # here: stable_sources() writes files, one thread at a time
    with ThreadPoolExecutor(width) as pool:
        list(pool.map(functools.partial(_make, link=link), builds, commands))  # re-raises the first failure
    return [b.exe for b in builds]


def _make(b: Build, command: tuple[list[str], Path], link: bool) -> None:
    cmd, obj = command
    compile_once(b.name, cmd, obj)
    if link:
        r = subprocess.run(b.link_command(obj), capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-6000:]


COMPILE_TIMEOUT_S = 1800  # one harness under TSan at -O2 on a loaded 2-core machine stays well below


def compile_once(name: str, cmd: list[str], obj: Path) -> None:
    """`obj` from `cmd` unless it exists: under the object's lock, so that a second asker (another test file's
    worker, the background prebuild) waits for the compile instead of repeating it."""
    OBJECTS.mkdir(parents=True, exist_ok=True)
    lock_path, pgid_path = obj.with_suffix(".lock"), obj.with_suffix(".pgid")
    t0 = time.monotonic()
    with open(lock_path, "a") as lock:
        while True:  # the lock is released when the file closes
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                # another process compiles it (its own compile ends within COMPILE_TIMEOUT_S, or its process does)
                assert time.monotonic() - t0 < 2 * COMPILE_TIMEOUT_S, f"{obj.name}: its lock was held too long"
                _hurry(pgid_path)  # again each time: the holder may not have started its compile yet
                time.sleep(2)  # polling the lock
        waited = time.monotonic() - t0
        if obj.exists():
            os.utime(obj)  # used: _prune() keeps it
            _log(name, "stored", 0.0, waited)
            return
        part = obj.with_name(f".{obj.name}.{os.getpid()}")
        ccache = [c] if (c := shutil.which("ccache")) else []
        # CCACHE_BASEDIR: ccache leaves the working directory (the root) out of the hash of a -g compile; ccache keys on
        # the inputs, not -o
        script = (
            f"cd {shlex.quote(str(ROOT))} && CCACHE_BASEDIR={shlex.quote(str(ROOT))} "
            f"exec {shlex.join([*ccache, *cmd, '-o', str(part)])}"
        )
        t1 = time.monotonic()
        # its own process group, named in a file: an asker that finds the lock taken raises its priority (_hurry)
        proc = subprocess.Popen(
            ["nice", "-n", "5", "sh", "-c", script],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        pgid_path.write_text(str(proc.pid))
        try:
            _, err = proc.communicate(timeout=COMPILE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        finally:
            pgid_path.unlink(missing_ok=True)
        assert proc.returncode == 0, err[-6000:]
        part.replace(obj)
        _log(name, "compiled", time.monotonic() - t1, waited)


PRUNE_AFTER_S = 2 * 86400


def _prune() -> None:
    """Objects no run used for two days go (each kernel edit makes new ones, ~10 MB each): each under its lock, so
    that none goes while another process compiles or takes it."""
    for obj in OBJECTS.glob("*.o") if OBJECTS.exists() else ():
        try:
            if time.time() - obj.stat().st_mtime < PRUNE_AFTER_S:
                continue
            with open(obj.with_suffix(".lock"), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                obj.unlink()
        except (BlockingIOError, FileNotFoundError):
            pass  # in use, or gone meanwhile


def _hurry(pgid_path: Path) -> None:
    """The compile another process holds the lock for, raised to this process's compile priority (the background
    prebuild runs at nice 10 + 5; a test waits for it). Lowering a nice value needs root (CI's user); else it stays."""
    try:
        pgid = int(pgid_path.read_text())
        mine = os.getpriority(os.PRIO_PROCESS, 0) + 5
        if os.getpriority(os.PRIO_PGRP, pgid) > mine:
            os.setpriority(os.PRIO_PGRP, pgid, mine)
    except (OSError, ValueError):
        pass  # finished meanwhile, or not allowed: the wait is only longer


_WHO = ["test"]  # "background" in the prebuild's process


def _log(name: str, how: str, seconds: float, waited: float) -> None:
    line = f"{name}\t{how}\t{seconds:.0f}\t{waited:.0f}\t{_WHO[0]}\n"
    with open(LOG, "a") as f:
        f.write(line)  # one short write in append mode: lines of concurrent writers stay whole


def emulation_builds() -> list[Build]:
    """Every build the test files' emulation_builds(mktemp) name (test files found by that function, wherever they
    live under tests/), their parts in a temporary folder."""
    tmp = Path(tempfile.mkdtemp(prefix="llama-vq-kernel-emu-"))
    builds: list[Build] = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if "def emulation_builds(" not in path.read_text():
            continue
        for d in (str(path.parent), str(Path(__file__).parent)):
            if d not in sys.path:
                sys.path.insert(0, d)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        builds += module.emulation_builds(_mktemp(tmp / path.stem))
    return builds


def _mktemp(base: Path) -> Callable[[str], Path]:
    """A fresh folder under `base` per call, as pytest's tmp_path_factory.mktemp gives one."""
    count = [0]

    def mktemp(name: str) -> Path:
        count[0] += 1
        d = base / f"{name}{count[0]}"
        d.mkdir(parents=True)
        return d

    return mktemp


_RUN_ENV = {"ASAN_OPTIONS": "detect_leaks=0", "TSAN_OPTIONS": "halt_on_error=1 exitcode=66"}


def run(exe: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["nice", "-n", "5", str(exe), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, **_RUN_ENV),
    )


def run_all(exes: list[Path], timeout: int = 600, stall: int | None = None) -> list[subprocess.CompletedProcess]:
    """The binaries run at once, each as run() runs it: a harness runs its blocks' threads as fibers on one core
    (tests/fused_attn_emu/fibers.h), so two keep 2 cores busy. Output goes to files beside each binary, so that
    neither waits on a pipe that nobody reads.

    `timeout`: seconds for them all. `stall`: a run whose output has not grown for that many seconds is hung (a
    deadlock the emulation did not catch, a loop); set where a harness prints a line per case, so that a run slowed
    by a loaded machine is told from a hang by its progress, not by the wall clock alone."""
    procs = []
    for exe in exes:
        with open(f"{exe}.out", "w") as out, open(f"{exe}.err", "w") as err:
            cmd = ["nice", "-n", "5", str(exe)]
            procs.append(subprocess.Popen(cmd, stdout=out, stderr=err, env=dict(os.environ, **_RUN_ENV)))
    start = time.monotonic()
    grown = {exe: (0, start) for exe in exes}  # output size, and when it last grew
    try:
        while any(p.poll() is None for p in procs):
            now = time.monotonic()
            for proc, exe in zip(procs, exes, strict=True):
                size = Path(f"{exe}.out").stat().st_size
                if size != grown[exe][0]:
                    grown[exe] = (size, now)
                if proc.poll() is None and stall is not None and now - grown[exe][1] > stall:
                    raise AssertionError(
                        f"{exe.name}: no output for {stall} s, a hang; its last lines:\n"
                        + "\n".join(Path(f"{exe}.out").read_text().splitlines()[-5:])
                    )
            if now - start > timeout:
                raise AssertionError(f"{', '.join(e.name for e in exes)}: still running after {timeout} s")
            time.sleep(1)  # polling the runs' progress
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return [
        subprocess.CompletedProcess(p.args, p.returncode, Path(f"{e}.out").read_text(), Path(f"{e}.err").read_text())
        for p, e in zip(procs, exes, strict=True)
    ]


__all__ = [
    "SURFACES",
    "Build",
    "build",
    "build_all",
    "compile_once",
    "emulation_builds",
    "cut",
    "dequantize_x8_part",
    "for_emulation",
    "kernel_path",
    "kernel_source",
    "kernels_parts",
    "require_sources",
    "run",
    "run_all",
    "write_part",
]


if __name__ == "__main__":
    # scripts/run.sh test: `nice -n 10 python tests/support/kernel_emu_support.py prebuild`, in the background
    if sys.argv[1:] != ["prebuild"]:
        sys.exit("usage: python tests/support/kernel_emu_support.py prebuild")
    _WHO[0] = "background"
    try:
        found = emulation_builds()
        build_all(found, link=False)
    except BaseException as e:  # pytest.skip's exception too (no sources, no compiler): the tests say it again
        sys.exit(f"llama-vq: the kernel emulations' background build stopped: {type(e).__name__}: {e}")
    print(f"llama-vq: the kernel emulations' {len(found)} objects are built", file=sys.stderr)
