"""llama-vq as users install it: the sdist and the wheels, in fresh virtual environments, away from the checkout.

* the wheels of `scripts/build.sh wheel` (llama-vq + bindings-only llama-cpp-python) install into a fresh venv;
  from a directory outside the checkout, `llama_vq` imports from that venv, generates with a q4_0 V cache and
  flash attention off, and `llama-vq-server` answers /health on 127.0.0.1;
* the README's one-line install from the sdist, `CMAKE_ARGS="-DLLAMA_BUILD=OFF" pip install ./llama-vq`, compiles
  llama.cpp once (llama-cpp-python without its own native build) and gives a working package. Timed.

Cost: the wheel reuses the suite's build directory (packaging only); the sdist install compiles the libraries
again in pip's temporary build tree, through ccache (hits: CCACHE_BASEDIR makes paths relative), plus pip's
downloads of the build requirements when its cache is cold.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import httpx
import pytest
from server_support import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SMOKE = """
import sys
from pathlib import Path
venv, model = Path(sys.argv[1]).resolve(), sys.argv[2]
import llama_vq
where = Path(llama_vq.__file__).resolve()
assert where.is_relative_to(venv), f"llama_vq imported from {where}, not from {venv}"
llm = llama_vq.Llama(model, n_ctx=256, type_k="q8_0", type_v="q4_0", flash_attn=False, n_threads=2, verbose=False)
info = llm.kv_cache_info()
assert (info.type_k, info.type_v, llm.flash_attn) == ("q8_0", "q4_0", False), (info, llm.flash_attn)
text = llm.create_completion("The capital of France is", max_tokens=4, temperature=0.0)["choices"][0]["text"]
assert text.strip(), repr(text)
print("smoke ok:", where, repr(text), llama_vq.build_info().patches[-1])
"""


def _run(cmd, *, cwd: Path, env: dict | None = None, timeout: float = 3600) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, (
        f"{' '.join(map(str, cmd))} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    )
    return r


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: nothing that points Python or the build at this checkout or the suite."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTHON", "VIRTUAL_ENV", "LLAMA_VQ_", "LLAMA_CPP_", "PYTEST", "CMAKE_ARGS"))
    }
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(str(ROOT)))
    env.update(extra)
    return env


def _venv(path: Path) -> Path:
    _run([sys.executable, "-m", "venv", path], cwd=path.parent)
    return path / "bin" / "python"


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    env = dict(os.environ, PYTHON=sys.executable)
    _run(["bash", ROOT / "scripts" / "build.sh", "sdist", out], cwd=ROOT, env=env)
    _run(["bash", ROOT / "scripts" / "build.sh", "wheel", out], cwd=ROOT, env=env)
    return out


def _server_answers_health(venv: Path, model: Path, cwd: Path) -> dict:
    port = free_port()
    log = (cwd / "server.log").open("wb")
    proc = subprocess.Popen(
        [
            venv / "bin" / "llama-vq-server",
            "--model",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--ctx-size",
            "256",
        ],
        cwd=cwd,
        env=_clean_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert proc.poll() is None, (cwd / "server.log").read_text()[-3000:]
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
                if r.status_code == 200:
                    return r.json()
            except httpx.TransportError:
                pass
            time.sleep(0.1)  # polling interval against the deadline
        raise AssertionError("no 200 from /health within 120 s:\n" + (cwd / "server.log").read_text()[-3000:])
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


def test_wheels_install_into_a_fresh_venv_and_run_without_the_source_tree(dist, smollm2_path, tmp_path):
    wheels = sorted(dist.glob("*.whl"))
    assert {w.name.split("-")[0] for w in wheels} == {"llama_vq", "llama_cpp_python"}, wheels
    # the server is the subpackage llama_vq.server, with its engine; no top-level "server" to collide with others'
    (ours,) = [w for w in wheels if w.name.startswith("llama_vq-")]
    names = zipfile.ZipFile(ours).namelist()
    assert {n.split("/")[0] for n in names if "/" in n and not n.split("/")[0].endswith(".dist-info")} == {
        "llama_vq"
    }, sorted({n.split("/")[0] for n in names})
    assert "llama_vq/server/cli.py" in names and "llama_vq/lib/libllama-vq-server.so" in names
    away = tmp_path / "elsewhere"
    away.mkdir()
    py = _venv(tmp_path / "venv")
    _run([py, "-m", "pip", "install", "-q", *wheels], cwd=away, env=_clean_env())
    r = _run([py, "-c", SMOKE, tmp_path / "venv", smollm2_path], cwd=away, env=_clean_env())
    print("\n" + r.stdout.strip())
    health = _server_answers_health(tmp_path / "venv", smollm2_path, away)
    assert health["status"] == "ok", health


def test_readme_one_line_install_from_the_sdist_builds_once_and_works(dist, smollm2_path, tmp_path, record_property):
    (sdist,) = dist.glob("llama_vq-*.tar.gz")
    with tarfile.open(sdist) as tar:
        top = tar.getnames()[0].split("/")[0]
        tar.extractall(tmp_path, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    shutil.move(tmp_path / top, tmp_path / "llama-vq")
    py = _venv(tmp_path / "venv")
    # llama-cpp-python's sdist, the pinned file tools/vendor.py fetched and checked, where pip looks first (CI
    # machines need not reach the index for a file already here)
    pinned_sdist = (
        subprocess.run(
            [sys.executable, ROOT / "tools" / "vendor.py", "sdist"], capture_output=True, text=True, check=True
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    t0 = time.monotonic()
    # the README's line: the variable reaches llama-cpp-python's build (bindings only) and ours (ignored)
    r = _run(
        [py, "-m", "pip", "install", "--find-links", Path(pinned_sdist).parent, "./llama-vq"],
        cwd=tmp_path,
        env=_clean_env(CMAKE_ARGS="-DLLAMA_BUILD=OFF"),
    )
    seconds = time.monotonic() - t0
    record_property("sdist_install_seconds", round(seconds, 1))
    print(f'\nCMAKE_ARGS="-DLLAMA_BUILD=OFF" pip install ./llama-vq: {seconds:.0f} s')
    shutil.rmtree(tmp_path / "llama-vq")  # nothing of the source tree is left to import from
    away = tmp_path / "elsewhere"
    away.mkdir()
    r = _run([py, "-c", SMOKE, tmp_path / "venv", smollm2_path], cwd=away, env=_clean_env())
    print(r.stdout.strip())
    # one native build: llama-cpp-python installed no libllama of its own
    r = _run(
        [
            py,
            "-c",
            "import importlib.util as u, pathlib; s = u.find_spec('llama_cpp'); "
            "print(*sorted(p.name for p in pathlib.Path(s.origin).parent.rglob('*.so')))",
        ],
        cwd=away,
        env=_clean_env(),
    )
    assert "libllama.so" not in r.stdout.split(), r.stdout
