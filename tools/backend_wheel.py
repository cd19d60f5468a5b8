#!/usr/bin/env python3
"""A backend wheel (llama-vq-hip, llama-vq-cuda) from a wheel of a DL build with that backend (scripts/wheels.sh).

    python tools/backend_wheel.py hip build/wheel-hip/raw/llama_vq-0.1.0-py3-none-linux_x86_64.whl DIR

The new wheel holds one file, ``llama_vq/lib/libggml-<kind>.so``, beside the base wheel's files in the same
package folder, and requires exactly this version of llama-vq: ``pip install "llama-vq[hip]"`` installs both
(the extra names it) and llama_vq/_backends.py loads the module at import. Prints the wheel's path.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _pin import ROOT  # noqa: E402

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

KINDS = {
    "hip": (
        "llama-vq-hip",
        "AMD GPUs, the system's ROCm 6 (libamdhip64.so.6, libhipblas.so.2, librocblas.so.4)",
    ),
    "cuda": (
        "llama-vq-cuda",
        "NVIDIA GPUs, the driver and the system's CUDA runtime and cuBLAS of the major version it was built with",
    ),
}


# A module that calls an API without naming its library in DT_NEEDED links (shared objects may leave symbols
# undefined) and then fails to load wherever that library is not already in the process: a libcuda.so link stub
# that defines nothing lets the linker's --as-needed drop libcuda.so.1, and ggml-cuda's virtual memory calls
# (cuMemCreate, ...) are then unresolved at dlopen. Per kind: its API's undefined symbols, the soname that binds them.
APIS = {
    "cuda": (re.compile(r"cu[A-Z]\w*$"), re.compile(r"libcuda\.so\.1$"), "libcuda.so.1", "the CUDA driver API"),
    "hip": (re.compile(r"hip[A-Z]\w*$"), re.compile(r"libamdhip64\.so\.\d+$"), "libamdhip64.so.6", "the HIP runtime"),
}


def check_links(kind: str, lib: bytes) -> None:
    """Refuse a backend module whose undefined symbols of its kind's API have no library in DT_NEEDED to bind them."""
    with tempfile.NamedTemporaryFile(suffix=".so") as f:
        f.write(lib)
        f.flush()
        out = subprocess.run(
            ["readelf", "-W", "--dynamic", "--dyn-syms", f.name], capture_output=True, text=True, check=True
        ).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)
    undefined = {m.group(1) for m in re.finditer(r"\sUND\s+(\S+?)(?:@\S*)?$", out, re.M)}
    symbol, library, soname, api = APIS[kind]
    calls = sorted(s for s in undefined if symbol.match(s))
    if calls and not any(library.match(n) for n in needed):
        raise SystemExit(
            f"libggml-{kind}.so calls {api} ({', '.join(calls[:4])}{', ...' if len(calls) > 4 else ''}) but "
            f"does not link {soname} (DT_NEEDED: {', '.join(needed)}): it would fail to load. Link the real "
            f"library or a stub that defines these symbols (the toolkit's stubs/ folder), not an empty one."
        )


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build(kind: str, source: Path, out: Path) -> Path:
    dist, summary = KINDS[kind]
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    member = f"llama_vq/lib/libggml-{kind}.so"
    with zipfile.ZipFile(source) as z:
        if member not in z.namelist():
            raise SystemExit(f"{source} holds no {member}: not a DL build with the {kind} backend")
        lib = z.read(member)
        lib_info = z.getinfo(member)
    check_links(kind, lib)
    norm = dist.replace("-", "_")
    info = f"{norm}-{version}.dist-info"
    metadata = (
        "Metadata-Version: 2.1\n"
        f"Name: {dist}\n"
        f"Version: {version}\n"
        f"Summary: llama-vq's ggml {kind} backend, loaded at run time: {summary}\n"
        "License: MIT\n"
        "Requires-Python: >=3.10\n"
        f"Requires-Dist: llama-vq=={version}\n"
    ).encode()
    wheel = (
        b"Wheel-Version: 1.0\nGenerator: llama-vq tools/backend_wheel.py\nRoot-Is-Purelib: false\n"
        b"Tag: py3-none-linux_x86_64\n"
    )
    files = [(member, lib), (f"{info}/METADATA", metadata), (f"{info}/WHEEL", wheel)]
    record = "".join(_record_line(n, d) + "\n" for n, d in files) + f"{info}/RECORD,,\n"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{norm}-{version}-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files:
            zi = zipfile.ZipInfo(name, date_time=lib_info.date_time)
            zi.external_attr = (0o755 if name == member else 0o644) << 16
            z.writestr(zi, data, zipfile.ZIP_DEFLATED)
        z.writestr(zipfile.ZipInfo(f"{info}/RECORD", date_time=lib_info.date_time), record)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=sorted(KINDS))
    ap.add_argument("wheel", type=Path, help="a wheel of a DL build with that backend")
    ap.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    print(build(args.kind, args.wheel, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
