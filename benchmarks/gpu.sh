#!/usr/bin/env bash
# The measurements only a GPU can make, on a lent NVIDIA machine (CUDA, sm_90) that cannot fetch anything, each
# in one call of at most 10 minutes. The machine stays up between calls: a measurement after `build` finds its
# products in /tmp (BUILD, MODEL_DIR).
#
# Here, once (the vendored tree must be there: scripts/run.sh setup):
#   bash benchmarks/gpu.sh carry [--python] [--wheels] [--ab REV]
#                                                        # .gpu-carry (git-ignored): the patched tree, gguf-py and a
#                                                        # vocab (~30 MB); --python adds the server's Python (~25 MB),
#                                                        # --wheels a wheelhouse, --ab our CUDA sources at REV for
#                                                        # decode-ab (benchmarks/gpu_carry.py says more)
# There, with .gpu-carry carried beside the working tree:
#   OUT=<dir> bash benchmarks/gpu.sh MEASUREMENT
#
# MEASUREMENT        what it measures (everything it prints goes to $OUT/MEASUREMENT.txt too)
#   build            builds our CMake project for CUDA sm_90 from the carried tree in BUILD (libraries, llama-server,
#                    llama-bench, test-backend-ops, llama-perplexity...; TARGETS narrows it), with flash attention's
#                    kernels (CUDA_FA=ON, the default; OFF builds faster and suits measurements without flash
#                    attention), and generates the synthetic models (MODELS) in /tmp/models, both in the background;
#                    waits up to WAIT s (540): call it again until it says "built"
#   first-call       the most one call on a fresh machine shows of the fused decode attention, for sessions whose
#                    machines are few: `build` in the foreground (CUDA_FA OFF unless set, the few targets it needs,
#                    the MiMo model; WAIT 330), ATTN_DECODE_FUSED's op tests on CUDA0 with the tensor-core form
#                    everywhere and the forms counted, then `decode-ab` on the MiMo shape at DEPTHS_MIMO (0,65536)
#                    where `carry --ab` stored a version, else tg64 of this checkout's. Whatever the call's limit cuts
#                    off, what ran is in OUT
#   rebuild          brings a warm machine's build up to date after a change (TARGETS: ggml-cuda llama-bench
#                    test-backend-ops)
#   op-tests         test-backend-ops on CUDA0 against the CPU: our attention ops (ATTN_SPLIT, ATTN_DECODE_FUSED,
#                    OUT_PROD, the fusions counted), then every op of ours as benchmarks/mi210.sh's step 2 runs them,
#                    with NVIDIA's defaults and with the HIP path's settings
#   attention-modes  the attention modes (split non-FA, prefill, flash attention, unbounded) side by side with
#                    benchmarks/attn_modes.py: the 8B shape (q4_0/q4_0) at 0/8K/32K, the MiMo shape (q8_0/q4_1) at
#                    0/64K with the compute buffers at 128K (SHAPES: "llama8b mimo"); HIP_SETTINGS=1 runs them under
#                    the HIP path's settings (an NVIDIA GPU configured as HIP; not a gfx90a result)
#   decode-bandwidth the fused decode attention against the memory bound: ATTN_DECODE_FUSED's op tests with every
#                    chain fused and the forms counted (tc=: both products on tensor cores), then llama-bench tg64 at
#                    depth (MiMo shape q8_0/q4_1 at DEPTHS_MIMO 0,32768,65536; 8B shape q4_0/q4_0 at DEPTHS_8B
#                    0,32768): ours in prefill mode (the default rule; on MiMo also the tensor-core form everywhere,
#                    TC=1, and never, TC=0) and flash attention on f16; then the full-attention layers' kernels of a
#                    decode at 64K under ncu, with the stall reasons by SASS line (NO_NCU=1 skips). Effective
#                    bandwidth = the step time the depth adds over the K/V bytes read (benchmarks/decode_bandwidth.py,
#                    against PEAK_TBS, 3.35 for an H100). A build with CUDA_FA=OFF runs ours with -fa off (the
#                    prompt through the split non-FA attention; the decode is the same) and leaves flash attention out
#   decode-ab        versions of the fused decode attention side by side in one call: this checkout's (the carried
#                    tree, as built) and the CUDA sources `carry --ab REV [--ab REV2 ...]` stored, swapped into the
#                    tree and rebuilt in the same build folder (only they recompile: ~2 min a swap), in turn (old,
#                    old-2, ..., new; AB_ROUNDS 1): tg64 of the MiMo shape (q8_0/q4_1, prefill mode, or -fa off where
#                    CUDA_FA=OFF; DEPTHS_MIMO) and of the 8B shape (q4_0/q4_0, DEPTHS_8B; SHAPES "mimo llama8b"), then
#                    the effective bandwidth of each; the tree and the build are left with this checkout's sources
#   decode-kernels   the GPU time of a decoded token kernel by kernel (ncu, benchmarks/kernel_times.py) on the MiMo
#                    shape at DEPTH (1024): ours, flash attention on the same types and on f16
#   attention-choice -fa auto by measurement (llama_vq.tune_attn) on the MiMo shape, q8_0/q4_1, with NVIDIA's and
#                    the HIP path's settings: first and cached start, then the fixed modes at 32K/64K (--python)
#   split-vs-unbounded  the split non-FA attention against the unbounded graph on the MiMo shape at 0/64K with the
#                    compute buffers at 128K, and the split's cost per chunk: the 8B shape's pp512 at 8K under
#                    scratch budgets of 512 (unsplit), 256, 128 and 64 MiB
#   fidelity         the attention modes' greedy text and logits on the GPU (benchmarks/attn_fidelity.py --gpu, tiny
#                    Llama and MiMo shapes; needs --python's carry)
#   cache-types      every cache type's tok/s against f16 at depth, FA off and on (benchmarks/run.py's matrix with its
#                    own llama-bench build; CUDA_FA=off by default here, then FA-on configs are reported as skipped;
#                    DEADLINE s, 400)
#   serving          llama-vq-server against llama-server from this build, same flags, both up at once, in
#                    alternating rounds (medians): MiMo attention shape on the GPU, q8_0 K / q4_0 V, FA off, -np 8,
#                    CLIENTS 1,4,8, ROUNDS 3 (benchmarks/serve_bench.py throughput; needs --python's carry)
#   cpu-experts      the deployment's shape: the MiMo-shaped MoE with its experts in CPU memory, -t = every core,
#                    llama-vq-server against llama-server (benchmarks/cpu_experts.sh; needs --python's carry)
#   two-gpu          MiMo's layer split over two GPUs of one host against one GPU (benchmarks/two_gpu.py; needs both
#                    GPUs visible and --python's carry)
#   wheels-build     the base wheel and the CUDA one (sm_90) built by scripts/wheels.sh from the carried tree, pip
#                    offline on the carried wheelhouse (--wheels; carry vendor/llama_cpp_python too), in the
#                    background; WHEEL_KINDS ("cpu cuda"), WAIT (540)
#   wheels-install   those wheels installed as users install them (pip install "llama-vq[cuda]", WHEEL_EXTRA; or
#                    WHEEL_DIST: wheels built elsewhere), then which backend modules loaded, a model on the GPU through
#                    llama_vq.Llama and llama-vq-server from the installed wheel answering a chat
#   wheels-attention-modes  pp512 of the attention modes on the installed wheels' libraries (WHEEL_TOOLS: a folder
#                    with llama-bench built against them): MiMo shape at 64K, 8B shape at 32K
# Env: CARRY (.gpu-carry), BUILD (/tmp/gpu-build), MODEL_DIR (/tmp/models), REPS (2), WHEEL_PY (python3).
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
measurement=${1:?"usage: bash benchmarks/gpu.sh carry|build|first-call|rebuild|op-tests|attention-modes|decode-bandwidth|decode-ab|decode-kernels|attention-choice|split-vs-unbounded|fidelity|cache-types|serving|cpu-experts|two-gpu|wheels-build|wheels-install|wheels-attention-modes"}
shift
C=${CARRY:-$here/.gpu-carry}
if [ "$measurement" = carry ]; then
    py=$here/.venv/bin/python
    [ -x "$py" ] || py=python3
    exec "$py" "$here/benchmarks/gpu_carry.py" "$C" "$@"
