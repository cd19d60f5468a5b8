"""The native build: pinned source, patch series, backend, binding, rpath, CPU safety."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import _patches as patch_tool  # noqa: E402
import _pin  # noqa: E402

import vendor as vendor_tool  # noqa: E402


def test_build_info_reports_backend_targets_commit_and_applied_patches(build):
    pin = _pin.read_pin()
    assert build.backend in ("cpu", "cuda", "hip")
    assert build.llama_cpp_commit == pin.llama_cpp_commit
    assert build.llama_cpp_python == pin.llama_cpp_python == "0.3.36"
    assert build.patches == _pin.read_series()
    assert build.patches, (
        "the series is never empty: 0001-bindings-introspection-build-tag-and-kv-cache-size tags the build"
    )
    if build.backend == "cpu":
        assert build.gpu_targets == []
    else:
        assert build.gpu_targets
    d = build.as_dict()
    assert {"backend", "gpu_targets", "llama_cpp_commit", "llama_cpp_build", "patches"} <= d.keys()


def test_loaded_library_is_the_patched_llama_vq_build(build):
    # patch 0001-bindings-introspection-build-tag-and-kv-cache-size tags llama_print_system_info(); a stock
    # libllama would not say this
    assert build.system_info.startswith(f"LLAMA_VQ : BUILD = {build.version} |"), build.system_info


def test_the_loaded_library_has_every_function_of_the_series_and_one_without_them_is_refused_with_the_fix(llama_vq):
    import llama_cpp

    from llama_vq import _llama_cpp
    from llama_vq.errors import BindingError

    lib = llama_cpp.llama_cpp._lib
    _llama_cpp.check_series()  # the library this process loaded (the package import ran the same check)
    assert all(hasattr(lib, name) for name in _llama_cpp.LLAMA_VQ_FUNCTIONS)

    class Stale:  # a libllama built without 0018-llama-flash-attn-prefill-mode
        _name = "/somewhere/libllama.so"

    for name in _llama_cpp.LLAMA_VQ_FUNCTIONS:
        if name != "llama_vq_flash_attn_type":
            setattr(Stale, name, getattr(lib, name))
    with pytest.raises(BindingError) as e:
        _llama_cpp.check_series(Stale())
    msg = str(e.value)
    assert "/somewhere/libllama.so lacks llama-vq's functions llama_vq_flash_attn_type:" in msg, msg
    assert "patches/series" in msg and "scripts/run.sh setup" in msg and "--force-reinstall" in msg, msg
    assert isinstance(e.value, ImportError)  # raised by `import llama_vq`


def test_llama_cpp_python_is_bound_to_llama_vq_lib(llama_vq):
    import llama_cpp

    loaded = Path(llama_cpp.llama_cpp._lib._name).resolve()
    assert loaded.parent == (Path(llama_vq.__file__).parent / "lib").resolve()


def _readelf_dynamic(path: Path) -> str:
    if not shutil.which("readelf"):
        pytest.skip("readelf (binutils) is not installed")
    return subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout


def test_native_libraries_use_origin_rpath_and_unversioned_sonames(llama_vq, build):
    from llama_vq._cdll import build_config

    lib = Path(llama_vq.__file__).parent / "lib"
    names = sorted(p.name for p in lib.glob("lib*.so"))
    # a build with backends as modules (scripts/run.sh's set-up on a CPU) has one CPU module per level it built
    cpu = {f"libggml-cpu-{v}.so" for v in build_config()["cpu_variants"]} if build.backend_dl else set()
    assert {"libllama.so", "libggml.so", "libggml-base.so"} | (cpu or {"libggml-cpu.so"}) <= set(names), names
    assert not build.backend_dl or f"libggml-cpu-{build.cpu_variant}.so" in cpu, (build.cpu_variant, names)
    for name in names:
        dyn = _readelf_dynamic(lib / name)
        assert "$ORIGIN" in dyn, f"{name} lacks an $ORIGIN rpath"
        assert ".so." not in dyn.split("Library soname:")[-1].split("]")[0], f"{name} has a versioned soname"


def test_cpu_build_is_portable_without_native_or_amx(build):
    # docs/architecture.md, decision 3: -march=native on an AMX Xeon enables ggml's AMX kernels, which fault.
    assert not any("AMX" in f for f in build.cpu_features)
    assert "AMX_INT8 = 1" not in build.system_info
    assert "AMX" not in " ".join(build.cpu_features)


def test_importing_llama_cpp_first_with_another_library_is_refused(tmp_path, llama_vq):
    other = tmp_path / "otherlib"
    shutil.copytree(Path(llama_vq.__file__).parent / "lib", other)
    code = "import llama_cpp\nimport llama_vq\n"
    env = dict(os.environ, LLAMA_CPP_LIB_PATH=str(other))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode != 0
    assert "ImportError" in proc.stderr or "BindingError" in proc.stderr
    assert "import llama_vq before" in proc.stderr
    assert str(other) in proc.stderr


def test_importing_llama_cpp_after_llama_vq_uses_llama_vq_lib(tmp_path):
    code = "import llama_vq, llama_cpp, pathlib\nprint(pathlib.Path(llama_cpp.llama_cpp._lib._name).resolve().parent)\n"
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_CPP_LIB_PATH"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, check=True
    )
    import llama_vq

    assert Path(proc.stdout.strip()) == (Path(llama_vq.__file__).parent / "lib").resolve()


def test_patch_series_applies_cleanly_to_the_pristine_tree():
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "patches.py"), "check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    for name in _pin.read_series():
        assert name in proc.stdout


def test_every_patch_has_a_dep3_header():
    for name in _pin.read_series():
        header = patch_tool.header(_pin.PATCHES / name)
        for field in ("Description:", "Author:", "Forwarded:", "Last-Update:"):
            assert field in header, f"{name} lacks {field}"
        assert "<what and why" not in header, f"{name} still has the placeholder description"


def test_a_patch_that_does_not_apply_fails_naming_the_patch(tmp_path):
    tree = tmp_path / "tree"
    (tree / "src").mkdir(parents=True)
    (tree / "src" / "a.c").write_text("int a = 1;\n")
    bad = tmp_path / "0099-broken.patch"
    bad.write_text("Description: x\n---\n--- a/src/a.c\n+++ b/src/a.c\n@@ -1 +1 @@\n-int a = 2;\n+int a = 3;\n")
    with pytest.raises(patch_tool.PatchError) as e:
        patch_tool.apply_one(tree, bad)
    assert "0099-broken.patch" in str(e.value)
    assert (tree / "src" / "a.c").read_text() == "int a = 1;\n"


def test_vendor_refuses_an_sdist_with_the_wrong_hash(tmp_path):
    fake = tmp_path / "llama_cpp_python-0.3.36.tar.gz"
    with tarfile.open(fake, "w:gz") as tar:
        f = tmp_path / "x.txt"
        f.write_text("not llama.cpp")
        tar.add(f, arcname="llama_cpp_python-0.3.36/vendor/llama.cpp/x.txt")
    pin = _pin.read_pin()
    with pytest.raises(vendor_tool.VendorError) as e:
        vendor_tool.extract(pin, fake, tmp_path / "vendor" / "llama.cpp")
    assert pin.sdist_sha256 in str(e.value)
    assert not (tmp_path / "vendor" / "llama.cpp").exists()


def test_vendored_tree_is_pristine_and_stamped():
    pin = _pin.read_pin()
    assert vendor_tool.is_current(pin)
    # llama.cpp's own llama.h is the pristine one: our API addition lives only in patches/
    assert "llama_kv_cache_size" not in (_pin.VENDOR / "include" / "llama.h").read_text()


def test_every_installed_tool_finds_its_shared_libraries(build, llama_vq):
    if not build.tools:
        pytest.skip("built without tools (LLAMA_VQ_BUILD_TOOLS=OFF)")
    if not shutil.which("ldd"):
        pytest.skip("ldd is not installed")
    bin_dir = Path(llama_vq.__file__).parent / "bin"
    for tool in build.tools:
        out = subprocess.run(["ldd", str(bin_dir / tool)], capture_output=True, text=True).stdout
        assert "not found" not in out, f"{tool}:\n{out}"
