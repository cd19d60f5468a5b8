#!/usr/bin/env bash
# A GPU round on a lent machine that cannot fetch anything, in phases that fit one call each (<= 10 minutes):
# one build, then the measurements only a GPU can make. The machine stays up between calls; phases after the
# build find its products in /tmp.
#
# Here, once:
#   python3 benchmarks/carry.py .bench-carry                         # patched tree, gguf-py, vocab (~30 MB)
#   .venv/bin/python benchmarks/pack_python.py .bench-py.tar.xz      # the server's Python (~25 MB)
# There (carry .bench-carry and .bench-py.tar.xz):
#   PHASE=build  OUT=<dir> bash benchmarks/gpu_session.sh   # starts the build (CUDA sm_90, FA kernels on, our
#                                                            # project: libs, tools, llama-server) and the models in
#                                                            # the background; waits up to WAIT s (default 540)
#   PHASE=attn1  ...   test-backend-ops of our attention ops; the attention modes on the 8B shape at 0/8K/32K;
#                      fidelity of the modes on the GPU (SmolLM2, MiMo-tiny)
#   PHASE=attn2  ...   the attention modes on the MiMo shape at 0/64K and its compute buffers at 128K (ub 512,
#                      2048); the same with the HIP path's settings (PROXY, as benchmarks/mi210.sh PROXY=cuda)
#   PHASE=ops    ...   every op of ours against the CPU (mi210.sh step 2, NVIDIA default and HIP settings), ATTN_SPLIT
#   PHASE=attn3  ...   the split non-FA attention after its fixes: off against unbounded (MiMo 0/64K),
#                      compute buffers at 128K, the cost per chunk (8B at 8K)
#   PHASE=attn4  ...   the split after the f16 mask and V*P's split-K: op tests, perf with and without split-K,
#                      attn3's measurements
#   PHASE=hipsplit ... the four attention modes on the MiMo shape at 0/64K under the HIP path's settings
#   PHASE=budget ...   the split's scratch budget on the MiMo shape: pp512 at 64K and the compute buffers at 128K
#                      (ub 512, 2048) at budgets 256 (the default), 384 and 512 MiB, side by side
#   PHASE=splitk ...   the split's V*P GEMM settings at 32K and 64K (MiMo shape, pp512): the default, split-K only at
#                      <= 8 tiles, that with the F16 GEMM, that at a 384 MiB budget; the unbounded graph beside them
#   PHASE=vonce1 ...   the split with V dequantized once per stream: op tests (NVIDIA and F16 GEMM), perf of the split
#                      graph and V*P at 64K cells both ways
#   PHASE=vonce2 ...   pp512 at 64K (MiMo shape): V per chunk (default) against V once, that with split-K off and a
#                      384 MiB budget, unbounded; compute buffers at 128K
#   PHASE=vpmma1 ...   V*P on tensor cores (k_out_prod_q_mma): OUT_PROD and ATTN_SPLIT op tests with the kernel off, by
#                      its rule and everywhere, and the F16 GEMM branch
#   PHASE=vpmma2 ...   its perf against the GEMM path (V*P, the split graph) and pp512 at 64K (MiMo shape), split and
#                      unbounded, each with the kernel off and on
#   PHASE=vpmma3 ...   its rule for the split's chunks (LLAMA_VQ_CUDA_OUT_PROD_MMA=1) timed: V*P at the chunk's shape, pp512
#                      at 64K off/on/on/off
#   PHASE=vpmma4 ...   its rule's tile bound: V*P at pp512's largest chunk at 8K/32K/64K (MiMo) and 8K/32K (8B) with the
#                      kernel off and everywhere, then pp512 (MiMo 8K/64K, 8B 32K) off against the rule at bounds 8 and 64
#   PHASE=vpmma5 ...   a changed form of the kernel (pipelined loads, the softmax taken in): OUT_PROD and ATTN_SPLIT op
#                      tests (the fusion counted), vpmma4's V*P sweep, the split graph at 64K with the fusion on and off
#   PHASE=vpmma6 ...   pp512 on the MiMo shape at 32K and 64K: GEMM path, kernel without and with the softmax, bound 16
#   PHASE=vpmma7 ...   the kernel's rule (default, bound 64, off) at MiMo 32K/64K and 8B 8K/32K beside the unbounded graph
#   PHASE=smf16 ...    the split's softmax as the F16 GEMM path's f16 P: op tests and pp512 (MiMo 64K) under the HIP
#                      path's settings with it on and off beside the unbounded graph (SMF16_NV=1: NVIDIA's TF32 and F16)
#   PHASE=rebuild ...  a warm machine's build brought up to date after a change (TARGETS)
#   PHASE=matrix ...   issue 34 item 4: llama-vq-server against llama-server on the MiMo attention shape, all layers
#                      on the GPU, q8_0 K / q4_0 V, FA off, -np 8, 1/4/8 clients, 3 alternating rounds (medians)
#   PHASE=serve  ...   the CPU-work benchmark of the deployment's shape (benchmarks/cpu_experts.sh: the MiMo-shaped
#                      MoE with its experts in CPU memory, -t = every core, llama-vq-server against llama-server)
#   PHASE=split  ...   two GPUs: MiMo's layer split against one GPU (benchmarks/two_gpu.py; both GPUs visible)
# Env: CARRY (.bench-carry), PYPACK (.bench-py.tar.xz), BUILD (/tmp/gpu-build), M (/tmp/models), REPS (2), CUDA_FA (ON;
# OFF builds no flash-attention kernels: faster, for phases that run no flash attention), TARGETS (build: the CMake
# targets, default every one the phases use), MODELS
# (build: the synthetic models to generate, default all five: llama8b mimo mimo-tiny llama-tiny cpu-moe).
# Everything a phase prints goes to $OUT/<phase>.txt too; the attention tables to $OUT/attn-modes-*.md/.json.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CARRY=${CARRY:-$here/.bench-carry}
PYPACK=${PYPACK:-$here/.bench-py.tar.xz}
: "${OUT:?set OUT to the results folder}"
: "${PHASE:?set PHASE to build, attn1, attn2, attn3, attn4, hipsplit, ops, budget, splitk, vonce1, vonce2, vpmma1, vpmma2, vpmma3, vpmma4, vpmma5, vpmma6, vpmma7, smf16, rebuild, matrix, serve or split}"
C=$CARRY
[ "$PHASE" != split ] || export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0,1}
. "$here/benchmarks/device_common.sh"
B=${BUILD:-/tmp/gpu-build}
[ -d /usr/local/cuda/bin ] && export PATH=/usr/local/cuda/bin:$PATH
bin=$B/bin
device_log "$PHASE" "$OUT/$PHASE.txt"

