#!/usr/bin/env python3
"""Pack a relocatable Python for llama-vq-server onto a machine that cannot install its dependencies.

    python benchmarks/pack_python.py OUT.tar.xz [--site SITE_PACKAGES]

The GPU benchmark machine has no network and a Python whose version has no binary pydantic-core in
the package index we can reach, so llama-vq-server cannot be installed there. This packs the running
interpreter (its binary, libpython when shared, the standard library without tests/IDLE/Tk) and the
server's runtime packages from SITE (default: this interpreter's own site-packages, e.g. the project's
.venv) into one archive (~25 MB). There:

    tar xJf OUT.tar.xz -C /tmp && LD_LIBRARY_PATH=/tmp/py/lib /tmp/py/bin/python3 -m llama_vq.server.cli ...

with the checkout on PYTHONPATH (llama_vq, llama_vq.server) and its llama_vq/lib built there. Run it with the
Python the packages were installed for (the .venv's python), so the ABI matches.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from pathlib import Path

# What `import llama_vq.server.cli, llama_vq, llama_cpp` needs at run time, and what those import in turn.
PACKAGES = [
    "annotated_doc",
    "annotated_types",
    "anyio",
    "click",
    "diskcache",
    "fastapi",
    "h11",
    "idna",
    "jinja2",
    "llama_cpp",
    "markupsafe",
    "numpy",
    "numpy.libs",
    "opentelemetry",
    "prometheus_client",
    "pydantic",
    "pydantic_core",
    "python_multipart",
    "multipart",
    "sniffio",
    "starlette",
    "typing_extensions.py",
    "typing_inspection",
    "uvicorn",
]
STDLIB_DROP = {"site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--site", type=Path, default=Path(sysconfig.get_paths()["purelib"]))
    a = ap.parse_args(argv)
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    exe = Path(os.path.realpath(sys.executable))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "py"
        (root / "bin").mkdir(parents=True)
        shutil.copy2(exe, root / "bin" / ver)
        (root / "bin" / "python3").symlink_to(ver)
        libdir = root / "lib"
        libdir.mkdir()
        ldlib = sysconfig.get_config_var("LDLIBRARY") or ""
        if sysconfig.get_config_var("Py_ENABLE_SHARED"):
            src = Path(sysconfig.get_config_var("LIBDIR")) / sysconfig.get_config_var("INSTSONAME")
            shutil.copy2(src, libdir / src.name)
            subprocess.run(["strip", str(libdir / src.name)], check=False)
        print(f"interpreter {exe} ({ldlib}), stdlib {stdlib}", file=sys.stderr)

        def skip(d: str, names: list[str]) -> set[str]:
            drop = {n for n in names if n == "__pycache__" or n.startswith("config-")}
            if Path(d) == stdlib:
                drop |= STDLIB_DROP & set(names)
            return drop

        shutil.copytree(stdlib, libdir / ver, ignore=skip, symlinks=True)
        site = libdir / ver / "site-packages"
        site.mkdir()
        for name in PACKAGES:
            p = a.site / name
            if not p.exists():
                print(f"missing in {a.site}: {name}", file=sys.stderr)
                return 1
            if p.is_dir():
                shutil.copytree(p, site / name, ignore=shutil.ignore_patterns("__pycache__", "tests"))
            else:
                shutil.copy2(p, site / name)
        for info in a.site.glob("*.dist-info"):  # importlib.metadata lookups (versions)
            shutil.copytree(info, site / info.name)
        a.out.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(a.out, "w:xz", preset=3) as t:
            t.add(root, arcname="py")
    print(f"{a.out}: {a.out.stat().st_size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