fi
: "${OUT:?set OUT to the results folder}"
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
# one GPU unless the measurement needs two: on a machine with several, llama-bench would split the layers
if [ "$measurement" = two-gpu ]; then
    export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0,1}
else
    export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
fi
export LLAMA_VQ_GGUF_PY=$C/gguf-py PYTHONUNBUFFERED=1
[ -d /usr/local/cuda/bin ] && export PATH=/usr/local/cuda/bin:$PATH
M=${MODEL_DIR:-/tmp/models}
B=${BUILD:-/tmp/gpu-build}
bin=$B/bin
mkdir -p "$M"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader \
    | tee "$OUT/$measurement.txt"
t0=$(date +%s)
log() { echo "[$measurement $(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/$measurement.txt"; }
late() { [ $(( $(date +%s) - t0 )) -gt "$1" ]; }

# gen NAME SYNTH-ARGS...: $M/synth-NAME.gguf in the background, written under a temporary name and renamed when
# complete; started in its own session, so it survives the call that started it
gen() {
    local name=$1; shift
    [ -f "$M/synth-$name.gguf" ] && return 0
    pgrep -f "tmp-$name.gguf" > /dev/null && return 0
    setsid bash -c "nice -n 5 python3 '$here/tools/synth_models.py' $* '$M/tmp-$name.gguf' --tokenizer-from '$C/vocab.gguf' \
        > '$M/gen-$name.log' 2>&1 && mv '$M/tmp-$name.gguf' '$M/synth-$name.gguf'" < /dev/null > /dev/null 2>&1 &
}

