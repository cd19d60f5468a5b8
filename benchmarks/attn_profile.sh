#!/usr/bin/env bash
# Where a decode step's GPU time goes, FA off, on the 8B shape (runs on the GPU machine; ncu must read the counters):
#   1. build the tools (FA kernels off; reused while the machine stays up)
#   2. test-backend-ops ATTN_DECODE_FUSED against the CPU, fused
#   3. per-kernel time of one decode step (ncu, one metric, every launch; benchmarks/ncu_timeline.py), for
#      f16/f16 and q4_0/q4_0 with the fused attention at 32K, 8K and depth 0, and q4_0 with the separate ops at 32K
#   4. ncu's full set for one launch of the fused kernel (32K and 8K) and its combine (8K); the per-instruction
#      stall samples of the 32K launch
# Here:   python3 benchmarks/carry.py .stage/carry --tokenizer-from <SmolLM2 GGUF>
# There:  CARRY=.stage/carry OUT=<results folder> bash benchmarks/attn_profile.sh
# Env: DEADLINE (seconds after which no new step starts; default 500), STEPS (default "3a 4a 3b 4b 3c 3d").
# Everything lands in $OUT/profile.tar.xz, the summary in $OUT/profile.txt.
set -u
. "$(dirname "${BASH_SOURCE[0]}")/device_common.sh"
device_log prof "$OUT/profile.txt"
txt=$OUT/profile.txt
W=/tmp/prof
mkdir -p "$W"
gen llama8b llama --preset llama-3.1-8b
B=/tmp/fattn-build
bin=$B/build/bin
if [ ! -x "$bin/llama-bench" ] || [ ! -x "$bin/test-backend-ops" ]; then
    log "1. build (FA kernels off)"
    build_tools "$B" off llama-bench,test-backend-ops,llama-perplexity
fi
log built
ncu --version | tail -1 | tee -a "$txt"

log "2. test-backend-ops ATTN_DECODE_FUSED against the CPU, fused"
LLAMA_VQ_CUDA_FUSED_ATTN=1 LLAMA_VQ_CUDA_FUSION_STATS=1 "$bin/test-backend-ops" test -j 8 -b CUDA0 -o ATTN_DECODE_FUSED \
    > "$W/tbo-fused.log" 2>&1
echo "fused: $(grep -E 'tests passed' "$W/tbo-fused.log" | tail -1) $(grep -c FAIL "$W/tbo-fused.log") FAIL," \
    "$(grep -o 'attention fusions run: .*' "$W/tbo-fused.log" | tail -1)" | tee -a "$txt"

wait_model llama8b
# timeline LABEL DEPTH CTK CTV [ENV=VALUE ...]: every launch of a 3-token decode after the depth's prefill, one metric
timeline() {
    local label=$1 d=$2 k=$3 v=$4; shift 4
    if late "${DEADLINE:-500}"; then log "skipped (deadline): timeline $label"; return; fi
    log "timeline $label"
    env "$@" timeout 200 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
        --print-units base --log-file "$W/tl-$label.csv" "$bin/llama-bench" -m "$M/synth-llama8b.gguf" -ngl 99 -fa 0 \
        -p 0 -n 3 -d "$d" -b 4096 -ub 4096 -r 1 --no-warmup -ctk "$k" -ctv "$v" > "$W/tl-$label.out" 2>&1
    echo "$label: rc $?, $(grep -c '^"[0-9]' "$W/tl-$label.csv" 2>/dev/null) launches profiled" | tee -a "$txt"
}
# full LABEL KERNEL SKIP DEPTH: ncu_full (device_common.sh) into $W/full-LABEL.*
full() {
    if late "${DEADLINE:-500}"; then log "skipped (deadline): full $1"; return; fi
    log "full $1"
    ncu_full "$txt" "$W/full-$1" "$2" "$3" "$4"
}

for st in ${STEPS:-3a 4a 3b 4b 3c 3d}; do
    case $st in
        3a) timeline f16-32k 32768 f16 f16
            timeline q4_0-fused-32k 32768 q4_0 q4_0 LLAMA_VQ_CUDA_FUSED_ATTN=1 ;;
        4a) full attn-32k k_attn_decode 40 32768
            # where the warps stall, per SASS instruction (the source page of the report)
            ncu -i "$W/full-attn-32k.ncu-rep" --page source --print-source sass --csv > "$W/sass-attn-32k.csv" 2>&1
            echo "sass rows: $(wc -l < "$W/sass-attn-32k.csv")" | tee -a "$txt" ;;
        3b) timeline f16-8k 8192 f16 f16
            timeline q4_0-fused-8k 8192 q4_0 q4_0 LLAMA_VQ_CUDA_FUSED_ATTN=1 ;;
        4b) full attn-8k k_attn_decode 40 8192
            full combine-8k k_attn_decode_combine 40 8192 ;;
        3c) timeline f16-d0 0 f16 f16
            timeline q4_0-fused-d0 0 q4_0 q4_0 LLAMA_VQ_CUDA_FUSED_ATTN=1 ;;
        3d) timeline q4_0-separate-32k 32768 q4_0 q4_0 LLAMA_VQ_CUDA_FUSED_ATTN=0 ;;
    esac
done

log "tables"
( cd "$W" && python3 "$here/benchmarks/ncu_timeline.py" tl-*.csv ) > "$W/timeline.txt" 2>&1
grep -E "^==|^ +[0-9.]+ +[0-9.]+ +[0-9.]+  " "$W/timeline.txt" | awk '/^==/ {n=0} {n++; if (n <= 14) print}' | tee -a "$txt"
tar cJf "$OUT/profile.tar.xz" -C "$W" .
log done