# the checkout's llama_vq with the libraries built here, under the packed Python (numpy, llama_cpp, the server)
# (not carried: the machine's python3, enough for the CMake configure and the benchmarks, not for the server)
use_python() {
    export PYTHONPATH=$here
    if [ ! -x /tmp/py/bin/python3 ] && [ ! -f "$PYPACK" ]; then
        PY=$(command -v python3); log "no $PYPACK: the machine's $PY (the server's packages missing)"; return
    fi
    [ -x /tmp/py/bin/python3 ] || tar xJf "$PYPACK" -C /tmp || exit 1
    PY=/tmp/py/bin/python3
    export LD_LIBRARY_PATH=/tmp/py/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
}

built() { [ -f "$B/.done" ]; }

# the split's cost per chunk: the 8B shape at depth 8K, pp512 without flash attention, under four scratch budgets
scratch_sweep() {
    log "the split's cost: 8B shape at 8K, pp512 without flash attention, budgets 512 (unsplit), 256, 128, 64 MiB"
    for mib in 512 256 128 64; do
        LLAMA_VQ_ATTN_SCRATCH_MIB=$mib "$bin/llama-bench" -m "$M/synth-llama8b.gguf" -ngl 99 -fa off -ctk q4_0 -ctv q4_0 \
            -d 8192 -p 512 -n 0 -r 1 -o jsonl 2>/dev/null | python3 -c "import json,sys
for l in sys.stdin: r=json.loads(l); print('scratch $mib MiB: pp512 @ d8192', round(r['avg_ts'], 1))" | tee -a "$OUT/$PHASE.txt"
    done
}

# ATTN_SPLIT and OUT_PROD on CUDA0 against the CPU, NVIDIA's default GEMM and the HIP branch's F16 GEMM
split_op_tests() {
    for f16 in 0 1; do
        for op in ATTN_SPLIT OUT_PROD; do
            LLAMA_VQ_CUDA_FORCE_F16_GEMM=$f16 timeout 200 "$bin/test-backend-ops" test -b CUDA0 -o $op \
                > "$OUT/tbo-$op-f16gemm$f16.log" 2>&1
            log "$op (LLAMA_VQ_CUDA_FORCE_F16_GEMM=$f16): $(grep -E 'tests passed|FAIL' "$OUT/tbo-$op-f16gemm$f16.log" \
                | sort | uniq -c | head -3 | tr '\n' ' ')"
        done
    done
}

# pp512 at DEPTHS (65536) on the MiMo attention shape, q8_0 K / q4_1 V, one run (benchmarks/attn_modes.py):
# mimo_pp512 LABEL MODE OUTDIR [attn_modes.py ARG ...]
mimo_pp512() {
    local label=$1 mode=$2 dir=$3
    shift 3
    python3 "$here/benchmarks/attn_modes.py" --bin "$bin" --model "$M/synth-mimo.gguf" --label "$label" \
        --ctk q8_0 --ctv q4_1 --depths "${DEPTHS:-65536}" --modes "$mode" --tg 0 --reps 1 "$@" --out "$dir" 2>&1 \
        | grep "attn-modes\]" | tee -a "$OUT/$PHASE.txt"
}

# V*P at the largest chunk pp512 gives at each depth (llama-vq-test-cases.h's perf cases), the tensor-core kernel off
# (the GEMM path) and on every shape it takes
vp_chunk_sweep() {
    for mma in 0 2; do
        LLAMA_VQ_CUDA_OUT_PROD_MMA=$mma "$bin/test-backend-ops" perf -b CUDA0 -o OUT_PROD -p 'n_kv=(8704|33280|66048)' 2>&1 \
            | grep -E "OUT_PROD\(" | sed "s/^/mma=$mma /" | tee -a "$OUT/$PHASE.txt"
    done
}

