#!/usr/bin/env python3
"""Fill vendor/llama.cpp with the pristine llama.cpp pinned in pyproject.toml, and vendor/llama_cpp_python with
the same release's Python bindings (its `llama_cpp` package and license), which llama-vq's wheel ships.

Both come from the llama-cpp-python sdist named by the pin, obtained with pip (so it honours the user's index
configuration) and checked against the pinned sha256 before anything is extracted.

    python tools/vendor.py fetch      # no-op when the pinned trees are already there
    python tools/vendor.py status     # print what is there
    python tools/vendor.py sdist      # print the path of the pinned sdist (fetched when missing)

Progress goes to stderr; stdout carries only what a command prints as its result (sdist: one path).

Exit status 0 on success; 1 with a message that says what to do otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _pin import BINDINGS, ROOT, STAMP_NAME, VENDOR, Pin, read_pin  # noqa: E402


def _load_fetch():
    """llama_vq/_fetch.py, the package's fetch-and-verify cache, by path: the package is not built (or importable)
    yet when this runs, and that module imports nothing of it."""
    spec = importlib.util.spec_from_file_location("llama_vq_fetch", ROOT / "llama_vq" / "_fetch.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_fetch = _load_fetch()
_sha256 = _fetch.sha256


class VendorError(RuntimeError):
    pass


def is_current(pin: Pin, vendor: Path = VENDOR) -> bool:
    stamp = vendor / STAMP_NAME
    return stamp.exists() and stamp.read_text() == pin.stamp and (vendor / "CMakeLists.txt").exists()


def sdist_path(pin: Pin) -> Path:
    """Return the pinned sdist, downloading it with pip into the cache when missing."""
    cache = _fetch.cache_dir("sdist")
    name = f"llama_cpp_python-{pin.llama_cpp_python}.tar.gz"
    path = cache / name
    if path.exists() and _sha256(path) == pin.sdist_sha256:
        return path
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        print(f"llama-vq: fetching llama-cpp-python=={pin.llama_cpp_python} sdist with pip", file=sys.stderr)
        try:
            (got,) = _fetch.pip_download(
                [(f"llama-cpp-python=={pin.llama_cpp_python}", pin.sdist_sha256)], Path(tmp), binary=False
            )
        except _fetch.FetchError as e:
            raise VendorError(
                f"{e}\nFix: check network access to your package index, or place the file {name} "
                f"(sha256 {pin.sdist_sha256}) in {cache} and run again. A different file from the index: make sure "
                "it serves the genuine release, or update the pin deliberately (docs/build.md, bumping the pin)."
            ) from None
        shutil.move(str(got), path)
    return path


def _bindings_members(pin: Pin) -> tuple[str, ...]:
    """What of the sdist goes into vendor/llama_cpp_python: the bindings package and its license. Left out:
    llama_cpp/server (llama-cpp-python's own server, whose extra dependencies we do not declare: llama-vq-server
    replaces it)."""
    top = f"llama_cpp_python-{pin.llama_cpp_python}/"
    return (top + "llama_cpp/", top + "LICENSE.md")


def _is_binding_member(name: str, pin: Pin) -> bool:
    pkg, lic = _bindings_members(pin)
    if name == lic:
        return True
    return name.startswith(pkg) and not name.startswith(pkg + "server/") and "__pycache__" not in name


def extract(pin: Pin, sdist: Path, vendor: Path = VENDOR) -> None:
    digest = _sha256(sdist)
    if digest != pin.sdist_sha256:
        raise VendorError(f"{sdist} has sha256 {digest}, expected {pin.sdist_sha256}. Delete it and run again.")
    prefix = f"llama_cpp_python-{pin.llama_cpp_python}/vendor/llama.cpp/"
    vendor.parent.mkdir(parents=True, exist_ok=True)
    # fetches hold the lock one at a time (fetch()): a staging directory seen now is an interrupted fetch's
    for stale in vendor.parent.glob(vendor.name + ".partial*"):
        shutil.rmtree(stale, ignore_errors=True)
    # a staging directory of our own: even a fetch the lock does not cover never shares it
    staging = Path(tempfile.mkdtemp(prefix=vendor.name + ".partial-", dir=vendor.parent))
    try:
        n = _extract_into(sdist, prefix, staging)
        (staging / STAMP_NAME).write_text(pin.stamp)
        if is_current(pin, vendor):  # another fetch finished first: keep its tree
            return
        shutil.rmtree(vendor, ignore_errors=True)
        staging.rename(vendor)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"llama-vq: vendor/llama.cpp filled ({n} entries, llama.cpp {pin.llama_cpp_commit[:10]})", file=sys.stderr)


def extract_bindings(pin: Pin, sdist: Path, dest: Path = BINDINGS) -> None:
    """vendor/llama_cpp_python/{llama_cpp/, LICENSE.md} from the pinned sdist, stamped like vendor/llama.cpp."""
    digest = _sha256(sdist)
    if digest != pin.sdist_sha256:
        raise VendorError(f"{sdist} has sha256 {digest}, expected {pin.sdist_sha256}. Delete it and run again.")
    prefix = f"llama_cpp_python-{pin.llama_cpp_python}/"
    dest.parent.mkdir(parents=True, exist_ok=True)
    for stale in dest.parent.glob(dest.name + ".partial*"):  # an interrupted fetch's (fetches hold the lock)
        shutil.rmtree(stale, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=dest.name + ".partial-", dir=dest.parent))
    try:
        n = _extract_into(sdist, prefix, staging, keep=lambda name: _is_binding_member(name, pin))
        if not (staging / "llama_cpp" / "llama_cpp.py").exists():
            raise VendorError(f"{sdist} holds no {prefix}llama_cpp/llama_cpp.py: not the expected sdist")
        (staging / STAMP_NAME).write_text(pin.stamp)
        if bindings_current(pin, dest):
            return
        shutil.rmtree(dest, ignore_errors=True)
        staging.rename(dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"llama-vq: vendor/llama_cpp_python filled ({n} entries, bindings {pin.llama_cpp_python})", file=sys.stderr)


def bindings_current(pin: Pin, dest: Path = BINDINGS) -> bool:
    stamp = dest / STAMP_NAME
    return stamp.exists() and stamp.read_text() == pin.stamp and (dest / "llama_cpp" / "llama_cpp.py").exists()


def _extract_into(sdist: Path, prefix: str, staging: Path, keep: Callable[[str], bool] | None = None) -> int:
    with tarfile.open(sdist, "r:gz") as tar:
        members = []
        for m in tar.getmembers():
            if not m.name.startswith(prefix) or m.name == prefix.rstrip("/"):
                continue
            if keep is not None and not keep(m.name):
                continue
            rel = m.name[len(prefix) :]
            if rel == ".git" or rel.startswith(".git/"):
                continue  # a gitlink into the sdist's own .git; meaningless here
            m.name = rel
            members.append(m)
        if not members:
            raise VendorError(f"{sdist} holds no {prefix}: not the expected llama-cpp-python sdist")
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(staging, members=members, **kwargs)
        return len(members)


@contextlib.contextmanager
def _fetch_lock(vendor: Path):
    """Serialize fetches of one checkout (two builds started at once): an advisory lock next to vendor/."""
    vendor.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # no flock (Windows): unique staging directories still keep fetches apart
        yield
        return
    with open(vendor.parent / (vendor.name + ".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def fetch(vendor: Path = VENDOR, bindings: Path = BINDINGS) -> Path:
    pin = read_pin()
    if is_current(pin, vendor) and bindings_current(pin, bindings):
        return vendor
    with _fetch_lock(vendor):
        if not is_current(pin, vendor):  # else filled by a fetch that held the lock before us
            if (vendor / "CMakeLists.txt").exists() and not (vendor / STAMP_NAME).exists():
                raise VendorError(
                    f"{vendor} exists but carries no pin stamp ({STAMP_NAME}); it may be hand-edited. "
                    "Fix: delete it and run `python tools/vendor.py fetch` to get the pristine pinned tree."
                )
            extract(pin, sdist_path(pin), vendor)
        if not bindings_current(pin, bindings):
            extract_bindings(pin, sdist_path(pin), bindings)
    return vendor


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["fetch", "status", "sdist"])
    args = ap.parse_args(argv)
    try:
        if args.command == "fetch":
            fetch()
        elif args.command == "sdist":
            print(sdist_path(read_pin()))
        else:
            pin = read_pin()
            print(f"pin: llama-cpp-python=={pin.llama_cpp_python} llama.cpp {pin.llama_cpp_commit}")
            print(f"vendor/llama.cpp: {'current' if is_current(pin) else 'missing or stale'}")
            print(f"vendor/llama_cpp_python: {'current' if bindings_current(pin) else 'missing or stale'}")
    except VendorError as e:
        print(f"llama-vq: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
