#!/usr/bin/env python3
"""Manage llama-vq's patch series against the pristine vendor/llama.cpp (quilt-like, DEP-3 headers).

    python tools/patches.py check                 # the series applies cleanly to the pristine tree
    python tools/patches.py apply [--dir D]       # working copy in D (default .dev/llama.cpp), a git
                                                  # repo with one commit per patch, for development
    python tools/patches.py refresh NAME [--dir D]
                                                  # regenerate patch NAME from the working copy: NAME
                                                  # must be the topmost patch, or a new name (appended
                                                  # to the series with a DEP-3 header to fill in)
    python tools/patches.py export DEST           # build-tree copy: pristine + series (used by CMake)

A patch that does not apply stops everything with its name and the tool's message. The pristine
tree is never modified.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _pin import PATCHES, ROOT, SERIES, STAMP_NAME, VENDOR, read_pin, read_series  # noqa: E402

# Parts of the upstream tree that no build of ours reads; left out of build-tree copies.
SKIP_DIRS = {".git", ".github", ".devops", "models", "docs", "media", "benches", "app", "skills", "gguf-py",
             "conversion", "pocs", "requirements", "licenses", "grammars", "ci"}
DEFAULT_DEV = ROOT / ".dev" / "llama.cpp"


class PatchError(RuntimeError):
    pass


def _run(cmd: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise PatchError(f"`{' '.join(cmd)}` failed in {cwd}:\n{proc.stdout}{proc.stderr}")
    return proc


def _require_vendor() -> None:
    pin = read_pin()
    stamp = VENDOR / STAMP_NAME
    if not stamp.exists() or stamp.read_text() != pin.stamp:
        raise PatchError("vendor/llama.cpp is missing or not the pinned tree. "
                         "Fix: run `python tools/vendor.py fetch`.")


def _copy_tree(dest: Path, full: bool = False) -> None:
    def ignore(directory: str, names: list[str]) -> set[str]:
        if full or Path(directory) != VENDOR:
            return {".git"} & set(names)
        return SKIP_DIRS & set(names)

    shutil.copytree(VENDOR, dest, ignore=ignore, symlinks=True)


def _apply_one(tree: Path, patch: Path) -> None:
    """Apply one -p1 patch with no fuzz; raise PatchError naming it when it does not apply."""
    if not patch.exists():
        raise PatchError(f"patch {patch.name} is listed in patches/series but patches/{patch.name} is missing")
    git = shutil.which("git")
    if git:
        cmd = [git, "apply", "-p1", "--whitespace=nowarn", str(patch)]
        env_dir = tree
    else:
        cmd = ["patch", "-p1", "--batch", "--forward", "--fuzz=0", "-i", str(patch)]
        env_dir = tree
    # GIT_DIR points nowhere so that `git apply` never looks at an enclosing repository.
    env = dict(os.environ, GIT_DIR=str(tree / ".no-git"), GIT_CEILING_DIRECTORIES=str(tree.parent))
    proc = subprocess.run(cmd, cwd=env_dir, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise PatchError(f"patch {patch.name} does not apply to the pinned llama.cpp:\n"
                         f"{(proc.stdout + proc.stderr).strip()}\n"
                         f"Fix: rebase it with `python tools/patches.py apply` and `refresh {patch.name}`.")


def series_digest() -> str:
    h = hashlib.sha256(read_pin().stamp.encode())
    for name in read_series():
        h.update(name.encode())
        h.update((PATCHES / name).read_bytes())
    return h.hexdigest()


def export(dest: Path) -> list[str]:
    """Pristine copy + series in dest; reuses dest unchanged when pin and series are the same."""
    _require_vendor()
    digest = series_digest()
    stamp = dest / ".llama-vq-series"
    if stamp.exists() and stamp.read_text() == digest:
        return read_series()
    tmp = dest.parent / (dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    _copy_tree(tmp)
    names = read_series()
    for name in names:
        _apply_one(tmp, PATCHES / name)
    stamp_tmp = tmp / ".llama-vq-series"
    stamp_tmp.write_text(digest)
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
    _require_vendor()
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "llama.cpp"
        _copy_tree(tree)
        names = read_series()
        for name in names:
            _apply_one(tree, PATCHES / name)
    return names


def _git(tree: Path, *args: str) -> str:
    env_args = ["-c", "user.name=llama-vq", "-c", "user.email=llama-vq@localhost", "-c", "core.autocrlf=false"]
    return _run(["git", *env_args, *args], cwd=tree).stdout


def apply(dev: Path) -> None:
    _require_vendor()
    if dev.exists():
        raise PatchError(f"{dev} exists. Refresh what you need from it, then delete it and run apply again.")
    dev.parent.mkdir(parents=True, exist_ok=True)
    _copy_tree(dev, full=True)
    _git(dev, "init", "-q")
    _git(dev, "add", "-A")
    _git(dev, "commit", "-q", "-m", "pristine")
    for name in read_series():
        _apply_one(dev, PATCHES / name)
        _git(dev, "add", "-A")
        _git(dev, "commit", "-q", "--allow-empty", "-m", name)
    print(f"working copy at {dev}: pristine + {len(read_series())} patch(es), one commit each")


def _header(patch: Path) -> str:
    lines = []
    for line in patch.read_text().splitlines(keepends=True):
        if line.startswith("diff --git ") or line.startswith("--- "):
            break
        lines.append(line)
    return "".join(lines)


def _touch_last_update(header: str) -> str:
    today = datetime.date.today().isoformat()
    out = []
    for line in header.splitlines(keepends=True):
        out.append(f"Last-Update: {today}\n" if line.startswith("Last-Update:") else line)
    return "".join(out)


def refresh(name: str, dev: Path) -> None:
    if not dev.exists():
        raise PatchError(f"no working copy at {dev}: run `python tools/patches.py apply` first")
    names = read_series()
    log = _git(dev, "log", "--format=%s").split("\n")
    top = log[0].strip()
    if name in names:
        if top != name:
            raise PatchError(f"{name} is not the topmost applied patch ({top}); refresh works on the top one. "
                             "Fix: move your change into a new patch, or reorder the series by hand.")
        base = "HEAD~1"
    else:
        base = "HEAD"
    _git(dev, "add", "-A")
    diff = _git(dev, "diff", "--cached", "--no-color", "--no-ext-diff", "--src-prefix=a/", "--dst-prefix=b/",
                base)
    if not diff.strip():
        raise PatchError(f"no changes for {name} in {dev}")
    path = PATCHES / name
    if path.exists():
        header = _touch_last_update(_header(path))
    else:
        header = (f"Description: <what and why, a few lines>\nAuthor: llama-vq developers\n"
                  f"Forwarded: not-needed\nLast-Update: {datetime.date.today().isoformat()}\n---\n")
    path.write_text(header + diff)
    if name not in names:
        with SERIES.open("a") as f:
            f.write(name + "\n")
        _git(dev, "commit", "-q", "-m", name)
    else:
        _git(dev, "commit", "-q", "--amend", "-m", name)
    print(f"refreshed patches/{name}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("check")
    a = sub.add_parser("apply")
    a.add_argument("--dir", type=Path, default=DEFAULT_DEV)
    r = sub.add_parser("refresh")
    r.add_argument("name")
    r.add_argument("--dir", type=Path, default=DEFAULT_DEV)
    e = sub.add_parser("export")
    e.add_argument("dest", type=Path)
    args = ap.parse_args(argv)
    try:
        if args.command == "check":
            names = check()
            print(f"series applies cleanly: {len(names)} patch(es)")
            for n in names:
                print(f"  {n}")
        elif args.command == "apply":
            apply(args.dir.resolve())
        elif args.command == "refresh":
            refresh(args.name, args.dir.resolve())
        elif args.command == "export":
            names = export(args.dest.resolve())
            print(f"patched tree at {args.dest} ({len(names)} patch(es))")
    except PatchError as e:
        print(f"llama-vq: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
