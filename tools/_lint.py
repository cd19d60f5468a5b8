"""The patch queue's rules (docs/patches.md), checked by `patches.py lint` and tests/repo/test_patch_queue.py.

Without the pristine tree:   names, numeric order, DEP-3 headers of at most MAX_HEADER_LINES lines, no patch
                             creates or deletes a file, no patch touches a file of ours (native/).
With it (lint_tree):         no patch changes a line that an earlier patch added (fold the change into that
                             patch instead), every hunk applies where it says, and import + write gives back
                             patches/ and native/ byte for byte.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import _patch_queue
import _patches as core
from _pin import ROOT, read_series

MAX_HEADER_LINES = 20
FIELDS = ("Description:", "Author:", "Forwarded:", "Last-Update:")
FORWARDED = re.compile(r"^Forwarded: (no|not-needed|https?://\S+)\s*$")
HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def parse(text: str) -> list[tuple[str, str, str, list[tuple[int, int, list[str]]]]]:
    """(old path, new path, the file's extended header, hunks (old start, new start, lines)) per file."""
    files = []
    cur = None
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("diff --git "):
            cur = ["", "", "", []]
            files.append(cur)
        elif cur is not None and line.startswith("--- ") and not cur[3]:
            cur[0] = line[4:].removeprefix("a/")
        elif cur is not None and line.startswith("+++ ") and not cur[3]:
            cur[1] = line[4:].removeprefix("b/")
        elif cur is not None and (m := HUNK.match(line)):
            body = []
            old_n = 1 if m.group(2) is None else int(m.group(2))
            new_n = 1 if m.group(4) is None else int(m.group(4))
            while (old_n > 0 or new_n > 0) and i + 1 < len(lines):
                i += 1
                b = lines[i]
                if b.startswith("\\"):
                    continue
                body.append(b)
                if b[:1] in (" ", "-", ""):
                    old_n -= 1
                if b[:1] in (" ", "+", ""):
                    new_n -= 1
            cur[3].append((int(m.group(1)), int(m.group(3)), body))
        elif cur is not None and not cur[3]:
            cur[2] += line + "\n"
        i += 1
    return [tuple(f) for f in files]


def lint_static(root: Path = ROOT) -> list[str]:
    problems = []
    pdir = root / "patches"
    names = read_series(pdir / "series")
    numbers = []
    for name in names:
        m = _patch_queue.NAME_RE.match(name)
        if not m:
            problems.append(f"{name}: not a patch name (NNNN-what-it-does.patch)")
            continue
        numbers.append(int(m.group(1)))
    if numbers != sorted(set(numbers)):
        problems.append("series: not in numeric order (or a number twice)")
    listed = set(names)
    for p in sorted(pdir.glob("*.patch")):
        if p.name not in listed:
            problems.append(f"{p.name}: in patches/ but not in series")
    ours = set(core.native_files(root))
    for name in names:
        path = pdir / name
        if not path.exists():
            problems.append(f"{name}: listed in series, missing")
            continue
        header = core.header(path)
        n = header.count("\n")
        if n > MAX_HEADER_LINES:
            problems.append(
                f"{name}: header of {n} lines (at most {MAX_HEADER_LINES}: measurements and history go to benchmarks/)"
            )
        for field in FIELDS:
            if not any(line.startswith(field) for line in header.splitlines()):
                problems.append(f"{name}: header lacks {field}")
        fwd = [line for line in header.splitlines() if line.startswith("Forwarded:")]
        if fwd and not FORWARDED.match(fwd[0]):
            problems.append(f"{name}: `{fwd[0]}`: Forwarded is no, not-needed or a URL")
        for old, new, ext, _ in parse(path.read_text()):
            if old == "/dev/null" or "new file mode" in ext:
                problems.append(
                    f"{name}: creates {new}: a new file of ours lives in native/ (_patches.NATIVE_MAP), not in a patch"
                )
            if new == "/dev/null" or "deleted file mode" in ext:
                problems.append(f"{name}: deletes {old}")
            for path_ in {old, new} & ours:
                problems.append(
                    f"{name}: changes {path_}, a file of ours: edit {core.tree_path_to_native(path_)} instead"
                )
    return problems


def provenance(root: Path = ROOT, base: Path | None = None) -> list[str]:
    """Walk the series over the files it changes (from base, default the pristine tree), each line tagged with the
    patch that added it (None: upstream); a `-` line tagged with a patch is a problem."""
    problems = []
    base = core.VENDOR if base is None else base
    ours = core.native_files(root)
    state: dict[str, tuple[list[str], list[str | None]]] = {}
    for name in read_series(root / "patches" / "series"):
        for old, new, _, hunks in parse((root / "patches" / name).read_text()):
            if old == "/dev/null" or new == "/dev/null":
                continue
            if old not in state:
                src = ours.get(old, base / old)
                text = src.read_text().splitlines() if src.exists() else []
                state[old] = (text, [None] * len(text))
            lines, tags = state[old]
            out_l, out_t, pos = [], [], 0
            for start, _, body in hunks:
                at = max(start - 1, 0) if any(b[:1] in (" ", "-", "") for b in body) else start
                out_l += lines[pos:at]
                out_t += tags[pos:at]
                pos = at
                for b in body:
                    kind, text = (b[:1] or " "), b[1:]
                    if kind in (" ", "-"):
                        if pos >= len(lines) or lines[pos] != text:
                            problems.append(
                                f"{name}: {old}: a hunk does not match line {pos + 1} where it says "
                                "(rewrite the queue: import, write)"
                            )
                            return problems
                        if kind == "-" and tags[pos] is not None:
                            problems.append(
                                f"{name}: changes line {pos + 1} of {old}, which {tags[pos]} added: "
                                f"fold the change into {tags[pos]}"
                            )
                        if kind == " ":
                            out_l.append(text)
                            out_t.append(tags[pos])
                        pos += 1
                    else:
                        out_l.append(text)
                        out_t.append(name)
            out_l += lines[pos:]
            out_t += tags[pos:]
            state[new] = (out_l, out_t)
    return problems


def lint_tree(root: Path = ROOT) -> list[str]:
    """The rules that need the pristine tree (vendor/llama.cpp)."""
    core.require_vendor()
    problems = []
    problems += provenance(root)
    with tempfile.TemporaryDirectory() as tmp:
        problems += round_trip(root, Path(tmp))
    return problems


def round_trip(root: Path, tmp: Path) -> list[str]:
    """import + write into a copy: patches/ and native/ must come back byte for byte."""
    dev = tmp / "queue"
    out = tmp / "out"
    (out / "patches").mkdir(parents=True)
    _patch_queue.import_queue(dev, root)
    _patch_queue.write_queue(dev, out)
    problems = []
    for p in sorted(
        set((root / "patches").iterdir()) | {out / "patches" / q.name for q in (out / "patches").iterdir()}
    ):
        a, b = root / "patches" / p.name, out / "patches" / p.name
        if not a.exists() or not b.exists() or a.read_bytes() != b.read_bytes():
            problems.append(
                f"{p.name}: import + write does not reproduce it (write the queue with "
                "`patches.py write`, never by hand)"
            )
    mine = {rel: src.read_bytes() for rel, src in core.native_files(root).items()}
    back = {rel: src.read_bytes() for rel, src in core.native_files(out).items()}
    if mine != back:
        problems.append("native/: import + write does not reproduce it")
    return problems


def lint(root: Path = ROOT) -> list[str]:
    problems = lint_static(root)
    if not problems:
        problems += lint_tree(root)
    return problems
