"""tools/backend_wheel.py refuses a GPU module that calls its driver API without linking the driver's library.

A shared object may leave symbols undefined, so a module linked against a libcuda.so stub that defines nothing
builds fine: the linker's --as-needed drops libcuda.so.1 from DT_NEEDED, and the module then fails to load on a
machine with a GPU (`undefined symbol: cuMemCreate`; the CUDA wheel built on a machine without a driver did this on
an H100, benchmarks/RESULTS.md). Here real objects are linked both ways by the system's compiler and linker.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import backend_wheel  # noqa: E402

CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(not CC or not shutil.which("readelf"), reason="needs a C compiler and readelf")


def _cc(tmp: Path, name: str, source: str, *args: str) -> Path:
    src = tmp / f"{name}.c"
    src.write_text(source)
    out = tmp / name
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([CC, "-shared", "-fPIC", "-o", out, src, *args], check=True, capture_output=True)
    return out


def _source_wheel(tmp: Path, module: Path) -> Path:
    whl = tmp / "llama_vq-0.1.0-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.write(module, "llama_vq/lib/libggml-cuda.so")
    return whl


@pytest.mark.parametrize("stub_defines", [False, True])
def test_cuda_module_must_name_libcuda_when_it_calls_the_driver_api(tmp_path, stub_defines):
    stub_dir = tmp_path / "stubs"
    stub_dir.mkdir()
    body = "int cuMemCreate(void) { return 0; }\nint cuDeviceGet(void) { return 0; }\n" if stub_defines else ""
    _cc(stub_dir, "libcuda.so", body or "void empty_stub_(void) {}\n", "-Wl,-soname,libcuda.so.1")
    module = _cc(
        tmp_path,
        "libggml-cuda.so",
        "extern int cuMemCreate(void);\nextern int cuDeviceGet(void);\n"
        "int vmm(void) { return cuMemCreate() + cuDeviceGet(); }\n",
        "-Wl,--as-needed",
        f"-L{stub_dir}",
        "-lcuda",
    )
    whl = _source_wheel(tmp_path, module)
    if stub_defines:
        out = backend_wheel.build("cuda", whl, tmp_path / "out")
        with zipfile.ZipFile(out) as z:
            assert z.read("llama_vq/lib/libggml-cuda.so") == module.read_bytes()
    else:
        with pytest.raises(SystemExit) as e:
            backend_wheel.build("cuda", whl, tmp_path / "out")
        msg = str(e.value)
        assert "calls the CUDA driver API (cuDeviceGet, cuMemCreate)" in msg, msg
        assert "does not link libcuda.so.1" in msg and "would fail to load" in msg, msg
        assert not (tmp_path / "out").exists()


def test_a_module_that_calls_no_driver_api_needs_no_driver_library(tmp_path):
    module = _cc(tmp_path, "libggml-cuda.so", "int cudaLike(void) { return 1; }\n")
    out = backend_wheel.build("cuda", _source_wheel(tmp_path, module), tmp_path / "out")
    assert out.is_file()
