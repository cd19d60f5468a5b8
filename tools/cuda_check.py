#!/usr/bin/env python3
"""Compile our CUDA kernel files for a GPU architecture on a machine without a GPU or a CUDA install, and report what
ptxas gives each of our kernels: registers, spills, stack; with --sass, what the machine code of its main loop is made
of. What a GPU machine's build would tell about resources and code, for the price of a few minutes of one core and no
device time.

    python tools/cuda_check.py [FILE.cu ...] [--arch sm_90] [--kernels REGEX] [--tree DIR] [--sass]

FILE: our sources under native/ggml/ggml-cuda (default: attn-decode-fused.cu), compiled from the checkout against
--tree: an exported patched tree (tools/patches.py export; default: one exported into a temporary folder). The
toolchain is NVIDIA's own pip wheels of CUDA (nvcc, cicc, ptxas, cuobjdump, nvdisasm, the runtime's, CCCL's and
cuBLAS's headers: ggml-cuda's common header includes cuBLAS), at the versions below, downloaded with pip (the user's
index configuration) into $XDG_CACHE_HOME/llama-vq/cuda-toolchain once (~500 MB of downloads, ~150 MB kept) and
unpacked there.

Prints one line per kernel whose demangled name matches --kernels (default: our kernels' prefixes): registers,
spilled bytes (stores/loads) and stack frame. --sass adds, per kernel, its SASS (cuobjdump and nvdisasm, from the same
wheels) read statically: the main loop (the innermost loop holding every tensor-core instruction, else the largest
loop; cold code that ptxas places after the kernel's exit and that branches back into it reads as a larger loop
around it), its instructions by class, and the loops inside it (the tiles' staging) with their sizes; instructions that
can never run (predicate !PT) are not counted. A static count: each instruction once, whatever the trip counts and
branches; it compares two versions of a kernel, it does not time one. Exit status 1 if a file does not compile.
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
    "nvidia-cuda-cuobjdump": (VERSION, ""),
    "nvidia-cuda-nvdisasm": (VERSION, ""),
}
# what an unpacked toolchain must hold (a cache from before the SASS tools were added lacks the last two)
NEEDED = ["bin/nvcc", "bin/ptxas", "bin/cuobjdump", "bin/nvdisasm"]
OUR_KERNELS = r"^(k_attn|k_out_prod|k_mmvq|k_fwht|k_rope|k_set_rows|k_dequant)"
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def toolchain() -> Path:
    """The unpacked toolchain's root (nvidia/cu13), downloaded and unpacked on first use."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "llama-vq" / "cuda-toolchain" / VERSION
    cu = cache / "nvidia" / "cu13"
    if all((cu / f).exists() for f in NEEDED) and (cu / ".complete").exists():
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


def tool_env(cu: Path) -> dict[str, str]:
    return dict(os.environ, PATH=f"{cu / 'bin'}:{os.environ.get('PATH', '')}", CUDA_HOME=str(cu))


def compile_report(cu: Path, tree: Path, src: str, arch: str, obj: Path) -> str:
    """ptxas's verbose report of one of our files (the checkout's: its own folder comes first for our headers),
    compiled against the tree as ggml-cuda compiles it (release, fast math), the object written to obj."""
    inc = tree / "ggml"
    cmd = [
        str(cu / "bin" / "nvcc"), "-std=c++17", "-O3", f"-arch={arch}", "-use_fast_math", "-extended-lambda",
        "-DNDEBUG", f"-I{inc / 'include'}", f"-I{inc / 'src'}", f"-I{inc / 'src' / 'ggml-cuda'}", "-Xptxas", "-v",
        "-c", str(NATIVE / src), "-o", str(obj),
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=tool_env(cu), capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"cuda_check: {src} does not compile for {arch}:\n{proc.stderr[-6000:]}")
    return proc.stderr


def demangle(mangled: str) -> str:
    name = subprocess.run(["c++filt", mangled], capture_output=True, text=True).stdout.strip() or mangled
    return name.removeprefix("void ")


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
            name = demangle(entry)
            if re.search(pattern, name):
                frame = FRAME.search(lines[i - 1])
                f, st, ld = frame.groups() if frame else ("?", "?", "?")
                out.append(f"{m.group(1):>4} regs  spill {st:>3}/{ld:<3} B  stack {f:>3} B  {name}")
            entry = None
    return out


INSN = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)")
MMA = ("HMMA", "IMMA", "HGMMA", "IGMMA", "DMMA")
# instruction classes by opcode (the part before the first dot)
CLASSES = {
    "mma": MMA,
    "ldsm": ("LDSM",),
    "lds": ("LDS",),
    "sts": ("STS",),
    "cp.async": ("LDGSTS", "LDGDEPBAR", "DEPBAR"),
    "ldg": ("LDG",),
    "ldc": ("LDC", "ULDC"),
    "stg": ("STG", "RED", "ATOM", "ATOMG"),
    "fp": tuple("FFMA FMUL FADD FMNMX FSEL FSETP MUFU HADD2 HMUL2 HFMA2 F2F F2FP I2F I2FP F2I FRND FCHK".split()),
    "shfl/vote": ("SHFL", "VOTE", "VOTEU", "MATCH"),
    "branch": ("BRA", "BSSY", "BSYNC", "WARPSYNC", "EXIT", "RET", "CALL", "BREAK"),
    "barrier": ("BAR",),
}