# start_model NAME: gen's model NAME (llama8b, mimo, mimo-tiny, llama-tiny, cpu-moe) started if needed
start_model() {
    case "$1" in
        llama8b) gen llama8b llama --preset llama-3.1-8b ;;
        mimo) gen mimo mimo --preset attn ;;
        mimo-tiny) gen mimo-tiny mimo --preset tiny ;;
        llama-tiny) gen llama-tiny llama --preset tiny ;;
        cpu-moe) gen cpu-moe mimo --preset cpu-moe ;;
        *) echo "no synthetic model $1" >&2; exit 2 ;;
    esac
}

# model NAME: $M/synth-NAME.gguf, started if needed and waited for; its generator's log and exit 1 if it died
model() {
    start_model "$1"
    while [ ! -f "$M/synth-$1.gguf" ]; do
        if ! pgrep -f "tmp-$1.gguf" > /dev/null && [ ! -f "$M/synth-$1.gguf" ]; then cat "$M/gen-$1.log"; exit 1; fi
        sleep 2
    done
}

# the server's Python (packed by `carry --python`: the machine's own lacks the server's packages) unpacked into
# /tmp/py, with the checkout's llama_vq on PYTHONPATH; sets PY (the machine's python3 when nothing was packed)
use_python() {
    export PYTHONPATH=$here
    if [ ! -x /tmp/py/bin/python3 ] && [ ! -f "$C/py.tar.xz" ]; then
        PY=$(command -v python3); log "no $C/py.tar.xz: the machine's $PY (the server's packages missing)"; return
    fi
    [ -x /tmp/py/bin/python3 ] || tar xJf "$C/py.tar.xz" -C /tmp || exit 1
    PY=/tmp/py/bin/python3
    export LD_LIBRARY_PATH=/tmp/py/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
}

built() { [ -f "$B/.done" ]; }
# whether the build has flash attention's kernels (CUDA_FA=ON); without them our decode is measured with -fa off
# (prompt batches through the split non-FA attention) and flash attention's rows are left out
fa_built() { grep -q '^GGML_CUDA_FA:BOOL=ON' "$B/CMakeCache.txt" 2>/dev/null; }
ours_fa() { if fa_built; then echo prefill; else echo off; fi; }
need_build() { built || { log "not built (bash benchmarks/gpu.sh build first)"; tail -5 "$B.log" 2>/dev/null; exit 1; }; }

# ops_summary LOG: the pass/fail lines of a test-backend-ops log, counted
ops_summary() { grep -E 'tests passed|FAIL' "$1" | sort | uniq -c | head -3 | tr '\n' ' '; }

# the HIP path's settings on an NVIDIA GPU (benchmarks/mi210.sh's PROXY=cuda): the fused attention without its MMA
# form, the F16 GEMM branch, no tensor-core V*P, no programmatic dependent launch
HIP_ENV=(LLAMA_VQ_CUDA_FUSED_ATTN=1 LLAMA_VQ_CUDA_FUSED_ATTN_MMA=0 LLAMA_VQ_CUDA_FORCE_F16_GEMM=1
    LLAMA_VQ_CUDA_OUT_PROD_MMA=0 GGML_CUDA_PDL=0)

# tg_rows FILE MODEL CONFIG LABEL: llama-bench's jsonl rows (stdin), each with the synthetic model's name and the
# configuration added, appended to FILE (benchmarks/decode_bandwidth.py reads them), and a line each into the log
tg_rows() {
    python3 -c "import json, sys
path, model, config, label = sys.argv[1:5]
for l in sys.stdin:
    r = json.loads(l); r.update(model=model, config=config)
    print(json.dumps(r), file=open(path, 'a'))
    print(label, 'depth', r['n_depth'], round(r['avg_ts'], 2), '+-', round(r['stddev_ts'], 2))" "$@" \
        | tee -a "$OUT/$measurement.txt"
}

# decode_op_tests TIMEOUT [VAR=VALUE...]: ATTN_DECODE_FUSED's op tests on CUDA0 with every chain fused and the forms
# counted (n_kv TEST_CELLS), into OUT/tbo-decode.log, and their summary into the log
decode_op_tests() {
    local limit=$1; shift
    env LLAMA_VQ_CUDA_FUSED_ATTN=1 LLAMA_VQ_CUDA_FUSION_STATS=1 "$@" timeout "$limit" "$bin/test-backend-ops" test \
        -b CUDA0 -o ATTN_DECODE_FUSED -p "n_kv=(${TEST_CELLS:-1|127|256|4096})," > "$OUT/tbo-decode.log" 2>&1
    log "ATTN_DECODE_FUSED: rc $? $(grep -E 'tests passed|attention fusions run' "$OUT/tbo-decode.log" | tr '\n' ' ')"
}

# attn_modes MODEL LABEL ARG...: benchmarks/attn_modes.py on this build's tools, its lines into the log
attn_modes() {
    local model=$1 label=$2; shift 2
    python3 "$here/benchmarks/attn_modes.py" --bin "$bin" --model "$model" --label "$label" --out "$OUT" "$@" 2>&1 \
        | tee -a "$OUT/$measurement.txt"
}

