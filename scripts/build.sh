#!/usr/bin/env bash
# The one build entry point (scripts/run.sh, CI and the Docker images all use it).
#
#   scripts/build.sh install [EXTRAS]   # into the current Python environment (e.g. "test")
#   scripts/build.sh wheel DIR          # llama-vq's wheel (the pinned llama_cpp bindings inside) into DIR
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
# The pinned, hash-checked llama.cpp source and llama-cpp-python's bindings from the same sdist (our wheel ships
# them: docs/architecture.md, decision 3).
"$py" tools/vendor.py fetch

# install and wheel build in pyproject.toml's build-dir, build/<wheel tag>, which scripts/wheels.sh cpu shares: one build
# there at a time (the suite's packaging and wheel tests may ask at once)
if [ "$mode" != sdist ] && command -v flock >/dev/null 2>&1; then
    mkdir -p build
    exec 9>build/.pip-build.lock
    flock 9
fi

case "$mode" in
    install)
        extras=${2:-}
        # an environment set up before llama-vq shipped the bindings holds a llama-cpp-python distribution whose
        # llama_cpp package is the same folder as ours: remove it first (import llama_vq refuses it)
        if "$py" -c 'import importlib.metadata as m; m.distribution("llama_cpp_python")' 2>/dev/null; then
            echo "llama-vq: uninstalling llama-cpp-python (llama-vq ships its llama_cpp bindings itself)" >&2
            "$py" -m pip uninstall -q -y llama-cpp-python
        fi
        target="."
        [ -n "$extras" ] && target=".[$extras]"
        "$py" -m pip install -q --no-build-isolation "$target"
        ;;
    wheel)
        out=${2:?usage: scripts/build.sh wheel DIR}
        mkdir -p "$out"
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
