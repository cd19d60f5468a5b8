# Sourced by the scripts that run on a GPU machine (cuda_device.sh, serve_device.sh, gpu_session.sh and
# investigations/hip_proxy.sh, investigations/fused_attn_check.sh):
# the carried folder, the output folder, the environment, and the synthetic models and tools they share.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
C=${CARRY:-$here/.bench-carry}
: "${OUT:?set OUT to the results folder}"
mkdir -p "$OUT"
# one GPU: on a machine with several, llama-bench would split the layers across all of them
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
export LLAMA_VQ_GGUF_PY=$C/gguf-py PYTHONUNBUFFERED=1
M=${MODEL_DIR:-/tmp/models}
mkdir -p "$M"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader

# device_log LABEL FILE: sets t0 (now) for log MSG (stamped "[LABEL <seconds since t0>s]", shown and appended to
# FILE) and late S (true once more than S seconds have passed since t0); a script may define its own after sourcing
device_log() {
    t0=$(date +%s)
    _log_label=$1
    _log_file=$2
}
log() { echo "[$_log_label $(( $(date +%s) - t0 ))s] $*" | tee -a "$_log_file"; }
late() { [ $(( $(date +%s) - t0 )) -gt "$1" ]; }

# gen NAME SYNTH-ARGS...: $M/synth-NAME.gguf in the background, written under a temporary name and renamed when
# complete; started in its own session, so it survives the call that started it (the machine stays up between calls)
gen() {
    local name=$1; shift
    [ -f "$M/synth-$name.gguf" ] && return 0
    setsid bash -c "nice -n 5 python3 '$here/tools/synth_models.py' $* '$M/tmp-$name.gguf' --tokenizer-from '$C/vocab.gguf' \
        > '$M/gen-$name.log' 2>&1 && mv '$M/tmp-$name.gguf' '$M/synth-$name.gguf'" < /dev/null &
}

# wait_model NAME: until gen's model is complete; its log and exit 1 if its generator died
wait_model() {
    while [ ! -f "$M/synth-$1.gguf" ]; do
        if ! pgrep -f "tmp-$1.gguf" > /dev/null; then cat "$M/gen-$1.log"; exit 1; fi
        sleep 2
    done
}

# build_tools BUILD_DIR on|off [TARGETS]: tools from the carried tree (FA kernels on or off; default
# llama-bench and test-backend-ops)
build_tools() {
    python3 "$here/benchmarks/run.py" --backend cuda --src "$C/llama.cpp" --build-dir "$1" --jobs "$(nproc)" \
        --targets "${3:-llama-bench,test-backend-ops}" --cuda-fa "$2" --build-only > "$OUT/build.log" 2>&1 \
        || { tail -40 "$OUT/build.log"; exit 1; }
}

# bench_tg TXT MODEL "LLAMA-BENCH ARGS" LABEL CTK CTV [ENV=VALUE ...]: decode with FA off on the GPU, one line per
# depth ("LABEL type_k type_v depth tok/s std") shown and appended to TXT; $bin is the tools folder
bench_tg() {
    local txt=$1 model=$2 args=$3 label=$4 k=$5 v=$6; shift 6
    # shellcheck disable=SC2086  # args: several llama-bench options
    env "$@" X=1 "$bin/llama-bench" -m "$model" -ngl 99 -fa 0 -p 0 $args -ctk "$k" -ctv "$v" -o jsonl 2>/dev/null \
        | python3 -c "import json,sys
for l in sys.stdin:
    r=json.loads(l); print('$label', r['type_k'], r['type_v'], r['n_depth'], round(r['avg_ts'],2), round(r['stddev_ts'],2))" \
        | tee -a "$txt"
}

# ncu_full TXT REPORT KERNEL SKIP DEPTH: ncu's full set for launch SKIP+1 of KERNEL in the 8B shape's decode at DEPTH
# (q4_0/q4_0, the fused attention on; the depth's prefill in ubatches of 4096 and no warmup come first, with no fused
# launch): REPORT.ncu-rep, its details in REPORT.txt, and the lines that say what bounds the kernel appended to TXT
# (prefixed KERNEL); $bin is the tools folder. ncu reads the counters on these machines with --clock-control none.
ncu_full() {
    local txt=$1 rep=$2 kern=$3 skip=$4 d=$5
    LLAMA_VQ_CUDA_FUSED_ATTN=1 timeout 200 ncu --clock-control none --set full --import-source no -k "$kern" \
        --launch-skip "$skip" --launch-count 1 -o "$rep" "$bin/llama-bench" -m "$M/synth-llama8b.gguf" -ngl 99 -fa 0 \
        -p 0 -n 3 -d "$d" -b 4096 -ub 4096 -r 1 --no-warmup -ctk q4_0 -ctv q4_0 > "$rep.out" 2>&1
    echo "$kern: ncu rc $?" | tee -a "$txt"
    ncu -i "$rep.ncu-rep" --print-details all > "$rep.txt" 2>&1
    grep -E "^ +(Duration|Elapsed Cycles|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Executed Ipc Active|Issue Slots Busy|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Block Limit|Warp Cycles Per Issued Instruction|No Eligible|Active Warps Per Scheduler|Eligible Warps Per Scheduler|L1/TEX Hit Rate|L2 Hit Rate|Mem Busy|Max Bandwidth|Executed Instructions  )" \
        "$rep.txt" | head -40 | sed "s/^/$kern /" | tee -a "$txt"
}

