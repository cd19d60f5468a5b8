"""The Docker images, as far as they can be checked without a Docker engine (none runs on our machines).

What runs here: the Dockerfiles' structure (digest-pinned bases, non-root user, health check, host, port), the
build context (.dockerignore), and the one thing that broke the build stage (`tools/vendor.py sdist` printing
progress on stdout). The ROCm build stage's command itself (scripts/build.sh wheel with LLAMA_VQ_BACKEND=hip,
LLAMA_VQ_BACKEND_DL=ON) runs in tests/packaging/test_hip_build.py, and so do its runtime stage's RUN steps.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dockerfile_support import arg_defaults, parse, stages

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted((ROOT / "docker").glob("Dockerfile.*"))
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def server_default_port() -> int:
    """llama-server's default port (common_params::port in the pinned llama.cpp), which llama-vq-server keeps."""
    header = (ROOT / "vendor" / "llama.cpp" / "common" / "common.h").read_text()
    m = re.search(r"int32_t port\s*=\s*(\d+);", header)
    assert m, "common_params::port not found in vendor/llama.cpp/common/common.h"
    return int(m.group(1))


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_every_base_image_is_pinned_by_digest(dockerfile):
    args = arg_defaults(dockerfile)
    froms = [rest.split()[0] for word, rest in parse(dockerfile) if word == "FROM"]
    stage_names = {rest.split()[-1] for word, rest in parse(dockerfile) if word == "FROM" and " AS " in rest.upper()}
    for ref in froms:
        if ref in stage_names:
            continue
        resolved = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), ""), ref)
        assert DIGEST.search(resolved), f"{dockerfile.name}: FROM {ref} -> {resolved!r} is not pinned by digest"


def test_rocm_image_runs_the_server_as_a_non_root_user_in_the_gpu_groups():
    final = stages(ROOT / "docker" / "Dockerfile.rocm")[-1]
    users = [rest for word, rest in final if word == "USER"]
    assert users and users[-1] not in ("root", "0"), users
    runs = " ".join(rest for word, rest in final if word == "RUN")
    m = re.search(r"useradd ([^;&|]*)", runs)
    assert m, runs
    words = m.group(1).split()
    assert words[-1] == users[-1], words
    assert "--groups" in words and set(words[words.index("--groups") + 1].split(",")) == {"video", "render"}, words


def test_rocm_image_listens_on_all_interfaces_on_the_documented_port_with_a_health_check():
    final = stages(ROOT / "docker" / "Dockerfile.rocm")[-1]
    env = " ".join(rest for word, rest in final if word == "ENV")
    port = server_default_port()
    assert "LLAMA_ARG_HOST=0.0.0.0" in env
    assert f"LLAMA_ARG_PORT={port}" in env
    assert [rest for word, rest in final if word == "EXPOSE"] == [str(port)]
    health = [rest for word, rest in final if word == "HEALTHCHECK"]
    assert len(health) == 1 and "/health" in health[0] and "LLAMA_ARG_PORT" in health[0]
    readme = (ROOT / "docker" / "README.md").read_text()
    ports = set(re.findall(r"\bport (\d{4,5})\b|-p (\d{4,5}):", readme))
    assert {p for pair in ports for p in pair if p} == {str(port)}, ports


def test_rocm_image_bakes_the_default_model_where_any_user_reads_it():
    final = stages(ROOT / "docker" / "Dockerfile.rocm")[-1]
    env = dict(kv.split("=", 1) for word, rest in final if word == "ENV" for kv in shlex.split(rest) if "=" in kv)
    runs = " ".join(rest for word, rest in final if word == "RUN")
    cache = env["LLAMA_VQ_CACHE"]
    assert not cache.startswith(("/root", "~")), cache
    assert "llama_vq.models fetch" in runs and f"chmod -R a+rX {Path(cache).parent}" in runs


def test_build_stages_use_the_users_build_entry_point():
    for dockerfile in DOCKERFILES:
        build = stages(dockerfile)[0]
        runs = [rest for word, rest in build if word == "RUN"]
        assert "bash scripts/build.sh wheel /dist" in runs, (dockerfile.name, runs)


def test_dockerignore_keeps_builds_caches_venvs_and_vendor_stamps_out_of_the_context():
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".venv", "build", "vendor", ".cache", ".git", "llama_vq/lib", "**/__pycache__"} <= ignored
    if shutil.which("git"):
        # nothing git tracks is ignored (the image builds from what a clone has)
        tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True).stdout.split()
        tops = {p.split("/")[0] for p in tracked}
        assert not tops & {i for i in ignored if "/" not in i and "*" not in i}, tops & ignored


@pytest.mark.slow
def test_vendor_sdist_prints_only_the_path_on_stdout_even_when_it_fetches(tmp_path):
    sys.path.insert(0, str(ROOT / "tools"))
    import _pin

    import vendor

    pin = _pin.read_pin()
    cached = vendor.sdist_path(pin)  # the build fetched it already: a local copy for pip to find
    links = tmp_path / "links"
    links.mkdir()
    shutil.copy(cached, links / cached.name)
    # pip reaches the configured index (the sdist's build backend comes from there) and this local copy
    find_links = " ".join(x for x in (os.environ.get("PIP_FIND_LINKS", ""), str(links)) if x)
    env = {**os.environ, "LLAMA_VQ_CACHE": str(tmp_path / "cache"), "PIP_FIND_LINKS": find_links}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "vendor.py"), "sdist"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "fetching" in proc.stderr  # it did download, and said so on stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and Path(lines[0]).is_file() and Path(lines[0]).name == cached.name, proc.stdout
    assert Path(lines[0]).is_relative_to(tmp_path / "cache")
