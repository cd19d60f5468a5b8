#!/usr/bin/env bash
# Issue 12 item 4 on a CUDA machine, one call (< 10 min): patch 0023, ggml-cuda's fused decode attention for a quantized
# K/V cache with FA off (K*Q -> softmax -> V*P in one pass, flash-decoding splits + a combine kernel; by default (0041)
# only single-token decode with V*P on tensor cores; every row here sets LLAMA_VQ_CUDA_FUSED_ATTN=1 or =0 itself),
# most important first:
#   1. build llama-bench + test-backend-ops + llama-perplexity (FA kernels off; CUDA_FA=on: on)
#   2. test-backend-ops ATTN_DECODE_FUSED against the CPU's separate ops, fused; 0023's count must show the fused
#      kernel ran (plain and with the query rotation, the tails, and 0040's tensor-core V*P); then the same with
#      0040 off (LLAMA_VQ_CUDA_FUSED_ATTN_MMA=0: the f32 V*P); and 0044's K store (ROPE_HADAMARD_SET_ROWS: rope +
#      rotation + quantized store in one kernel; its count must show it ran) with HADAMARD_SET_ROWS. On a failure the
#      same cases run unfused as a control, and nothing is timed
#   2c. (unless FAST=1) OUT_PROD and ATTN_DECODE_FUSED with the separate ops against the CPU
#   3. (unless FAST=1) V*P op timings with the separate ops (test-backend-ops perf repeats only a graph's last node,
#      so it cannot time the fused chain; end to end does, step 4)
#   4. 8B shape decode, FA off, tg128 at depths 0/8K/32K: f16/f16, q4_0/q4_0 and q8_0/q8_0 fused and (unless
#      SEPARATE=0) unfused, with the fused attention's count per config (LLAMA_VQ_CUDA_FUSION_STATS=1); with AB=1 also
#      q4_0 and q8_0 fused with 0040 off (the f32 V*P); ratios to f16/f16. (AB=2, AB=3 and the split rows went with
#      their measuring switches, issue 25: docs/knobs.md)
#   5. (time left; runs after 7) KL from f16 with 8-token batches (where 0023 fires): q4_0/q4_0 fused and separate
#      (the row with V*P on TF32 went with LLAMA_VQ_CUDA_OUT_PROD_MAX_COLS); q8_0/q8_0 fused and separate; FA on (FA_ON=1)
#   6. (NCU=1) ncu's full set for one launch of the fused kernel and one of its combine at 32K
#   7. (MIMO=1; runs before 5) the MiMo shape (tools/synth_models.py mimo --preset attn: GQA 16 full layers, GQA 8 sliding-window
#      layers, sinks), tg128 at 0/32K/64K, one repetition: f16/f16, the production types q8_0 K / q4_1 V fused and
#      separate, q4_0/q4_0 fused; ratios to f16/f16
# Here:   python3 benchmarks/carry.py .bench-carry --tokenizer-from <SmolLM2 GGUF>
# There:  OUT=<results folder> bash benchmarks/investigations/fused_attn_check.sh
# Env: DEADLINE (seconds from the start after which no benchmark starts; default 540), REPS (default 2), FAST=1 (skip
# steps 2c and 3: the separate ops' tests and timings), KL_CHUNKS (512-token chunks of step 5, default 4; 0 skips
# it; FA_ON=1 (or FA_CPU=1) adds FA-on rows, f16 first (decision 8's FA on/off floor): with CUDA_FA=on the tools are
# built with CUDA's FA kernels (in their own folder) and FA runs there, else the scheduler runs FLASH_ATTN_EXT on the
# CPU backend, 16 threads, the rest of the model on the GPU (mixed K/V types, q8_0 K / q4_1 V, have CUDA FA kernels
# only with GGML_CUDA_FA_ALL_QUANTS, which this build does not set: that row's FA runs on the CPU either way);
# PROD=1 adds q8_0 K / q4_1 V rows), NCU=1 (step 6),
# TESTS=0 (skip step 2: only where an earlier call on the same machine passed it), SEPARATE=0, AB=1,
# and BENCH=0 (step 4: BENCH=0 skips it), MIMO=1 (step 7; its model is generated in the background from the
# start, also with MIMO_GEN=1 alone, so that a later call on the same machine finds it).
set -u
. "$(dirname "${BASH_SOURCE[0]}")/../device_common.sh"
t0=$(date +%s)
txt=$OUT/fused-attn.txt
log() { echo "[fattn $(( $(date +%s) - t0 ))s] $*" | tee -a "$txt"; }
late() { [ $(( $(date +%s) - t0 )) -gt "${DEADLINE:-540}" ]; }
gen llama8b llama --preset llama-3.1-8b
if [ -n "${MIMO:-}${MIMO_GEN:-}" ]; then gen mimo mimo --preset attn; fi
FA=${CUDA_FA:-off}
B=/tmp/fattn-build$([ "$FA" = on ] && echo -fa)
bin=$B/build/bin
if [ ! -x "$bin/llama-bench" ] || [ ! -x "$bin/test-backend-ops" ] || [ ! -x "$bin/llama-perplexity" ]; then
    log "1. build (FA kernels $FA)"
    build_tools "$B" "$FA" llama-bench,test-backend-ops,llama-perplexity