case "$measurement" in
build)
    nproc
    for m in ${MODELS:-llama8b mimo mimo-tiny llama-tiny cpu-moe}; do  # MODELS: the synthetic models to generate
        start_model "$m"
    done
    if ! built && ! pgrep -f "cmake --build $B" > /dev/null && ! pgrep -f "cmake -S $here" > /dev/null; then
        use_python
        setsid bash -c "
            cmake -S '$here' -B '$B' -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_VQ_PATCHED_SRC='$C/llama.cpp' \
                -DLLAMA_VQ_BACKEND=cuda -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=${CUDA_FA:-ON} \
                -DLLAMA_VQ_BUILD_TOOLS=ON -DPython3_EXECUTABLE='$PY' > '$B.log' 2>&1 &&
            cmake --build '$B' -j $(nproc) --target ${TARGETS:-llama ggml ggml-base ggml-cpu ggml-cuda ggml-rpc llama-common \
                llama-vq-chat llama-vq-server mtmd llama-bench llama-perplexity test-backend-ops ggml-rpc-server \
                llama-server llama-completion} >> '$B.log' 2>&1 &&
            mkdir -p '$here/llama_vq/lib' && find '$B' -name 'lib*.so' -not -path '*/CMakeFiles/*' \
                -exec cp -L {} '$here/llama_vq/lib/' ';' && cp '$B/_build_config.json' '$here/llama_vq/' &&
            touch '$B/.done'" < /dev/null > /dev/null 2>&1 &
        sleep 5
    fi
    while ! built && ! late "${WAIT:-540}"; do
        if ! pgrep -f "cmake --build $B" > /dev/null && ! pgrep -f "cmake -S $here" > /dev/null && ! built; then
            log "build failed"; tail -30 "$B.log"; cp "$B.log" "$OUT/build.log"; exit 1
        fi
        sleep 5
    done
    if built; then log "built"; else log "still building ($(grep -c '^\[' "$B.log") steps logged): call build again"; fi
    tail -2 "$B.log"; ls "$M"
    ;;
first-call)
    CUDA_FA=${CUDA_FA:-OFF} WAIT=${WAIT:-330} MODELS=${MODELS:-mimo} \
        TARGETS=${TARGETS:-ggml ggml-base ggml-cpu ggml-cuda llama llama-bench test-backend-ops} bash "$0" build
    need_build
    decode_op_tests 90 LLAMA_VQ_CUDA_FUSED_ATTN_TC=1
    if [ -f "$C/ab/REV" ]; then
        SHAPES=${SHAPES:-mimo} DEPTHS_MIMO=${DEPTHS_MIMO:-0,65536} bash "$0" decode-ab
    else
        model mimo
        "$bin/llama-bench" -m "$M/synth-mimo.gguf" -ngl 99 -fa "$(ours_fa)" -ctk q8_0 -ctv q4_1 -p 0 -n 64 \
            -d "${DEPTHS_MIMO:-0,65536}" -r "${REPS:-2}" -o jsonl 2>/dev/null \
            | tg_rows "$OUT/tg.jsonl" mimo "this checkout" "tg64 mimo q8_0/q4_1"
        python3 "$here/benchmarks/decode_bandwidth.py" "$OUT/tg.jsonl" --peak-tbs "${PEAK_TBS:-3.35}" \
            | tee -a "$OUT/$measurement.txt"
    fi
    ;;
rebuild)
    # the carry's files are all new to the build, so this recompiles what they feed (minutes for ggml-cuda)
    [ -f "$B/build.ninja" ] || { log "no build to update (build first)"; exit 1; }
    use_python
    rm -f "$B/.done"
    # shellcheck disable=SC2086  # TARGETS: several CMake targets
    cmake --build "$B" -j "$(nproc)" --target ${TARGETS:-ggml-cuda llama-bench test-backend-ops} > "$B.log" 2>&1 \
        && find "$B" -name 'lib*.so' -not -path '*/CMakeFiles/*' -exec cp -L {} "$here/llama_vq/lib/" ';' \
        && touch "$B/.done" && log "rebuilt" || { log "rebuild failed"; tail -20 "$B.log"; exit 1; }
    ;;
op-tests)
    need_build
    log "test-backend-ops on CUDA0 against the CPU: the split attention, the fused decode attention, OUT_PROD"
    for op in ATTN_SPLIT ATTN_DECODE_FUSED OUT_PROD; do
        LLAMA_VQ_CUDA_FUSION_STATS=1 timeout 240 "$bin/test-backend-ops" test -b CUDA0 -o "$op" > "$OUT/tbo-$op.log" 2>&1
        log "$op: rc $? $(ops_summary "$OUT/tbo-$op.log")"
    done
    # every op of ours (benchmarks/mi210.sh step 2), NVIDIA's default and the HIP path's settings, with proof that
    # each fused kernel ran
    for hip in 0 1; do
        PROXY=cuda HIP_PATH=$hip BIN=$bin STEPS=2 VOCAB=$C/vocab.gguf bash "$here/benchmarks/mi210.sh" "$OUT/ops-hip$hip" \
            2>&1 | grep -E "^\[|tests passed|FAIL|ran|never" | tee -a "$OUT/$measurement.txt"
    done
    ;;
