"""llama-vq as users install it: the sdist and the wheel, in fresh virtual environments, away from the checkout.

* the wheel of `scripts/build.sh wheel` (llama_vq with the pinned llama_cpp bindings inside) installs alone into a
  fresh venv; from a directory outside the checkout, `llama_vq` imports from that venv, generates with a q4_0 V
  cache and flash attention off, and `llama-vq-server` answers /health on 127.0.0.1. A llama-cpp-python installed
  after it is refused at import with the fix, and the fix works;
* `pip install llama-vq` from a folder holding our sdist and llama-cpp-python's (an index as users have it), with
  no CMAKE_ARGS, compiles llama.cpp exactly once: pip's verbose log links one libllama, the venv holds one, and
  no llama-cpp-python distribution is installed. Timed.

Cost: the wheel reuses the suite's build directory (packaging only); the sdist install compiles the libraries
again in pip's temporary build tree with the set-up build's compile flags (same backend, backends as modules, options
for the libraries; the host's CPU module of the set-up's four), so every compile is a ccache hit (CCACHE_BASEDIR makes
paths relative, and the unity batches include their files by relative paths: cmake/llama_vq_unity.cmake); the cost is
CMake's configure, the links and pip's downloads of build requirements when its cache is cold. The two
installs run at once (fixture `installs`): the wheel's is mostly pip resolving dependencies against the index, the
sdist's mostly the compile.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import venv_support
from server_support import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
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
    return venv_support.fresh_venv(path)  # with the suite's pip (tests/support/venv_support.py says why)


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    env = dict(os.environ, PYTHON=sys.executable)
    _run(["bash", ROOT / "scripts" / "build.sh", "sdist", out], cwd=ROOT, env=env)
    _run(["bash", ROOT / "scripts" / "build.sh", "wheel", out], cwd=ROOT, env=env)
    return out


class _Install:
    """A `pip install` into a fresh venv, started now and waited for by the test that checks it."""

    def __init__(self, root: Path, args: list) -> None:
        root.mkdir()
        self.root, self.venv, self.away = root, root / "venv", root / "elsewhere"
        self.away.mkdir()
        self.py = _venv(self.venv)
        self.cmd = [str(self.py), "-m", "pip", "install", *map(str, args)]
        self.t0 = time.monotonic()
        with (root / "pip.out").open("w") as out, (root / "pip.err").open("w") as err:
            self.proc = subprocess.Popen(self.cmd, cwd=root, env=_clean_env(), stdout=out, stderr=err)

    def wait(self) -> tuple[str, float]:
        """pip's output (stdout, then stderr) and the install's wall seconds; fails as _run does."""
        try:
            self.proc.wait(timeout=3600)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        seconds = time.monotonic() - self.t0
        out, err = (self.root / "pip.out").read_text(), (self.root / "pip.err").read_text()
        assert self.proc.returncode == 0, (
            f"{' '.join(self.cmd)} failed ({self.proc.returncode}):\n{out[-3000:]}\n{err[-3000:]}"
        )
        return out + err, seconds


@pytest.fixture(scope="module")
def installs(dist, tmp_path_factory) -> Iterator[dict[str, _Install]]:
    """Both installs of this module, started at once: the wheel's (pip resolving its dependencies, mostly waiting
    on the index) beside the sdist's (mostly the compile). Each test waits for its own and checks it."""
    root = tmp_path_factory.mktemp("installs")
    (wheel,) = sorted(dist.glob("*.whl"))
    (sdist,) = dist.glob("llama_vq-*.tar.gz")
    index = root / "index"
    index.mkdir()
    shutil.copy(sdist, index)
    shutil.copy(_pinned_sdist(), index)  # llama-cpp-python's, as the package index holds it: never used now
    started = {"wheel": _Install(root / "wheel", ["-q", wheel])}
    # no CMAKE_ARGS: what a user types
    started["sdist"] = _Install(root / "sdist", ["-v", "--find-links", index, "llama-vq"])
    yield started
    for install in started.values():  # a test that failed early leaves its install running
        if install.proc.poll() is None:
            install.proc.kill()
            install.proc.wait()


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


def _pinned_sdist() -> Path:
    """llama-cpp-python's sdist, the pinned file tools/vendor.py fetched and checked."""
    out = subprocess.run(
        [sys.executable, ROOT / "tools" / "vendor.py", "sdist"], capture_output=True, text=True, check=True
    ).stdout
    return Path(out.strip().splitlines()[-1])


FOREIGN_CHECK = """
try:
    import llama_vq
except ImportError as e:
    print("refused:", e)
else:
    print("imported", llama_vq.__file__)
"""


