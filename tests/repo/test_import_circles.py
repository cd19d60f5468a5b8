"""No import circles in llama_vq/ and tools/ (tools/_imports.py, which scripts/lint.sh runs too)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import _imports  # noqa: E402


def test_llama_vq_and_tools_have_no_import_circle():
    assert _imports.check() == []


def test_a_circle_through_a_function_level_import_is_found_and_type_checking_imports_are_not(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import x\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import y\n")
    (pkg / "d.py").write_text("from .c import z\n")
    assert _imports.circles(_imports.graph(pkg, "pkg")) == [["pkg.a", "pkg.b"]]
    (pkg / "a.py").write_text("from .c import q\n")
    (pkg / "c.py").write_text("import pkg.d\n")
    assert _imports.circles(_imports.graph(pkg, "pkg")) == [["pkg.c", "pkg.d"]]


def test_tools_scripts_importing_each_other_by_bare_name_are_seen(tmp_path):
    (tmp_path / "cli.py").write_text("import core\n")
    (tmp_path / "core.py").write_text("from cli import main\n")
    assert _imports.circles(_imports.graph(tmp_path, None)) == [["cli", "core"]]
