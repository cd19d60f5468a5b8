"""llama-vq builds for AMD MI210 (HIP, gfx90a) on every CI run, in Debian's ROCm toolchain.

scripts/hip-toolchain.sh provisions a Debian unstable chroot with ROCm 6.4 (hipcc, clang 21 as the HIP compiler,
hipBLAS, rocBLAS) at the versions in scripts/hip-toolchain.lock, cached under ~/.cache/llama-vq/hip-toolchain,
then runs the users' build entry point (scripts/build.sh wheel, the Docker image's command and settings) with
LLAMA_VQ_BACKEND=hip GPU_TARGETS=gfx90a LLAMA_VQ_BACKEND_DL=ON on a copy of this checkout, and splits the llama-vq-hip
wheel from it (scripts/wheels.sh split hip): one gfx90a compile for the compile checks, the ROCm image's runtime
stage and the HIP wheel's install. A compile or link error fails the build and so this test. The build starts in
the background with the session, at nice 19 (tests/support/hip_build_support.py), and the test waits for it. No AMD GPU
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
import venv_support
import wheel_support
from dockerfile_support import stages
from server_support import free_port

ROOT = Path(__file__).resolve().parents[2]
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
    # and our patches' kernels have device code there (tests/support/hip_code_objects.py)
    objs = report["code_objects"]
    assert isinstance(objs, dict), objs
    assert objs["bundles"] >= 100 and objs["bundles_without_gpu_code"] == 0, objs
    assert objs["targets"] == [f"hipv4-amdgcn-amd-amdhsa--{target}", "host-x86_64-unknown-linux-gnu-"], objs
    assert objs["machs"] == [f"EF_AMDGPU_MACH_AMDGCN_{target.upper()}"], objs
    # code object v5, which every ROCm 6 runtime loads (clang 21's default, v6, needs a newer one)
    assert objs["code_object_versions"] == [5], objs
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


# The llama-vq-hip wheel of that build with the base wheel (tests/support/wheel_support.py), installed as a user would,
# in a throwaway overlay of the chroot, which has the ROCm runtime this host lacks: with the runtime and no AMD GPU (no
# /dev/kfd), then with the runtime's libamdhip64 removed. test_hip_wheel_installs_and_links_where_the_base_wheel_does
# installs the same wheels on this host.
PROBE = """
import json, sys
import llama_vq
from llama_vq import _backends
info = llama_vq.build_info()
llm = llama_vq.Llama(sys.argv[1], n_ctx=512, n_gpu_layers=-1, n_threads=2, type_k="q8_0", type_v="q4_0",
                     flash_attn="auto", verbose=False)
