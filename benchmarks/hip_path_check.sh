#!/usr/bin/env bash
# One call on a CUDA machine for the path AMD MI210 (HIP) takes, on an NVIDIA GPU, against the CPU:
#   1. test-backend-ops OUT_PROD with LLAMA_VQ_CUDA_FORCE_F16_GEMM=1: 0011's prefill in the F16 GEMM branch (the only
#      one HIP has; NVIDIA Ampere+ otherwise runs TF32). The log must show that the forced branch ran.
#   2. the K-shaped MUL_MAT (0012: its prefill is F16 on both vendors) and the fused rotations (0017, on by default)
#      with the switch still set, then OUT_PROD without it (TF32) for comparison
#   3. test-backend-ops perf, quantized V·P at 8B shapes, F16 branch and TF32 branch (what the branch costs here)
# Here:   python3 benchmarks/carry.py .bench-carry --tokenizer-from <SmolLM2 GGUF>
# There:  OUT=<results folder> bash benchmarks/hip_path_check.sh          (~5 min with the build)
# Exit status 1 if any case fails or the forced branch did not run; hip_path.txt sums it up.
set -u
. "$(dirname "${BASH_SOURCE[0]}")/device_common.sh"
t0=$(date +%s)
log() { echo "[hip-path $(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/hip_path.txt"; }
B=/tmp/hip-path-build
log "build llama-bench and test-backend-ops (FA kernels off)"
build_tools "$B" off
bin=$B/build/bin
log built

fail=0
# tbo NAME ENV... -- ARGS...: test-backend-ops test on CUDA0, its summary line into hip_path.txt
tbo() {
    local name=$1; shift
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    env "${envs[@]}" X=1 "$bin/test-backend-ops" test -b CUDA0 "$@" > "$OUT/tbo-$name.log" 2>&1 || fail=1
    log "$name: $(grep -E 'tests passed' "$OUT/tbo-$name.log" | tail -1)"
    grep -E "FAIL" "$OUT/tbo-$name.log" | head -5 | tee -a "$OUT/hip_path.txt"
}

log "1. OUT_PROD, F16 GEMM forced (the HIP branch)"
tbo out-prod-f16 LLAMA_VQ_CUDA_FORCE_F16_GEMM=1 -- -o OUT_PROD
if grep -q "LLAMA_VQ_CUDA_FORCE_F16_GEMM=1: F16 GEMM" "$OUT/tbo-out-prod-f16.log"; then
    log "the forced F16 branch ran"
else
    log "FAILED: no line from the forced F16 branch: it did not run (is patch 0030 in the tree?)"
    fail=1
fi

log "2. the rest of the HIP-relevant ops with the switch set, and OUT_PROD in TF32"
tbo mul-mat-kq LLAMA_VQ_CUDA_FORCE_F16_GEMM=1 -- -o MUL_MAT -p "type_k="
for op in HADAMARD_SET_ROWS CONT_HADAMARD HADAMARD_KQ CPY; do
    tbo "$op" LLAMA_VQ_CUDA_FORCE_F16_GEMM=1 LLAMA_VQ_CUDA_FUSION_STATS=1 -- -o "$op"
    if ! fusion_ran "$OUT/tbo-$op.log" "$op"; then
        log "FAILED: $op passed without its fused kernel ever running (0031's counts)"
        fail=1
    fi
done
tbo out-prod-tf32 -- -o OUT_PROD

log "3. perf: quantized V·P (8B shapes), F16 branch then TF32 branch"
for mode in f16 tf32; do
    envs=(X=1)
    [ "$mode" = f16 ] && envs=(LLAMA_VQ_CUDA_FORCE_F16_GEMM=1)
    env "${envs[@]}" "$bin/test-backend-ops" perf -b CUDA0 -o OUT_PROD > "$OUT/perf-out-prod-$mode.log" 2>&1
    grep -E "OUT_PROD.*n_tokens=512" "$OUT/perf-out-prod-$mode.log" | sed "s/^/$mode: /" | tee -a "$OUT/hip_path.txt"
done
[ "$fail" = 0 ] && log "done: all passed" || log "done: FAILURES above"
exit "$fail"
