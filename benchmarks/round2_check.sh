#!/usr/bin/env bash
# Issue 12 (performance round 2) on a CUDA machine, in two calls on one warm machine (each under 10 minutes):
#   a: build (FA kernels off); test-backend-ops against the CPU with the rotation fusions on (the default): K*Q with a
#      quantized K incl. MiMo's K 192 at GQA 8/16 and MLA-like 576 x GQA 128 (0020), also with every column count on
#      the vector kernel; the rotation fusions; K*Q op timings at MiMo's full-layer shape by column limit
#      (LLAMA_VQ_CUDA_KQ_VEC_MAX_COLS); then the 8B shape's prefill/decode ratios (f16, q4_0, q8_0 at 0/8K/32K)
#   b: MiMo shape: f16, q4_0, q8_0 and SWA-f16 + full-q4_0 (0019's LLAMA_VQ_CACHE_TYPE_K/V_SWA) at 0/8K/32K, decode
#      at 64K, then the production types (q8_0 K / q4_1 V) with and without f16 SWA layers
#   c: (its own call) build llama-bench only; 8B decode at 0/8K/32K: f16, q4_0 fused (default) and unfused, q8_0
# Here:   python3 benchmarks/carry.py .bench-carry --tokenizer-from <SmolLM2 GGUF>
# There:  OUT=<results folder> bash benchmarks/round2_check.sh a|b|c
# Env: DEADLINE (seconds after the start after which no further benchmark starts; default 500), REPS (default 2).
set -u
. "$(dirname "${BASH_SOURCE[0]}")/device_common.sh"
stage=${1:-a}
t0=$(date +%s)
txt=$OUT/round2-$stage.txt
log() { echo "[r2$stage $(( $(date +%s) - t0 ))s] $*" | tee -a "$txt"; }
late() { [ $(( $(date +%s) - t0 )) -gt "${DEADLINE:-500}" ]; }
gen llama8b llama --preset llama-3.1-8b
gen mimo mimo --preset attn
B=/tmp/r2-build
bin=$B/build/bin
targets=llama-bench,test-backend-ops
[ "$stage" = c ] && targets=llama-bench
if [ ! -x "$bin/llama-bench" ] || { [ "$stage" != c ] && [ ! -x "$bin/test-backend-ops" ]; }; then
    log "build (FA kernels off)"
    build_tools "$B" off "$targets"
fi
log built

# bench LABEL MODEL "LLAMA-BENCH ARGS" CTK CTV [ENV=VALUE ...]: FA off, -ngl 99; "LABEL K V test depth t/s std" lines
bench() {
    local label=$1 model=$2 args=$3 k=$4 v=$5; shift 5
    if late; then log "skipped (deadline): $label $args"; return; fi
    # shellcheck disable=SC2086  # args: several llama-bench options
    env "$@" X=1 timeout 240 "$bin/llama-bench" -m "$model" -ngl 99 -fa 0 $args -ctk "$k" -ctv "$v" -o jsonl \
        2>> "$OUT/bench-$stage.err" | python3 -c "import json,sys
for l in sys.stdin:
    r=json.loads(l); t=('pp%d' % r['n_prompt']) if r['n_prompt'] else ('tg%d' % r['n_gen'])
    print('$label', r['type_k'], r['type_v'], t, r['n_depth'], round(r['avg_ts'],2), round(r['stddev_ts'],2))" \
        | tee -a "$txt" "$OUT/bench.txt"
}

# ratios LABEL...: each label's t/s over f16's at the same test and depth (bench.txt of this stage)
ratios() {
    python3 - "$OUT/bench.txt" "$@" <<'EOF'
import sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
base = {(r[3], r[4]): float(r[5]) for r in rows if r[0] == sys.argv[2]}
print("label test depth t/s ratio")
for r in rows:
    if r[0] != sys.argv[2] and (r[3], r[4]) in base:
        print(r[0], r[3], r[4], r[5], "%.3f" % (float(r[5]) / base[(r[3], r[4])]))
EOF
}

if [ "$stage" = a ]; then
    log "1. test-backend-ops against the CPU (fusions on: the default)"
    tbo() { # NAME ARGS...: one test-backend-ops run, its pass line
        local name=$1; shift
        "$bin/test-backend-ops" test -j 8 -b CUDA0 "$@" > "$OUT/tbo-$name.log" 2>&1
        echo "$name: $(grep -E 'tests passed' "$OUT/tbo-$name.log" | tail -1) $(grep -c FAIL "$OUT/tbo-$name.log") FAIL" \
            | tee -a "$txt"
        grep -E "FAIL" "$OUT/tbo-$name.log" | head -5 | tee -a "$txt"
    }
    tbo mul-mat-kq -o MUL_MAT -p "type_k="
    tbo hadamard-kq -o HADAMARD_KQ
    tbo hadamard-set-rows -o HADAMARD_SET_ROWS
    tbo cont-hadamard -o CONT_HADAMARD
    LLAMA_VQ_CUDA_KQ_VEC_MAX_COLS=128 tbo mul-mat-kq-vec128 -o MUL_MAT -p "type_k="
    LLAMA_VQ_CUDA_KQ_VEC_MAX_COLS=128 tbo hadamard-kq-vec128 -o HADAMARD_KQ

    log "2. K*Q op timings, MiMo full layers (K 192, 4 KV heads, GQA 16) and MLA-like (576, GQA 128), by column limit"
    for cols in 8 16 64 128; do
        LLAMA_VQ_CUDA_KQ_VEC_MAX_COLS=$cols "$bin/test-backend-ops" perf -b CUDA0 -o MUL_MAT -p "d_k=(192|576)" \
            > "$OUT/perf-kq-$cols.log" 2>&1
        python3 - "$cols" < "$OUT/perf-kq-$cols.log" <<'EOF' | tee -a "$OUT/perf-kq.txt"
