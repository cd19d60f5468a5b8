"""llama-vq builds for AMD MI210 (HIP, gfx90a) on every CI run, in Debian's ROCm toolchain.

scripts/hip-toolchain.sh provisions a Debian unstable chroot with ROCm 6.4 (hipcc, clang 21 as the HIP compiler,
hipBLAS, rocBLAS) at the versions in scripts/hip-toolchain.lock, cached under ~/.cache/llama-vq/hip-toolchain,
then runs the users' build entry point (scripts/build.sh wheel, the Docker image's command and settings) with
LLAMA_VQ_BACKEND=hip GPU_TARGETS=gfx90a LLAMA_VQ_BACKEND_DL=ON on a copy of this checkout, and splits the llama-vq-hip
wheel from it (scripts/wheels.sh split hip): one gfx90a compile for the compile checks, the ROCm image's runtime
stage and the HIP wheel's install. A compile or link error fails the build and so this test. The build starts in
the background with the session, at nice 19 (tests/hip_build_support.py), and the test waits for it. No AMD GPU
runs here: what the kernels compute on a 64-wide wavefront is the GPU checks' job (README, "AMD MI210").

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
import wheel_support
from dockerfile_support import stages
from server_support import free_port

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
    # device code for the target, and our patches' kernels' host stubs, are in libggml-hip
    assert report["offload_targets"] and all(target in t for t in report["offload_targets"])
    assert set(report["kernels"]) == set(PATCH_KERNELS), report["kernels"]
    # the ROCm image's build (LLAMA_VQ_BACKEND_DL): libggml-hip is a module beside one CPU module per SIMD level, and
    # the llama-vq-hip wheel is that module alone, for this llama-vq, tagged by auditwheel
    assert report["backend_dl"] is True, report
    assert report["cpu_modules"] == [f"libggml-cpu-{v}.so" for v in ("haswell", "icelake", "skylakex", "x64")], report
    (hip_wheel,) = report["hip_wheel"]
    assert re.fullmatch(r"llama_vq_hip-[\w.]+-py3-none-manylinux_2_\d+_x86_64\.whl", hip_wheel), hip_wheel
    assert report["hip_wheel_files"] == ["llama_vq/lib/libggml-hip.so"], report
    # its module's GPU code, read with ROCm's LLVM tools: every HIP source's bundle holds a code object for the target,
    # and our patches' kernels have device code there (tests/hip_code_objects.py)
    objs = report["code_objects"]
    assert isinstance(objs, dict), objs
    assert objs["bundles"] >= 100 and objs["bundles_without_gpu_code"] == 0, objs
    assert objs["targets"] == [f"hipv4-amdgcn-amd-amdhsa--{target}", "host-x86_64-unknown-linux-gnu-"], objs
    assert objs["machs"] == [f"EF_AMDGPU_MACH_AMDGCN_{target.upper()}"], objs
    assert set(objs["kernels"]) == set(PATCH_KERNELS), objs


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


# The llama-vq-hip wheel of that build with the base wheel (tests/wheel_support.py), installed as a user would, in a
# throwaway overlay of the chroot: this host has no ROCm runtime, and the HIP wheel, built against Debian unstable's
# glibc and libstdc++ (its manylinux tag says which), installs only where those are as new. So the chroot runs it:
# with the ROCm runtime and no AMD GPU (no /dev/kfd), then with the runtime's libamdhip64 removed.
PROBE = """
import json, sys
import llama_vq
from llama_vq import _native
info = llama_vq.build_info()
llm = llama_vq.Llama(sys.argv[1], n_ctx=512, n_gpu_layers=-1, n_threads=2, type_k="q8_0", type_v="q4_0",
                     flash_attn="auto", verbose=False)
out = llm.create_chat_completion(messages=[{"role": "user", "content": "Say hi"}], max_tokens=8, temperature=0.0)
print(json.dumps({"notes": info.backend_notes, "modules": info.backend_modules, "devices": _native.devices(),
                  "content": out["choices"][0]["message"]["content"], "file": llama_vq.__file__}))
