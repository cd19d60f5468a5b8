"""The GPU code objects in a HIP library, read with ROCm's LLVM tools (run inside scripts/hip-toolchain.sh's chroot).

    python3 tests/support/hip_code_objects.py llama_vq/lib/libggml-hip.so [KERNEL ...]

Prints one JSON line: the offload bundles of the library's .hip_fatbin section (one per HIP source), the targets
each bundle holds (clang-offload-bundler --list), the machine of every gfx code object unbundled from them
(llvm-readelf's e_flags, e.g. "EF_AMDGPU_MACH_AMDGCN_GFX90A") and code object version (its ABI version: the oldest
ROCm runtime that loads it), and which of the KERNELs have device code there
(llvm-nm on the code objects: every __global__ function has a kernel descriptor, a symbol ending in ".kd").
No GPU is needed; nothing runs on one.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"


def tool(name: str) -> str:
    """ROCm's LLVM tool: Debian links them into PATH with the LLVM major as a suffix (clang-offload-bundler-21); the
    real path, since clang-offload-bundler looks for llvm-objcopy beside itself."""
    for cand in [name] + [f"{name}-{v}" for v in range(30, 16, -1)]:
        path = shutil.which(cand)
        if path:
            return os.path.realpath(path)
    raise SystemExit(f"{name} is not installed (ROCm's LLVM tools)")


def _run(cmd: list[str]) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{shlex.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout


def inspect(lib: Path, kernels: list[str]) -> dict:
    bundler, objcopy, readelf, nm = (
        tool(t) for t in ("clang-offload-bundler", "llvm-objcopy", "llvm-readelf", "llvm-nm")
    )
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        fatbin = tmp / "fatbin"
        _run([objcopy, f"--dump-section=.hip_fatbin={fatbin}", str(lib), str(tmp / "stripped")])
        data = fatbin.read_bytes()
        starts = [m.start() for m in re.finditer(re.escape(MAGIC), data)]
        targets: set[str] = set()
        per_bundle: list[list[str]] = []
        objects: list[str] = []
        for i, start in enumerate(starts):
            end = starts[i + 1] if i + 1 < len(starts) else len(data)
            bundle = tmp / f"b{i}.o"
            bundle.write_bytes(data[start:end])
            listed = _run([bundler, "--list", "--type=o", f"--input={bundle}"]).split()
            per_bundle.append(listed)
            targets.update(listed)
            for t in (t for t in listed if "amdgcn" in t):
                co = tmp / f"b{i}-{t.rsplit('-', 1)[-1]}.co"
                _run([bundler, "--unbundle", "--type=o", f"--targets={t}", f"--input={bundle}", f"--output={co}"])
                objects.append(str(co))
        machs: set[str] = set()
        versions: set[int] = set()
        symbols = ""
        if objects:
            headers = _run([readelf, "-h", *objects])
            machs = set(re.findall(r"EF_AMDGPU_MACH_\w+", headers))
            # e_ident[EI_ABIVERSION] of ELFOSABI_AMDGPU_HSA ("ABIVersion" as llvm-readobj, the real tool, writes it):
            # 2, 3, 4 are code object v4, v5, v6
            versions = {int(v) + 2 for v in re.findall(r"^\s*ABI ?Version:\s*(\d+)", headers, re.M)}
            symbols = _run([nm, "--defined-only", *objects])
    kds = [line.split()[-1] for line in symbols.splitlines() if line.endswith(".kd")]
    return {
        "bundles": len(starts),
        "targets": sorted(targets),
        "bundles_without_gpu_code": sum(1 for b in per_bundle if not any("amdgcn" in t for t in b)),
        "code_objects": len(objects),
        "machs": sorted(machs),
        "code_object_versions": sorted(versions),
        "kernels": [k for k in kernels if any(_names(sym, k) for sym in kds)],
    }


def _names(symbol: str, kernel: str) -> bool:
    """Whether a kernel descriptor symbol is this kernel's: extern "C" (the name itself) or C++ (the mangled name
    carries it with its length in front, so that k_attn_decode is not k_attn_decode_combine)."""
    return symbol == f"{kernel}.kd" or re.search(rf"(?<!\d){len(kernel)}{re.escape(kernel)}", symbol) is not None


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    print(json.dumps(inspect(Path(sys.argv[1]), sys.argv[2:])))
