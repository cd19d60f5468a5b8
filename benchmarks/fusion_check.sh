#!/usr/bin/env bash
# One call on a CUDA machine: the fused Hadamard rotations of quantized K/V (patches 0016 + 0017, opt-in through
# LLAMA_VQ_CUDA_FUSE_ROTATION=1) checked against the CPU, then the FA-off matrix on both synthetic models with the
# fusions on (f16/f16 against the quantized pairs), then decode with q4_0/q4_0 three ways: rotation fused, rotation
# unfused (today's default), no rotation (LLAMA_ATTN_ROT_DISABLE=1), against f16/f16.
# Here:   python3 benchmarks/carry.py .bench-carry --tokenizer-from <SmolLM2 GGUF>
# There:  OUT=<results folder> bash benchmarks/fusion_check.sh
# Env: DEADLINE (seconds from the start after which no matrix config starts; default 540), REPS (default 2).
set -u
. "$(dirname "${BASH_SOURCE[0]}")/device_common.sh"
t0=$(date +%s)
log() { echo "[fusion $(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/fusion.txt"; }
gen llama8b llama --preset llama-3.1-8b
gen mimo mimo --preset attn
B=/tmp/fusion-build
log "build (FA kernels off)"
build_tools "$B" off
bin=$B/build/bin
log built

export LLAMA_VQ_CUDA_FUSE_ROTATION=1
log "test-backend-ops against the CPU (fusions on)"
fail=0
for op in HADAMARD_SET_ROWS CONT_HADAMARD HADAMARD_KQ OUT_PROD SET_ROWS MUL_MAT_HADAMARD; do
    "$bin/test-backend-ops" test -j 8 -b CUDA0 -o "$op" > "$OUT/tbo-$op.log" 2>&1 || fail=1
    echo "$op: $(grep -E 'tests passed' "$OUT/tbo-$op.log" | tail -1)" | tee -a "$OUT/fusion.txt"
    grep -E "FAIL" "$OUT/tbo-$op.log" | head -5 | tee -a "$OUT/fusion.txt"
done
"$bin/test-backend-ops" test -j 8 -b CUDA0 -o MUL_MAT -p "type_k=" > "$OUT/tbo-mul-mat-kq.log" 2>&1 || fail=1
echo "MUL_MAT (K-shaped): $(grep -E 'tests passed' "$OUT/tbo-mul-mat-kq.log" | tail -1)" | tee -a "$OUT/fusion.txt"
[ "$fail" = 0 ] || { log "test-backend-ops failed: no benchmark"; exit 1; }

for m in llama8b mimo; do wait_model "$m"; done
deadline=$(( ${DEADLINE:-540} - ($(date +%s) - t0) - 40 ))
log "matrix (FA off), ${deadline} s"
python3 "$here/benchmarks/run.py" --backend cuda --bin "$bin" --src "$C/llama.cpp" --models llama8b,mimo --model-dir "$M" \
    --configs fa-off_f16-f16,fa-off_q4_0-q4_0,fa-off_q8_0-q8_0,fa-off_q8_0-q4_0 -r "${REPS:-2}" --out /tmp/fusion-matrix \
    --pack-logs --deadline "$deadline" --timeout 120 > "$OUT/run.log" 2>&1
grep -E "^\[bench\]" "$OUT/run.log" | tail -20
cp /tmp/fusion-matrix/results.json /tmp/fusion-matrix/results.md /tmp/fusion-matrix/tok_s_vs_depth.png \
    /tmp/fusion-matrix/logs.tar.xz "$OUT/" 2>/dev/null

# what the rotation still costs at decode: the same caches unrotated, and rotated without the fusions
bench() { # label ctk ctv env...
    local label=$1 k=$2 v=$3; shift 3
    env "$@" X=1 "$bin/llama-bench" -m "$M/synth-llama8b.gguf" -ngl 99 -fa 0 -p 0 -n 128 -d 0,8192 -r 2 -ctk "$k" -ctv "$v" \
        -o jsonl 2>/dev/null | python3 -c "import json,sys
for l in sys.stdin:
    r=json.loads(l); print('$label', r['type_k'], r['type_v'], r['n_depth'], round(r['avg_ts'],2), round(r['stddev_ts'],2))" \
        | tee -a "$OUT/fusion.txt"
}
log "decode, rotation variants (8B, tg128, d 0 and 8192)"
bench f16 f16 f16
bench fused q4_0 q4_0
bench unfused q4_0 q4_0 LLAMA_VQ_CUDA_FUSE_ROTATION=0
bench rot-off q4_0 q4_0 LLAMA_ATTN_ROT_DISABLE=1
bench f16 f16 f16
log done
