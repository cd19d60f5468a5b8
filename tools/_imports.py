"""No import circles in llama_vq/ and tools/: scripts/lint.sh runs this, tests/repo/test_import_circles.py too.

An edge is any import statement of a module, at its top or inside a function (a circle through a function-level
import is still two modules that need each other): in llama_vq/, `from . import x`, `from .x import y`,
`from llama_vq.x import y` and `import llama_vq.x`; in tools/, `import x` / `from x import y` of a module that is a
file of tools/. Imports under `if TYPE_CHECKING:` do not count (they never run). Importing a submodule is not
counted as importing its package's __init__ (that is Python's mechanics, not a dependency the code chose).
`python tools/_imports.py` prints each circle and exits 1.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _module_name(path: Path, base: Path, package: str | None) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([package, *parts] if package else parts) or (package or "")


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node but those under `if TYPE_CHECKING:` (imports for annotations only, never run)."""
    out: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


def graph(base: Path, package: str | None) -> dict[str, set[str]]:
    """module -> the modules of the same tree it imports. package: the import name of base (None: a folder of
    scripts whose files import each other by their bare names, as tools/ does)."""
    files = {_module_name(p, base, package): p for p in sorted(base.rglob("*.py"))}
    known = set(files)
    edges: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        is_pkg = path.name == "__init__.py"
        here = mod if is_pkg else mod.rpartition(".")[0]
        for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = here
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    src = f"{anchor}.{node.module}" if node.module else anchor
                else:
                    src = node.module or ""
                # `from pkg import sub` imports the submodule sub; `from mod import name` imports mod
                subs = [f"{src}.{a.name}" for a in node.names if f"{src}.{a.name}" in known]
                targets = subs if len(subs) == len(node.names) else [src, *subs]
            for t in targets:
                if t in known and t != mod:
                    edges[mod].add(t)
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def check(root: Path = ROOT) -> list[str]:
    problems = []
    for base, package in ((root / "llama_vq", "llama_vq"), (root / "tools", None)):
        for comp in circles(graph(base, package)):
            problems.append(f"import circle in {base.relative_to(root)}/: {' <-> '.join(comp)}")
    return problems


def main() -> int:
    problems = check()
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