case "$PHASE" in
build)
    nproc
    for m in ${MODELS:-llama8b mimo mimo-tiny llama-tiny cpu-moe}; do  # MODELS: the synthetic models to generate
        case "$m" in
            llama8b) gen llama8b llama --preset llama-3.1-8b ;;
            mimo) gen mimo mimo --preset attn ;;
            mimo-tiny) gen mimo-tiny mimo --preset tiny ;;
            llama-tiny) gen llama-tiny llama --preset tiny ;;
            cpu-moe) gen cpu-moe mimo --preset cpu-moe ;;
        esac
    done
    if ! built; then
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
    fi
    end=$(( $(date +%s) + ${WAIT:-540} ))
    while ! built && [ "$(date +%s)" -lt "$end" ]; do
        if ! pgrep -f "cmake --build $B" > /dev/null && ! pgrep -f "cmake -S $here" > /dev/null && ! built; then
            log "build failed"; tail -30 "$B.log"; cp "$B.log" "$OUT/build.log"; exit 1
        fi
        sleep 5
    done
    built && log "built" || log "still building ($(grep -c '^\[' "$B.log") steps logged)"
    tail -2 "$B.log"; ls "$M"
    ;;
attn1)
    built || { log "not built"; tail -5 "$B.log"; exit 1; }
    log "test-backend-ops on CUDA0: the split attention, the fused decode attention, OUT_PROD"
    for op in ATTN_SPLIT ATTN_DECODE_FUSED OUT_PROD; do
        LLAMA_VQ_CUDA_FUSION_STATS=1 timeout 240 "$bin/test-backend-ops" test -b CUDA0 -o "$op" > "$OUT/tbo-$op.log" 2>&1
        log "$op: $(grep -E 'tests passed|FAIL' "$OUT/tbo-$op.log" | sort | uniq -c | head -3 | tr '\n' ' ')"
    done
    wait_model llama8b
    python3 "$here/benchmarks/attn_modes.py" --bin "$bin" --model "$M/synth-llama8b.gguf" --label h200-8b \
        --ctk q4_0 --ctv q4_0 --depths 0,8192,32768 --reps "${REPS:-2}" --out "$OUT" 2>&1 | tee -a "$OUT/$PHASE.txt"
    wait_model mimo-tiny
    use_python
    log "fidelity of the modes on the GPU"
    wait_model llama-tiny
    "$PY" "$here/benchmarks/attn_fidelity.py" --gpu --model "llama-tiny=$M/synth-llama-tiny.gguf" \
        --model "mimo-tiny=$M/synth-mimo-tiny.gguf" 2>&1 | tee -a "$OUT/$PHASE.txt"
    ;;
attn2)
    built || { log "not built"; exit 1; }
    wait_model mimo
    python3 "$here/benchmarks/attn_modes.py" --bin "$bin" --model "$M/synth-mimo.gguf" --label h200-mimo \
        --ctk q8_0 --ctv q4_1 --depths 0,65536 --reps 1 --buffers 131072 --out "$OUT" 2>&1 | tee -a "$OUT/$PHASE.txt"
    scratch_sweep
    use_python
    log "fidelity of the modes on the GPU"
    "$PY" "$here/benchmarks/attn_fidelity.py" --gpu --model "llama-tiny=$M/synth-llama-tiny.gguf" \
        --model "mimo-tiny=$M/synth-mimo-tiny.gguf" 2>&1 | tee -a "$OUT/$PHASE.txt"
    log "the HIP path's settings (PROXY=cuda of mi210.sh): an NVIDIA GPU configured as HIP runs it, not a gfx90a result"
    python3 "$here/benchmarks/attn_modes.py" --bin "$bin" --model "$M/synth-mimo.gguf" --label h200-mimo-hip-proxy \
        --ctk q8_0 --ctv q4_1 --depths 0,32768 --modes off,prefill,on --reps 1 --out "$OUT" \
        --env LLAMA_VQ_CUDA_FUSED_ATTN=1 --env LLAMA_VQ_CUDA_FUSED_ATTN_MMA=0 --env LLAMA_VQ_CUDA_FORCE_F16_GEMM=1 \
        --env LLAMA_VQ_CUDA_OUT_PROD_MMA=0 --env GGML_CUDA_PDL=0 2>&1 | tee -a "$OUT/$PHASE.txt"
    ;;
ops)
    # every op of ours on CUDA0 against the CPU (benchmarks/mi210.sh step 2), the NVIDIA default and the HIP
    # path's settings, with proof that each fused kernel ran
    built || { log "not built"; exit 1; }
    for hip in 0 1; do
        PROXY=cuda HIP_PATH=$hip BIN=$bin STEPS=2 VOCAB=$C/vocab.gguf bash "$here/benchmarks/mi210.sh" "$OUT/ops-hip$hip" \
            2>&1 | grep -E "^\[|tests passed|FAIL|ran|never" | tee -a "$OUT/$PHASE.txt"
    done
    timeout 240 "$bin/test-backend-ops" test -b CUDA0 -o ATTN_SPLIT > "$OUT/tbo-ATTN_SPLIT.log" 2>&1
    log "ATTN_SPLIT: $(grep -E 'tests passed|FAIL' "$OUT/tbo-ATTN_SPLIT.log" | sort | uniq -c | head -3 | tr '\n' ' ')"
    ;;
