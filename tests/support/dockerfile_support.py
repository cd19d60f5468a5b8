"""A small Dockerfile reader for the tests (instructions, stages, ARG defaults); no Docker engine needed."""

from __future__ import annotations

from pathlib import Path


def parse(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, continuation lines joined, comments dropped."""
    out, cur = [], ""
    for line in path.read_text().splitlines():
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction
        cont = line.endswith("\\")
        cur += (line[:-1].strip() + " ") if cont else line.strip()
        if not cont:
            word, _, rest = cur.partition(" ")
            out.append((word.upper(), rest.strip()))
            cur = ""
    return out


def stages(path: Path) -> list[list[tuple[str, str]]]:
    """The instructions of each stage, FROM first."""
    result: list[list[tuple[str, str]]] = []
    for ins in parse(path):
        if ins[0] == "FROM":
            result.append([])
        if result:
            result[-1].append(ins)
    return result


def arg_defaults(path: Path) -> dict[str, str]:
    args = {}
    for word, rest in parse(path):
        if word == "ARG" and "=" in rest:
            k, _, v = rest.partition("=")
            args[k] = v
    return args
