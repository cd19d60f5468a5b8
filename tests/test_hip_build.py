"""llama-vq builds for AMD MI210 (HIP, gfx90a) on every CI run, in Debian's ROCm toolchain.

scripts/hip-toolchain.sh provisions a Debian unstable chroot with ROCm 6.4 (hipcc, clang 21 as the HIP compiler,
hipBLAS, rocBLAS) at the versions in scripts/hip-toolchain.lock, cached under ~/.cache/llama-vq/hip-toolchain,
then runs the users' build entry point (scripts/build.sh wheel, the Docker image's command) with
LLAMA_VQ_BACKEND=hip GPU_TARGETS=gfx90a on a copy of this checkout. A compile or link error fails the build and so
this test. The build starts in the background with the session, at nice 19 (tests/hip_build_support.py), and the
test waits for it. No AMD GPU runs here: what the kernels compute on a 64-wide wavefront is the GPU checks' job
(README, "AMD MI210").

Left out, for the CI budget (90 min on 2 cores with the cold CPU build and the rest of the suite): the tools other
than test-backend-ops (host code the CPU build compiles too; LLAMA_VQ_TOOLS), and flash attention's kernels
(-DGGML_CUDA_FA=OFF), ~40 more template instances, none of which our patches touch; the non-FA attention that
llama-vq exists for is compiled and linked in full. LLAMA_VQ_HIP_FA=ON builds them too.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import hip_build_support
import pytest
from dockerfile_support import stages

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "hip-toolchain.sh"

# kernels that our patches add: their host stubs must be in the linked library
PATCH_KERNELS = (
    "k_out_prod_q_vec",
    "k_out_prod_q_combine",
    "mul_mat_vec_q_short",
    "k_fwht_set_rows",
    "k_cont_fwht",
    "k_attn_decode",
    "k_attn_decode_combine",
    "dequantize_x8_rows",
)


def test_hip_toolchain_lock_pins_the_suite_state_and_every_package_at_rocm_6_1_or_newer():
    lines = [x for x in (ROOT / "scripts" / "hip-toolchain.lock").read_text().splitlines() if x and x[0] != "#"]
    values = dict(x.split("=", 1) for x in lines if not x.startswith("pkg "))
    pkgs = dict(x[4:].split("=", 1) for x in lines if x.startswith("pkg "))
    assert values["suite"] == "sid" and re.fullmatch(r"\d{8}T\d{6}Z", values["snapshot"]), values
    need = {"hipcc", "libamdhip64-dev", "libhipblas-dev", "librocblas-dev", "cmake", "ninja-build", "g++", "ccache"}
    assert need <= pkgs.keys(), need - pkgs.keys()
    assert all(re.fullmatch(r"[0-9][\w.:+~-]*", v) for v in pkgs.values()), pkgs  # exact versions, no ranges
    major, minor = (int(x) for x in re.match(r"(\d+)\.(\d+)", pkgs["libamdhip64-dev"]).groups())
    assert (major, minor) >= (6, 1), "llama.cpp needs HIP >= 6.1"


@pytest.mark.slow
def test_hip_toolchain_refuses_without_root_with_a_clear_message():
    if not shutil.which("setpriv") or os.geteuid() != 0:
        pytest.skip("needs root and setpriv to run the script as another user")
    # a copy that the unprivileged user can read (a checkout or pytest's tmp_path may be root-only)
    d = Path(tempfile.mkdtemp(prefix="hip-toolchain-noroot-"))
    try:
        os.chmod(d, 0o755)
        (d / "scripts").mkdir(mode=0o755)
        for name in ("hip-toolchain.sh", "hip-toolchain.lock"):
            shutil.copy(ROOT / "scripts" / name, d / "scripts" / name)
            os.chmod(d / "scripts" / name, 0o644)
        env = {"PATH": os.environ["PATH"], "HOME": str(d), "LLAMA_VQ_HIP_CHROOT": str(d / "chroot")}
        proc = subprocess.run(
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "bash",
                str(d / "scripts" / "hip-toolchain.sh"),
                "provision",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode != 0
        assert "needs root" in proc.stderr and "Nothing was changed" in proc.stderr, proc.stderr
        assert not (d / "chroot").exists()
    finally:
        shutil.rmtree(d)


@pytest.mark.slow
def test_hip_build_for_gfx90a_links_libggml_hip_the_server_engine_and_test_backend_ops():
    reason = hip_build_support.skip_reason()
    if reason:
        pytest.skip(reason)
    # started when the session started (conftest.py), or now when this test runs alone
    proc = hip_build_support.result()
    took = proc.took_s
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, f"HIP build failed after {took:.0f} s:\n{tail}"
    # the last line of stdout: what the wheel holds (scripts/hip-toolchain.sh, build_inside)
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    target = hip_build_support.build_env()["GPU_TARGETS"]
    print(f"HIP build ({target}) in {took:.0f} s, {proc.waited_s:.0f} s of it waited for: {report}")
    assert report["backend"] == "hip" and report["gpu_targets"] == [target]
    assert report["missing"] == []
    # device code for the target, and our patches' kernels, are in libggml-hip
    assert report["offload_targets"] and all(target in t for t in report["offload_targets"])
    assert set(report["kernels"]) == set(PATCH_KERNELS), report["kernels"]


def _runtime_stage_script(port: int) -> str:
    """The ROCm image's runtime stage as a shell script: its COPY of the wheels, ENV, WORKDIR and RUN steps verbatim,
    then its ENTRYPOINT as its USER with its environment, polled with its HEALTHCHECK command until healthy."""
    final = stages(ROOT / "docker" / "Dockerfile.rocm")[-1]
    lines, env, user, health, entry = ["set -euo pipefail"], {}, "root", None, None
    for word, rest in final[1:]:
        if word == "COPY" and rest == "--from=build /dist /dist":
            lines.append("mkdir -p /dist && cp /src/llama-vq/dist/*.whl /dist/")
        elif word == "ENV":
            for kv in shlex.split(rest):
                k, _, v = kv.partition("=")
                env[k] = v
                lines.append(f"export {k}={v}")
        elif word == "RUN":
            lines.append(rest)
        elif word == "WORKDIR":
            lines.append(f"mkdir -p {rest} && cd {rest}")
        elif word == "USER":
            user = rest
        elif word == "HEALTHCHECK":
            health = json.loads(rest[rest.index("CMD") + 3 :])
        elif word == "ENTRYPOINT":
            entry = json.loads(rest)
        elif word not in ("EXPOSE", "ARG"):
            raise AssertionError(f"Dockerfile.rocm: {word} in the runtime stage: teach this test what it does")
    assert user != "root" and health and entry
    env["LLAMA_ARG_PORT"] = str(port)  # the chroot shares this machine's network: a free port, not the image's
    # the image's environment (the exported values above), nothing else, as the image's user
    as_user = f"runuser -u {user} -- env -i HOME=/home/{user} " + " ".join(f'{k}="${k}"' for k in env)
    lines += [
        f"export LLAMA_ARG_PORT={port}",
        f"{as_user} {shlex.join(entry)} > /tmp/server.log 2>&1 &",
        "pid=$!",
        'stop() { kill $(pgrep -P "$pid") "$pid" 2>/dev/null || true; }',
        "for i in $(seq 600); do",  # the image's start period is 300 s; poll twice a second
        f"    if {as_user} {shlex.join(health)} 2>/dev/null; then",
        '        users=$(ps -o user= -p "$(pgrep -P "$pid")")',
        '        echo "healthy after $i polls; server user: $users"; stop; exit 0',
        "    fi",
        '    kill -0 "$pid" 2>/dev/null || { cat /tmp/server.log; exit 1; }',
        "    sleep 0.5",
        "done",
        "cat /tmp/server.log; stop; exit 1",
    ]
    return "\n".join(lines) + "\n"


@pytest.mark.slow
def test_rocm_image_runtime_steps_install_the_hip_wheels_and_serve_health_as_non_root(tmp_path, free_port):
    reason = hip_build_support.skip_reason()
    if reason:
        pytest.skip(reason)
    script = _runtime_stage_script(free_port)
    proc = subprocess.run(
        ["bash", str(SCRIPT), "ephemeral", "bash", "-c", script], capture_output=True, text=True, timeout=20 * 60
    )
    out = proc.stdout + proc.stderr
    if proc.returncode != 0 and "cannot stat '/src/llama-vq/dist/*.whl'" in out:
        pytest.fail(
            "no HIP wheels: test_hip_build_for_gfx90a_links_libggml_hip_the_server_engine_and_test_backend_ops "
            "builds them"
        )
    assert proc.returncode == 0, out[-6000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("healthy after") and last.endswith("server user: llama-vq"), last
