#!/usr/bin/env python3
"""Compile our CUDA kernel files for a GPU architecture on a machine without a GPU or a CUDA install, and report what
ptxas gives each of our kernels: registers, spills, stack. What a GPU machine's build would tell about resources, for
the price of a few minutes of one core and no device time.

    python tools/cuda_check.py [FILE.cu ...] [--arch sm_90] [--kernels REGEX] [--tree DIR]

FILE: our sources under native/ggml/ggml-cuda (default: attn-decode-fused.cu); --tree: an exported patched tree
(tools/patches.py export) to compile against (default: one exported into a temporary folder). The toolchain is
NVIDIA's own pip wheels of CUDA (nvcc, cicc, ptxas, the runtime's, CCCL's and cuBLAS's headers: ggml-cuda's
common header includes cuBLAS), at the versions below, downloaded with pip (the user's index configuration) into
$XDG_CACHE_HOME/llama-vq/cuda-toolchain once (~500 MB of downloads, ~150 MB kept) and unpacked there.

Prints one line per kernel whose demangled name matches --kernels (default: our kernels' prefixes): registers,
spilled bytes (stores/loads) and stack frame. Exit status 1 if a file does not compile.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "native" / "ggml" / "ggml-cuda"
VERSION = "13.5.37"
# wheel name -> (version, the members to unpack: a prefix within the wheel, or "" for all)
WHEELS = {
    "nvidia-cuda-nvcc": (VERSION, ""),
    "nvidia-nvvm": (VERSION, ""),
    "nvidia-cuda-crt": (VERSION, ""),
    "nvidia-cuda-runtime": (VERSION, ""),
    "nvidia-cuda-cccl": ("13.3.5.0.6", ""),
    "nvidia-cublas": ("13.10.0.20", "nvidia/cu13/include/"),
}
OUR_KERNELS = r"^(k_attn|k_out_prod|k_mmvq|k_fwht|k_rope|k_set_rows|k_dequant)"
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def toolchain() -> Path:
    """The unpacked toolchain's root (nvidia/cu13), downloaded and unpacked on first use."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "llama-vq" / "cuda-toolchain" / VERSION
    cu = cache / "nvidia" / "cu13"
    if (cu / "bin" / "nvcc").exists() and (cu / ".complete").exists():
        return cu
    with tempfile.TemporaryDirectory(prefix="llama-vq-cuda-") as tmp:
        reqs = [f"{name}=={ver}" for name, (ver, _) in WHEELS.items()]
        print(f"cuda_check: downloading {', '.join(reqs)} (once)", file=sys.stderr)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", tmp, *reqs],
            check=True,
        )
        for whl in Path(tmp).glob("*.whl"):
            name = re.sub(r"_", "-", whl.name.split("-")[0])
            prefix = WHEELS[name][1]
            with zipfile.ZipFile(whl) as z:
                members = [m for m in z.namelist() if m.startswith("nvidia/") and m.startswith(prefix)]
                z.extractall(cache, members)
    for exe in (cu / "bin").iterdir():
        exe.chmod(0o755)
    for exe in (cu / "nvvm" / "bin").iterdir():
        exe.chmod(0o755)
    (cu / ".complete").touch()
    return cu


def exported_tree() -> Path:
    tmp = Path(tempfile.mkdtemp(prefix="llama-vq-cuda-tree-"))
    subprocess.run([sys.executable, str(ROOT / "tools" / "patches.py"), "export", str(tmp / "llama.cpp")], check=True)
    return tmp / "llama.cpp"


def compile_report(cu: Path, tree: Path, src: str, arch: str) -> str:
    """ptxas's verbose report of one of our files, compiled as ggml-cuda compiles it (release, fast math)."""
    inc = tree / "ggml"
    env = dict(os.environ, PATH=f"{cu / 'bin'}:{os.environ.get('PATH', '')}", CUDA_HOME=str(cu))
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            str(cu / "bin" / "nvcc"), "-std=c++17", "-O3", f"-arch={arch}", "-use_fast_math", "-extended-lambda",
            "-DNDEBUG", f"-I{inc / 'include'}", f"-I{inc / 'src'}", f"-I{inc / 'src' / 'ggml-cuda'}", "-Xptxas", "-v",
            "-c", str(inc / "src" / "ggml-cuda" / src), "-o", str(Path(tmp) / "x.o"),
        ]  # fmt: skip
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"cuda_check: {src} does not compile for {arch}:\n{proc.stderr[-6000:]}")
    return proc.stderr


def kernels(report: str, pattern: str) -> list[str]:
    """One line per matching kernel: registers, spills, stack (ptxas -v's lines, names demangled by c++filt)."""
    out = []
    lines = report.splitlines()
    entry = None
    for i, line in enumerate(lines):
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            entry = m.group(1)
        m = re.search(r"Used (\d+) registers", line)
        if m and entry:
            name = subprocess.run(["c++filt", entry], capture_output=True, text=True).stdout.strip() or entry
            name = name.removeprefix("void ")
            if re.search(pattern, name):
                frame = FRAME.search(lines[i - 1])
                f, st, ld = frame.groups() if frame else ("?", "?", "?")
                out.append(f"{m.group(1):>4} regs  spill {st:>3}/{ld:<3} B  stack {f:>3} B  {name}")
            entry = None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", default=["attn-decode-fused.cu"])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--kernels", default=OUR_KERNELS, help="regex on the demangled kernel name")
    ap.add_argument("--tree", type=Path, help="an exported patched tree (default: export one)")
    args = ap.parse_args()
    if shutil.which("c++filt") is None:
        sys.exit("cuda_check: c++filt (binutils) is needed to name the kernels")
    cu = toolchain()
    tree = args.tree or exported_tree()
    for src in args.files:
        if not (NATIVE / src).exists():
            sys.exit(f"cuda_check: {src} is not one of ours (native/ggml/ggml-cuda)")
        for line in kernels(compile_report(cu, tree, src, args.arch), args.kernels):
            print(f"{src}: {line}")


if __name__ == "__main__":
    main()
