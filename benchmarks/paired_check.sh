#!/usr/bin/env bash
# Issue 12 item 4's decode ratios with the drift between runs paired away, and prefill at every depth, on a CUDA
# machine in one call (< 10 min):
#   1. build llama-bench (FA kernels off; reuses fused_attn_check.sh's build folder when a warm machine has it)
#   2. prefill, 8B shape, FA off, pp512 at depths 0/8K/32K: f16/f16, q4_0/q4_0, q8_0/q8_0 (the default code paths)
#   3. decode, 8B shape, FA off, tg128 at DEPTHS (default 8192), in ROUNDS rounds of f16/f16 then each of CONFIGS, one
#      llama-bench run each (2 repetitions): every quantized run's ratio to the f16 run of its own round, then per config
#      the median of the rounds' ratios. Runs minutes apart on one GPU drift by 1-2 % (clocks, the tool's own
#      start-up): a ratio of two runs taken back to back shares that drift, a ratio of two averages does not.
# Here:   python3 benchmarks/carry.py .stage/carry --tokenizer-from <SmolLM2 GGUF>
# There:  OUT=<results folder> bash benchmarks/paired_check.sh
# Env: DEADLINE (seconds from the start after which no run starts; default 480), ROUNDS (default 5), DEPTHS (llama-bench
# -d list for step 3, default 8192), CONFIGS (space-separated LABEL:CTK:CTV[:ENV=VALUE,...]; default
# "q4_0:q4_0:q4_0 q8_0:q8_0:q8_0"), PREFILL=0 skips step 2.
set -u
. "$(dirname "${BASH_SOURCE[0]}")/device_common.sh"
t0=$(date +%s)
txt=$OUT/paired.txt
log() { echo "[paired $(( $(date +%s) - t0 ))s] $*" | tee -a "$txt"; }
late() { [ $(( $(date +%s) - t0 )) -gt "${DEADLINE:-480}" ]; }
gen llama8b llama --preset llama-3.1-8b
B=/tmp/fattn-build
bin=$B/build/bin
if [ ! -x "$bin/llama-bench" ]; then
    log "1. build (FA kernels off)"
    build_tools "$B" off llama-bench,test-backend-ops,llama-perplexity
fi
log built
wait_model llama8b
m="$M/synth-llama8b.gguf"

# one llama-bench run: "LABEL K V depth t/s std" lines on stdout (device_common.sh's bench_tg fixes -p 0, decode
# only, and appends to a file; step 2 needs prefill, and both steps a timeout)
run1() { # label k v "llama-bench args" [ENV=VALUE ...]
    local label=$1 k=$2 v=$3 args=$4; shift 4
    # shellcheck disable=SC2086
    env "$@" X=1 timeout 200 "$bin/llama-bench" -m "$m" -ngl 99 -fa 0 $args -ctk "$k" -ctv "$v" -o jsonl 2>/dev/null \
        | python3 -c "import json,sys
for l in sys.stdin:
    r=json.loads(l); print('$label', r['type_k'], r['type_v'], r['n_depth'], round(r['avg_ts'],2), round(r['stddev_ts'],2))"
}

if [ "${PREFILL:-1}" != 0 ]; then
    log "2. prefill, 8B shape, FA off, pp512 at 0/8K/32K (ratios to f16/f16)"
    for cfg in "f16 f16 f16" "q4_0 q4_0 q4_0" "q8_0 q8_0 q8_0"; do
        late && { log "skipped (deadline): prefill $cfg"; continue; }
        # shellcheck disable=SC2086
        run1 $cfg "-p 512 -n 0 -d 0,8192,32768 -r 2" | sed 's/^/pp /' | tee -a "$txt" "$OUT/prefill.txt"
    done
    python3 - "$OUT/prefill.txt" <<'EOF' | tee -a "$txt"
import sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
base = {r[4]: float(r[5]) for r in rows if r[1] == "f16"}
for r in rows:
    if r[1] != "f16" and r[4] in base:
        print("pp ratio", r[1], r[4], "%.3f" % (float(r[5]) / base[r[4]]))
EOF
fi

log "3. decode, tg128 at ${DEPTHS:-8192}: ${ROUNDS:-5} rounds of f16 then each config"
configs=${CONFIGS:-"q4_0:q4_0:q4_0 q8_0:q8_0:q8_0"}
for r in $(seq 1 "${ROUNDS:-5}"); do
    late && { log "stopped (deadline) before round $r"; break; }
    run1 f16 f16 f16 "-p 0 -n 128 -d ${DEPTHS:-8192} -r 2" | sed "s/^/round $r /" | tee -a "$txt" "$OUT/decode.txt"
    for c in $configs; do
        IFS=: read -r label k v envs <<< "$c"
        # shellcheck disable=SC2046
        run1 "$label" "$k" "$v" "-p 0 -n 128 -d ${DEPTHS:-8192} -r 2" $(echo "${envs:-}" | tr ',' ' ') \
            | sed "s/^/round $r /" | tee -a "$txt" "$OUT/decode.txt"
    done
done
python3 - "$OUT/decode.txt" <<'EOF' | tee -a "$txt"
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
f16 = {(r[1], r[5]): float(r[6]) for r in rows if r[2] == "f16"}
ratios = {}
for r in rows:
    if r[2] != "f16" and (r[1], r[5]) in f16:
        ratios.setdefault((r[2], r[5]), []).append(float(r[6]) / f16[(r[1], r[5])])
for (label, depth), xs in sorted(ratios.items()):
    print("decode", label, "depth", depth, "rounds", len(xs), "median %.3f" % statistics.median(xs),
          "min %.3f max %.3f" % (min(xs), max(xs)), " ".join("%.3f" % x for x in xs))
EOF
log done
