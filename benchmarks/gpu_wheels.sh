#!/usr/bin/env bash
# Issue 32 on a lent GPU machine without a package index: llama-vq's prebuilt wheels built there and run as users
# install them. Here, once:
#   python3 benchmarks/carry.py .bench-carry              # the patched tree, gguf-py, vocab
#   python3 benchmarks/wheelhouse.py .wheelhouse           # build tools and dependencies for that machine's Python
# There (carry .bench-carry, .wheelhouse and vendor/llama_cpp_python), each in a call of its own:
#   PHASE=build OUT=<dir> bash benchmarks/gpu_wheels.sh   # the base wheel and the CUDA one (sm_90), in the background
#   PHASE=test  OUT=<dir> bash benchmarks/gpu_wheels.sh   # pip install "llama-vq[cuda]", then Llama and the server
#   PHASE=bench OUT=<dir> bash benchmarks/gpu_wheels.sh   # pp512 at depth on the installed wheels (WHEEL_TOOLS)
# Wheels built elsewhere (scripts/wheels.sh cuda needs nvcc, cuBLAS and a libcuda to link, no GPU) skip PHASE=build:
# carry them and set WHEEL_DIST to their folder.
# Env: WHEEL_PY (python3), WHEELHOUSE (.wheelhouse), WHEEL_KINDS (build: "cpu cuda"), WHEEL_EXTRA (test: "[cuda]";
# empty for the base wheel alone), WHEEL_DIST (test: /tmp/dist), WHEEL_TOOLS (bench), MODES (bench), WAIT (build:
# 540 s), CARRY, MODEL_DIR (benchmarks/device_common.sh).
set -u
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/device_common.sh"
: "${PHASE:?set PHASE to build, test or bench}"
device_log "wheels-$PHASE" "$OUT/wheels-$PHASE.txt"

case "$PHASE" in
build)
    # issue 32: the prebuilt wheels on a GPU. The base wheel and the CUDA one (sm_90) built here by scripts/wheels.sh from
    # the carried patched tree, pip offline on the carried wheelhouse (benchmarks/wheelhouse.py; carry .bench-carry,
    # .wheelhouse and vendor/llama_cpp_python), with the machine's Python (WHEEL_PY, default python3); in the background,
    # waited for up to WAIT s (default 540); WHEEL_KINDS (default "cpu cuda"). PHASE=test installs and runs them.
    WPY=${WHEEL_PY:-python3}
    WH=${WHEELHOUSE:-$here/.wheelhouse}
    if [ ! -d "$WH" ] || [ ! -f "$here/vendor/llama_cpp_python/llama_cpp/llama_cpp.py" ]; then
        log "carry .wheelhouse and vendor/llama_cpp_python"; exit 1
    fi
    gen llama-tiny llama --preset tiny
    mkdir -p /tmp/dist
    if [ ! -f /tmp/dist/.done ] && ! pgrep -f "scripts/wheels.sh" > /dev/null; then
        rm -f /tmp/dist/.failed
        setsid bash -c "cd '$here' && export PIP_NO_INDEX=1 PIP_FIND_LINKS='$WH' \
            LLAMA_VQ_PATCHED_SRC='$C/llama.cpp' CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) CMAKE_CUDA_ARCHITECTURES=90 \
            PYTHON='$WPY'; ok=1; for k in ${WHEEL_KINDS:-cpu cuda}; do
            bash scripts/wheels.sh \$k /tmp/dist > /tmp/wheel-\$k.log 2>&1 || { ok=0; break; }; done
            [ \$ok = 1 ] && touch /tmp/dist/.done || touch /tmp/dist/.failed" < /dev/null > /dev/null 2>&1 &
    fi
    while [ ! -f /tmp/dist/.done ] && [ ! -f /tmp/dist/.failed ] && ! late "${WAIT:-540}"; do sleep 5; done
    for k in cpu cuda; do [ -f /tmp/wheel-$k.log ] && tail -c 3000 /tmp/wheel-$k.log > "$OUT/wheel-$k.log"; done
    log "wheels: $(ls /tmp/dist 2>/dev/null | tr '\n' ' ')$([ -f /tmp/dist/.failed ] && echo FAILED)"
    ;;
test)
    # the wheels PHASE=build built, as a user installs them: `pip install "llama-vq[cuda]" --find-links` (offline, the
    # wheelhouse for the dependencies) into the machine's Python; then, outside the checkout, which backend modules
    # loaded, a model on the GPU through llama_vq.Llama (f16 and q4_0 V without flash attention), and llama-vq-server
    # from the installed wheel answering a chat with every layer on the GPU
    WPY=${WHEEL_PY:-python3}
    WH=${WHEELHOUSE:-$here/.wheelhouse}
    dist=${WHEEL_DIST:-/tmp/dist}  # WHEEL_DIST: wheels built elsewhere and carried
    [ -f "$dist/.done" ] || [ -n "${WHEEL_DIST:-}" ] || { log "no wheels (PHASE=build)"; exit 1; }
    gen llama-tiny llama --preset tiny
    wait_model llama-tiny
    spec="llama-vq${WHEEL_EXTRA-[cuda]}"  # WHEEL_EXTRA= (empty): the base wheel alone
    PIP_NO_INDEX=1 "$WPY" -m pip install --find-links "$dist" --find-links "$WH" "$spec" \
        > "$OUT/wheeltest-pip.log" 2>&1
    log "pip install $spec: rc $? $(grep -E '^Successfully installed' "$OUT/wheeltest-pip.log" | tr -s ' ' | cut -c1-300)"
    mkdir -p /tmp/away && cd /tmp/away || exit 1
    env -u PYTHONPATH "$WPY" - "$M/synth-llama-tiny.gguf" > "$OUT/wheeltest-llama.log" 2>&1 <<'PY'
