"""The patch queue as a git branch (Debian's gbp-pq, Ollama's patch workflow): import, write back, rebase.

Branch layout in the queue repository (default .dev/llama.cpp, git-ignored):

    upstream            the pristine llama.cpp tree (what export copies; SKIP_DIRS left out)
    queue = upstream + "llama-vq sources"      our native/ files at their tree paths (_patches.NATIVE_MAP)
                     + one commit per patch    subject: the patch's file name; body: its DEP-3 header

Edit with ordinary git (commit --fixup + rebase -i --autosquash, reword, reorder, edit our sources in the
sources commit), then `write`: every patch, `series` and native/ are rewritten from the branch. A patch file
is its header, a `---` line and `git diff` of its commit, so import + write is the identity.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

import _patches as core
from _pin import ROOT, read_series

SOURCES_SUBJECT = "llama-vq sources"
NAME_RE = re.compile(r"^(\d{4})-[a-z0-9][a-z0-9._-]*\.patch$")
# every setting that shapes `git diff`'s text, fixed here rather than read from the user's configuration
DIFF_ARGS = [
    "diff",
    "--no-color",
    "--no-ext-diff",
    "--no-textconv",
    "--no-renames",
    "--unified=3",
    "--diff-algorithm=myers",
    "--indent-heuristic",
    "--abbrev=12",
    "--src-prefix=a/",
    "--dst-prefix=b/",
]
GIT_CONFIG = [
    "-c",
    "user.name=llama-vq developers",
    "-c",
    "user.email=llama-vq@localhost",
    "-c",
    "core.autocrlf=false",
    "-c",
    "commit.gpgsign=false",
    "-c",
    "core.quotePath=true",
    "-c",
    "diff.noprefix=false",
    "-c",
    "diff.mnemonicPrefix=false",
    "-c",
    "advice.detachedHead=false",
]


def git(repo: Path, *args: str, check: bool = True, env: dict | None = None) -> str:
    full_env = dict(os.environ, GIT_EDITOR="true", GIT_CEILING_DIRECTORIES=str(repo.parent), **(env or {}))
    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        if env is None or var not in env:
            full_env.pop(var, None)
    proc = subprocess.run(["git", *GIT_CONFIG, *args], cwd=repo, capture_output=True, text=True, env=full_env)
    if check and proc.returncode != 0:
        raise core.PatchError(f"`git {' '.join(args)}` failed in {repo}:\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def _commit_all(repo: Path, message: str) -> None:
    git(repo, "add", "-A", "-f", ".")
    with tempfile.NamedTemporaryFile("w", suffix=".msg", delete=False) as f:
        f.write(message)
    try:
        git(repo, "commit", "-q", "--allow-empty", "--no-verify", "--cleanup=verbatim", "-F", f.name)
    finally:
        os.unlink(f.name)


def import_queue(dev: Path, root: Path = ROOT) -> None:
    """The series as a branch `queue` in dev (which must not exist)."""
    core.require_vendor()
    if dev.exists():
        raise core.PatchError(
            f"{dev} exists. Write back what you need from it (`write`), delete it, and run import again."
        )
    dev.parent.mkdir(parents=True, exist_ok=True)
    core.copy_pristine(dev)
    git(dev, "init", "-q", "-b", "upstream")
    _commit_all(dev, f"pristine llama.cpp {core.read_pin().llama_cpp_commit}\n")
    git(dev, "checkout", "-q", "-b", "queue")
    core.place_native(dev, root)
    _commit_all(dev, SOURCES_SUBJECT + "\n")
    names = read_series(root / "patches" / "series")
    for name in names:
        patch = root / "patches" / name
        core.apply_one(dev, patch)
        _commit_all(dev, f"{name}\n\n{core.header(patch)}")
    print(f"queue at {dev} (branch queue on upstream): our sources + {len(names)} patch(es), one commit each")


def _message(repo: Path, rev: str) -> str:
    raw = git(repo, "cat-file", "commit", rev)
    return raw.split("\n\n", 1)[1] if "\n\n" in raw else ""


def _queue_commits(dev: Path) -> list[str]:
    if git(dev, "rev-list", "--merges", "upstream..HEAD").strip():
        raise core.PatchError("the queue holds a merge commit; a queue is a straight line of commits")
    revs = git(dev, "rev-list", "--reverse", "upstream..HEAD").split()
    if not revs or _message(dev, revs[0]).strip() != SOURCES_SUBJECT:
        raise core.PatchError(f"the first commit on upstream must be `{SOURCES_SUBJECT}` (our native/ files)")
    return revs


def _check_clean(dev: Path) -> None:
    if (dev / ".git" / "rebase-merge").exists() or (dev / ".git" / "rebase-apply").exists():
        raise core.PatchError("a rebase is in progress in the queue: finish it (`rebase --continue`) first")
    if git(dev, "status", "--porcelain", "--untracked-files=all").strip():
        raise core.PatchError(f"{dev} has uncommitted changes: commit them (e.g. `git commit --fixup`) first")


def _write_sources(dev: Path, rev: str, root: Path) -> int:
    files = {}
    for line in git(dev, "diff", "--no-renames", "--name-status", "upstream", rev).splitlines():
        status, path = line.split("\t", 1)
        ours = core.tree_path_to_native(path)
        if status != "A" or ours is None:
            raise core.PatchError(
                f"`{SOURCES_SUBJECT}` must only add files in NATIVE_MAP's folders; it has "
                f"{status} {path}. Fix: move that change into a patch, or add a mapping."
            )
        files[ours] = path
    for rel, src in core.native_files(root).items():
        if core.tree_path_to_native(rel) not in files:
            src.unlink()
    for ours, path in files.items():
        dest = root / ours
        dest.parent.mkdir(parents=True, exist_ok=True)
        data = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=dev, capture_output=True, check=True).stdout
        if not dest.exists() or dest.read_bytes() != data:
            dest.write_bytes(data)
    return len(files)


def patch_text(dev: Path, rev: str) -> tuple[str, str]:
    """(file name, patch text) of one queue commit."""
    msg = _message(dev, rev)
    name, _, header = msg.partition("\n\n")
    name = name.strip()
    if not NAME_RE.match(name):
        raise core.PatchError(
            f"commit {rev[:12]}'s subject `{name}` is not a patch name (NNNN-what.patch). "
            "Fix: `git rebase -i upstream` and reword it (or squash it into its patch)."
        )
    if not header.strip():
        raise core.PatchError(f"{name} has no DEP-3 header in its commit message")
    diff = git(dev, *DIFF_ARGS, f"{rev}~1", rev)
    return name, header + "---\n" + diff


def write_queue(dev: Path, root: Path = ROOT) -> list[str]:
    """Rewrite root/patches (every patch and series) and root/native from the queue branch in dev."""
    if not dev.exists():
        raise core.PatchError(f"no queue at {dev}: run `python tools/patches.py import` first")
    _check_clean(dev)
    revs = _queue_commits(dev)
    n_src = _write_sources(dev, revs[0], root)
    out = [patch_text(dev, rev) for rev in revs[1:]]
    numbers = [int(NAME_RE.match(n).group(1)) for n, _ in out]
    if numbers != sorted(set(numbers)):
        raise core.PatchError("patch numbers must increase along the queue: " + ", ".join(n for n, _ in out))
    pdir = root / "patches"
    pdir.mkdir(exist_ok=True)
    keep = {n for n, _ in out}
    for old in pdir.glob("*.patch"):
        if old.name not in keep:
            old.unlink()
    for name, text in out:
        path = pdir / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    (pdir / "series").write_text("".join(n + "\n" for n, _ in out))
    print(f"wrote {len(out)} patch(es), series and {n_src} native file(s) from {dev}")
    return [n for n, _ in out]


def rebase(dev: Path, new: Path | None, cont: bool) -> None:
    """Move the queue onto another pristine tree with `git rebase --onto` (3-way merges, stops on conflicts)."""
    if cont:
        proc = subprocess.run(
            ["git", *GIT_CONFIG, "rebase", "--continue"], cwd=dev, text=True, env=dict(os.environ, GIT_EDITOR="true")
        )
        if proc.returncode != 0:
            raise core.PatchError("the rebase stopped again: resolve, `git add`, then `rebase --continue`")
        print("rebased; now `python tools/patches.py write`")
        return
    if new is None or not (new / "ggml" / "include" / "ggml.h").exists():
        raise core.PatchError(f"{new} is not a llama.cpp tree")
    _check_clean(dev)
    old_base = git(dev, "rev-parse", "upstream").strip()
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "llama.cpp"
        core.copy_pristine(tree, src=new)
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index"), "GIT_WORK_TREE": str(tree)}
        git(dev, "add", "-A", "-f", ".", env=env)
        tree_id = git(dev, "write-tree", env=env).strip()
    base = git(dev, "commit-tree", tree_id, "-p", old_base, "-m", f"pristine llama.cpp from {new}").strip()
    git(dev, "branch", "-f", "upstream-old", old_base)
    git(dev, "branch", "-f", "upstream", base)
    git(dev, "checkout", "-q", "queue")
    proc = subprocess.run(
        ["git", *GIT_CONFIG, "rebase", "--onto", "upstream", "upstream-old", "queue"],
        cwd=dev,
        capture_output=True,
        text=True,
        env=dict(os.environ, GIT_EDITOR="true"),
    )
    if proc.returncode != 0:
        print(proc.stdout + proc.stderr)
        raise core.PatchError(
            "a patch conflicts with the new tree: resolve the files git names in the queue, "
            "`git add` them, then `python tools/patches.py rebase --continue` (as often as it "
            "stops), then `write`. `git rebase --abort` goes back (upstream-old is the old base)."
        )
    print("rebased cleanly; now `python tools/patches.py write`")