"""
CLIENT = """
import json, os, sys, time, urllib.request
base, pid = f"http://127.0.0.1:{sys.argv[1]}", int(sys.argv[2])
deadline = time.monotonic() + 180
while True:
    os.kill(pid, 0)  # the server still runs
    try:
        with urllib.request.urlopen(base + "/health", timeout=5) as r:
            if r.status == 200:
                break
    except OSError:
        pass
    if time.monotonic() > deadline:
        sys.exit("the server was not healthy within 180 s")
    time.sleep(0.2)  # polling interval against the deadline
body = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8, "temperature": 0}
req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                             headers={"Content-Type": "application/json"})
with urllib.request.urlopen(req, timeout=120) as r:
    print(json.dumps(json.load(r)))
"""
INSTALL = r"""
set -euo pipefail
links=/tmp/hip-wheels
mkdir -p "$links"
cp "$SHARED"/llama_vq-*.whl /src/llama-vq/dist/hip/llama_vq_hip-*.whl "$links/"
python3 -m venv /tmp/venv
site=$(/tmp/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# every step of the user's runs with the venv on PATH and nothing else: no compiler, no cmake, no ROCm tools
user="env PATH=/tmp/venv/bin"
for t in cc gcc g++ c++ clang clang++ hipcc cmake ninja make; do
    if $user /bin/sh -c "command -v $t" >/dev/null; then echo "@@compiler $t"; fi
done
$user pip install "llama-vq[hip]" --find-links "$links" >/tmp/pip.log 2>&1 || { cat /tmp/pip.log; exit 4; }
grep -E "^(Processing|Successfully installed)" /tmp/pip.log | sed 's/^/@@pip /'
python3 "$ROOT/tests/hip_code_objects.py" "$site/llama_vq/lib/libggml-hip.so" $KERNELS | sed 's/^/@@objects /'
$user python "$SHARED/probe.py" "$SHARED/model.gguf" >/tmp/probe.out 2>/tmp/probe.err || { cat /tmp/probe.err; exit 5; }
tail -n1 /tmp/probe.out | sed 's/^/@@probe /'
sed 's/^/@@probe-stderr /' /tmp/probe.err
$user llama-vq-server -m "$SHARED/model.gguf" --port "$PORT" -c 512 -t 2 -ngl 99 >/tmp/server.log 2>&1 &
pid=$!
$user python "$SHARED/client.py" "$PORT" "$pid" | sed 's/^/@@chat /' || true
kill "$pid"; wait "$pid" || true
sed 's/^/@@server-log /' /tmp/server.log
mkdir /tmp/hidden && mv /usr/lib/x86_64-linux-gnu/libamdhip64.so* /tmp/hidden/  # the overlay is thrown away
$user python "$SHARED/probe.py" "$SHARED/model.gguf" >/tmp/probe.out 2>/tmp/probe.err || { cat /tmp/probe.err; exit 6; }
tail -n1 /tmp/probe.out | sed 's/^/@@noruntime /'
sed 's/^/@@noruntime-stderr /' /tmp/probe.err
"""


@pytest.fixture(scope="module")
def hip_wheel_install(smollm2_path) -> dict[str, list[str]]:
    """The install script's output lines by tag ("probe", "chat", "server-log", ...)."""
    reason = hip_build_support.skip_reason()
    if reason:
        pytest.skip(reason)
    build = hip_build_support.result()  # the gfx90a build: its llama-vq-hip wheel is in the chroot's dist/hip
    assert build.returncode == 0, f"the gfx90a build failed; see {BUILD_TEST_NAME}"
    shared = ROOT / "build" / "hip-wheel-test"  # under the checkout: the chroot sees it at the same path
    shutil.rmtree(shared, ignore_errors=True)
    shared.mkdir(parents=True)
    shutil.copy(wheel_support.base_wheel(), shared)
    try:
        os.link(smollm2_path, shared / "model.gguf")
    except OSError:
        shutil.copy(smollm2_path, shared / "model.gguf")
    (shared / "probe.py").write_text(PROBE)
    (shared / "client.py").write_text(CLIENT)
    env = dict(os.environ, SHARED=str(shared), ROOT=str(ROOT), PORT=str(free_port()), KERNELS=" ".join(PATCH_KERNELS))
    # the script reads these from its environment: scripts/hip-toolchain.sh passes only its own, so they go inline
    script = "".join(f"{k}={shlex.quote(env[k])}\n" for k in ("SHARED", "ROOT", "PORT", "KERNELS")) + INSTALL
    proc = subprocess.run(
        ["bash", str(SCRIPT), "ephemeral", "bash", "-c", script], capture_output=True, text=True, timeout=20 * 60
    )
    shutil.rmtree(shared, ignore_errors=True)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    tags: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        if line.startswith("@@"):
            tag, _, rest = line[2:].partition(" ")
            tags.setdefault(tag, []).append(rest)
    return tags


BUILD_TEST_NAME = "test_hip_build_for_gfx90a_links_libggml_hip_the_server_engine_and_test_backend_ops"
NO_GPU = "libggml-hip.so (llama-vq-hip) is installed, but ROCm found no AMD GPU"


@pytest.mark.slow
def test_hip_wheel_installs_with_the_base_wheel_from_a_folder_with_no_compiler_on_path(hip_wheel_install):
    assert "compiler" not in hip_wheel_install, hip_wheel_install.get("compiler")
    pip = "\n".join(hip_wheel_install["pip"])
    # both of ours from the folder given with --find-links (no index holds them)
    assert re.search(r"^Processing \.?/tmp/hip-wheels/llama_vq-[\w.]+-py3-none-manylinux_\w+\.whl$", pip, re.M), pip
    assert re.search(
        r"^Processing \.?/tmp/hip-wheels/llama_vq_hip-[\w.]+-py3-none-manylinux_\w+\.whl( \(from llama-vq\[hip\]\))?$",
        pip,
        re.M,
    ), pip
    (done,) = [x.split()[2:] for x in hip_wheel_install["pip"] if x.startswith("Successfully installed")]
    assert any(re.fullmatch(r"llama-vq-\d[\w.]*", w) for w in done), done
    assert any(re.fullmatch(r"llama-vq-hip-\d[\w.]*", w) for w in done), done


@pytest.mark.slow
def test_installed_libggml_hip_holds_gfx90a_code_objects_with_our_kernels(hip_wheel_install):
    (line,) = hip_wheel_install["objects"]
    objs = json.loads(line)
    assert objs["bundles"] >= 100 and objs["bundles_without_gpu_code"] == 0, objs
    assert objs["machs"] == ["EF_AMDGPU_MACH_AMDGCN_GFX90A"], objs
    assert set(objs["kernels"]) == set(PATCH_KERNELS), objs


@pytest.mark.slow
def test_without_an_amd_gpu_llama_and_the_server_say_so_once_and_answer_on_the_cpu(hip_wheel_install):
    (line,) = hip_wheel_install["probe"]
    probe = json.loads(line)
    said = [x for x in hip_wheel_install.get("probe-stderr", []) if NO_GPU in x]
    assert len(said) == 1 and probe["notes"] == said, hip_wheel_install.get("probe-stderr")
    assert "running on the CPU" in said[0], said
    assert probe["file"].startswith("/tmp/venv/"), probe
    assert probe["devices"] == ["CPU"] and "libggml-hip.so" not in probe["modules"], probe
    assert probe["content"].strip(), probe  # n_gpu_layers=-1 asked for, answered on the CPU
    (chat,) = hip_wheel_install.get("chat", ["{}"])
    log = hip_wheel_install.get("server-log", [])
    assert json.loads(chat).get("choices", [{}])[0].get("message", {}).get("content", "").strip(), (chat, log[-40:])
    assert sum(NO_GPU in x for x in log) == 1, log[-40:]


@pytest.mark.slow
def test_without_the_rocm_runtime_the_import_names_the_missing_soname_once_and_llama_answers_on_the_cpu(
    hip_wheel_install,
):
    (line,) = hip_wheel_install["noruntime"]
    probe = json.loads(line)
    stderr = hip_wheel_install.get("noruntime-stderr", [])
    said = [x for x in stderr if "libggml-hip.so (llama-vq-hip) is installed" in x]
    assert len(said) == 1 and probe["notes"] == said, stderr
    assert "the ROCm runtime it needs is missing: libamdhip64.so.6" in said[0], said
    assert "install ROCm 6.x" in said[0] and "pip uninstall llama-vq-hip" in said[0], said
    assert probe["devices"] == ["CPU"] and probe["content"].strip(), probe