attention-modes)
    need_build
    envs=()
    if [ "${HIP_SETTINGS:-0}" = 1 ]; then
        log "the HIP path's settings: an NVIDIA GPU configured as HIP runs them, not a gfx90a result"
        for e in "${HIP_ENV[@]}"; do envs+=(--env "$e"); done
    fi
    tag=$([ "${HIP_SETTINGS:-0}" = 1 ] && echo -hip-settings)
    for shape in ${SHAPES:-llama8b mimo}; do
        case "$shape" in
            llama8b) model llama8b; attn_modes "$M/synth-llama8b.gguf" "8b$tag" --ctk q4_0 --ctv q4_0 --depths 0,8192,32768 \
                --reps "${REPS:-2}" ${envs[@]+"${envs[@]}"} ;;
            mimo) model mimo; attn_modes "$M/synth-mimo.gguf" "mimo$tag" --ctk q8_0 --ctv q4_1 --depths 0,65536 --reps 1 \
                --buffers 131072 ${envs[@]+"${envs[@]}"} ;;
            *) log "SHAPES: llama8b, mimo (not $shape)"; exit 2 ;;
        esac
    done
    ;;
decode-bandwidth)
    need_build
    decode_op_tests 300
    tg() { # SHAPE DEPTHS FA CTK CTV TC
        model "$1"
        local tcenv=(LLAMA_VQ_CUDA_FUSED_ATTN_TC="$6"); [ "$6" = default ] && tcenv=()
        env "${tcenv[@]}" "$bin/llama-bench" -m "$M/synth-$1.gguf" -ngl 99 -fa "$3" -ctk "$4" -ctv "$5" \
            -p 0 -n 64 -d "$2" -r "${REPS:-2}" -o jsonl 2>/dev/null \
            | tg_rows "$OUT/decode.jsonl" "$1" "fa=$3 TC=$6" "tg64 $1 fa=$3 $4/$5 TC=$6"
    }
    dm=${DEPTHS_MIMO:-0,32768,65536}
    fa=$(ours_fa)
    fa_built || log "built without flash attention's kernels (CUDA_FA=OFF): ours with -fa off, no flash attention rows"
    tg mimo "$dm" "$fa" q8_0 q4_1 default; tg mimo "$dm" "$fa" q8_0 q4_1 1; tg mimo "$dm" "$fa" q8_0 q4_1 0
    fa_built && tg mimo "$dm" on f16 f16 default
    if command -v ncu > /dev/null && [ -z "${NO_NCU:-}" ]; then
        # the decode steps at 64K: llama-bench's warm-up decodes at depth 0, where the default rule never picks
        # k_attn_decode_tc (>= 8,192 cells) and the splits are few enough to fold their combine, so these two names
        # catch only the deep steps' full-attention layers (the first form's sliding-window launches are skipped);
        # the source counters give the stall reasons by SASS line
        timeout 150 ncu --clock-control none -k regex:"k_attn_decode_tc|k_attn_decode_combine" \
            --launch-count "${NCU_KERNELS:-4}" --section SpeedOfLight --section Occupancy --section LaunchStats \
            --section WarpStateStats --section InstructionStats --section SchedulerStats --section MemoryWorkloadAnalysis \
            --section SourceCounters "$bin/llama-bench" -m "$M/synth-mimo.gguf" -ngl 99 -fa "$fa" -ctk q8_0 \
            -ctv q4_1 -p 0 -n 2 -d 65536 -r 1 > "$OUT/ncu.txt" 2>&1
        grep -E "k_attn_decode|Duration|DRAM Throughput|Achieved Occupancy|SM Active Cycles|Warp Cycles Per|Issued Ipc" \
            "$OUT/ncu.txt" | head -60
        grep -E "Executed Instructions |Stall|stalled|No Eligible" "$OUT/ncu.txt" | head -30
    fi
    d8=${DEPTHS_8B:-0,32768}
    tg llama8b "$d8" "$fa" q4_0 q4_0 default; fa_built && tg llama8b "$d8" on f16 f16 default
    python3 "$here/benchmarks/decode_bandwidth.py" "$OUT/decode.jsonl" --peak-tbs "${PEAK_TBS:-3.35}" \
        | tee -a "$OUT/$measurement.txt"
    ;;
