"""docs/knobs.md from the registry of environment variables (llama_vq/_envs.py), and the scan of the tree for
the variables its code reads (tests/repo/test_env_registry.py holds the registry against it).

    python tools/knobs.py write   # regenerate docs/knobs.md
    python tools/knobs.py check   # exit 1 when docs/knobs.md is not what `write` would write
    python tools/knobs.py scan    # every LLAMA_VQ_* variable the code reads or sets, and where

A read is what the code of its language does to read a variable: ``getenv("X")`` (C, C++, CUDA; in patches, the
lines a patch adds), ``os.environ.get("X")``, ``environ["X"]``, ``X_ENV = "X"`` and ``_envs.get("X")`` (Python),
``$X`` / ``${X...}`` (shell), ``$ENV{X}`` (CMake), ``{ env = "X" }`` (pyproject.toml), and the variables of
llama-vq-server's flags (llama_vq/server/options.py FLAGS, whose names are made from the flags). A set is
``setenv("X"``, a Python string or keyword ``X``, a shell or Dockerfile ``X=``.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "knobs.md"

# the tree that is scanned: the code of every layer, not the docs (which describe, never read)
SCANNED = ("llama_vq", "native", "patches", "scripts", "cmake", "benchmarks", "tools", "tests", "docker", ".ci")
SCANNED_FILES = ("CMakeLists.txt", "pyproject.toml")

_N = r"(LLAMA_VQ_[A-Z0-9_]*[A-Z0-9])"
_PY_READ = [
    re.compile(p)
    for p in (
        rf"\w*env\w*\.get\(\s*[\"']{_N}[\"']",
        rf"\w*environ\[\s*[\"']{_N}[\"']\s*\](?!\s*=[^=])",
        rf"getenv\(\s*[\"']{_N}[\"']",
        rf"[\"']{_N}[\"']\s+in\s+\w*\.?environ",
        rf"^\s*[A-Z_]*ENV\s*=\s*[\"']{_N}[\"']",
        rf"_envs\.get\(\s*[\"']{_N}[\"']",
    )
]
_PY_SET = [re.compile(rf"[\"']{_N}[\"']"), re.compile(rf"[(,]\s*{_N}=")]
_C_READ = [re.compile(rf"(?:\bgetenv|\w+_from_env)\(\s*\"{_N}\"")]
_C_SET = [re.compile(rf"\bsetenv\(\s*\"{_N}\"")]
_SH_READ = [re.compile(rf"\$\{{?{_N}")]
_SH_SET = [re.compile(rf"(?<![\w.$-]){_N}=")]
_CMAKE_READ = [re.compile(rf"\$ENV\{{{_N}\}}")]
_TOML_READ = [re.compile(rf"\benv\s*=\s*\"{_N}\"")]


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def registry() -> ModuleType:
    """llama_vq/_envs.py, loaded by path (importing llama_vq would load the native library)."""
    return _load("llama_vq_envs", ROOT / "llama_vq" / "_envs.py")


def server_flag_vars() -> list[str]:
    """The variables of llama-vq-server's flags: "LLAMA_VQ_" + the flag's name (options.Flag.env), read from
    options.py's source so that nothing of the server is imported."""
    tree = ast.parse((ROOT / "llama_vq" / "server" / "options.py").read_text())
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Flag" and len(node.args) >= 2:
            flag = node.args[1]
            if isinstance(flag, ast.Constant) and isinstance(flag.value, str):
                names.append("LLAMA_VQ_" + flag.value.lstrip("-").replace("-", "_").upper())
    return names


def _files() -> list[Path]:
    """The tracked files of SCANNED; outside a git checkout (an unpacked sdist), every file there."""
    proc = subprocess.run(["git", "ls-files", "-z", "--", *SCANNED, *SCANNED_FILES], cwd=ROOT, capture_output=True)
    if proc.returncode == 0 and proc.stdout:
        return [ROOT / f for f in proc.stdout.decode().split("\0") if f and (ROOT / f).is_file()]
    found = [ROOT / f for f in SCANNED_FILES if (ROOT / f).is_file()]
    for d in SCANNED:
        found += [p for p in sorted((ROOT / d).rglob("*")) if p.is_file() and "__pycache__" not in p.parts]
    return found


