"""benchmarks/run.py's set-up: llama-bench and the other tools built from the patched tree, and the models
(SmolLM2 from the package, synthetic ones generated where the run happens)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

TARGETS = ["llama-bench", "llama-perplexity", "test-backend-ops"]
BUILT_FROM: dict = {}  # what the tools were built from (filled by build_tools or from --bin)

# FA kernels for K/V type pairs beyond ggml-cuda's default set (f16, q4_0, q8_0 pairs)
CUDA_FA_QUANTS = "q4_0-q4_0,q8_0-q8_0,q8_0-q4_0,q4_0-f16"


def build_tools(
    backend: str,
    src: Path | None,
    build_dir: Path,
    jobs: int,
    cuda_fa: bool,
    targets: list[str],
    log: Path,
    cpu_simd: str = "avx2",
) -> Path:
    """Export the patched tree (unless --src), configure, build the tools; return the bin dir."""
    if src is None:
        src = build_dir / "llama.cpp-patched"
        subprocess.run(
            [sys.executable, str(REPO / "tools" / "patches.py"), "export", str(src)], check=True
        )
    args = [
        "cmake",
        "-S",
        str(src),
        "-B",
        str(build_dir / "build"),
        "-G",
        "Ninja",
        "-DCMAKE_BUILD_TYPE=Release",
        "-DGGML_NATIVE=OFF",
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_OPENSSL=OFF",
        "-DLLAMA_BUILD_SERVER=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_TESTS=ON",
        "-DBUILD_SHARED_LIBS=ON",
    ]
    if shutil.which("ccache"):
        args.append("-DGGML_CCACHE=ON")
    else:
        args.append("-DGGML_CCACHE=OFF")
    if backend == "cpu":
        # portable x86-64 with AVX2/FMA/F16C, never -march=native
        # (AMX trap on CI Xeons: docs/architecture.md, decision 3)
        args += ["-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON"]
        if cpu_simd == "avx512":  # the AVX-512 class's own kernels (VNNI int8 dots), still no AMX
            args += ["-DGGML_AVX512=ON", "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_VBMI=ON", "-DGGML_AVX512_BF16=ON"]
        else:
            args += ["-DGGML_AVX512=OFF", "-DGGML_AVX512_VNNI=OFF", "-DGGML_AVX512_VBMI=OFF", "-DGGML_AVX512_BF16=OFF"]
    elif backend == "cuda":
        args += [
            "-DGGML_CUDA=ON",
            "-DCMAKE_CUDA_ARCHITECTURES=90",
            f"-DGGML_CUDA_FA={'ON' if cuda_fa else 'OFF'}",
            f"-DGGML_CUDA_FA_QUANTS={CUDA_FA_QUANTS}",
        ]
    elif backend == "hip":
        # clang from the ROCm install as the HIP compiler (llama.cpp's documented HIP build)
        if shutil.which("hipconfig") and not os.environ.get("HIPCXX"):
            llvm = subprocess.run(["hipconfig", "-l"], capture_output=True, text=True).stdout.strip()
            os.environ["HIPCXX"] = os.path.join(llvm, "clang")
            os.environ.setdefault(
                "HIP_PATH", subprocess.run(["hipconfig", "-R"], capture_output=True, text=True).stdout.strip()
            )
        args += [
            "-DGGML_HIP=ON",
            f"-DGPU_TARGETS={os.environ.get('GPU_TARGETS', 'gfx90a')}",
            f"-DGGML_CUDA_FA={'ON' if cuda_fa else 'OFF'}",
            f"-DGGML_CUDA_FA_QUANTS={CUDA_FA_QUANTS}",
        ]
    if "LLAMA_BUILD_APP" in (src / "CMakeLists.txt").read_text(errors="replace"):
        args.append("-DLLAMA_BUILD_APP=OFF")
    if not shutil.which("ninja"):
        args[args.index("-G") + 1] = "Unix Makefiles"
    t0 = time.time()
    stamp = src / ".llama-vq-series"
    BUILT_FROM.update(
        src=str(src), series_stamp=stamp.read_text().strip() if stamp.exists() else ""
    )
    build = ["cmake", "--build", str(build_dir / "build"), "-j", str(jobs), "--target", *targets]
    print(f"[bench] building {', '.join(targets)} ({backend}); log: {log}", flush=True)
    with open(log, "w") as f:
        for cmd in (args, build):
            f.write(f"$ {shlex.join(cmd)}\n")
            f.flush()
            if subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode != 0:
                f.close()
                sys.stdout.write("".join(log.read_text(errors="replace").splitlines(True)[-40:]))
                raise SystemExit(f"build failed: {shlex.join(cmd)}")
    BUILT_FROM["build_s"] = round(time.time() - t0)
    if backend == "cpu":
        BUILT_FROM["cpu_simd"] = cpu_simd
    print(f"[bench] build took {BUILT_FROM['build_s']} s", flush=True)
    return build_dir / "build" / "bin"


# ----------------------------------------------------------------------------
# models


SYNTH = {
    # name: synth_models.py arguments
    "llama8b": ["llama", "--preset", "llama-3.1-8b"],
    "mimo": ["mimo", "--preset", "attn"],
    "llama-tiny": ["llama", "--preset", "tiny"],
    "mimo-tiny": ["mimo", "--preset", "tiny"],
}


def start_models(
    names: list[str], model_dir: Path, tokenizer_from: str | None
) -> tuple[dict[str, Path], list[tuple[str, subprocess.Popen, float]]]:
    """Paths of the models, generating the synthetic ones in background processes (they overlap
    the build); wait_models() waits for them."""
    model_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    procs = []
    for name in names:
        if name == "smollm2":
            paths[name] = smollm2_path()
            continue
        if name not in SYNTH:
            raise SystemExit(f"unknown model {name!r}; known: smollm2, {', '.join(SYNTH)}")
        path = model_dir / f"synth-{name}.gguf"
        paths[name] = path
        if path.exists():
            continue
        cmd = [sys.executable, str(REPO / "tools" / "synth_models.py"), SYNTH[name][0], str(path)]
        cmd += SYNTH[name][1:]
        if tokenizer_from:
            cmd += ["--tokenizer-from", str(tokenizer_from)]
        nice = ["nice", "-n", "5"] if shutil.which("nice") else []
        procs.append((name, subprocess.Popen(nice + cmd, stdout=subprocess.DEVNULL), time.time()))
    return paths, procs


def wait_models(paths: dict[str, Path], procs) -> None:
    for name, p, t0 in procs:
        if p.wait() != 0:
            raise SystemExit(f"generating {name} failed (rc={p.returncode})")
        size = paths[name].stat().st_size / 2**30
        print(f"[bench] generated {name} ({size:.2f} GiB), {time.time() - t0:.0f} s", flush=True)


def smollm2_path() -> Path:
    env = os.environ.get("LLAMA_VQ_SMOLLM2")
    if env:
        return Path(env)
    r = subprocess.run(
        [sys.executable, "-m", "llama_vq.models", "path"], capture_output=True, text=True, cwd=REPO
    )
    lines = r.stdout.strip().splitlines()
    if r.returncode == 0 and lines and Path(lines[-1]).is_file():
        return Path(lines[-1])
    raise SystemExit(
        "SmolLM2 not found: set LLAMA_VQ_SMOLLM2=<path to the GGUF> "
        "or install llama_vq (python -m llama_vq.models path)"
    )


