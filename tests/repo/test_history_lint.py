"""No history in code or user docs (tools/_history.py): patches cited by their names in patches/series, no round,
issue or call numbers outside benchmarks/, and the repository paths that the text names exist. No build needed."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import _history  # noqa: E402


def test_the_tree_has_no_history_outside_benchmarks():
    problems = _history.lint()
    assert problems == [], "\n".join(problems)


def _root(tmp_path: Path, files: dict[str, str]) -> Path:
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "series").write_text("0001-first-thing.patch\n0002-second-thing.patch\n")
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_the_lint_refuses_numbers_old_names_rounds_and_missing_paths(tmp_path):
    root = _root(
        tmp_path,
        {
            "llama_vq/a.py": "# fixed by patch 0002 (was 0038: slower)\n",
            "native/b.cu": "// see 0003-gone-now and 0032-0034\n",
            "docs/c.md": "measured in round 11 (issue 25, call 3); see docs/missing.md\n",
            "tests/d.py": '"""0001-first-thing.patch hooks it; docs/c.md says how; 0.0041 is a number."""\n',
        },
    )
    problems = _history.lint(root)
    text = "\n".join(problems)
    assert "llama_vq/a.py:1: patch 0002 cited by number" in text
    assert "llama_vq/a.py:1: patch 0038 cited by number" in text
    assert "native/b.cu:1: 0003-gone-now is not a patch of patches/series" in text
    assert "native/b.cu:1: patch 0032 cited by number" in text
    assert "`round 11`" in text and "`issue 25`" in text and "`call 3`" in text
    assert "docs/c.md:1: docs/missing.md does not exist" in text
    assert not [p for p in problems if p.startswith("tests/d.py")], text  # names, paths and decimals pass
    assert len(problems) == 9, text  # 0034 of the range too


def test_the_lint_reads_a_patch_header_and_its_added_lines_only(tmp_path):
    patch = (
        "Description: like 0002 did\nAuthor: a\nForwarded: no\nLast-Update: 1\n---\n"
        "diff --git a/x.c b/x.c\n--- a/x.c\n+++ b/x.c\n@@ -1,2 +1,2 @@\n"
        " // upstream's context: 0099 stays theirs\n-old\n+// ours, round 4\n"
    )
    root = _root(tmp_path, {"patches/0001-first-thing.patch": patch})
    problems = _history.lint(root)
    assert [p.split(": ", 1)[0] for p in problems] == [
        "patches/0001-first-thing.patch:1",
        "patches/0001-first-thing.patch:12",
    ], problems