fi
fa_where=$([ "$FA" = on ] && echo cuda || echo cpu)
log built

# ratios FILE [PREFIX]: FILE's "LABEL K V depth t/s std" lines as ratios to the f16 row of the same depth, shown and
# appended to the summary (each line led by PREFIX)
ratios() {
    python3 - "$1" "${2:-}" <<'EOF' | tee -a "$txt"
import sys
pre = (sys.argv[2] + " ") if sys.argv[2] else ""
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
base = {r[3]: float(r[4]) for r in rows if r[0] == "f16"}
print(pre + "label depth t/s ratio_to_f16")
for r in rows:
    if r[0] != "f16" and r[3] in base:
        print(pre + " ".join((r[0], r[3], r[4], "%.3f" % (float(r[4]) / base[r[3]]))))
EOF
}
# attn_ran LOG: the fused attention's counts that 0023 prints at exit ("attention fusions run: attn=N rotated=N")
attn_counts() { grep -o "attention fusions run: .*" "$1" | tail -1; }
# rot_counts LOG: the rotation fusions' counts (0031; rope= from 0044)
rot_counts() { grep -o "rotation fusions run: .*" "$1" | tail -1; }
# passed LOG: test-backend-ops' "N/M tests passed" line of LOG and its count of FAIL lines
passed() { echo "$(grep -E 'tests passed' "$1" | tail -1) $(grep -c FAIL "$1") FAIL"; }

if [ "${TESTS:-1}" = 0 ]; then
    # only for a second call on a machine whose earlier call built these tools and passed step 2
    log "2. skipped (TESTS=0)"
else
log "2. test-backend-ops ATTN_DECODE_FUSED against the CPU (fused: the default)"
LLAMA_VQ_CUDA_FUSED_ATTN=1 LLAMA_VQ_CUDA_FUSION_STATS=1 "$bin/test-backend-ops" test -j 8 -b CUDA0 -o ATTN_DECODE_FUSED > "$OUT/tbo-fused.log" 2>&1
rc=$?
echo "fused: $(passed "$OUT/tbo-fused.log"), $(attn_counts "$OUT/tbo-fused.log")" \
    | tee -a "$txt"
grep -E "FAIL" "$OUT/tbo-fused.log" | head -10 | tee -a "$txt"
counts=$(attn_counts "$OUT/tbo-fused.log")
plain=$(echo "$counts" | sed -n 's/.*attn=\([0-9]*\).*/\1/p')
rot=$(echo "$counts" | sed -n 's/.* rotated=\([0-9]*\).*/\1/p')
tail_=$(echo "$counts" | sed -n 's/.* tail=\([0-9]*\).*/\1/p')
tailr=$(echo "$counts" | sed -n 's/.* tail_rotated=\([0-9]*\).*/\1/p')
mma=$(echo "$counts" | sed -n 's/.* mma=\([0-9]*\).*/\1/p')
if [ "${plain:-0}" -eq 0 ] || [ "${rot:-0}" -eq 0 ] || [ "${tail_:-0}" -eq 0 ] || [ "${tailr:-0}" -eq 0 ] || [ "${mma:-0}" -eq 0 ]; then
    log "FAILED: the fused kernel never ran in some form (plain ${plain:-?}, rotated ${rot:-?}, tail ${tail_:-?}, tail rotated ${tailr:-?}, mma ${mma:-?})"
    rc=1
