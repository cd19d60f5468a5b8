#!/usr/bin/env bash
# The one build entry point (scripts/run.sh, CI and the Docker images all use it).
#
#   scripts/build.sh install [EXTRAS]   # into the current Python environment (e.g. "test")
#   scripts/build.sh wheel DIR          # wheels of llama-vq and bindings-only llama-cpp-python into DIR
#   scripts/build.sh sdist DIR          # llama-vq's sdist (with the pinned llama.cpp source) into DIR
#
# Python: $PYTHON (default: python3 on PATH). Environment passes through to the build:
# LLAMA_VQ_BACKEND, GPU_TARGETS, CMAKE_ARGS, LLAMA_VQ_BUILD_TOOLS, LLAMA_VQ_CPU_FEATURES.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
py=${PYTHON:-python3}
mode=${1:?usage: scripts/build.sh install [EXTRAS] | wheel DIR | sdist DIR}

"$py" -m pip install -q 'scikit-build-core>=0.10' 'tomli>=2; python_version < "3.11"'
# GPU_TARGETS (e.g. gfx90a for MI210), as llama.cpp's HIP build names it, also from the environment
if [ -n "${GPU_TARGETS:-}" ]; then
    export CMAKE_ARGS="${CMAKE_ARGS:-} -DGPU_TARGETS=$GPU_TARGETS"
fi
# The pinned, hash-checked llama.cpp source; the sdist it comes from is also llama-cpp-python's.
"$py" tools/vendor.py fetch
sdist=$("$py" tools/vendor.py sdist)
bindings_only=(env CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF")

case "$mode" in
    install)
        extras=${2:-}
        if ! "$py" -c 'import importlib.metadata as m, sys; sys.exit(m.version("llama_cpp_python") != "0.3.36")' 2>/dev/null; then
            echo "llama-vq: installing llama-cpp-python 0.3.36 (bindings only, no native build)" >&2
            "${bindings_only[@]}" "$py" -m pip install -q "$sdist"
        fi
        target="."
        [ -n "$extras" ] && target=".[$extras]"
        "$py" -m pip install -q --no-build-isolation "$target"
        ;;
    wheel)
        out=${2:?usage: scripts/build.sh wheel DIR}
        mkdir -p "$out"
        "${bindings_only[@]}" "$py" -m pip wheel -q --no-deps -w "$out" "$sdist"
        "$py" -m pip wheel -q --no-deps --no-build-isolation -w "$out" .
        ;;
    sdist)
        out=${2:?usage: scripts/build.sh sdist DIR}
        mkdir -p "$out"
        # the PEP 517 hook itself (no extra 'build' package needed); vendor/llama.cpp is in it (pyproject)
        "$py" -c 'import sys; from scikit_build_core.build import build_sdist; print(build_sdist(sys.argv[1]))' "$out"
        ;;
    *) echo "usage: scripts/build.sh install [EXTRAS] | wheel DIR | sdist DIR" >&2; exit 2 ;;
esac
