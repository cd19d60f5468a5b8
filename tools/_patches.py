"""The core of llama-vq's changes to the pristine vendor/llama.cpp: our own source files (native/, placed by
NATIVE_MAP) and the patch queue (patches/, DEP-3 headers, quilt's `series`) applied to a copy of the tree.
The command line is tools/patches.py; the queue as a git branch is _patch_queue.py, its rules _lint.py.

Export order: (1) copy the pristine tree, (2) place our sources (NATIVE_MAP), (3) apply the series. A patch that
does not apply stops everything with its name. The pristine tree is never modified.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from _pin import PATCHES, ROOT, STAMP_NAME, VENDOR, read_pin, read_series

# Our own source files and where the export places them in the llama.cpp tree: native/<key>/X -> <value>/X,
# sub-folders kept, file names unchanged (tests and tools read a kernel from native/ by its exported name).
# The only place this mapping is written down (docs/patches.md points here). ggml-cuda and ggml-hip compile
# every *.cu of ggml/src/ggml-cuda by glob: a new kernel file needs no CMake change.
NATIVE_MAP = {
    "native/ggml/ggml-cuda": "ggml/src/ggml-cuda",
    "native/ggml/ggml-cpu": "ggml/src/ggml-cpu",
    "native/ggml/tests": "tests",
    "native/llama/src": "src",
}

# Parts of the upstream tree that no build of ours reads; left out of build-tree copies and of the queue.
SKIP_DIRS = {
    ".git",
    ".github",
    ".devops",
    "models",
    "docs",
    "media",
    "benches",
    "app",
    "skills",
    "gguf-py",
    "conversion",
    "pocs",
    "requirements",
    "licenses",
    "grammars",
    "ci",
}
DEFAULT_DEV = ROOT / ".dev" / "llama.cpp"
STAMP_EXPORT = ".llama-vq-series"


class PatchError(RuntimeError):
    pass


def require_vendor() -> None:
    pin = read_pin()
    stamp = VENDOR / STAMP_NAME
    if not stamp.exists() or stamp.read_text() != pin.stamp:
        raise PatchError("vendor/llama.cpp is missing or not the pinned tree. Fix: run `python tools/vendor.py fetch`.")


def copy_pristine(dest: Path, src: Path = VENDOR) -> None:
    """src (a pristine llama.cpp tree) into dest, without SKIP_DIRS at its top."""

    def ignore(directory: str, names: list[str]) -> set[str]:
        return (SKIP_DIRS if Path(directory) == src else {".git"}) & set(names)

    shutil.copytree(src, dest, ignore=ignore, symlinks=True)


def native_files(root: Path = ROOT) -> dict[str, Path]:
    """Tree-relative path -> our source file, for every file under NATIVE_MAP's folders."""
    out: dict[str, Path] = {}
    for ours, theirs in NATIVE_MAP.items():
        base = root / ours
        if not base.is_dir():
            continue
        for p in sorted(base.rglob("*")):
            if p.is_file():
                out[f"{theirs}/{p.relative_to(base).as_posix()}"] = p
    return out


def tree_path_to_native(rel: str) -> str | None:
    """ggml/src/ggml-cuda/X -> native/ggml/ggml-cuda/X (None outside NATIVE_MAP's folders)."""
    for ours, theirs in NATIVE_MAP.items():
        if rel.startswith(theirs + "/"):
            return f"{ours}/{rel[len(theirs) + 1 :]}"
    return None


def place_native(tree: Path, root: Path = ROOT) -> list[str]:
    """Copy our sources into tree; an upstream file of the same path is an error (patches change those)."""
    placed = []
    for rel, src in native_files(root).items():
        dest = tree / rel
        if dest.exists():
            raise PatchError(
                f"{src.relative_to(root)} would replace llama.cpp's own {rel}. "
                "Fix: give our file another name, or change upstream's file with a patch."
            )
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
        placed.append(rel)
    return placed