decode-ab)
    need_build
    [ -f "$C/ab/REV" ] || { log "no $C/ab (bash benchmarks/gpu.sh carry --ab REV, here)"; exit 1; }
    cuda=$C/llama.cpp/ggml/src/ggml-cuda
    # the versions: old (ab: the first --ab REV), old-2 (ab-2), ..., then new (this checkout)
    sides=old; for d in "$C"/ab-*; do [ -f "$d/REV" ] && sides="$sides old-${d##*/ab-}"; done; sides="$sides new"
    side_dir() { case "$1" in old) echo "$C/ab" ;; old-*) echo "$C/ab-${1#old-}" ;; *) echo "$B/ab-new" ;; esac; }
    files=$(for sd in $sides; do [ "$sd" = new ] || (cd "$(side_dir "$sd")" && ls -- *.cu *.cuh 2>/dev/null); done \
        | sort -u)
    # this checkout's sources, kept aside (each call brings them anew with the carry)
    mkdir -p "$B/ab-new"
    for f in $files; do cp "$cuda/$f" "$B/ab-new/$f"; done
    # use SIDE: the tree's CUDA sources as SIDE (a version's file where it stored one, else this checkout's; a file is
    # copied only where it differs) and the build brought up to date, always (ninja does nothing where it is); a
    # failed build puts this checkout's sources back and leaves the build to `rebuild`
    use() {
        local from f src
        from=$(side_dir "$1")
        for f in $files; do
            src=$from/$f; [ -f "$src" ] || src=$B/ab-new/$f
            cmp -s "$src" "$cuda/$f" || cp "$src" "$cuda/$f"
        done
        log "building $1 ($([ "$1" = new ] && echo this checkout || tr -d '\n' < "$from/REV")): $(echo $files)"
        if ! cmake --build "$B" -j "$(nproc)" --target ggml-cuda llama-bench > "$B-ab.log" 2>&1; then
            log "build of $1 failed"; tail -20 "$B-ab.log"
            for f in $files; do cp "$B/ab-new/$f" "$cuda/$f"; done
            rm -f "$B/.done"
            exit 1
        fi
    }
    abtg() { # SIDE ROUND MODEL DEPTHS CTK CTV
        model "$3"
        "$bin/llama-bench" -m "$M/synth-$3.gguf" -ngl 99 -fa "$(ours_fa)" -ctk "$5" -ctv "$6" -p 0 -n 64 -d "$4" \
            -r "${REPS:-2}" -o jsonl 2>/dev/null | tg_rows "$OUT/ab.jsonl" "$3" "$1" "tg64 $3 $5/$6 $1 (round $2)"
    }
    for round in $(seq "${AB_ROUNDS:-1}"); do
        for sd in $sides; do
            use "$sd"
            for shape in ${SHAPES:-mimo llama8b}; do
                case "$shape" in
                    mimo) abtg "$sd" "$round" mimo "${DEPTHS_MIMO:-0,32768,65536}" q8_0 q4_1 ;;
                    llama8b) abtg "$sd" "$round" llama8b "${DEPTHS_8B:-0,32768}" q4_0 q4_0 ;;
                esac
            done
        done
    done
    python3 "$here/benchmarks/decode_bandwidth.py" "$OUT/ab.jsonl" --peak-tbs "${PEAK_TBS:-3.35}" \
        | tee -a "$OUT/$measurement.txt"
    ;;
decode-kernels)
    # the GPU time of a decoded token kernel by kernel (benchmarks/kernel_times.py): ncu (one metric, caches and
    # clocks left alone) on llama-bench -n 1 and -n 3 at DEPTH (1024: the sliding-window caches full, the full layers
    # short), the difference being two tokens: ours, flash attention on the same types and on f16
    need_build
    model mimo
    ncu_times=(ncu --csv --print-units base --metrics gpu__time_duration.sum --cache-control none --clock-control none)
    prof() { # LABEL N DEPTH FA CTK CTV
        local label=$1 n=$2 d=$3 fa=$4 ctk=$5 ctv=$6
        timeout 240 "${ncu_times[@]}" "$bin/llama-bench" -m "$M/synth-mimo.gguf" -ngl 99 -fa "$fa" -ctk "$ctk" \
            -ctv "$ctv" -p 0 -n "$n" -d "$d" -r 1 > "$OUT/ncu-$label-n$n.csv" 2> "$OUT/ncu-$label-n$n.err" \
            || log "ncu $label -n $n: rc $?"
    }
    runs=()
    for cfg in "ours prefill q8_0 q4_1" "fa-same on q8_0 q4_1" "fa-f16 on f16 f16"; do
        read -r -a c <<< "$cfg"
        prof "${c[0]}" 1 "${DEPTH:-1024}" "${c[@]:1}"; prof "${c[0]}" 3 "${DEPTH:-1024}" "${c[@]:1}"
        runs+=("${c[0]}=$OUT/ncu-${c[0]}-n3.csv,$OUT/ncu-${c[0]}-n1.csv")
        late "${NCU_BUDGET:-300}" && { log "ncu: past NCU_BUDGET, the rest skipped"; break; }
    done
    python3 "$here/benchmarks/kernel_times.py" --tokens 2 "${runs[@]}" 2>&1 | tee -a "$OUT/$measurement.txt"
    # ours at DEPTH_FULL (65536): two tokens' attention kernels only (the fill runs flash attention's)
    late "${NCU_BUDGET:-300}" || {
        timeout 200 "${ncu_times[@]}" -k regex:k_attn_decode "$bin/llama-bench" -m "$M/synth-mimo.gguf" -ngl 99 -fa prefill \
            -ctk q8_0 -ctv q4_1 -p 0 -n 1 -d "${DEPTH_FULL:-65536}" -r 1 > "$OUT/ncu-ours-deep.csv" 2>&1
        python3 "$here/benchmarks/kernel_times.py" --tokens 2 "ours-${DEPTH_FULL:-65536}=$OUT/ncu-ours-deep.csv" 2>&1 \
            | tee -a "$OUT/$measurement.txt"
    }
    ;;