attn3)
    # the split non-FA attention again after its fixes (one copy of the mask per layer, room in the scheduler's
    # graph): off (split) against unbounded on the MiMo shape at 0/64K, the compute
    # buffers at 128K, and the split's cost per chunk on the 8B shape
    built || { log "not built"; exit 1; }
    wait_model mimo
    python3 "$here/benchmarks/attn_modes.py" --bin "$bin" --model "$M/synth-mimo.gguf" --label h200-mimo-split \
        --ctk q8_0 --ctv q4_1 --depths 0,65536 --modes off,unbounded,prefill --reps 1 --buffers 131072 \
        --buffer-modes off,prefill,on --out "$OUT" 2>&1 | tee -a "$OUT/$PHASE.txt"
    wait_model llama8b
    scratch_sweep
    ;;
attn4)
    # the split after the f16 mask (one copy per graph and device) and V*P's split-K GEMM: our ops against the CPU
    # (NVIDIA default and the HIP path's F16 GEMM), the chunk's V*P and the split graph timed with and without
    # split-K, then attn3's measurements
    built || { log "not built"; exit 1; }
    split_op_tests
    for sk in 1 0; do
        log "perf, LLAMA_VQ_CUDA_OUT_PROD_SPLIT_K=$sk: MiMo full layer at 64K cells, V*P of a 16-token chunk and of 512 tokens; split and unsplit graphs"
        LLAMA_VQ_CUDA_OUT_PROD_SPLIT_K=$sk "$bin/test-backend-ops" perf -b CUDA0 -o OUT_PROD \
            -p 'n_kv=65536,n_head_kv=4,gqa=16,n_tokens=(16|512),' 2>&1 | grep -E "OUT_PROD" | tee -a "$OUT/$PHASE.txt"
        LLAMA_VQ_CUDA_OUT_PROD_SPLIT_K=$sk "$bin/test-backend-ops" perf -b CUDA0 -o ATTN_SPLIT,ATTN_DECODE_FUSED \
            -p 'n_kv=65536,n_tokens=512' 2>&1 | grep -E "ATTN_" | tee -a "$OUT/$PHASE.txt"
    done
    wait_model mimo
    python3 "$here/benchmarks/attn_modes.py" --bin "$bin" --model "$M/synth-mimo.gguf" --label h200-mimo-split2 \
        --ctk q8_0 --ctv q4_1 --depths 0,65536 --modes off,unbounded,prefill --reps 1 --buffers 131072 \
        --buffer-modes off,prefill,on --out "$OUT" 2>&1 | tee -a "$OUT/$PHASE.txt"
    log "the same split without split-K (LLAMA_VQ_CUDA_OUT_PROD_SPLIT_K=0)"
    python3 "$here/benchmarks/attn_modes.py" --bin "$bin" --model "$M/synth-mimo.gguf" --label h200-mimo-split2-nosplitk \
        --ctk q8_0 --ctv q4_1 --depths 65536 --modes off --reps 1 --out "$OUT" \
        --env LLAMA_VQ_CUDA_OUT_PROD_SPLIT_K=0 2>&1 | tee -a "$OUT/$PHASE.txt"
    wait_model llama8b
    scratch_sweep
    ;;
hipsplit)
    # the split and prefill modes under the HIP path's settings (PROXY=cuda of mi210.sh): not a gfx90a result
    built || { log "not built"; exit 1; }
    wait_model mimo
    python3 "$here/benchmarks/attn_modes.py" --bin "$bin" --model "$M/synth-mimo.gguf" --label h200-mimo-split2-hip-proxy \
        --ctk q8_0 --ctv q4_1 --depths 0,65536 --modes off,unbounded,prefill,on --reps 1 --out "$OUT" \
        --env LLAMA_VQ_CUDA_FUSED_ATTN=1 --env LLAMA_VQ_CUDA_FUSED_ATTN_MMA=0 --env LLAMA_VQ_CUDA_FORCE_F16_GEMM=1 \
        --env LLAMA_VQ_CUDA_OUT_PROD_MMA=0 --env GGML_CUDA_PDL=0 2>&1 | tee -a "$OUT/$PHASE.txt"
    ;;
budget)
    # the scratch budget's trade: fewer, larger chunks against a larger compute buffer (target: <= 1.5x flash
    # attention's at 128K); every budget in this one run, so that they compare side by side
    built || { log "not built"; exit 1; }
    wait_model mimo
    for mib in ${BUDGETS:-256 384 512}; do
        log "scratch budget $mib MiB"
        python3 "$here/benchmarks/attn_modes.py" --bin "$bin" --model "$M/synth-mimo.gguf" --label "h200-mimo-budget$mib" \
            --ctk q8_0 --ctv q4_1 --depths 65536 --modes off --tg 0 --reps 1 --buffers 131072 --buffer-modes off \
            --env "LLAMA_VQ_ATTN_SCRATCH_MIB=$mib" --out "$OUT" 2>&1 | tee -a "$OUT/$PHASE.txt"
    done
    ;;