def _patterns(path: Path) -> tuple[list[re.Pattern[str]], list[re.Pattern[str]], str]:
    """(read patterns, set patterns, comment prefix) of a file's language; no patterns: not scanned."""
    name, suffix = path.name, path.suffix
    if suffix == ".py":
        return _PY_READ, _PY_SET, "#"
    if suffix in (".c", ".cc", ".cpp", ".h", ".hpp", ".cu", ".cuh", ".patch"):
        return _C_READ, _C_SET, "//"
    if suffix == ".sh" or name == "run" or name.startswith("Dockerfile"):
        return _SH_READ, _SH_SET, "#"
    if name == "CMakeLists.txt" or suffix == ".cmake":
        return _CMAKE_READ, [], "#"
    if name == "pyproject.toml":
        return _TOML_READ, [], "#"
    return [], [], ""


def scan() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(reads, sets): variable -> the files (relative) whose code reads it, or sets it."""
    reads: dict[str, set[str]] = {}
    sets: dict[str, set[str]] = {}
    for path in _files():
        read_pats, set_pats, comment = _patterns(path)
        if not read_pats:
            continue
        rel = path.relative_to(ROOT).as_posix()
        if rel == "llama_vq/_envs.py":
            continue  # the declarations themselves
        for line in path.read_text(errors="replace").splitlines():
            if path.suffix == ".patch":
                if not line.startswith("+") or line.startswith("+++"):
                    continue  # context lines are upstream's
                line = line[1:]
            code = line.split(comment, 1)[0] if line.lstrip().startswith(comment) else line
            for pat in read_pats:
                for m in pat.finditer(code):
                    reads.setdefault(m.group(1), set()).add(rel)
            for pat in set_pats:
                for m in pat.finditer(code):
                    sets.setdefault(m.group(1), set()).add(rel)
    for name in server_flag_vars():
        reads.setdefault(name, set()).add("llama_vq/server/options.py")
    return reads, sets


def render() -> str:
    envs = registry()
    out = [
        "# Environment variables",
        "",
        "Every `LLAMA_VQ_*` variable that code of llama-vq reads, by who reads it. Generated from",
        "llama_vq/_envs.py by `python tools/knobs.py write`: edit the registry, not this page",
        "(tests/repo/test_env_registry.py checks that the page is current and that the code reads what the registry",
        "declares, and nothing else). Switches are for users and for tests that compare two paths; a switch that",
        "only served one measurement goes once the measurement is recorded in benchmarks/.",
        "CMake options without a variable (`-DLLAMA_VQ_INSTALL_INPLACE`) are in",
        "[build.md](build.md); llama.cpp's own `LLAMA_ARG_*` variables work as upstream documents them.",
    ]
    for layer, what in envs.LAYERS.items():
        rows = [v for v in envs.VARS if v.layers[0] == layer]
        if not rows:
            continue
        out += ["", f"## {layer}", "", f"Read by {what}.", ""]
        native = layer == "native"
        out.append("| variable | values | default | meaning |" + (" where |" if native else ""))
        out.append("|---|---|---|---|" + ("---|" if native else ""))
        for v in rows:
            also = f" (also read by: {', '.join(v.layers[1:])})" if len(v.layers) > 1 else ""
            default = "unset" if v.default is None else f"`{v.default}`"
            cells = [f"`{v.name}`", v.type.replace("|", " \\| "), default, v.meaning.replace("|", "\\|") + also]
            if native:
                cells.append(v.where)
            out.append("| " + " | ".join(cells) + " |")
    out += [
        "",
        "## Removed: measuring-only switches",
        "",
        "Their defaults are constants now; the measurements they served are in benchmarks/ and its git history",
        "(search the switch's name).",
        "",
        "| switch | chose | now |",
        "|---|---|---|",
    ]
    out += [f"| `{name}` | {was} | {now} |" for name, was, now in envs.REMOVED]
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else ""
    if cmd == "write":
        DOC.write_text(render())
        print(f"wrote {DOC.relative_to(ROOT)}")
        return 0
    if cmd == "check":
        if DOC.read_text() != render():
            print(f"{DOC.relative_to(ROOT)} is not current: run `python tools/knobs.py write`", file=sys.stderr)
            return 1
        return 0
    if cmd == "scan":
        reads, sets = scan()
        for name in sorted(set(reads) | set(sets)):
            print(f"{name}\n  read: {', '.join(sorted(reads.get(name, ()))) or '-'}")
            print(f"  set:  {', '.join(sorted(sets.get(name, ()))) or '-'}")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