import sys
import llama_vq
from llama_vq import Llama, _backends

print("llama_vq from", llama_vq.__file__)
st = _backends.load()
print("modules:", st.modules, "notes:", llama_vq.build_info().backend_notes)
for tv in ("f16", "q4_0"):
    llm = Llama(sys.argv[1], n_gpu_layers=99, n_ctx=512, type_k=tv, type_v=tv, flash_attn=False, verbose=True)
    out = llm.create_completion("Once upon a time", max_tokens=8, temperature=0)
    print(f"completion (type_v={tv}):", repr(out["choices"][0]["text"]), out["usage"])
    del llm
PY
    log "llama_vq.Llama: rc $? $(grep -E '^modules:|^completion|offloaded' "$OUT/wheeltest-llama.log" | tr '\n' ' ' | cut -c1-600)"
    if [ -n "${WHEEL_EXTRA-[cuda]}" ] && ! grep -q "^modules:.*libggml-cuda.so" "$OUT/wheeltest-llama.log"; then
        log "FAILED: libggml-cuda.so did not load (the notes above say why); the model ran on the CPU"; exit 1
    fi
    srvbin=$(env -u PYTHONPATH "$WPY" -c 'import os, sys; print(os.path.join(os.path.dirname(sys.executable), "llama-vq-server"))')
    env -u PYTHONPATH "$srvbin" --model "$M/synth-llama-tiny.gguf" -ngl 99 -ctk q4_0 -ctv q4_0 -fa off --port 8391 \
        > "$OUT/wheeltest-server.log" 2>&1 &
    spid=$!
    for _ in $(seq 120); do curl -sf http://127.0.0.1:8391/health > /dev/null && break; sleep 1; done
    curl -s http://127.0.0.1:8391/v1/chat/completions -H 'Content-Type: application/json' \
        -d '{"messages":[{"role":"user","content":"Hello"}],"max_tokens":8}' > "$OUT/wheeltest-chat.json"
    log "llama-vq-server chat: $(head -c 400 "$OUT/wheeltest-chat.json"); $(grep -E 'CUDA0|offloaded|KV cache' "$OUT/wheeltest-server.log" | head -4 | tr '\n' ' ' | cut -c1-500)"
    kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
    ;;
bench)
    # issue 33 on the installed wheels (PHASE=test first): llama-bench from their build folder (WHEEL_TOOLS: a folder
    # holding it, built there with LLAMA_VQ_BUILD_TOOLS=ON) on the installed libraries and backend modules; pp512 on the
    # MiMo shape (q8_0 / q4_1) at 64K and the 8B shape (q4_0 / q4_0) at 32K, the modes (MODES: the split, the unbounded
    # graph, flash attention for the prompt) interleaved in one invocation each (benchmarks/attn_modes.py)
    WPY=${WHEEL_PY:-python3}
    lib=$(cd /tmp && env -u PYTHONPATH "$WPY" -c 'import llama_vq, os; print(os.path.join(os.path.dirname(llama_vq.__file__), "lib"))') \
        || { log "llama_vq not installed (PHASE=test)"; exit 1; }
    mkdir -p /tmp/wbin && cp "${WHEEL_TOOLS:?a folder with llama-bench}"/* /tmp/wbin/ && ln -sf "$lib"/*.so* /tmp/wbin/
    # the libraries auditwheel grafted (libgomp under a hashed name), found by the wheel's own RPATH ($ORIGIN/../..)
    ln -sf "$lib"/../../llama_vq.libs/* /tmp/wbin/ 2>/dev/null
    export LD_LIBRARY_PATH=/tmp/wbin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    gen mimo mimo --preset attn
    gen llama8b llama --preset llama-3.1-8b
    for run in "mimo q8_0 q4_1 65536" "llama8b q4_0 q4_0 32768"; do
        read -r name tk tv depth <<< "$run"
        wait_model "$name"
        python3 "$here/benchmarks/attn_modes.py" --bin /tmp/wbin --model "$M/synth-$name.gguf" --label "wheel-$name" \
            --ctk "$tk" --ctv "$tv" --depths "$depth" --modes "${MODES:-off,unbounded,prefill}" --tg 0 --reps 1 \
            --out "$OUT" 2>&1 | grep "attn-modes\]" | tee -a "$OUT/wheels-$PHASE.txt"
    done
    ;;
*)
    echo "PHASE=$PHASE: not a phase (build, test, bench)" >&2; exit 2 ;;
esac
log "done"
