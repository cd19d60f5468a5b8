#!/usr/bin/env bash
# One call on a CUDA machine for the fused Hadamard rotations of quantized K/V (patches 0016 + 0017, on by default;
# LLAMA_VQ_CUDA_FUSE_ROTATION=0 turns them off), most important first:
#   1. test-backend-ops against the CPU with the fusions on (stops here if any case fails)
#   2. decode, 8B shape, q4_0/q4_0 three ways against f16/f16: rotation fused (the default), unfused, off
#   3. fidelity of the fast path on the GPU: KL divergence of q4_0/q4_0 (FA off) from f16/f16 on the 8B shape with
#      llama-perplexity, fused and unfused, and the same on the CPU of that machine (--device none) for comparison
#   4. the FA-off matrix on both synthetic models with the fusions on, until DEADLINE (later configs: skipped)
# Here:   python3 benchmarks/carry.py .bench-carry --tokenizer-from <SmolLM2 GGUF>
# There:  OUT=<results folder> bash benchmarks/fusion_check.sh
# Env: DEADLINE (seconds from the start after which no matrix config starts; default 560), REPS (default 2).
set -u
. "$(dirname "${BASH_SOURCE[0]}")/device_common.sh"
t0=$(date +%s)
log() { echo "[fusion $(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/fusion.txt"; }
gen llama8b llama --preset llama-3.1-8b
gen mimo mimo --preset attn
B=/tmp/fusion-build
log "build (FA kernels off)"
build_tools "$B" off llama-bench,test-backend-ops,llama-perplexity
bin=$B/build/bin
log built

export LLAMA_VQ_CUDA_FUSE_ROTATION=1
log "1. test-backend-ops against the CPU (fusions on; each fusion's own test must have run it: 0031's counts)"
fail=0
for op in HADAMARD_SET_ROWS CONT_HADAMARD HADAMARD_KQ OUT_PROD SET_ROWS MUL_MAT_HADAMARD; do
    LLAMA_VQ_CUDA_FUSION_STATS=1 "$bin/test-backend-ops" test -j 8 -b CUDA0 -o "$op" > "$OUT/tbo-$op.log" 2>&1 || fail=1
    echo "$op: $(grep -E 'tests passed' "$OUT/tbo-$op.log" | tail -1)" | tee -a "$OUT/fusion.txt"
    grep -E "FAIL" "$OUT/tbo-$op.log" | head -5 | tee -a "$OUT/fusion.txt"
    fusion_ran "$OUT/tbo-$op.log" "$op" || { echo "$op: FAILED: the fused kernel never ran" | tee -a "$OUT/fusion.txt"; fail=1; }
done
"$bin/test-backend-ops" test -j 8 -b CUDA0 -o MUL_MAT -p "type_k=" > "$OUT/tbo-mul-mat-kq.log" 2>&1 || fail=1
echo "MUL_MAT (K-shaped): $(grep -E 'tests passed' "$OUT/tbo-mul-mat-kq.log" | tail -1)" | tee -a "$OUT/fusion.txt"
[ "$fail" = 0 ] || { log "test-backend-ops failed: nothing timed"; exit 1; }

wait_model llama8b
bench() { bench_tg "$OUT/fusion.txt" "$M/synth-llama8b.gguf" "-n 128 -d 0,8192 -r 2" "$@"; } # label ctk ctv env...
log "2. decode, rotation variants (8B, tg128, depths 0 and 8192)"
bench f16 f16 f16
bench fused q4_0 q4_0
bench unfused q4_0 q4_0 LLAMA_VQ_CUDA_FUSE_ROTATION=0
bench rot-off q4_0 q4_0 LLAMA_ATTN_ROT_DISABLE=1
bench fused q8_0 q8_0
bench f16 f16 f16

log "3. fidelity: KL of q4_0/q4_0 (FA off) from f16/f16, 8B shape, 4 x 512 tokens of llama.cpp's own docs"
ppl() { ppl_kl "$OUT/fusion.txt" "$@"; }  # label [ENV=VALUE ...] -- args...
ppl gpu-base -- -ngl 99 --kl-divergence-base /tmp/kld-gpu
ppl gpu-fused -- -ngl 99 -ctk q4_0 -ctv q4_0 --kl-divergence-base /tmp/kld-gpu --kl-divergence
export LLAMA_VQ_CUDA_FUSE_ROTATION=0
ppl gpu-unfused -- -ngl 99 -ctk q4_0 -ctv q4_0 --kl-divergence-base /tmp/kld-gpu --kl-divergence
export LLAMA_VQ_CUDA_FUSE_ROTATION=1
ppl cpu-base -- -dev none -t "$(nproc)" --kl-divergence-base /tmp/kld-cpu
ppl cpu -- -dev none -t "$(nproc)" -ctk q4_0 -ctv q4_0 --kl-divergence-base /tmp/kld-cpu --kl-divergence

wait_model mimo
deadline=$(( ${DEADLINE:-560} - ($(date +%s) - t0) ))
log "4. matrix (FA off, fusions on), ${deadline} s"
python3 "$here/benchmarks/run.py" --backend cuda --bin "$bin" --src "$C/llama.cpp" --models llama8b,mimo --model-dir "$M" \
    --configs fa-off_f16-f16,fa-off_q4_0-q4_0,fa-off_q8_0-q8_0,fa-off_q8_0-q4_0 -r "${REPS:-2}" --out /tmp/fusion-matrix \
    --pack-logs --deadline "$deadline" --timeout 120 > "$OUT/run.log" 2>&1
grep -E "^\[bench\]" "$OUT/run.log" | tail -20
cp /tmp/fusion-matrix/results.json /tmp/fusion-matrix/results.md /tmp/fusion-matrix/tok_s_vs_depth.png \
    /tmp/fusion-matrix/logs.tar.xz "$OUT/" 2>/dev/null
log done