import re, sys
for l in sys.stdin:
    m = re.search(r"type_k=(\w+),d_k=(\d+),n_kv=(\d+),n_head_kv=\d+,gqa=(\d+),n_tokens=(\d+).*?([\d.]+) us/run", l)
    if m:
        print("cols<=%s %s d%s kv%s gqa%s t%s %s" % ((sys.argv[1],) + m.groups()))
EOF
    done

    wait_model llama8b
    log "3. 8B shape (Q4_K_M-like), FA off: pp2048 + tg128 at 0/8K/32K"
    a8="-p 2048 -n 128 -d 0,8192,32768 -r ${REPS:-2}"
    bench f16 "$M/synth-llama8b.gguf" "$a8" f16 f16
    bench q4_0 "$M/synth-llama8b.gguf" "$a8" q4_0 q4_0
    bench q8_0 "$M/synth-llama8b.gguf" "$a8" q8_0 q8_0
    ratios f16 q4_0 q8_0 | tee -a "$txt"
    log "K*Q timings (us per op; cols<=8 = before 0020: the F16 GEMM above 8 columns)"
    python3 - "$OUT/perf-kq.txt" <<'EOF'
import sys, collections
t = collections.defaultdict(dict)
for l in open(sys.argv[1]):
    f = l.split()
    t[" ".join(f[1:6])][f[0]] = f[6]
cols = ["cols<=8", "cols<=16", "cols<=64", "cols<=128"]
print("shape", *cols)
for k, v in t.items():
    print(k.replace(" ", "_"), *(v.get(c, "-") for c in cols))
EOF
elif [ "$stage" = c ]; then
    wait_model llama8b
    log "8B decode only (tg128 at 0/8K/32K): f16, q4_0 (rotation fused: the default), q4_0 unfused, f16 again"
    ac="-p 0 -n 128 -d 0,8192,32768 -r ${REPS:-2}"
    bench f16 "$M/synth-llama8b.gguf" "$ac" f16 f16
    bench q4_0 "$M/synth-llama8b.gguf" "$ac" q4_0 q4_0
    bench q4_0-unfused "$M/synth-llama8b.gguf" "$ac" q4_0 q4_0 LLAMA_VQ_CUDA_FUSE_ROTATION=0
    bench q8_0 "$M/synth-llama8b.gguf" "$ac" q8_0 q8_0
    ratios f16 q4_0 q4_0-unfused q8_0 | tee -a "$txt"
else
    wait_model mimo
    mm="$M/synth-mimo.gguf"
    log "4. MiMo shape (48 layers, 8 full GQA 16 + 40 SWA GQA 8), FA off: pp2048 + tg128 at 0/8K/32K"
    am="-p 2048 -n 128 -d 0,8192,32768 -r ${REPS:-2}"
    bench f16 "$mm" "$am" f16 f16
    bench q4_0 "$mm" "$am" q4_0 q4_0
    bench swaf16-q4_0 "$mm" "$am" q4_0 q4_0 LLAMA_VQ_CACHE_TYPE_K_SWA=f16 LLAMA_VQ_CACHE_TYPE_V_SWA=f16
    bench q8_0 "$mm" "$am" q8_0 q8_0
    log "5. MiMo decode at 64K"
    a64="-p 0 -n 128 -d 65536 -r 1"
    bench f16 "$mm" "$a64" f16 f16
    bench q4_0 "$mm" "$a64" q4_0 q4_0
    bench swaf16-q4_0 "$mm" "$a64" q4_0 q4_0 LLAMA_VQ_CACHE_TYPE_K_SWA=f16 LLAMA_VQ_CACHE_TYPE_V_SWA=f16
    log "6. production types q8_0 K / q4_1 V, with and without f16 SWA layers"
    bench q8_0-q4_1 "$mm" "-p 0 -n 128 -d 0,8192,32768 -r ${REPS:-2}" q8_0 q4_1
    bench swaf16-q8_0-q4_1 "$mm" "-p 0 -n 128 -d 0,8192,32768 -r ${REPS:-2}" q8_0 q4_1 \
        LLAMA_VQ_CACHE_TYPE_K_SWA=f16 LLAMA_VQ_CACHE_TYPE_V_SWA=f16
    grep -h "llama_kv_cache: size\|SWA layers' cache" "$OUT/bench-$stage.err" | sort | uniq -c | head -20 > "$OUT/kv-sizes.txt"
    ratios f16 q4_0 swaf16-q4_0 q8_0 q8_0-q4_1 swaf16-q8_0-q4_1 | tee -a "$txt"
fi
log done