# fusion_ran LOG OP: whether the test-backend-ops run logged in LOG (with LLAMA_VQ_CUDA_FUSION_STATS=1) ran
# OP's rotation fusion at least once (patch 0031 prints the counts at exit); a test that passed without the
# fused kernel proves nothing about it. OPs without a fusion count as ran.
fusion_ran() {
    local kind
    case "$2" in
        HADAMARD_SET_ROWS) kind=set_rows ;;
        CONT_HADAMARD) kind=cont ;;
        HADAMARD_KQ) kind=kq ;;
        ROPE_HADAMARD_SET_ROWS) kind=rope ;;
        *) return 0 ;;
    esac
    grep -o "rotation fusions run: .*" "$1" | grep -o "$kind=[0-9]*" | cut -d= -f2 \
        | awk '{ s += $1 } END { exit !(s > 0) }'
}

# build_project BUILD_DIR PYTHON [TARGETS...]: our CMake project from the carried tree (CUDA sm_90, FA kernels off):
# llama_vq/lib filled in place, llama-server and the tools in BUILD_DIR/bin (serve_device.sh)
build_project() {
    local B=$1 py=$2; shift 2
    cmake -S "$here" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_VQ_PATCHED_SRC="$C/llama.cpp" \
        -DLLAMA_VQ_BACKEND=cuda -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DGGML_CUDA_FA=OFF \
        -DLLAMA_VQ_BUILD_TOOLS=ON -DPython3_EXECUTABLE="$py" > "$OUT/build.log" 2>&1 \
        && cmake --build "$B" -j "$(nproc)" --target llama ggml ggml-base ggml-cpu ggml-cuda llama-common llama-vq-chat \
            llama-vq-server mtmd \
            "$@" >> "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
    mkdir -p "$here/llama_vq/lib"
    find "$B" -name 'lib*.so' -not -path '*/CMakeFiles/*' -exec cp -L {} "$here/llama_vq/lib/" \;
    cp "$B/_build_config.json" "$here/llama_vq/"
}

# engine_build LABEL FILE [TARGETS...]: how serve_device.sh starts:
# device_log LABEL FILE, the MiMo-shaped model (attn preset) generated in the background, the server's Python (PY),
# and our project built in B (BUILD_DIR, default /tmp/serve-build) with TARGETS
engine_build() {
    local label=$1 file=$2; shift 2
    device_log "$label" "$file"
    gen mimo mimo --preset attn
    server_python
    B=${BUILD_DIR:-/tmp/serve-build}
    log "build (CUDA sm_90, FA kernels off)"
    build_project "$B" "$PY" "$@"
}

# server_python: the server's Python (3.11 + its packages, packed here by pack_python.py; the machine's own Python
# lacks pydantic-core) unpacked into /tmp/py; sets PY
server_python() {
    tar xJf "$(dirname "$C")/py.tar.xz" -C /tmp || exit 1
    PY=/tmp/py/bin/python3
    export LD_LIBRARY_PATH=/tmp/py/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export PYTHONPATH=$here  # llama_vq and llama_vq.server from the checkout
}

# ppl_kl TXT LABEL [ENV=VALUE ...] -- ARGS...: llama-perplexity on the 8B shape over 4 x 512 tokens of llama.cpp's own
# docs, FA off, with ARGS (e.g. --kl-divergence-base FILE [--kl-divergence], cache types, batch sizes); its log in
# $OUT/ppl-LABEL.log, its KL / top-token / PPL-ratio lines appended to TXT; $bin is the tools folder
ppl_kl() {
    local txt=$1 label=$2; shift 2
    local envs=()
    while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    [ -s /tmp/ppl-text.txt ] || cat "$C"/llama.cpp/*.md "$C"/llama.cpp/tools/*/README.md > /tmp/ppl-text.txt
    env ${envs[@]+"${envs[@]}"} timeout "${PPL_TIMEOUT:-300}" "$bin/llama-perplexity" -m "$M/synth-llama8b.gguf" -f /tmp/ppl-text.txt \
        -c 512 --chunks 4 -fa off "$@" > "$OUT/ppl-$label.log" 2>&1 \
        || { echo "$label: failed ($(tail -1 "$OUT/ppl-$label.log"))" | tee -a "$txt"; return 1; }
    grep -E "^(Mean +KLD|Same top p|Mean PPL\(Q\)/PPL\(base\))" "$OUT/ppl-$label.log" | sed "s/^/$label: /" | tee -a "$txt"
}

