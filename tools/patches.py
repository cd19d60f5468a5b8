#!/usr/bin/env python3
"""llama-vq's changes to the pristine vendor/llama.cpp: our own source files (native/) and a patch queue
(patches/, DEP-3 headers, quilt's `series`). docs/patches.md has the workflow.

    python tools/patches.py export DEST      # build-tree copy (CMake): pristine + native sources + series
    python tools/patches.py check            # the same in a temporary directory: does the series apply?
    python tools/patches.py import [--dir D] # the queue as a git branch in D (default .dev/llama.cpp)
    python tools/patches.py write [--dir D]  # write the branch back: patches/, series, native/
    python tools/patches.py rebase NEW [--dir D] | --continue
                                             # move the branch onto another pristine llama.cpp tree (git rebase)
    python tools/patches.py lint             # the queue's rules (docs/patches.md); the test suite runs it
    python tools/patches.py digest DIR       # sha256 of a tree: every file's path and content, sorted

The command line only: the work is in _patches.py (export, check, digest), _patch_queue.py (import, write,
rebase) and _lint.py (lint).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _lint  # noqa: E402
import _patch_queue  # noqa: E402
from _patches import DEFAULT_DEV, PatchError, check, export, tree_digest  # noqa: E402
from _pin import read_series  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("check")
    e = sub.add_parser("export")
    e.add_argument("dest", type=Path)
    for verb in ("import", "write"):
        sub.add_parser(verb).add_argument("--dir", type=Path, default=DEFAULT_DEV)
    r = sub.add_parser("rebase")
    r.add_argument("new", type=Path, nargs="?", help="a pristine llama.cpp tree (e.g. another sdist's vendor/)")
    r.add_argument("--continue", dest="cont", action="store_true")
    r.add_argument("--dir", type=Path, default=DEFAULT_DEV)
    sub.add_parser("lint")
    d = sub.add_parser("digest")
    d.add_argument("tree", type=Path)
    args = ap.parse_args(argv)
    try:
        if args.command == "check":
            names = check()
            print(f"series applies cleanly: {len(names)} patch(es)")
            for n in names:
                print(f"  {n}")
        elif args.command == "export":
            names = export(args.dest.resolve())
            print(f"patched tree at {args.dest} ({len(names)} patch(es))")
        elif args.command == "import":
            _patch_queue.import_queue(args.dir.resolve())
        elif args.command == "write":
            _patch_queue.write_queue(args.dir.resolve())
        elif args.command == "rebase":
            _patch_queue.rebase(args.dir.resolve(), args.new.resolve() if args.new else None, args.cont)
        elif args.command == "lint":
            problems = _lint.lint()
            for p in problems:
                print(p)
            print(f"lint: {len(problems)} problem(s) in {len(read_series())} patch(es)")
            return 1 if problems else 0
        elif args.command == "digest":
            print(tree_digest(args.tree))
    except PatchError as err:
        print(f"llama-vq: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
