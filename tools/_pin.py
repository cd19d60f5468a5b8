"""Read the upstream pin from pyproject.toml ([tool.llama-vq.pin]); shared by the build tools."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
VENDOR = ROOT / "vendor" / "llama.cpp"
# llama-cpp-python's pure-Python ctypes bindings (the `llama_cpp` package) from the same sdist; our wheel ships them
BINDINGS = ROOT / "vendor" / "llama_cpp_python"
PATCHES = ROOT / "patches"
SERIES = PATCHES / "series"
STAMP_NAME = ".llama-vq-pin"


@dataclass(frozen=True)
class Pin:
    llama_cpp_python: str
    sdist_sha256: str
    llama_cpp_commit: str

    @property
    def stamp(self) -> str:
        return f"llama-cpp-python=={self.llama_cpp_python} sha256={self.sdist_sha256}\n"


def read_pin(root: Path = ROOT) -> Pin:
    data = tomllib.loads((root / "pyproject.toml").read_text())
    pin = data["tool"]["llama-vq"]["pin"]
    return Pin(pin["llama-cpp-python"], pin["sdist-sha256"], pin["llama-cpp-commit"])


def read_series(series: Path = SERIES) -> list[str]:
    """Patch names in order; blank lines and '#' comments are ignored (quilt's format)."""
    if not series.exists():
        return []
    names = []
    for line in series.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line.split()[0])
    return names