def test_wheel_installs_alone_into_a_fresh_venv_and_runs_without_the_source_tree(dist, installs, smollm2_path):
    wheels = sorted(dist.glob("*.whl"))
    # one wheel: llama-cpp-python's bindings are inside it, no llama_cpp_python wheel next to it
    assert [w.name.split("-")[0] for w in wheels] == ["llama_vq"], wheels
    (ours,) = wheels
    names = zipfile.ZipFile(ours).namelist()
    # the server is the subpackage llama_vq.server, with its engine; no top-level "server" to collide with others';
    # llama_cpp is the pinned bindings package, and nothing else sits at the top level
    tops = {n.split("/")[0] for n in names if "/" in n and not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"llama_vq", "llama_cpp"}, sorted(tops)
    assert "llama_vq/server/cli.py" in names and "llama_vq/lib/libllama-vq-server.so" in names
    assert "llama_cpp/llama_cpp.py" in names and not [n for n in names if n.startswith("llama_cpp/server/")]
    assert [n for n in names if n.endswith("libllama.so")] == ["llama_vq/lib/libllama.so"]
    # the product only: the test models' fetchers are fixtures of tests/ (qwen_coder_support.py)
    assert not [n for n in names if "qwen_coder" in n or n.startswith("tests/")], names
    install = installs["wheel"]
    install.wait()
    py, venv, away = install.py, install.venv, install.away
    r = _run([py, "-c", SMOKE, venv, smollm2_path], cwd=away, env=_clean_env())
    print("\n" + r.stdout.strip())
    health = _server_answers_health(venv, smollm2_path, away)
    assert health["status"] == "ok", health

    # llama-cpp-python installed afterwards (bindings only, so that this test compiles nothing): its llama_cpp
    # overwrites ours; import llama_vq refuses, naming the fix
    _run(
        [py, "-m", "pip", "install", "-q", "--no-deps", _pinned_sdist()],
        cwd=away,
        env=_clean_env(CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF"),
    )
    r = _run([py, "-c", FOREIGN_CHECK], cwd=away, env=_clean_env())
    assert r.stdout.startswith("refused:"), r.stdout
    assert "llama-cpp-python 0.3.36 is installed" in r.stdout and "pip uninstall -y llama-cpp-python" in r.stdout
    # the fix, as the message words it, gives a working llama_vq again
    _run([py, "-m", "pip", "uninstall", "-q", "-y", "llama-cpp-python"], cwd=away, env=_clean_env())
    _run([py, "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", ours], cwd=away, env=_clean_env())
    r = _run([py, "-c", SMOKE, venv, smollm2_path], cwd=away, env=_clean_env())
    assert r.stdout.startswith("smoke ok:"), r.stdout


# a link step of libllama in pip's verbose build log (ninja's and make's wording)
_LIBLLAMA_LINK = re.compile(r"Linking (?:CXX|C) shared (?:library|module) \S*\blibllama\.(?:so|dylib)\b")


def test_pip_install_from_an_index_with_both_sdists_compiles_llama_cpp_once(installs, smollm2_path, record_property):
    install = installs["sdist"]  # pip install -v --find-links <our sdist and llama-cpp-python's> llama-vq
    log, seconds = install.wait()
    record_property("sdist_install_seconds", round(seconds, 1))
    (install.root / "pip.log").write_text(log)
    links = _LIBLLAMA_LINK.findall(log)
    print(f"\npip install llama-vq (from our sdist): {seconds:.0f} s, libllama links: {len(links)}")
    assert len(links) == 1, f"libllama was linked {len(links)} times:\n" + "\n".join(
        line for line in log.splitlines() if "libllama" in line
    )
    py, venv, away = install.py, install.venv, install.away
    listed = _run([py, "-m", "pip", "list", "--format=freeze"], cwd=away, env=_clean_env()).stdout
    assert "llama_cpp_python" not in listed.replace("-", "_").lower(), listed
    built = sorted(str(p.relative_to(venv)) for p in venv.rglob("libllama.so"))
    assert len(built) == 1 and built[0].endswith("site-packages/llama_vq/lib/libllama.so"), built
    r = _run([py, "-c", SMOKE, venv, smollm2_path], cwd=away, env=_clean_env())
    print(r.stdout.strip())


def test_foreign_llama_cpp_python_distribution_is_named_with_the_fix(llama_vq, tmp_path, monkeypatch):
    from llama_vq import _llama_cpp

    assert _llama_cpp.foreign_llama_cpp_python() is None  # the suite's environment holds none
    info = tmp_path / "llama_cpp_python-0.3.20.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: llama_cpp_python\nVersion: 0.3.20\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    msg = _llama_cpp.foreign_llama_cpp_python()
    assert msg is not None and "llama-cpp-python 0.3.20 is installed" in msg, msg
    assert "pip uninstall -y llama-cpp-python" in msg and "--force-reinstall" in msg


def test_dependencies_are_the_pinned_bindings_own_and_extras_name_this_versions_backend_wheels():
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    ours = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    with tarfile.open(_pinned_sdist()) as tar:
        name = next(n for n in tar.getnames() if n.endswith("/pyproject.toml") and n.count("/") == 1)
        theirs = tomllib.loads(tar.extractfile(name).read().decode())["project"]
    # the bindings inside our wheel need what their release declares, and llama-cpp-python itself is not among ours
    assert set(theirs["dependencies"]) <= set(ours["dependencies"]), (theirs["dependencies"], ours["dependencies"])
    assert not [d for d in ours["dependencies"] if d.replace("_", "-").startswith("llama-cpp-python")]
    version = ours["version"]
    extras = ours["optional-dependencies"]
    assert f"llama-vq-hip=={version}" in extras["hip"] and f"llama-vq-cuda=={version}" in extras["cuda"], extras
