"""One registry of the LLAMA_VQ_* environment variables (llama_vq/_envs.py): the code reads what it declares and
nothing else, docs/knobs.md is generated from it, and the package reads its variables through it.

The scan (tools/knobs.py) covers the package, native/, patches/ (the lines they add), scripts/, cmake/,
CMakeLists.txt, pyproject.toml, benchmarks/, tools/, tests/, docker/ and .ci/.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import knobs  # noqa: E402


@pytest.fixture(scope="module")
def envs():
    return knobs.registry()


@pytest.fixture(scope="module")
def scanned():
    return knobs.scan()


def test_every_variable_the_code_reads_is_declared_in_the_registry(envs, scanned):
    reads, _ = scanned
    undeclared = {name: sorted(files) for name, files in reads.items() if name not in envs.BY_NAME}
    assert not undeclared, f"declare these in llama_vq/_envs.py: {undeclared}"


def test_every_variable_the_code_sets_is_declared_in_the_registry(envs, scanned):
    # a test or script that sets a name nobody declares sets a typo, or a switch that is gone
    _, sets = scanned
    undeclared = {name: sorted(files) for name, files in sets.items() if name not in envs.BY_NAME}
    assert not undeclared, f"set but not declared in llama_vq/_envs.py: {undeclared}"


def test_no_code_reads_or_sets_a_removed_switch(envs, scanned):
    reads, sets = scanned
    removed = {name for name, _, _ in envs.REMOVED}
    assert not removed & envs.BY_NAME.keys()
    assert not removed & (reads.keys() | sets.keys()), sorted(removed & (reads.keys() | sets.keys()))


def test_every_declared_variable_is_read_by_some_code(envs, scanned):
    reads, _ = scanned
    unread = [v.name for v in envs.VARS if v.name not in reads]
    assert not unread, f"declared in llama_vq/_envs.py but read nowhere (remove them): {unread}"


def test_each_variable_is_declared_once_with_known_layers_and_a_meaning(envs):
    names = [v.name for v in envs.VARS]
    assert len(names) == len(set(names)), [n for n in names if names.count(n) > 1]
    for v in envs.VARS:
        assert re.fullmatch(r"LLAMA_VQ_[A-Z0-9_]+", v.name), v.name
        assert v.layers and set(v.layers) <= set(envs.LAYERS), (v.name, v.layers)
        assert v.type and len(v.meaning) > 20, v.name
        if "native" in v.layers:
            assert v.where, f"{v.name}: a native variable names the patch or source that reads it"


def test_the_server_flags_variables_are_the_registrys_server_layer(envs):
    from llama_vq.server.options import FLAGS

    assert sorted(knobs.server_flag_vars()) == sorted(f.env for f in FLAGS)
    declared = sorted(v.name for v in envs.VARS if "server" in v.layers)
    assert declared == sorted(f.env for f in FLAGS)


def test_the_cache_folder_and_the_chat_log_verbosity_are_documented(envs):
    page = (ROOT / "docs" / "knobs.md").read_text()
    for name in ("LLAMA_VQ_CACHE", "LLAMA_VQ_CHAT_LOG_VERBOSITY", "LLAMA_VQ_STATE_BUDGET", "LLAMA_VQ_CPU_VARIANT"):
        assert f"`{name}`" in page, name


def test_docs_knobs_md_is_generated_from_the_registry():
    assert (ROOT / "docs" / "knobs.md").read_text() == knobs.render(), "run `python tools/knobs.py write`"


def test_the_package_reads_its_variables_through_the_registry():
    # os.environ / getenv of a LLAMA_VQ_* name in the package, outside the registry itself, bypasses it.
    # _fetch.py is the one exception: tools/vendor.py loads it by path before the package is built, so it
    # imports nothing of the package (its LLAMA_VQ_CACHE is declared all the same)
    direct = re.compile(r"(?:environ\.get|environ\[|getenv)\(?\s*[\"']LLAMA_VQ_")
    offenders = []
    for path in sorted((ROOT / "llama_vq").rglob("*.py")):
        if path.name in ("_envs.py", "_fetch.py"):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if direct.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}")
    assert not offenders, offenders


def test_get_returns_the_value_or_the_declared_default_and_refuses_an_undeclared_name(envs):
    assert envs.get("LLAMA_VQ_CHAT_LOG_VERBOSITY", {}) == "1"
    assert envs.get("LLAMA_VQ_CHAT_LOG_VERBOSITY", {"LLAMA_VQ_CHAT_LOG_VERBOSITY": "2"}) == "2"
    assert envs.get("LLAMA_VQ_CACHE", {"LLAMA_VQ_CACHE": ""}) is None  # empty is unset; no default
    with pytest.raises(KeyError):
        envs.get("LLAMA_VQ_" + "NOT_DECLARED", {})  # spelled so that the scan does not take it for a read


def test_the_scan_sees_each_languages_reads(scanned):
    # one read per language, each of a known variable at a known place: the scan can fail
    reads, sets = scanned
    assert "patches/0017-llama-attn-split-scratch-budget.patch" in reads["LLAMA_VQ_ATTN_SCRATCH_MIB"]  # getenv (patch)
    assert "native/ggml/ggml-cpu/llama-vq-op-log.h" in reads["LLAMA_VQ_CPU_OP_LOG"]  # getenv (native)
    assert "llama_vq/_fetch.py" in reads["LLAMA_VQ_CACHE"]  # os.environ.get (Python)
    assert "llama_vq/chat.py" in reads["LLAMA_VQ_CHAT_LOG_VERBOSITY"]  # _envs.get (Python)
    assert "scripts/hip-toolchain.sh" in reads["LLAMA_VQ_HIP_MIRROR"]  # ${...} (shell)
    assert "CMakeLists.txt" in reads["LLAMA_VQ_TOOLS"]  # $ENV{...} (CMake)
    assert "pyproject.toml" in reads["LLAMA_VQ_CPU_FEATURES"]  # { env = ... } (scikit-build-core)
    assert "llama_vq/server/options.py" in reads["LLAMA_VQ_DRAIN_TIMEOUT"]  # generated from the flag
    assert "native/server/llama_vq_server_impl.h" in sets["LLAMA_VQ_CACHE_TYPE_K_SWA"]  # setenv
    assert "docker/Dockerfile.cpu" in sets["LLAMA_VQ_CPU_FEATURES"]  # ENV X=