fi
if [ "$rc" = 0 ]; then
    log "2b. the same with 0040 off (LLAMA_VQ_CUDA_FUSED_ATTN_MMA=0: the f32 V*P)"
    LLAMA_VQ_CUDA_FUSED_ATTN=1 LLAMA_VQ_CUDA_FUSED_ATTN_MMA=0 LLAMA_VQ_CUDA_FUSION_STATS=1 "$bin/test-backend-ops" test -j 8 -b CUDA0 \
        -o ATTN_DECODE_FUSED > "$OUT/tbo-fused-f32.log" 2>&1 || rc=1
    echo "fused, f32 V*P: $(passed "$OUT/tbo-fused-f32.log"), $(attn_counts "$OUT/tbo-fused-f32.log")" | tee -a "$txt"
    grep -E "FAIL" "$OUT/tbo-fused-f32.log" | head -10 | tee -a "$txt"
fi
if [ "$rc" = 0 ]; then
    log "2d. K's rope + rotation + store in one kernel (0044), and the rotation + store alone, against the CPU"
    for op in ROPE_HADAMARD_SET_ROWS HADAMARD_SET_ROWS; do
        LLAMA_VQ_CUDA_FUSION_STATS=1 "$bin/test-backend-ops" test -j 8 -b CUDA0 -o "$op" > "$OUT/tbo-$op.log" 2>&1 || rc=1
        echo "$op: $(passed "$OUT/tbo-$op.log"), $(rot_counts "$OUT/tbo-$op.log")" | tee -a "$txt"
        grep -E "FAIL" "$OUT/tbo-$op.log" | head -10 | tee -a "$txt"
        fusion_ran "$OUT/tbo-$op.log" "$op" || { log "FAILED: $op's fused kernel never ran"; rc=1; }
    done
fi
if [ "$rc" != 0 ]; then
    log "control: the same cases unfused (LLAMA_VQ_CUDA_FUSED_ATTN=0)"
    LLAMA_VQ_CUDA_FUSED_ATTN=0 "$bin/test-backend-ops" test -j 8 -b CUDA0 -o ATTN_DECODE_FUSED > "$OUT/tbo-unfused.log" 2>&1
    echo "unfused: $(passed "$OUT/tbo-unfused.log")" \
        | tee -a "$txt"
    grep -E "FAIL" "$OUT/tbo-unfused.log" | head -5 | tee -a "$txt"
    log "test-backend-ops failed: nothing timed"
    exit 1
fi
fi

if [ -z "${FAST:-}" ]; then
log "2c. the separate ops against the CPU (dequantize_x8's users: OUT_PROD, and K*Q inside ATTN_DECODE_FUSED unfused)"
"$bin/test-backend-ops" test -j 8 -b CUDA0 -o OUT_PROD > "$OUT/tbo-outprod.log" 2>&1
echo "OUT_PROD: $(passed "$OUT/tbo-outprod.log")" | tee -a "$txt"
LLAMA_VQ_CUDA_FUSED_ATTN=0 "$bin/test-backend-ops" test -j 8 -b CUDA0 -o ATTN_DECODE_FUSED > "$OUT/tbo-unfused.log" 2>&1
echo "ATTN_DECODE_FUSED unfused: $(passed "$OUT/tbo-unfused.log")" | tee -a "$txt"

log "3. V*P op timings, separate ops (perf repeats only the chain's last node, OUT_PROD: the fused kernel is not timed)"
LLAMA_VQ_CUDA_FUSED_ATTN=0 "$bin/test-backend-ops" perf -b CUDA0 -o ATTN_DECODE_FUSED > "$OUT/perf-unfused.log" 2>&1
grep -E "ATTN_DECODE_FUSED" "$OUT/perf-unfused.log" | sed -E 's/.*type_k=([a-z0-9_]+),type_v=([a-z0-9_]+),d_k=([0-9]+),d_v=([0-9]+),n_head=([0-9]+),n_head_kv=([0-9]+),n_kv=([0-9]+),n_tokens=([0-9]+).* ([0-9.]+) us\/run.*/\1\/\2 d\3\/\4 h\5\/\6 kv\7 t\8 \9 us/' \
    | tee -a "$txt"
