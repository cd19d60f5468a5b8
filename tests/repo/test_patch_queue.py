"""The patch queue (docs/patches.md): its rules, import/write round trip, export, rebase. No compile; the tests
that need the pristine tree skip without it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import _lint  # noqa: E402
import _patch_queue  # noqa: E402
import _patches as core  # noqa: E402
import _pin  # noqa: E402


def _vendor_or_skip() -> None:
    try:
        core.require_vendor()
    except core.PatchError as e:
        pytest.skip(str(e))


def _mini_root(tmp: Path, patches: dict[str, str], native: dict[str, str] | None = None) -> Path:
    root = tmp / "root"
    (root / "patches").mkdir(parents=True)
    for name, text in patches.items():
        (root / "patches" / name).write_text(text)
    (root / "patches" / "series").write_text("".join(n + "\n" for n in patches))
    for rel, text in (native or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


HEADER = "Description: x\nAuthor: a\nForwarded: no\nLast-Update: 2026-12-03\n---\n"


def _edit(path: str, old_start: int, lines: list[str]) -> str:
    n_old = sum(1 for line in lines if line[0] in " -")
    n_new = sum(1 for line in lines if line[0] in " +")
    return (
        f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n"
        f"@@ -{old_start},{n_old} +{old_start},{n_new} @@\n" + "".join(line + "\n" for line in lines)
    )


def test_lint_passes_on_the_series():
    assert _lint.lint_static() == []


def test_lint_refuses_a_new_file_a_file_of_ours_a_long_header_and_disorder(tmp_path):
    new_file = (
        HEADER + "diff --git a/src/x.c b/src/x.c\nnew file mode 100644\n--- /dev/null\n+++ b/src/x.c\n"
        "@@ -0,0 +1 @@\n+int x;\n"
    )
    ours = HEADER + _edit("ggml/src/ggml-cuda/k.cu", 1, ["-a", "+b"])
    long_header = "Description: x\n" + " more\n" * 20 + "Author: a\nForwarded: maybe\nLast-Update: 1\n---\n"
    root = _mini_root(
        tmp_path,
        {
            "0002-new-file.patch": new_file,
            "0001-ours.patch": ours,
            "0003-long.patch": long_header + _edit("src/a.c", 1, ["-a", "+b"]),
        },
        native={"native/ggml/ggml-cuda/k.cu": "a\n"},
    )
    problems = "\n".join(_lint.lint_static(root))
    assert "0002-new-file.patch: creates src/x.c" in problems
    assert "0001-ours.patch: changes ggml/src/ggml-cuda/k.cu, a file of ours" in problems
    assert "native/ggml/ggml-cuda/k.cu" in problems
    assert "0003-long.patch: header of 24 lines" in problems
    assert "Forwarded is no, not-needed or a URL" in problems
    assert "not in numeric order" in problems


def test_lint_refuses_a_patch_that_changes_an_earlier_patchs_line(tmp_path):
    base = tmp_path / "base"
    (base / "src").mkdir(parents=True)
    (base / "src" / "a.c").write_text("one\ntwo\nthree\n")
    first = HEADER + _edit("src/a.c", 1, [" one", "-two", "+TWO", " three"])
    second = HEADER + _edit("src/a.c", 1, [" one", "-TWO", "+2", " three"])
    root = _mini_root(tmp_path, {"0001-first.patch": first, "0002-second.patch": second})
    problems = _lint.provenance(root, base)
    assert problems == [
        "0002-second.patch: changes line 2 of src/a.c, which 0001-first.patch added: "
        "fold the change into 0001-first.patch"
    ]
    fine = HEADER + _edit("src/a.c", 1, [" one", " TWO", "-three", "+3"])
    root2 = _mini_root(tmp_path / "2", {"0001-first.patch": first, "0002-fine.patch": fine})
    assert _lint.provenance(root2, base) == []


def test_lint_with_the_pristine_tree_and_round_trip():
    _vendor_or_skip()
    assert _lint.lint_tree() == []


def test_export_places_our_sources_and_applies_the_series(tmp_path):
    _vendor_or_skip()
    tree = tmp_path / "llama.cpp"
    names = core.export(tree)
    assert names == _pin.read_series()
    ours = core.native_files()
    assert "ggml/src/ggml-cuda/attn-decode-fused.cu" in ours
    for rel, src in ours.items():
        assert (tree / rel).read_bytes() == src.read_bytes(), rel
    # the hooks are in: the fusion loop calls into our files
    assert "attn-fusion.cuh" in (tree / "ggml/src/ggml-cuda/ggml-cuda.cu").read_text()
    digest = core.tree_digest(tree)
    assert core.export(tree) == names and core.tree_digest(tree) == digest  # unchanged inputs: reused


def test_a_fixup_commit_rewrites_only_its_patch(tmp_path):
    _vendor_or_skip()
    dev = tmp_path / "queue"
    _patch_queue.import_queue(dev)
    target = next(n for n in _pin.read_series() if "iq4_nl" in n)
    rev = _patch_queue.git(dev, "log", "--format=%H", "--fixed-strings", f"--grep={target}", "-1").strip()
    cpy = dev / "ggml/src/ggml-cuda/cpy.cu"
    cpy.write_text(
        cpy.read_text().replace(
            "static __device__ void cpy_blck_iq4_nl_f32(", "// fixed up\nstatic __device__ void cpy_blck_iq4_nl_f32(", 1
        )
    )
    _patch_queue.git(dev, "commit", "-q", "-a", f"--fixup={rev}")
    _patch_queue.git(dev, "rebase", "-q", "-i", "--autosquash", "upstream", env={"GIT_SEQUENCE_EDITOR": "true"})
    out = tmp_path / "out"
    (out / "patches").mkdir(parents=True)
    assert _patch_queue.write_queue(dev, out) == _pin.read_series()
    changed = [
        p.name
        for p in sorted((out / "patches").glob("*.patch"))
        if p.read_bytes() != (_pin.PATCHES / p.name).read_bytes()
    ]
    assert changed == [target]
    assert "+// fixed up" in (out / "patches" / target).read_text()


@pytest.mark.slow
def test_rebase_onto_a_changed_upstream_merges_and_writes(tmp_path):
    _vendor_or_skip()
    dev = tmp_path / "queue"
    _patch_queue.import_queue(dev)
    new = tmp_path / "new" / "llama.cpp"
    core.copy_pristine(new)
    llama = new / "src" / "llama.cpp"
    llama.write_text("// a line upstream added\n" + llama.read_text())
    _patch_queue.rebase(dev, new, cont=False)
    out = tmp_path / "out"
    (out / "patches").mkdir(parents=True)
    _patch_queue.write_queue(dev, out)
    first = _pin.read_series()[0]
    assert "@@ -" in (out / "patches" / first).read_text()
    assert (out / "patches" / first).read_text() != (_pin.PATCHES / first).read_text()  # its hunk moved a line
    tree = tmp_path / "tree"
    shutil.copytree(new, tree)
    core.place_native(tree)
    for name in _pin.read_series(out / "patches" / "series"):
        core.apply_one(tree, out / "patches" / name)


def test_cli_digest_runs():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "patches.py"), "digest", str(ROOT / "patches")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and len(proc.stdout.strip()) == 64, proc.stderr
