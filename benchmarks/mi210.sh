#!/usr/bin/env bash
# For a user with an AMD MI210 (gfx90a) and ROCm >= 6.1: the figures this project could not measure without one.
# From the repository root:
#   bash benchmarks/mi210.sh [OUT]      # OUT default benchmarks/out/mi210-<UTC time>; send it back (~1 h, half build)
# Env: GPU_TARGETS (default gfx90a), HIP_VISIBLE_DEVICES (default 0: one GPU), REPS (llama-bench repetitions, 2).
#   1. bare-metal build, the users' way: scripts/run.sh setup with LLAMA_VQ_BACKEND=hip and the tools (llama-bench,
#      llama-perplexity, test-backend-ops; flash attention's kernels included, for the FA-on references)
#   2. correctness on 64-wide wavefronts: test-backend-ops on ROCm0 against the CPU for the ops our patches add
#   3. speed: benchmarks/run.py --backend hip (synthetic Llama-3.1-8B- and MiMo-shaped models, FA off x cache-type
#      pairs x depths 0/8K/32K, FA on references; ratios to f16/f16 from the same run)
#   4. fidelity (DESIGN.md decision 8): KL divergence from f16/f16 of quantized K/V with FA off (llama-vq's path)
#      against FA on (upstream's reference path) and the FA on/off f16 floor, on SmolLM2 (real weights)
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${1:-benchmarks/out/mi210-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
export HIP_VISIBLE_DEVICES=${HIP_VISIBLE_DEVICES:-0} GPU_TARGETS=${GPU_TARGETS:-gfx90a}
t0=$(date +%s)
log() { echo "[mi210 $(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/mi210.txt"; }
{ rocm-smi --showproductname --showmeminfo vram 2>&1; rocminfo 2>&1 | grep -E 'Marketing Name|gfx|Compute Unit'; } \
    > "$OUT/machine.txt"

log "1. build (LLAMA_VQ_BACKEND=hip GPU_TARGETS=$GPU_TARGETS, tools on)"
LLAMA_VQ_BACKEND=hip LLAMA_VQ_BUILD_TOOLS=ON bash scripts/run.sh setup > "$OUT/build.log" 2>&1 \
    || { tail -40 "$OUT/build.log"; exit 1; }
py=.venv/bin/python
bin=llama_vq/bin
"$py" -c 'import json, llama_vq; print(json.dumps(llama_vq.build_info().as_dict(), default=str))' >> "$OUT/mi210.txt"
smollm2=$("$py" -m llama_vq.models path)

log "2. test-backend-ops on ROCm0 against the CPU"
fail=0
tbo() { # NAME ARGS...
    local name=$1; shift
    "$bin/test-backend-ops" test -b ROCm0 "$@" > "$OUT/tbo-$name.log" 2>&1 || fail=1
    log "$name: $(grep -E 'tests passed' "$OUT/tbo-$name.log" | tail -1)"
    grep -E "FAIL" "$OUT/tbo-$name.log" | head -5 | tee -a "$OUT/mi210.txt"
}
tbo out-prod -o OUT_PROD
tbo mul-mat-kq -o MUL_MAT -p "type_k="
for op in HADAMARD_SET_ROWS CONT_HADAMARD HADAMARD_KQ CPY SET_ROWS; do tbo "$op" -o "$op"; done
LLAMA_VQ_CUDA_FUSE_ROTATION=0 tbo hadamard-unfused -o MUL_MAT_HADAMARD
"$bin/test-backend-ops" perf -b ROCm0 -o OUT_PROD > "$OUT/perf-out-prod.log" 2>&1
"$bin/test-backend-ops" perf -b ROCm0 -o MUL_MAT -p "type_k=" > "$OUT/perf-mul-mat-kq.log" 2>&1

log "3. speed: benchmarks/run.py --backend hip"
"$py" benchmarks/run.py --backend hip --bin "$bin" --tokenizer-from "$smollm2" -r "${REPS:-2}" \
    --out "$OUT/bench" --pack-logs > "$OUT/run.log" 2>&1 || fail=1
grep -E "^\[bench\]" "$OUT/run.log" | tail -30 | tee -a "$OUT/mi210.txt"

log "4. fidelity: KL from f16/f16, SmolLM2, 512-token chunks of llama.cpp's README and build guide"
cat vendor/llama.cpp/README.md vendor/llama.cpp/docs/build.md > "$OUT/ppl-text.txt"
ppl() { # LABEL ARGS...
    local label=$1; shift
    "$bin/llama-perplexity" -m "$smollm2" -f "$OUT/ppl-text.txt" -c 512 -ngl 99 "$@" > "$OUT/ppl-$label.log" 2>&1 \
        || { log "$label: failed ($(tail -1 "$OUT/ppl-$label.log"))"; fail=1; return; }
    grep -E "^(Mean +KLD|Same top p|Mean PPL\(Q\)/PPL\(base\))" "$OUT/ppl-$label.log" | sed "s/^/$label: /" \
        | tee -a "$OUT/mi210.txt"
}
base=$OUT/kld-base-f16-fa-off
ppl base -fa off --kl-divergence-base "$base"
ppl f16-fa-on -fa on --kl-divergence-base "$base" --kl-divergence
for kv in q8_0 q4_0; do
    ppl "$kv-fa-off" -fa off -ctk "$kv" -ctv "$kv" --kl-divergence-base "$base" --kl-divergence
    ppl "$kv-fa-on" -fa on -ctk "$kv" -ctv "$kv" --kl-divergence-base "$base" --kl-divergence
done
ppl q8_0-q4_0-fa-off -fa off -ctk q8_0 -ctv q4_0 --kl-divergence-base "$base" --kl-divergence
rm -f "$base"
[ "$fail" = 0 ] && log "done: $OUT" || log "done with failures: $OUT"
exit "$fail"