def sass_functions(cu: Path, obj: Path) -> dict[str, list[tuple[int, str]]]:
    """The SASS of every kernel in obj: mangled name -> [(address, instruction)], instructions that never run
    (predicated on !PT) and NOPs left out."""
    proc = subprocess.run([str(cu / "bin" / "cuobjdump"), "-sass", str(obj)], env=tool_env(cu), capture_output=True,
                          text=True)  # fmt: skip
    if proc.returncode != 0:
        sys.exit(f"cuda_check: cuobjdump failed:\n{proc.stderr[-3000:]}")
    funcs: dict[str, list[tuple[int, str]]] = {}
    cur: list[tuple[int, str]] | None = None
    for line in proc.stdout.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = funcs.setdefault(m.group(1), [])
            continue
        m = INSN.match(line)
        if m and cur is not None:
            text = m.group(2)
            if text.startswith("@!PT ") or text.startswith("NOP"):
                continue
            cur.append((int(m.group(1), 16), text))
    return funcs


def opcode(text: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]


def classify(ins: list[tuple[int, str]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for _, text in ins:
        op = opcode(text)
        cls = next((c for c, ops in CLASSES.items() if op in ops), "int/other")
        counts[cls] = counts.get(cls, 0) + 1
    return counts


def sass_summary(ins: list[tuple[int, str]]) -> str:
    """The main loop of one kernel, read statically (see the module's doc)."""
    loops = []  # (head, branch address): backward branches
    for addr, text in ins:
        m = BRANCH.search(text)
        if m and int(m.group(1), 16) <= addr:
            loops.append((int(m.group(1), 16), addr))
    mma = [a for a, t in ins if opcode(t) in MMA]
    if mma:
        cands = [lp for lp in loops if lp[0] <= min(mma) and max(mma) <= lp[1]]
        main = min(cands, key=lambda lp: lp[1] - lp[0]) if cands else None
    else:
        main = max(loops, key=lambda lp: lp[1] - lp[0]) if loops else None
    if main is None:
        return f"{len(ins)} instructions, no loop"
    body = [(a, t) for a, t in ins if main[0] <= a <= main[1]]
    inner = [lp for lp in loops if lp != main and main[0] <= lp[0] and lp[1] <= main[1]]
    # the outermost of the inner loops only (a loop inside one of them is counted in it)
    outer = [lp for lp in inner if not any(o != lp and o[0] <= lp[0] and lp[1] <= o[1] for o in inner)]
    in_inner = {a for a, _ in body if any(lp[0] <= a <= lp[1] for lp in outer)}
    own = [(a, t) for a, t in body if a not in in_inner]
    sizes = [sum(1 for a, _ in body if lp[0] <= a <= lp[1]) for lp in sorted(outer)]
    cls = ", ".join(f"{k} {v}" for k, v in sorted(classify(own).items(), key=lambda kv: -kv[1]))
    loops_txt = f"; {len(sizes)} loops inside: {'/'.join(map(str, sizes))}" if sizes else ""
    return f"{len(ins)} instructions; main loop {len(body)}, {len(own)} outside its inner loops ({cls}){loops_txt}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", default=["attn-decode-fused.cu"])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--kernels", default=OUR_KERNELS, help="regex on the demangled kernel name")
    ap.add_argument("--tree", type=Path, help="an exported patched tree (default: export one)")
    ap.add_argument("--sass", action="store_true", help="also read each kernel's machine code (see above)")
    args = ap.parse_args()
    if shutil.which("c++filt") is None:
        sys.exit("cuda_check: c++filt (binutils) is needed to name the kernels")
    cu = toolchain()
    tree = args.tree or exported_tree()
    for src in args.files:
        if not (NATIVE / src).exists():
            sys.exit(f"cuda_check: {src} is not one of ours (native/ggml/ggml-cuda)")
        with tempfile.TemporaryDirectory(prefix="llama-vq-cuda-obj-") as tmp:
            obj = Path(tmp) / "x.o"
            report = compile_report(cu, tree, src, args.arch, obj)
            for line in kernels(report, args.kernels):
                print(f"{src}: {line}")
            if args.sass:
                for mangled, ins in sorted(sass_functions(cu, obj).items()):
                    name = demangle(mangled)
                    if re.search(args.kernels, name):
                        print(f"{src}: sass  {name}: {sass_summary(ins)}")


if __name__ == "__main__":
    main()