attention-choice)
    # -fa auto by measurement (llama-vq-tune-attn: llama_vq.tune_attn) on the MiMo shape with the
    # deployment's types, NVIDIA's settings and the HIP path's (HIP_SETTINGS 0 1): the first start's cost, a second
    # start reading the cache, then the fixed modes' pp512 and tg64 at 32K and 64K side by side (the tuned mode must
    # equal the best of them within drift). Needs --python's carry
    need_build
    model mimo
    use_python
    for hip in ${HIP_SETTINGS:-0 1}; do
        envs=() margs=()
        if [ "$hip" = 1 ]; then envs=("${HIP_ENV[@]}"); for e in "${HIP_ENV[@]}"; do margs+=(--env "$e"); done; fi
        cache=$OUT/attn-choice-hip$hip.json
        for start in first second; do
            s0=$(date +%s.%N)
            env ${envs[@]+"${envs[@]}"} LLAMA_VQ_ATTN_CACHE="$cache" "$PY" -m llama_vq.tune_attn \
                -m "$M/synth-mimo.gguf" -ctk q8_0 -ctv q4_1 -ub 512 -c 131072 2>&1 | tee -a "$OUT/$measurement.txt"
            log "HIP settings $hip, $start start: $(python3 -c "print(round($(date +%s.%N) - $s0, 1))") s"
        done
        attn_modes "$M/synth-mimo.gguf" "mimo-choice-hip$hip" --ctk q8_0 --ctv q4_1 --depths 32768,65536 \
            --modes off,prefill,on --reps "${REPS:-1}" ${margs[@]+"${margs[@]}"}
    done
    ;;
split-vs-unbounded)
    need_build
    model mimo
    attn_modes "$M/synth-mimo.gguf" mimo-split --ctk q8_0 --ctv q4_1 --depths 0,65536 --modes off,unbounded,prefill \
        --reps 1 --buffers 131072 --buffer-modes off,prefill,on
    model llama8b
    log "the split's cost: 8B shape at 8K, pp512 without flash attention, budgets 512 (unsplit), 256, 128, 64 MiB"
    for mib in 512 256 128 64; do
        LLAMA_VQ_ATTN_SCRATCH_MIB=$mib "$bin/llama-bench" -m "$M/synth-llama8b.gguf" -ngl 99 -fa off -ctk q4_0 -ctv q4_0 \
            -d 8192 -p 512 -n 0 -r 1 -o jsonl 2>/dev/null | python3 -c "import json,sys
for l in sys.stdin: r=json.loads(l); print('scratch $mib MiB: pp512 @ d8192', round(r['avg_ts'], 1))" \
            | tee -a "$OUT/$measurement.txt"
    done
    ;;
fidelity)
    need_build
    model llama-tiny
    model mimo-tiny
    use_python
    "$PY" "$here/benchmarks/attn_fidelity.py" --gpu --model "llama-tiny=$M/synth-llama-tiny.gguf" \
        --model "mimo-tiny=$M/synth-mimo-tiny.gguf" 2>&1 \
        | tee -a "$OUT/$measurement.txt"
    ;;
cache-types)
    # its own build of llama-bench (FA kernels off by default: ~200 s instead of twice that) and its own models
    python3 "$here/benchmarks/run.py" --backend cuda --src "$C/llama.cpp" --build-dir /tmp/bench-build \
        --jobs "$(nproc)" --targets llama-bench --cuda-fa "${CUDA_FA:-off}" --tokenizer-from "$C/vocab.gguf" \
        --model-dir "$M" --out "$OUT" --pack-logs --deadline "${DEADLINE:-400}" --timeout "${CONFIG_TIMEOUT:-90}" "$@" \
        2>&1 | tee -a "$OUT/$measurement.txt"
    ;;
