#!/usr/bin/env bash
# The CUDA benchmark with flash attention on, split over two calls of at most 10 minutes on one GPU machine that
# stays up between them (the FA kernels roughly double the build). Stage a: build llama-bench + test-backend-ops
# with the FA kernels, check the quantized-V/K kernels against the CPU, time the V kernels op by op, then run the
# matrix on the Llama-3.1-8B-shaped model (MiMo's model is generated meanwhile). Stage b: the MiMo-shaped matrix
# with the same build (rebuilt only if the machine was not kept).
#
# Here:   python3 benchmarks/carry.py .bench-carry --tokenizer-from <SmolLM2 GGUF>
# There:  OUT=<results folder> bash benchmarks/cuda_session.sh a      then      ... b
#
# Env: DEADLINE (seconds from the stage's start after which no config starts; default 585),
# REPS (default 2), CONFIGS (default: FA off x the five cache pairs, FA on x f16/f16 and q4_0/q4_0).
set -u
stage=${1:?stage a or b}
. "$(dirname "${BASH_SOURCE[0]}")/device_common.sh"
B=/tmp/bench-build-fa
REPS=${REPS:-2}
CONFIGS=${CONFIGS:-fa-off_f16-f16,fa-off_q4_0-q4_0,fa-off_q8_0-q8_0,fa-off_q8_0-q4_0,fa-off_q4_0-f16,fa-on_f16-f16,fa-on_q4_0-q4_0}
t0=$(date +%s)
log() { echo "[session $stage $(( $(date +%s) - t0 ))s] $*"; }
if [ ! -x "$B/build/bin/llama-bench" ]; then
    gen llama8b llama --preset llama-3.1-8b
    [ "$stage" = b ] && gen mimo mimo --preset attn
    log "build (FA kernels on)"
    build_tools "$B" on
    log built
else
    log "reusing the build in $B"
fi
bin=$B/build/bin

if [ "$stage" = a ]; then
    gen mimo mimo --preset attn
    log "test-backend-ops against the CPU: OUT_PROD, K-shaped MUL_MAT"
    "$bin/test-backend-ops" test -j 8 -b CUDA0 -o OUT_PROD > "$OUT/tbo-out-prod.log" 2>&1
    grep -E "tests passed|FAIL" "$OUT/tbo-out-prod.log" | tail -3
    "$bin/test-backend-ops" test -j 8 -b CUDA0 -o MUL_MAT -p "type_k=" > "$OUT/tbo-mul-mat-kq.log" 2>&1
    grep -E "tests passed|FAIL" "$OUT/tbo-mul-mat-kq.log" | tail -3
    log "V*P op timings (decode): quantized OUT_PROD against the f16 MUL_MAT of a transposed V"
    "$bin/test-backend-ops" perf -b CUDA0 -o OUT_PROD -p "n_tokens=1," 2>&1 | grep "OUT_PROD(" | sed -e 's/  */ /g' \
        | tee "$OUT/perf.log"
    "$bin/test-backend-ops" perf -b CUDA0 -o MUL_MAT -p "type_a=f16,type_b=f32,m=128,n=1,k=(256|8192|32768),bs=\[8,1\]" 2>&1 \
        | grep "MUL_MAT(" | sed -e 's/  */ /g' | tee -a "$OUT/perf.log"
    models=llama8b
    model_configs=()
else
    # MiMo, and the 8B configs stage a had no time for
    models=llama8b,mimo
    left=$(python3 -c "import json,sys
try: st=json.load(open('/tmp/session-a/results.json'))['statuses']
except OSError: print('$CONFIGS'); sys.exit()
print(','.join(s['config'] for s in st if s['status']=='skipped'))")
    model_configs=(--model-configs "llama8b=$left")
    log "8B configs left from stage a: ${left:-none}"
fi

for m in ${models//,/ }; do wait_model "$m"; done
deadline=$(( ${DEADLINE:-585} - ($(date +%s) - t0) ))
log "matrix: $models, ${deadline} s"
python3 "$here/benchmarks/run.py" --backend cuda --bin "$bin" --src "$C/llama.cpp" --models "$models" --model-dir "$M" \
    --configs "$CONFIGS" "${model_configs[@]}" -r "$REPS" --out "/tmp/session-$stage" --pack-logs \
    --deadline "$deadline" --timeout 120 > "$OUT/run.log" 2>&1
grep -E "^\[bench\]" "$OUT/run.log" | tail -30
cp /tmp/session-$stage/results.json /tmp/session-$stage/results.md /tmp/session-$stage/logs.tar.xz "$OUT/" 2>/dev/null
log done