def apply_one(tree: Path, patch: Path) -> None:
    """Apply one -p1 patch with no fuzz; raise PatchError naming it when it does not apply."""
    if not patch.exists():
        raise PatchError(f"patch {patch.name} is listed in patches/series but patches/{patch.name} is missing")
    # GIT_DIR points nowhere so that `git apply` never looks at an enclosing repository.
    env = dict(os.environ, GIT_DIR=str(tree / ".no-git"), GIT_CEILING_DIRECTORIES=str(tree.parent))
    proc = subprocess.run(
        ["git", "apply", "-p1", "--whitespace=nowarn", str(patch)], cwd=tree, capture_output=True, text=True, env=env
    )
    if proc.returncode != 0:
        raise PatchError(
            f"patch {patch.name} does not apply to the pinned llama.cpp:\n"
            f"{(proc.stdout + proc.stderr).strip()}\n"
            "Fix: `python tools/patches.py import`, repair it there (git rebase -i), then `write`."
        )


def series_digest() -> str:
    h = hashlib.sha256(read_pin().stamp.encode())
    for rel, src in native_files().items():
        h.update(b"native\0" + rel.encode() + b"\0" + src.read_bytes())
    for name in read_series():
        h.update(name.encode())
        h.update((PATCHES / name).read_bytes())
    return h.hexdigest()


def tree_digest(tree: Path) -> str:
    """sha256 over every file of tree (path and content, sorted by path; a symlink by its target), without
    export's stamp: two exports with the same digest are the same tree, byte for byte."""
    h = hashlib.sha256()
    files = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_file() or p.is_symlink())
    for rel in files:
        if rel == STAMP_EXPORT:
            continue
        p = tree / rel
        data = os.readlink(p).encode() if p.is_symlink() else p.read_bytes()
        h.update(rel.encode() + b"\0" + hashlib.sha256(data).hexdigest().encode() + b"\n")
    return h.hexdigest()


def build_tree(dest: Path) -> list[str]:
    """Pristine copy + our sources + series in dest (which must not exist)."""
    copy_pristine(dest)
    place_native(dest)
    names = read_series()
    for name in names:
        apply_one(dest, PATCHES / name)
    return names


def export(dest: Path) -> list[str]:
    """The build-tree copy in dest; reuses dest unchanged when pin, sources and series are the same."""
    require_vendor()
    digest = series_digest()
    stamp = dest / STAMP_EXPORT
    if stamp.exists() and stamp.read_text() == digest:
        return read_series()
    tmp = dest.parent / (dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    names = build_tree(tmp)
    (tmp / STAMP_EXPORT).write_text(digest)
    if dest.exists():
        _sync(tmp, dest)
        shutil.rmtree(tmp)
    else:
        tmp.rename(dest)
    return names


def _sync(src: Path, dest: Path) -> None:
    """Make dest equal to src, touching only files whose content changed (keeps incremental builds)."""
    src_files = {p.relative_to(src) for p in src.rglob("*") if p.is_file() or p.is_symlink()}
    dest_files = {p.relative_to(dest) for p in dest.rglob("*") if p.is_file() or p.is_symlink()}
    for rel in dest_files - src_files:
        (dest / rel).unlink()
    for rel in src_files:
        s, d = src / rel, dest / rel
        if d.exists() and not d.is_symlink() and not s.is_symlink() and d.read_bytes() == s.read_bytes():
            continue
        d.parent.mkdir(parents=True, exist_ok=True)
        if d.exists() or d.is_symlink():
            d.unlink()
        shutil.copy2(s, d, follow_symlinks=False)


def check() -> list[str]:
    require_vendor()
    with tempfile.TemporaryDirectory() as tmp:
        return build_tree(Path(tmp) / "llama.cpp")


def header(patch: Path) -> str:
    """The DEP-3 header: every line before the `---` line that ends it (or before the diff)."""
    lines = []
    for line in patch.read_text().splitlines(keepends=True):
        if line.rstrip("\n") == "---" or line.startswith("diff --git ") or line.startswith("--- "):
            break
        lines.append(line)
    return "".join(lines)