out = llm.create_chat_completion(messages=[{"role": "user", "content": "Say hi"}], max_tokens=8, temperature=0.0)
print(json.dumps({"notes": info.backend_notes, "modules": info.backend_modules, "devices": _backends.devices(),
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
python3 "$ROOT/tests/support/hip_code_objects.py" "$site/llama_vq/lib/libggml-hip.so" $KERNELS | sed 's/^/@@objects /'
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
    assert objs["code_object_versions"] == [5], objs
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


# The module's ROCm symbols, defined by stand-ins for the three runtime libraries: libamdhip64's with its symbol
# versions (hip_4.2, ...: the loader checks that the library it names defines them), hipBLAS's and rocBLAS's bare.
STUB_VERSIONED = re.compile(r"^hip_[\d.]+$")
ROCM_BLAS = re.compile(r"^(hipblas|rocblas_)")


def _rocm_stubs(module: Path, base: Path, out: Path) -> None:
    """Stand-in libamdhip64.so.6, libhipblas.so.2 and librocblas.so.4 in `out`, defining every symbol the module takes
    from them: the HIP runtime's (versioned hip_*) and the BLAS libraries' (hipblas*, rocblas_*). Every other symbol the
    module needs must come from this host's own libraries or libggml-base.so."""
    defined = set(
        subprocess.run(
            ["nm", "-D", "--defined-only", "--format=just-symbols", base], capture_output=True, text=True, check=True
        ).stdout.split()
    )
    versions: dict[str, list[str]] = {}
    plain: list[str] = []
    for line in subprocess.run(
        ["objdump", "-T", module], capture_output=True, text=True, check=True
    ).stdout.splitlines():
        m = re.match(r"^[0-9a-f]+ +(\w?) +(D[FO]|) *\*UND\*\s+[0-9a-f]+\s+(?:\(?([\w.]+)\)?\s+)?(\S+)$", line)
        if not m or m.group(1) == "w":
            continue
        version, name = m.group(3), m.group(4)
        if version and STUB_VERSIONED.match(version):
            versions.setdefault(version, []).append(name)
        elif not version and name not in defined and ROCM_BLAS.match(name):
            plain.append(name)
    assert versions and plain, (versions, plain)  # the HIP runtime's, and hipBLAS's/rocBLAS's
    out.mkdir(parents=True)
    (out / "hip.c").write_text("".join(f"long {n}(void) {{ return 0; }}\n" for v in versions.values() for n in v))
    (out / "hip.map").write_text(
        "".join(f"{v} {{ global: {'; '.join(ns)}; }};\n" for v, ns in sorted(versions.items()))
    )
    (out / "blas.c").write_text("".join(f"long {n}(void) {{ return 0; }}\n" for n in plain))
    (out / "none.c").write_text("int llama_vq_stub;\n")
    for soname, src, extra in (
        ("libamdhip64.so.6", "hip.c", [f"-Wl,--version-script={out / 'hip.map'}"]),
        ("libhipblas.so.2", "blas.c", []),
        ("librocblas.so.4", "none.c", []),
    ):
        subprocess.run(
            ["cc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", *extra, "-o", out / soname, out / src],
            check=True,
            capture_output=True,
        )


@pytest.mark.slow
def test_hip_wheel_installs_and_links_where_the_base_wheel_does(smollm2_path, tmp_path):
    """The llama-vq-hip wheel on this host, outside the chroot: its manylinux tag asks no newer glibc than the base
    wheel's; `pip install "llama-vq[hip]" --find-links` takes both; its libggml-hip.so loads with every symbol bound
    (RTLD_NOW) against this host's glibc and libstdc++, the ROCm runtime stood in by stubs; without them, the import
    names the missing runtime once and the model answers on the CPU. On a host with a glibc older than the build
    chroot's (Debian 12: 2.36 against unstable's 2.43), this is the user's Ubuntu 22.04 or 24.04 with ROCm 6."""
    reason = hip_build_support.skip_reason()
    if reason:
        pytest.skip(reason)
    build = hip_build_support.result()
    assert build.returncode == 0, f"the gfx90a build failed; see {BUILD_TEST_NAME}"
    links = tmp_path / "wheels"
    links.mkdir()
    shared = ROOT / "build" / "hip-wheel-host"  # the chroot sees the checkout at the same path
    shutil.rmtree(shared, ignore_errors=True)
    shared.mkdir(parents=True)
    try:
        subprocess.run(
            ["bash", str(SCRIPT), "run", "sh", "-c", f"cp /src/llama-vq/dist/hip/llama_vq_hip-*.whl {shared}/"],
            check=True,
            capture_output=True,
            timeout=600,
        )
        (hip,) = shared.glob("llama_vq_hip-*.whl")
        shutil.copy(hip, links)
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    base = wheel_support.base_wheel()
    shutil.copy(base, links)

    def glibc(whl: str) -> tuple[int, int]:
        m = re.search(r"-manylinux_(\d+)_(\d+)_x86_64\.whl$", whl)
        assert m, whl
        return int(m.group(1)), int(m.group(2))

    assert glibc(hip.name) <= glibc(base.name), (hip.name, base.name)
    venv_support.fresh_venv(tmp_path / "venv")  # with the suite's pip (tests/support/venv_support.py says why)
    venv = tmp_path / "venv"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTHON", "VIRTUAL_ENV", "LLAMA_VQ_", "LLAMA_CPP_", "PYTEST", "CMAKE", "CC", "CXX"))
    }
    env["PATH"] = str(venv / "bin")  # as the user installs: no compiler, no ROCm tools
    pip = subprocess.run(
        [venv / "bin" / "pip", "install", "llama-vq[hip]", "--find-links", links],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert pip.returncode == 0, (pip.stdout + pip.stderr)[-4000:]
    for whl in (base, hip):
        assert re.search(rf"^Processing \S*wheels/{re.escape(whl.name)}", pip.stdout, re.M), pip.stdout[-3000:]
    (lib,) = venv.glob("lib/python*/site-packages/llama_vq/lib")
    _rocm_stubs(lib / "libggml-hip.so", lib / "libggml-base.so", tmp_path / "stubs")
    load = subprocess.run(
        [
            venv / "bin" / "python",
            "-c",
            "import ctypes, os, sys; ctypes.CDLL(sys.argv[1], mode=os.RTLD_NOW); print('ok')",
            lib / "libggml-hip.so",
        ],
        env={**env, "LD_LIBRARY_PATH": str(tmp_path / "stubs")},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert load.returncode == 0 and load.stdout.strip() == "ok", load.stderr[-3000:]
    (shared_probe := tmp_path / "probe.py").write_text(PROBE)
    r = subprocess.run(
        [venv / "bin" / "python", shared_probe, smollm2_path],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    probe = json.loads(r.stdout.strip().splitlines()[-1])
    said = [x for x in r.stderr.splitlines() if "libggml-hip.so (llama-vq-hip) is installed" in x]
    if not said and "libggml-hip.so" in probe["modules"]:
        pytest.skip("this host has the ROCm runtime and an AMD GPU: the CPU fallback cannot be shown here")
    assert len(said) == 1 and probe["notes"] == said, r.stderr[-3000:]
    assert "the ROCm runtime it needs is missing" in said[0] and "running on the CPU" in said[0], said
    assert probe["devices"] == ["CPU"] and probe["content"].strip(), probe