splitk)
    # RESULTS' "the split's scratch budget and its V*P GEMM at 64K": which of its findings hold at other depths
    built || { log "not built"; exit 1; }
    wait_model mimo
    for spec in default LLAMA_VQ_CUDA_OUT_PROD_SPLIT_K=8 LLAMA_VQ_CUDA_OUT_PROD_SPLIT_K=8+LLAMA_VQ_CUDA_FORCE_F16_GEMM=1 \
            LLAMA_VQ_CUDA_OUT_PROD_SPLIT_K=8+LLAMA_VQ_CUDA_FORCE_F16_GEMM=1+LLAMA_VQ_ATTN_SCRATCH_MIB=384; do
        envs=()
        [ "$spec" = default ] || for kv in ${spec//+/ }; do envs+=(--env "$kv"); done
        log "split, $spec"
        python3 "$here/benchmarks/attn_modes.py" --bin "$bin" --model "$M/synth-mimo.gguf" --label "h200-mimo-splitk-${spec//[^A-Za-z0-9]/_}" \
            --ctk q8_0 --ctv q4_1 --depths "${DEPTHS:-32768,65536}" --modes off --tg 0 --reps 1 ${envs[@]+"${envs[@]}"} \
            --out /tmp/splitk 2>&1 | grep "attn-modes\]" | tee -a "$OUT/$PHASE.txt"
    done
    python3 "$here/benchmarks/attn_modes.py" --bin "$bin" --model "$M/synth-mimo.gguf" --label h200-mimo-splitk-unbounded \
        --ctk q8_0 --ctv q4_1 --depths "${DEPTHS:-32768,65536}" --modes unbounded --tg 0 --reps 1 --out /tmp/splitk 2>&1 \
        | grep "attn-modes\]" | tee -a "$OUT/$PHASE.txt"
    ;;
vonce1)
    # the split attention with V dequantized once per stream (LLAMA_VQ_ATTN_V_F16, llama-vq-attn.h): op tests
    # against the CPU (NVIDIA default and the HIP branch's F16 GEMM), then the split graph and V*P timed both ways
    built || { log "not built"; exit 1; }
    split_op_tests
    for sk in 1 0; do
        log "perf, LLAMA_VQ_CUDA_OUT_PROD_SPLIT_K=$sk: MiMo full layer at 64K cells, the split graph with V read per chunk and once"
        LLAMA_VQ_CUDA_OUT_PROD_SPLIT_K=$sk "$bin/test-backend-ops" perf -b CUDA0 -o ATTN_SPLIT,OUT_PROD \
            -p 'n_kv=65536|k=9000' 2>&1 | grep -E "ATTN_|OUT_PROD" | tee -a "$OUT/$PHASE.txt"
    done
    ;;
vonce2)
    # pp512 at 64K on the MiMo shape (q8_0 / q4_1): the split (V read by each chunk, the default) against V dequantized
    # once (LLAMA_VQ_ATTN_V_F16=1), that with split-K off and with a larger budget, and the unbounded graph; compute
    # buffers at 128K
    built || { log "not built"; exit 1; }
    wait_model mimo
    for spec in ${SPECS:-default LLAMA_VQ_ATTN_V_F16=1 LLAMA_VQ_ATTN_V_F16=1+LLAMA_VQ_CUDA_OUT_PROD_SPLIT_K=0 LLAMA_VQ_ATTN_V_F16=1+LLAMA_VQ_ATTN_SCRATCH_MIB=384}; do
        envs=()
        [ "$spec" = default ] || for kv in ${spec//+/ }; do envs+=(--env "$kv"); done
        extra=()
        case "$spec" in default|LLAMA_VQ_ATTN_V_F16=1|*MIB=384) extra=(--buffers 131072 --buffer-modes off) ;; esac
        log "split, $spec"
        mimo_pp512 "mimo-vonce-${spec//[^A-Za-z0-9]/_}" off /tmp/vonce ${envs[@]+"${envs[@]}"} ${extra[@]+"${extra[@]}"}
    done
    mimo_pp512 mimo-vonce-unbounded unbounded /tmp/vonce
    ;;