fi

wait_model llama8b
if [ "${BENCH:-1}" != 0 ]; then
# bench LABEL CTK CTV [ENV=VALUE ...]: 8B shape, FA off, tg128 at 0/8K/32K; "LABEL K V depth t/s std" lines, and the
# fused attention's count for this config
bench() {
    local label=$1 k=$2 v=$3; shift 3
    if late; then log "skipped (deadline): $label"; return; fi
    # shellcheck disable=SC2086
    env "$@" LLAMA_VQ_CUDA_FUSION_STATS=1 timeout 240 "$bin/llama-bench" -m "$M/synth-llama8b.gguf" -ngl 99 -fa 0 -p 0 \
        -n 128 -d 0,8192,32768 -r "${REPS:-2}" -ctk "$k" -ctv "$v" -o jsonl 2> "$OUT/bench-$label.err" \
        | python3 -c "import json,sys
for l in sys.stdin:
    r=json.loads(l); print('$label', r['type_k'], r['type_v'], r['n_depth'], round(r['avg_ts'],2), round(r['stddev_ts'],2))" \
        | tee -a "$txt" "$OUT/bench.txt"
    echo "$label: $(attn_counts "$OUT/bench-$label.err"); $(rot_counts "$OUT/bench-$label.err")" | tee -a "$txt"
}
log "4. 8B decode (tg128 at 0/8K/32K, FA off): f16, q4_0 and q8_0 fused (default) and unfused"
bench f16 f16 f16
bench q4_0 q4_0 q4_0 LLAMA_VQ_CUDA_FUSED_ATTN=1
if [ "${AB:-}" = 1 ]; then
    bench q4_0-f32vp q4_0 q4_0 LLAMA_VQ_CUDA_FUSED_ATTN=1 LLAMA_VQ_CUDA_FUSED_ATTN_MMA=0
fi
[ "${SEPARATE:-1}" = 0 ] || bench q4_0-unfused q4_0 q4_0 LLAMA_VQ_CUDA_FUSED_ATTN=0
bench q8_0 q8_0 q8_0 LLAMA_VQ_CUDA_FUSED_ATTN=1
[ "${AB:-}" != 1 ] || bench q8_0-f32vp q8_0 q8_0 LLAMA_VQ_CUDA_FUSED_ATTN=1 LLAMA_VQ_CUDA_FUSED_ATTN_MMA=0
[ "${SEPARATE:-1}" = 0 ] || bench q8_0-unfused q8_0 q8_0 LLAMA_VQ_CUDA_FUSED_ATTN=0
ratios "$OUT/bench.txt"
fi
if [ -n "${MIMO:-}" ] && ! late; then
    log "7. MiMo shape, FA off, tg128 at 0/32K/64K: f16, q8_0/q4_1 fused and separate, q4_0 fused"
    wait_model mimo
    mm="$M/synth-mimo.gguf"
    cfgs=("f16 f16 f16" "q8_0-q4_1-fused q8_0 q4_1 LLAMA_VQ_CUDA_FUSED_ATTN=1" "q4_0-fused q4_0 q4_0 LLAMA_VQ_CUDA_FUSED_ATTN=1")
    [ "${SEPARATE:-1}" = 0 ] || cfgs+=("q8_0-q4_1-separate q8_0 q4_1 LLAMA_VQ_CUDA_FUSED_ATTN=0")
    for cfg in "${cfgs[@]}"; do
        if late; then log "skipped (deadline): mimo $cfg"; continue; fi
        # shellcheck disable=SC2086
        bench_tg "$OUT/mimo.txt" "$mm" "-n 128 -d 0,32768,65536 -r 1" $cfg
    done
    ratios "$OUT/mimo.txt" mimo
fi

