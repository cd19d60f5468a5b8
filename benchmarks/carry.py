#!/usr/bin/env python3
"""Prepare what a benchmark run on another machine needs, in a folder git ignores (~30 MB).

    python benchmarks/carry.py DEST [--tokenizer-from GGUF]

DEST/llama.cpp   the patched tree (tools/patches.py export), without the sources of backends a
                 CUDA or CPU build never configures (CMake only enters ggml/src/ggml-<x> when
                 GGML_<X>=ON) and without the web UI's sources (llama-server
                 builds with LLAMA_BUILD_UI=OFF)
DEST/gguf-py     the gguf package matching the pin (tools/synth_models.py finds it via --src)
DEST/vocab.gguf  tokenizer metadata only (SmolLM2's), for the synthetic models

The vendored tree is git-ignored, so it does not travel with the working tree by itself.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("dest", type=Path)
    ap.add_argument(
        "--tokenizer-from",
        help="GGUF with tokenizer metadata (default: SmolLM2 via llama_vq.models)",
    )
    a = ap.parse_args(argv)
    dest = a.dest.resolve()
    dest.mkdir(parents=True, exist_ok=True)
    tree = dest / "llama.cpp"
    if tree.exists():
        shutil.rmtree(tree)
    subprocess.run(
        [sys.executable, str(REPO / "tools" / "patches.py"), "export", str(tree)], check=True
    )
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

    src = a.tokenizer_from or synth_models.default_tokenizer_source()
    synth_models.write_vocab_only(src, dest / "vocab.gguf")
    size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    print(f"{dest}: {size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