vpmma1)
    # V*P on tensor cores (k_out_prod_q_mma, out-prod-q-mma.cuh): OUT_PROD and ATTN_SPLIT on CUDA0 against the CPU with the
    # kernel off (LLAMA_VQ_CUDA_OUT_PROD_MMA=0: the GEMM path), by its rule (1, the default) and wherever it takes the
    # shape (2); then NVIDIA's F16 GEMM branch (HIP's) with the kernel off
    built || { log "not built"; exit 1; }
    for spec in LLAMA_VQ_CUDA_OUT_PROD_MMA=0 LLAMA_VQ_CUDA_OUT_PROD_MMA=1 LLAMA_VQ_CUDA_OUT_PROD_MMA=2 \
            LLAMA_VQ_CUDA_OUT_PROD_MMA=0+LLAMA_VQ_CUDA_FORCE_F16_GEMM=1; do
        for op in OUT_PROD ATTN_SPLIT; do
            lg="$OUT/tbo-$op-${spec//[^A-Za-z0-9]/_}.log"
            env ${spec//+/ } timeout 200 "$bin/test-backend-ops" test -b CUDA0 -o $op > "$lg" 2>&1
            log "$op ($spec): rc $? $(grep -E 'tests passed|FAIL' "$lg" | sort | uniq -c | head -3 | tr '\n' ' ')"
        done
    done
    ;;
vpmma2)
    # V*P and the split graph at 64K cells timed with the kernel off and on (test-backend-ops perf), then pp512 at 64K
    # on the MiMo shape (q8_0 / q4_1): the split and the unbounded graph, each with the kernel off and on
    built || { log "not built"; exit 1; }
    for mma in 0 1; do
        log "perf, LLAMA_VQ_CUDA_OUT_PROD_MMA=$mma: V*P (16 and 512 tokens) and the split graph at 64K cells"
        LLAMA_VQ_CUDA_OUT_PROD_MMA=$mma "$bin/test-backend-ops" perf -b CUDA0 -o ATTN_SPLIT,OUT_PROD -p 'n_kv=65536' 2>&1 \
            | grep -E "ATTN_|OUT_PROD" | grep -vE "n_tokens=[2348],|gqa=16,n_tokens=[2348]" | tee -a "$OUT/$PHASE.txt"
    done
    wait_model mimo
    for mode in off unbounded; do
        for mma in 0 1; do
            log "pp512 @ ${DEPTHS:-65536}, $mode, LLAMA_VQ_CUDA_OUT_PROD_MMA=$mma"
            mimo_pp512 "mimo-vpmma-$mode-mma$mma" $mode /tmp/vpmma --env LLAMA_VQ_CUDA_OUT_PROD_MMA=$mma
        done
    done
    cp /tmp/vpmma/*.md /tmp/vpmma/*.json "$OUT/" 2>/dev/null
    ;;
vpmma3)
    # the tensor-core V*P's rule for the split's chunks (LLAMA_VQ_CUDA_OUT_PROD_MMA=1: more than 128 columns in at most
    # 64 tiles), untimed end to end so far: V*P at the chunk's shape and pp512 at 64K (MiMo shape), off against on,
    # in alternating order
    built || { log "not built"; exit 1; }
    for mma in 0 1; do
        LLAMA_VQ_CUDA_OUT_PROD_MMA=$mma "$bin/test-backend-ops" perf -b CUDA0 -o OUT_PROD -p 'n_kv=6(5536|6048)' 2>&1 \
            | grep -E "OUT_PROD" | grep -E "n_tokens=(15|16)," | sed "s/^/mma=$mma /" | tee -a "$OUT/$PHASE.txt"
    done
    wait_model mimo
    for mma in 0 1 1 0; do
        mimo_pp512 "mimo-vpmma3-mma$mma" off /tmp/vpmma3 --env LLAMA_VQ_CUDA_OUT_PROD_MMA=$mma
    done
    ;;
vpmma4)
    # the tensor-core V*P's tile bound (LLAMA_VQ_CUDA_OUT_PROD_MMA_MAX_TILES): V*P at the largest chunk pp512 gives at each
    # depth (llama-vq-test-cases.h) with the kernel off (0) and on every shape (2); then pp512 on the MiMo shape at 8K and
    # 64K and on the 8B shape at 32K (q4_0), the kernel off against its rule with the default bound (8) and with 64
    built || { log "not built"; exit 1; }
    vp_chunk_sweep
    wait_model mimo
    wait_model llama8b
    for spec in 0 1 1+LLAMA_VQ_CUDA_OUT_PROD_MMA_MAX_TILES=64 0; do
        envs=(--env "LLAMA_VQ_CUDA_OUT_PROD_MMA=${spec%%+*}")
        [ "$spec" = "${spec#*+}" ] || envs+=(--env "${spec#*+}")
        DEPTHS=8192,65536 mimo_pp512 "mimo-vpmma4-${spec//[^A-Za-z0-9]/_}" off /tmp/vpmma4 "${envs[@]}"
        python3 "$here/benchmarks/attn_modes.py" --bin "$bin" --model "$M/synth-llama8b.gguf" \
            --label "l8b-vpmma4-${spec//[^A-Za-z0-9]/_}" --ctk q4_0 --ctv q4_0 --depths 32768 --modes off --tg 0 --reps 1 \
            "${envs[@]}" --out /tmp/vpmma4 2>&1 | grep "attn-modes\]" | tee -a "$OUT/$PHASE.txt"
    done
    ;;
vpmma5)
    # a changed form of the tensor-core V*P (its loads pipelined; the softmax taken in, LLAMA_VQ_CUDA_SOFTMAX_VP),
    # correctness and the ops' speed: OUT_PROD with the kernel everywhere and by rule; ATTN_SPLIT by default (the
    # fusion counted), with the kernel everywhere, and with the softmax fusion off; V*P at each depth's chunk (vpmma4's
    # sweep) and the split graph at 64K with the fusion on and off
    built || { log "not built"; exit 1; }
    for spec in LLAMA_VQ_CUDA_OUT_PROD_MMA=2 LLAMA_VQ_CUDA_OUT_PROD_MMA=1; do
        lg="$OUT/tbo-OUT_PROD-${spec//[^A-Za-z0-9]/_}.log"
        env $spec timeout 120 "$bin/test-backend-ops" test -b CUDA0 -o OUT_PROD > "$lg" 2>&1
        log "OUT_PROD ($spec): rc $? $(grep -E 'tests passed|FAIL' "$lg" | sort | uniq -c | head -3 | tr '\n' ' ')"
    done
    for spec in LLAMA_VQ_CUDA_OUT_PROD_MMA=1 LLAMA_VQ_CUDA_OUT_PROD_MMA=2 LLAMA_VQ_CUDA_SOFTMAX_VP=0; do
        lg="$OUT/tbo-ATTN_SPLIT-${spec//[^A-Za-z0-9]/_}.log"
        env $spec LLAMA_VQ_CUDA_FUSION_STATS=1 timeout 120 "$bin/test-backend-ops" test -b CUDA0 -o ATTN_SPLIT > "$lg" 2>&1
        log "ATTN_SPLIT ($spec): rc $? $(grep -E 'tests passed|FAIL|softmax_vp=' "$lg" | sed 's/.*softmax_vp=/softmax_vp=/' \
            | sort | uniq -c | head -4 | tr '\n' ' ')"
    done
    vp_chunk_sweep
    for svp in 0 1; do
        LLAMA_VQ_CUDA_SOFTMAX_VP=$svp "$bin/test-backend-ops" perf -b CUDA0 -o ATTN_SPLIT -p 'n_kv=65536' 2>&1 \
            | grep -E "ATTN_SPLIT\(" | sed "s/^/softmax_vp=$svp /" | tee -a "$OUT/$PHASE.txt"
    done
    ;;
vpmma6)
    # pp512 on the MiMo shape (q8_0 / q4_1) at 32K and 64K: the GEMM path, the tensor-core V*P without and with the
    # softmax taken in, and with the bound 16, in an order and its reverse
    built || { log "not built"; exit 1; }
    wait_model mimo
    for spec in LLAMA_VQ_CUDA_OUT_PROD_MMA=0 LLAMA_VQ_CUDA_SOFTMAX_VP=0 LLAMA_VQ_CUDA_SOFTMAX_VP=1 \
            LLAMA_VQ_CUDA_OUT_PROD_MMA_MAX_TILES=16 LLAMA_VQ_CUDA_OUT_PROD_MMA_MAX_TILES=16 LLAMA_VQ_CUDA_SOFTMAX_VP=1 \
            LLAMA_VQ_CUDA_SOFTMAX_VP=0 LLAMA_VQ_CUDA_OUT_PROD_MMA=0; do
        DEPTHS=32768,65536 mimo_pp512 "mimo-vpmma6-${spec//[^A-Za-z0-9]/_}" off /tmp/vpmma6 --env "$spec"
    done
    ;;
vpmma7)
    # the tensor-core V*P's rule after its pipelined form, beside the unbounded graph in the same invocations (modes
    # interleaved per depth): pp512 on the MiMo shape (q8_0 / q4_1) at 32K/64K, the default (bound 16) and unbounded,
    # the kernel off, then unbounded and the default again in reverse order; the 8B shape (q4_0 / q4_0) at 8K/32K, the
    # default and unbounded, the bound 64 (the kernel also at 8K's 48 tiles) and the kernel off
    built || { log "not built"; exit 1; }
    gen llama8b llama --preset llama-3.1-8b
    wait_model mimo
    DEPTHS=32768,65536 mimo_pp512 mimo-vpmma7-default-a off,unbounded /tmp/vpmma7
    DEPTHS=32768,65536 mimo_pp512 mimo-vpmma7-mma0 off /tmp/vpmma7 --env LLAMA_VQ_CUDA_OUT_PROD_MMA=0
    DEPTHS=32768,65536 mimo_pp512 mimo-vpmma7-default-b unbounded,off /tmp/vpmma7
    wait_model llama8b
    for run in "default off,unbounded" "tiles64 off LLAMA_VQ_CUDA_OUT_PROD_MMA_MAX_TILES=64" \
            "mma0 off LLAMA_VQ_CUDA_OUT_PROD_MMA=0"; do
        read -r name modes spec <<< "$run"
        envs=()
        [ -n "${spec:-}" ] && envs=(--env "$spec")
        python3 "$here/benchmarks/attn_modes.py" --bin "$bin" --model "$M/synth-llama8b.gguf" --label "l8b-vpmma7-$name" \
            --ctk q4_0 --ctv q4_0 --depths 8192,32768 --modes "$modes" --tg 0 --reps 1 ${envs[@]+"${envs[@]}"} \
            --out /tmp/vpmma7 2>&1 | grep "attn-modes\]" | tee -a "$OUT/$PHASE.txt"
    done
    cp /tmp/vpmma7/*.md "$OUT/" 2>/dev/null
    ;;
smf16)
    # the split's softmax written as the F16 GEMM path's f16 P (k_out_prod_q_softmax_f16: HIP's V*P path, NVIDIA's under
    # LLAMA_VQ_CUDA_FORCE_F16_GEMM), under the HIP path's settings: ATTN_SPLIT against the CPU with the fusion on and off
    # (counted), OUT_PROD once; pp512 on the MiMo shape at DEPTHS (65536) with the fusion on beside the unbounded graph,
    # off, then on again (SMF16_RUNS); with SMF16_NV=1, NVIDIA's default against the F16 GEMM with the fusion at 8K
    built || { log "not built"; exit 1; }
    hip=(LLAMA_VQ_CUDA_FUSED_ATTN=1 LLAMA_VQ_CUDA_FUSED_ATTN_MMA=0 LLAMA_VQ_CUDA_FORCE_F16_GEMM=1 LLAMA_VQ_CUDA_OUT_PROD_MMA=0
        GGML_CUDA_PDL=0)
    for t in "ATTN_SPLIT 1" "ATTN_SPLIT 0" "OUT_PROD 1"; do
        read -r op svp <<< "$t"
        lg="$OUT/tbo-$op-hip-softmax_vp$svp.log"
        env "${hip[@]}" LLAMA_VQ_CUDA_SOFTMAX_VP=$svp LLAMA_VQ_CUDA_FUSION_STATS=1 timeout 150 "$bin/test-backend-ops" test \
            -b CUDA0 -o $op > "$lg" 2>&1
        log "$op (HIP settings, SOFTMAX_VP=$svp): rc $? $(grep -E 'tests passed|FAIL|softmax_vp=' "$lg" \
            | sed 's/.*softmax_vp=/softmax_vp=/' | sort | uniq -c | head -4 | tr '\n' ' ')"
    done
    wait_model mimo
    henv=()
    for e in "${hip[@]}"; do henv+=(--env "$e"); done
    IFS=';' read -ra runs <<< "${SMF16_RUNS:-a 1 off,unbounded;b 0 off;c 1 off}"  # NAME SOFTMAX_VP MODES; ...
    for run in "${runs[@]}"; do
        read -r name svp modes <<< "$run"
        mimo_pp512 "mimo-smf16-hip-$name-softmax_vp$svp" "$modes" /tmp/smf16 "${henv[@]}" --env LLAMA_VQ_CUDA_SOFTMAX_VP=$svp
    done
    if [ "${SMF16_NV:-0}" = 1 ]; then
        for spec in LLAMA_VQ_CUDA_FORCE_F16_GEMM=0 LLAMA_VQ_CUDA_FORCE_F16_GEMM=1; do
            DEPTHS=8192 mimo_pp512 "mimo-smf16-nv-${spec//[^A-Za-z0-9]/_}" off /tmp/smf16 --env "$spec"
        done
    fi
    cp /tmp/smf16/*.md "$OUT/" 2>/dev/null
    ;;
rebuild)
    # a warm machine's build after a change: the configure step runs the packed Python (use_python's libraries); the
    # carry's files are all new, so this recompiles what they feed (minutes for ggml-cuda)
    [ -f "$B/build.ninja" ] || { log "no build to update"; exit 1; }
    use_python
    rm -f "$B/.done"
    cmake --build "$B" -j "$(nproc)" --target ${TARGETS:-ggml-cuda llama-bench test-backend-ops} > "$B.log" 2>&1 \
        && find "$B" -name 'lib*.so' -not -path '*/CMakeFiles/*' -exec cp -L {} "$here/llama_vq/lib/" ';' \
        && touch "$B/.done" && log "rebuilt" || { log "rebuild failed"; tail -20 "$B.log"; exit 1; }
    ;;
matrix)
    # llama-vq-server against llama-server from this build, same flags, both up at once, in alternating rounds
    built || { log "not built"; exit 1; }
    wait_model mimo
    use_python
    python3 "$here/benchmarks/serve_bench.py" throughput --model "$M/synth-mimo.gguf" --python "$PY" \
        --llama-server "$bin/llama-server" --extra "-ngl 999" --threads "${THREADS:-8}" --ctk q8_0 --ctv q4_0 --fa off \
        --clients "${CLIENTS:-1,4,8}" --requests "${REQUESTS:-4}" --max-tokens "${MAX_TOKENS:-128}" \
        --rounds "${ROUNDS:-3}" --request-timeout 60 --out /tmp/matrix 2>&1 | tee -a "$OUT/$PHASE.txt"
    cp /tmp/matrix/throughput.json /tmp/matrix/throughput.md "$OUT/" 2>/dev/null
    for f in /tmp/matrix/*.log; do [ -f "$f" ] && tail -c 60000 "$f" > "$OUT/matrix-$(basename "$f")"; done
    ;;
serve)
    built || { log "not built"; exit 1; }
    wait_model cpu-moe
    use_python
    OUT=$OUT/serve BIN=$bin PY=$PY BENCH_PY=python3 MODEL="$M/synth-cpu-moe.gguf" CLIENTS=${CLIENTS:-1,4,8} \
        ROUNDS=${ROUNDS:-3} bash "$here/benchmarks/cpu_experts.sh" 2>&1 | tail -40 | tee -a "$OUT/$PHASE.txt"
    ;;
split)
    built || { log "not built"; exit 1; }
    wait_model mimo
    use_python
    nvidia-smi -L
    BIN=$bin MODEL="$M/synth-mimo.gguf" PY=$PY DEADLINE=${DEADLINE:-250} python3 "$here/benchmarks/two_gpu.py" 2>&1 \
        | tail -60 | tee -a "$OUT/$PHASE.txt"
    ;;
*)
    echo "PHASE=$PHASE: not a phase (build, attn1, attn2, attn3, attn4, hipsplit, ops, budget, splitk, vonce1, vonce2, vpmma1, vpmma2, vpmma3, vpmma4, vpmma5, vpmma6, vpmma7, smf16, rebuild, matrix, serve, split)" >&2; exit 2 ;;
esac
log "done"