if [ "${KL_CHUNKS:-4}" = 0 ]; then log "KL skipped (KL_CHUNKS=0)"; elif late; then log "skipped (deadline): KL"; else
log "5. fidelity: KL from f16 (FA off) with batches of 8 tokens, where 0023 fires: fused vs separate ops"
# 0023 fuses decode-sized batches only (<= 8 tokens per stream), so llama-perplexity runs with -b 8 -ub 8; the fused
# kernel's V*P and softmax are the separate ops' f32 math in another order, its K*Q takes int8 queries (0034) as the
# CPU's does; 8B shape, KL_CHUNKS x 512 tokens of llama.cpp's own docs against the f16 run's logits
wait_model llama8b
ppl() { # label [ENV=VALUE ...] -- args...: with 8-token batches, and 0023's fusion count for the run
    if late; then log "skipped (deadline): $1"; return; fi
    ppl_kl "$txt" "$1" LLAMA_VQ_CUDA_FUSION_STATS=1 "${@:2}" -b 8 -ub 8 -ngl 99 --chunks "${KL_CHUNKS:-4}" \
        --kl-divergence-base /tmp/kld-base || return
    echo "$1: $(attn_counts "$OUT/ppl-$1.log")" | tee -a "$txt"
}
# FA on with the same cache types (issue 12's fidelity bound, FA_ON=1): FLASH_ATTN_EXT on CUDA (CUDA_FA=on) or on the
# CPU backend, 512-token batches (FA's result does not depend on the batching)
pplfa() {
    [ -n "${FA_ON:-}${FA_CPU:-}" ] || return 0
    if late; then log "skipped (deadline): $1"; return; fi
    ppl_kl "$txt" "$1" -- -fa on -b 512 -ub 512 -t 16 -ngl 99 --chunks "${KL_CHUNKS:-4}" \
        --kl-divergence-base /tmp/kld-base --kl-divergence "${@:2}"
}
ppl base --
pplfa f16-fa-on-$fa_where
[ "${SEPARATE:-1}" = 0 ] || ppl q4_0-separate LLAMA_VQ_CUDA_FUSED_ATTN=0 -- -ctk q4_0 -ctv q4_0 --kl-divergence
ppl q4_0-fused LLAMA_VQ_CUDA_FUSED_ATTN=1 -- -ctk q4_0 -ctv q4_0 --kl-divergence
# 0040's f16 V and P against the f32 V*P (AB=1)
[ "${AB:-}" != 1 ] || ppl q4_0-fused-f32vp LLAMA_VQ_CUDA_FUSED_ATTN=1 LLAMA_VQ_CUDA_FUSED_ATTN_MMA=0 -- -ctk q4_0 -ctv q4_0 \
    --kl-divergence
pplfa q4_0-fa-on-$fa_where -ctk q4_0 -ctv q4_0
# q8_0 adds little error of its own: the clean view of what the fused path (its int8 queries) adds
[ "${SEPARATE:-1}" = 0 ] || ppl q8_0-separate LLAMA_VQ_CUDA_FUSED_ATTN=0 -- -ctk q8_0 -ctv q8_0 --kl-divergence
ppl q8_0-fused LLAMA_VQ_CUDA_FUSED_ATTN=1 -- -ctk q8_0 -ctv q8_0 --kl-divergence
pplfa q8_0-fa-on-$fa_where -ctk q8_0 -ctv q8_0
if [ -n "${PROD:-}" ]; then
    [ "${SEPARATE:-1}" = 0 ] || ppl q8_0-q4_1-separate LLAMA_VQ_CUDA_FUSED_ATTN=0 -- -ctk q8_0 -ctv q4_1 --kl-divergence
    ppl q8_0-q4_1-fused LLAMA_VQ_CUDA_FUSED_ATTN=1 -- -ctk q8_0 -ctv q4_1 --kl-divergence
    pplfa q8_0-q4_1-fa-on-$fa_where -ctk q8_0 -ctv q4_1
fi
fi


if [ -n "${NCU:-}" ]; then
    # where the fused kernel's time goes at 32K (issue- or stall-bound, and on what): launch 41 is token 2's layer 9
    for kern in k_attn_decode k_attn_decode_combine; do
        if late; then log "skipped (deadline): ncu $kern"; continue; fi
        log "6. ncu of $kern, 8B q4_0/q4_0 at 32K, fused"
        ncu_full "$txt" "$OUT/ncu-$kern" "$kern" 40 32768
    done
fi
log done