serving)
    need_build
    model mimo
    use_python
    python3 "$here/benchmarks/serve_bench.py" throughput --model "$M/synth-mimo.gguf" --python "$PY" \
        --llama-server "$bin/llama-server" --extra "-ngl 999" --threads "${THREADS:-8}" --ctk q8_0 --ctv q4_0 --fa off \
        --clients "${CLIENTS:-1,4,8}" --requests "${REQUESTS:-4}" --max-tokens "${MAX_TOKENS:-128}" \
        --rounds "${ROUNDS:-3}" --request-timeout 60 --out /tmp/serving 2>&1 | tee -a "$OUT/$measurement.txt"
    cp /tmp/serving/throughput.json /tmp/serving/throughput.md "$OUT/" 2>/dev/null
    for f in /tmp/serving/*.log; do [ -f "$f" ] && tail -c 60000 "$f" > "$OUT/serving-$(basename "$f")"; done
    ;;
cpu-experts)
    need_build
    model cpu-moe
    use_python
    OUT=$OUT/cpu-experts BIN=$bin PY=$PY BENCH_PY=python3 MODEL="$M/synth-cpu-moe.gguf" CLIENTS=${CLIENTS:-1,4,8} \
        ROUNDS=${ROUNDS:-3} bash "$here/benchmarks/cpu_experts.sh" 2>&1 | tail -40 | tee -a "$OUT/$measurement.txt"
    ;;
two-gpu)
    need_build
    model mimo
    use_python
    nvidia-smi -L
    BIN=$bin MODEL="$M/synth-mimo.gguf" PY=$PY DEADLINE=${DEADLINE:-250} python3 "$here/benchmarks/two_gpu.py" 2>&1 \
        | tail -60 | tee -a "$OUT/$measurement.txt"
    ;;
wheels-build)
    WPY=${WHEEL_PY:-python3}
    WH=$C/wheelhouse
    if [ ! -d "$WH" ] || [ ! -f "$here/vendor/llama_cpp_python/llama_cpp/llama_cpp.py" ]; then
        log "carry .gpu-carry with --wheels, and vendor/llama_cpp_python"; exit 1
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
wheels-install)
    WPY=${WHEEL_PY:-python3}
    dist=${WHEEL_DIST:-/tmp/dist}  # WHEEL_DIST: wheels built elsewhere and carried
    [ -f "$dist/.done" ] || [ -n "${WHEEL_DIST:-}" ] || { log "no wheels (wheels-build first)"; exit 1; }
    model llama-tiny
    tiny=$M/synth-llama-tiny.gguf
    spec="llama-vq${WHEEL_EXTRA-[cuda]}"  # WHEEL_EXTRA= (empty): the base wheel alone
    PIP_NO_INDEX=1 "$WPY" -m pip install --find-links "$dist" --find-links "$C/wheelhouse" "$spec" \
        > "$OUT/wheeltest-pip.log" 2>&1
    log "pip install $spec: rc $? $(grep -E '^Successfully installed' "$OUT/wheeltest-pip.log" | tr -s ' ' | cut -c1-300)"
    mkdir -p /tmp/away && cd /tmp/away || exit 1
    env -u PYTHONPATH "$WPY" - "$tiny" > "$OUT/wheeltest-llama.log" 2>&1 <<'PY'
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
    env -u PYTHONPATH "$srvbin" --model "$tiny" -ngl 99 -ctk q4_0 -ctv q4_0 -fa off --port 8391 \
        > "$OUT/wheeltest-server.log" 2>&1 &
    spid=$!
    for _ in $(seq 120); do curl -sf http://127.0.0.1:8391/health > /dev/null && break; sleep 1; done
    curl -s http://127.0.0.1:8391/v1/chat/completions -H 'Content-Type: application/json' \
        -d '{"messages":[{"role":"user","content":"Hello"}],"max_tokens":8}' > "$OUT/wheeltest-chat.json"
    log "llama-vq-server chat: $(head -c 400 "$OUT/wheeltest-chat.json"); $(grep -E 'CUDA0|offloaded|KV cache' "$OUT/wheeltest-server.log" | head -4 | tr '\n' ' ' | cut -c1-500)"
    kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
    ;;
wheels-attention-modes)
    WPY=${WHEEL_PY:-python3}
    lib=$(cd /tmp && env -u PYTHONPATH "$WPY" -c 'import llama_vq, os; print(os.path.join(os.path.dirname(llama_vq.__file__), "lib"))') \
        || { log "llama_vq not installed (wheels-install first)"; exit 1; }
    mkdir -p /tmp/wbin && cp "${WHEEL_TOOLS:?a folder with llama-bench}"/* /tmp/wbin/ && ln -sf "$lib"/*.so* /tmp/wbin/
    # the libraries auditwheel grafted (libgomp under a hashed name), found by the wheel's own RPATH ($ORIGIN/../..)
    ln -sf "$lib"/../../llama_vq.libs/* /tmp/wbin/ 2>/dev/null
    export LD_LIBRARY_PATH=/tmp/wbin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    bin=/tmp/wbin
    model mimo
    attn_modes "$M/synth-mimo.gguf" wheel-mimo --ctk q8_0 --ctv q4_1 --depths 65536 --modes "${MODES:-off,unbounded,prefill}" \
        --tg 0 --reps 1
    model llama8b
    attn_modes "$M/synth-llama8b.gguf" wheel-llama8b --ctk q4_0 --ctv q4_0 --depths 32768 \
        --modes "${MODES:-off,unbounded,prefill}" --tg 0 --reps 1
    ;;
*)
    echo "$measurement: not a measurement (bash benchmarks/gpu.sh without arguments lists them)" >&2; exit 2 ;;
esac
log "done"
