"""The CUDA/HIP kernel sources the build compiles, for the CPU emulations of tests/fused_attn_emu.

``kernel_source(name)`` reads ``native/ggml/ggml-cuda/NAME`` where our own kernel files live, else NAME under
ggml/src/ggml-cuda of a tree exported by ``tools/patches.py export`` (pristine llama.cpp + the series, as CMake
builds it; exported once per session into a temporary folder). Upstream files (ggml-common.h, cpy-utils.cuh) come
from that tree, never from a copy.

``cut`` takes a kernel's part of a file between two markers; ``for_emulation`` points its shared memory at the
harness's (the only edit made to a kernel's text besides a test's own mutations).
"""

from __future__ import annotations

import atexit
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "native" / "ggml" / "ggml-cuda"
_EXPORTED: dict[str, Path] = {}


class SourceUnavailable(RuntimeError):
    """The pinned llama.cpp (vendor/) is missing, so no tree can be exported."""


def exported_tree() -> Path:
    """pristine + series, exported once per session (tools/patches.py export)."""
    if "tree" not in _EXPORTED:
        sys.path.insert(0, str(ROOT / "tools"))
        try:
            import _patches as patches
        finally:
            sys.path.remove(str(ROOT / "tools"))
        tmp = Path(tempfile.mkdtemp(prefix="llama-vq-kernels-"))
        atexit.register(shutil.rmtree, tmp, True)
        try:
            patches.export(tmp / "llama.cpp")
        except patches.PatchError as e:
            raise SourceUnavailable(str(e)) from e
        _EXPORTED["tree"] = tmp / "llama.cpp"
    return _EXPORTED["tree"]


def kernel_path(name: str) -> Path:
    """Where the build reads kernel file `name` (e.g. "fwht-fused.cu"): native/ggml/ggml-cuda, else the export."""
    own = NATIVE / name
    if own.exists():
        return own
    return exported_tree() / "ggml" / "src" / "ggml-cuda" / name


def kernel_source(name: str) -> str:
    return kernel_path(name).read_text()


def ggml_src_dir() -> Path:
    """ggml/src of the exported tree (ggml-common.h), for -I."""
    return exported_tree() / "ggml" / "src"


def cut(text: str, begin: str, end: str | None) -> str:
    """text from the first `begin` up to the first `end` after it (to the end of text if end is None)."""
    i = text.index(begin)
    j = len(text) if end is None else text.index(end, i)
    return text[i:j]


_EXTERN_SHARED = re.compile(r"extern __shared__ (\w+) (\w+)\[\];")
_STATIC_SHARED = re.compile(r"(?<!extern )__shared__ (\w+) (\w+)((?:\[[^\]]+\])+);")


def for_emulation(text: str) -> str:
    """Shared memory as the harness provides it: `extern __shared__ T x[];` points at the launch's dynamic buffer
    (g_smem), `__shared__ T x[A][B];` is a reference to the block's instance of that array (emu_static_shared: one
    per block, filled with NaN, counted against the surface's LDS limit)."""
    text = _EXTERN_SHARED.sub(r"\1 * \2 = (\1 *) g_smem;", text)
    return _STATIC_SHARED.sub(r"\1 (&\2)\3 = emu_static_shared<\1\3>(EMU_SHARED_KEY);", text)
