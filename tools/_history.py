"""No history in code or user docs: comments say what and why, not when. tests/repo/test_history_lint.py runs this.

Outside benchmarks/ (where measurements and their history live):
- a patch is cited by its name in today's patches/series (`0012-cpu-kq-quantized-k-gqa-shared-rows`, with or
  without `.patch`), never by a bare number: numbers of an earlier series collide with today's, and a name that
  is no longer in the series is caught here when a patch is renamed or renumbered;
- no round, issue or call numbers (those words followed by a number, or a number after "#"): when something was
  written belongs in the commit message and benchmarks/;
- a path of this repository that the text names (`benchmarks/mi210.sh`, `docs/knobs.md`) exists.

Scanned: the text files under SCANNED (README, docs, the package, native sources, tests, tools, scripts, build
files) and benchmarks/README.md; of each patch, its DEP-3 header and the lines it adds (context lines are
upstream's). `python tools/_history.py` prints the problems.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _pin import ROOT, read_series  # noqa: E402

SCANNED = (
    "README.md",
    "CMakeLists.txt",
    "pyproject.toml",
    ".ci",
    "cmake",
    "docker",
    "docs",
    "llama_vq",
    "native",
    "scripts",
    "tests",
    "tools",
    "benchmarks/README.md",
    "patches",
)
SKIP_PARTS = {"__pycache__", "lib", "bin", ".pytest_cache"}
TEXT_SUFFIXES = {
    ".py",
    ".md",
    ".sh",
    ".c",
    ".cc",
    ".cpp",
    ".h",
    ".hpp",
    ".cu",
    ".cuh",
    ".txt",
    ".toml",
    ".cmake",
    ".cfg",
    ".ini",
    ".yml",
    ".yaml",
    ".json",
    ".lock",
    ".patch",
    "",
}

# a four-digit patch number below 0100, optionally with its name; not inside a word or a decimal (0.0041)
PATCH_REF = re.compile(r"(?<![\w.])(00\d\d)(-[a-z][a-z0-9_]*(?:-[a-z0-9_]+)*)?(?:\.patch)?(?![\w])")
HISTORY = re.compile(r"\b(?:rounds?|issues?|calls?)\s+#?\d+\b|(?<![\w&/])#\d+\b(?!\s*[;)\]])", re.IGNORECASE)
# a path into this repository; a glob, a placeholder or a template is not checked
REPO_PATH = re.compile(
    r"(?<![\w./-])((?:benchmarks|docs|tests|tools|scripts|llama_vq|native|docker|patches|cmake)"
    r"/[\w.+-]+(?:/[\w.+-]+)*)(?![\w*{<$/.-])"
)
# build outputs a checkout has only after a build
GENERATED = ("llama_vq/lib", "llama_vq/bin", "llama_vq/_build_config.json")
# a path that a test creates in a directory of its own
MADE_BY_TESTS = {("tests/repo/test_patch_queue.py", "native/ggml/ggml-cuda/k.cu")}
SELF = "tools/_history.py"  # names the paths above
EXAMPLES = {"tests/repo/test_history_lint.py"}  # the lint's own test: what it must refuse
# tests of the patch tooling build small queues of their own, with patch names of their own
OWN_QUEUES = {"tests/repo/test_patch_queue.py", "tests/packaging/test_build.py"}
PLACEHOLDER = re.compile(r"(^|/)[A-Z]+([-.][\w.-]*)?$")  # native/ggml/ggml-cuda/X, patches/NNNN-what.patch


def _files(root: Path) -> list[Path]:
    out = []
    for name in SCANNED:
        base = root / name
        if base.is_file():
            out.append(base)
        elif base.is_dir():
            out += sorted(
                p
                for p in base.rglob("*")
                if p.is_file()
                and not SKIP_PARTS & set(p.relative_to(root).parts)
                and not p.relative_to(root).as_posix().startswith(GENERATED)
                and (p.suffix in TEXT_SUFFIXES or p.name.startswith("Dockerfile"))
            )
    return out


def _lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) to check: every line, or of a patch its header and its added lines."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return []
    lines = list(enumerate(text.splitlines(), 1))
    if path.suffix != ".patch":
        return lines
    out, in_diff = [], False
    for n, line in lines:
        if line.startswith("diff --git "):
            in_diff = True
        if not in_diff and line != "---":
            out.append((n, line))
        elif in_diff and line.startswith("+") and not line.startswith("+++ "):
            out.append((n, line[1:]))
    return out


def lint(root: Path = ROOT) -> list[str]:
    names = {n.removesuffix(".patch") for n in read_series(root / "patches" / "series")}
    problems = []
    for path in _files(root):
        rel = path.relative_to(root).as_posix()
        if rel == "patches/series" or rel in EXAMPLES:
            continue
        for n, line in _lines(path):
            where = f"{rel}:{n}"
            for m in PATCH_REF.finditer(line):
                if not m.group(2):
                    problems.append(
                        f"{where}: patch {m.group(1)} cited by number: cite it by its name in "
                        "patches/series (numbers of an earlier series collide with today's)"
                    )
                elif m.group(1) + m.group(2) not in names and rel not in OWN_QUEUES:
                    problems.append(f"{where}: {m.group(1) + m.group(2)} is not a patch of patches/series")
            for m in HISTORY.finditer(line):
                problems.append(
                    f"{where}: `{m.group(0)}`: when something was done belongs in the commit message "
                    "and benchmarks/, not in code or user docs"
                )
            for m in REPO_PATH.finditer(line):
                p = m.group(1).rstrip(".")
                if PLACEHOLDER.search(p) or p.startswith(GENERATED) or (rel, p) in MADE_BY_TESTS or rel == SELF:
                    continue
                # llama.cpp's own tools/ and tests/ are cited by their paths in its tree
                if not (root / p).exists() and not (root / "vendor" / "llama.cpp" / p).exists():
                    problems.append(f"{where}: {p} does not exist")
    return problems


if __name__ == "__main__":
    found = lint()
    print("\n".join(found))
    print(f"history lint: {len(found)} problem(s)", file=sys.stderr)
    sys.exit(1 if found else 0)
