#!/usr/bin/env bash
# Issue 10 item 5, the GPU half, in one call on a CUDA machine with no network: llama-vq-server against llama.cpp's
# own llama-server, both built here from the same patched tree (CUDA, FA kernels off), on the MiMo-shaped
# synthetic model (tools/synth_models.py mimo --preset attn), -ngl 999, q8_0 K / q4_0 V, FA off:
#   1. throughput at 1/2/4/8 streaming clients, both servers with the same flags (-np 8; llama-server then splits
#      its cache into 8 streams, ours is unified), optionally llama-server with its cache unified too;
#   2. the agent replay (12 turns, restart before 7) on both.
# Here, once:
#   python3 benchmarks/carry.py .stage/carry --tokenizer-from <SmolLM2 GGUF>     # patched tree, gguf-py, vocab
#   .venv/bin/python benchmarks/pack_python.py .stage/py.tar.xz                  # the server's Python (~21 MB)
# There (carry .stage):  CARRY=.stage/carry OUT=<results> bash benchmarks/serve_device.sh
# Env: CLIENTS (1,2,4,8), REQUESTS (3 per client), MAX_TOKENS (128), UNIFIED=1 (also the unified llama-server run),
# DEADLINE (s after the start; later runs start only before it, default 420), TURNS (12), RESTART_AT (7),
# AGENT_BUDGET (s, 150), NO_AGENT=1 (no agent replay), REQUEST_TIMEOUT (s, 45), ONLY_OURS=1 (no llama-server),
# EXTRA (more server flags, e.g. '--cache-ram 0' or '--swa-full'), DECODE_BENCH=1 (then issue 12's 8B decode ratios
# with 0023 off and on, started before DECODE_DEADLINE s, default 480; REPS 1), REPEAT (throughput runs, default 1),
# SPY=N (py-spy our server for SPY_SECONDS, default 4, of the N-client round of each throughput run;
# benchmarks/spy_summary.py's table goes into serve.txt; needs `xz -9 -c .venv/bin/py-spy > .stage/py-spy.xz` here).
# EXTRA_TARGETS (more CMake targets for the same build, e.g. test-backend-ops), THREADS (both servers' CPU threads,
# default 8). MATRIX (entries run interleaved REPEAT times, then their medians;
# nothing else runs; see below), SPY_LABEL, and for MATRIX runs CTX (the servers' -c, 4096) and CONTEXT_WORDS (a
# long history of that many words of its own before each client's prompts, 0). A request not done in
# REQUEST_TIMEOUT s counts as failed; our server's /slots (twice, 2 s apart) and thread stacks then go into ours.log,
# the GPU's utilization during the throughput runs into gpu.csv.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CARRY=${CARRY:-$here/.stage/carry}
. "$here/benchmarks/device_common.sh"
[ -z "${DECODE_BENCH:-}" ] || gen llama8b llama --preset llama-3.1-8b
engine_build serve "$OUT/serve.txt" llama-server ${DECODE_BENCH:+llama-bench} ${EXTRA_TARGETS:-}
log "built: $(ls "$here/llama_vq/lib" | tr '\n' ' ')"
"$PY" -c "import llama_vq; print(llama_vq.build_info())" | tee -a "$OUT/serve.txt" || exit 1
wait_model mimo
model=$M/synth-mimo.gguf
srv=$B/bin/llama-server
base=(--model "$model" --python "$PY" --extra "-ngl 999 ${EXTRA:-}" --threads "${THREADS:-8}")
common=("${base[@]}")
[ -n "${ONLY_OURS:-}" ] || common+=(--llama-server "$srv")
rt=${REQUEST_TIMEOUT:-45}
export PYTHONUNBUFFERED=1
spy=()
if [ -n "${SPY:-}" ] && [ -f "$(dirname "$C")/py-spy.xz" ]; then  # SPY=N: py-spy our server in the N-client round
    xz -dc "$(dirname "$C")/py-spy.xz" > /tmp/py-spy && chmod +x /tmp/py-spy && export PY_SPY=/tmp/py-spy
    spy=(--spy-clients "$SPY" --spy-seconds "${SPY_SECONDS:-4}")
fi
# spy_report DIR: spy_summary.py's table of the py-spy samples a throughput run left in DIR, into serve.txt
spy_report() {
    local sp=$1/spy-${SPY:-0}
    [ -f "$sp-all.txt" ] && "$PY" "$here/benchmarks/spy_summary.py" "$sp-all.txt" "$sp-gil.txt" 2>&1 | tee -a "$OUT/serve.txt"
}

# run_spec SPEC DIR [SERVE_BENCH ARGS...]: one throughput run of a MATRIX entry LABEL+KIND[+ENV=VALUE...]; KIND is
# ours, llama (llama-server, its own layout at -np 8) or llama-unified (LLAMA_ARG_KV_UNIFIED=1)
run_spec() {
    local spec=$1 d=$2 label kind rest envs=() opts=(); shift 2
    IFS=+ read -r label kind rest <<< "$spec"
    [ -z "$rest" ] || IFS=+ read -r -a envs <<< "$rest"
    case "$kind" in
        ours) ;;
        llama) opts=(--llama-server "$srv" --only-llama-server) ;;
        llama-unified) opts=(--llama-server "$srv" --only-llama-server); envs+=(LLAMA_ARG_KV_UNIFIED=1) ;;
        *) log "MATRIX: unknown kind '$kind' in $spec"; return 1 ;;
    esac
    env ${envs[@]+"${envs[@]}"} python3 "$here/benchmarks/serve_bench.py" throughput "${base[@]}" "${opts[@]}" \
        --label "$label" --out "$d" --request-timeout "$rt" --clients "${CLIENTS:-1,4,8}" --requests "${REQUESTS:-4}" \
        --max-tokens "${MAX_TOKENS:-128}" --ctx "${CTX:-4096}" --context-words "${CONTEXT_WORDS:-0}" "$@" 2>&1 \
        | grep --line-buffered -v '^|' \
        | sed -u "s/^\[throughput\] /[$label] /" | tee -a "$OUT/serve.txt"
}

# the GPU's utilization and memory once a second while it runs: busy at a stall means kernels, idle means the host
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 1 > "$OUT/gpu.csv" 2>&1 &
smi=$!
if [ -n "${MATRIX:-}" ]; then
    # MATRIX="LABEL+KIND[+ENV=VALUE...] ...": every entry once per repetition, interleaved (REPEAT, default 3), so
    # that a drift of the machine reaches all of them alike; then the medians and ratios (serve_bench.py summary).
    # SPY_LABEL=LABEL (with SPY=N): one more run of that entry with py-spy on our server in the N-client round.
    log "matrix (-np 8): $MATRIX, ${REPEAT:-3} times"
    files=()
    for r in $(seq "${REPEAT:-3}"); do
        for spec in $MATRIX; do
            late "${DEADLINE:-420}" && { log "matrix: deadline"; break 2; }
            run_spec "$spec" "/tmp/sb/m$r-${spec%%+*}"
            [ -f "/tmp/sb/m$r-${spec%%+*}/throughput.json" ] && files+=("/tmp/sb/m$r-${spec%%+*}/throughput.json")
        done
    done
    if [ ${#files[@]} -gt 0 ]; then
        python3 "$here/benchmarks/serve_bench.py" summary "${files[@]}" 2>&1 | tee -a "$OUT/serve.txt"
        python3 -c 'import json, sys; print(json.dumps([json.load(open(f)) for f in sys.argv[1:]], indent=1))' \
            "${files[@]}" > "$OUT/matrix.json"
    fi
    for spec in $MATRIX; do
        if [ -n "${SPY_LABEL:-}" ] && [ "${spec%%+*}" = "$SPY_LABEL" ] && [ ${#spy[@]} -gt 0 ]; then
            log "py-spy run: $spec"
            run_spec "$spec" /tmp/sb/spy "${spy[@]}"
            spy_report /tmp/sb/spy
        fi
    done
    kill "$smi" 2>/dev/null
    log done
    exit 0
fi
log "throughput (both servers -np 8; llama-server splits its cache into 8 streams, ours is unified)"
for r in $(seq "${REPEAT:-1}"); do  # REPEAT runs one after the other (fresh servers), for medians
    d=/tmp/sb/split$([ "$r" = 1 ] || echo "$r")
    python3 "$here/benchmarks/serve_bench.py" throughput "${common[@]}" --out "$d" --request-timeout "$rt" \
        --clients "${CLIENTS:-1,2,4,8}" --requests "${REQUESTS:-3}" --max-tokens "${MAX_TOKENS:-128}" \
        ${spy[@]+"${spy[@]}"} 2>&1 | grep --line-buffered -v '^|' | tee -a "$OUT/serve.txt"
    spy_report "$d"
done
kill "$smi" 2>/dev/null
if [ -n "${UNIFIED:-}" ] && ! late "${DEADLINE:-420}"; then
    log "throughput, llama-server with LLAMA_ARG_KV_UNIFIED=1"
    LLAMA_ARG_KV_UNIFIED=1 python3 "$here/benchmarks/serve_bench.py" throughput "${common[@]}" --out /tmp/sb/unified \
        --request-timeout "$rt" --clients "${CLIENTS:-1,2,4,8}" --requests "${REQUESTS:-3}" \
        --max-tokens "${MAX_TOKENS:-128}" 2>&1 | grep --line-buffered -v '^|' | tee -a "$OUT/serve.txt"
fi
if [ -z "${NO_AGENT:-}" ] && ! late "${DEADLINE:-420}"; then
    log "agent replay (ours, then llama-server; turns ${TURNS:-12}, restart before ${RESTART_AT:-7})"
    timeout $(( ${AGENT_BUDGET:-150} )) python3 "$here/benchmarks/serve_bench.py" agent "${common[@]}" --out /tmp/sb/agent \
        --state-dir /tmp/agent-state --turns "${TURNS:-12}" --restart-at "${RESTART_AT:-7}" 2>&1 | grep --line-buffered -v '^|' \
        | tee -a "$OUT/serve.txt"
else
    log "agent replay skipped (deadline)"
fi
if [ -n "${DECODE_BENCH:-}" ] && ! late "${DECODE_DEADLINE:-480}"; then
    # issue 12: 8B-shape decode, FA off, tg128 at 0/8K/32K, with 0023's fused attention off (the default) and on
    log "8B decode, FA off: f16, q4_0 and q8_0 with the separate ops and with 0023 (LLAMA_VQ_CUDA_FUSED_ATTN=1)"
    wait_model llama8b
    bin=$B/bin
    for cfg in "f16 f16 f16" "q4_0 q4_0 q4_0 LLAMA_VQ_CUDA_FUSED_ATTN=0" "q4_0-fused q4_0 q4_0 LLAMA_VQ_CUDA_FUSED_ATTN=1" \
            "q8_0 q8_0 q8_0 LLAMA_VQ_CUDA_FUSED_ATTN=0" "q8_0-fused q8_0 q8_0 LLAMA_VQ_CUDA_FUSED_ATTN=1"; do
        # shellcheck disable=SC2086
        late "${DECODE_DEADLINE:-480}" || bench_tg "$OUT/serve.txt" "$M/synth-llama8b.gguf" "-n 128 -d 0,8192,32768 -r ${REPS:-1}" $cfg
    done
fi
# at most 8 files come back: the tables and logs in serve.txt, the records as JSON, the servers' log tails
for d in split unified agent; do
    for f in /tmp/sb/$d/*.md; do [ -f "$f" ] && { echo "== $d: $(basename "$f")"; cat "$f"; } >> "$OUT/serve.txt"; done
    for f in /tmp/sb/$d/*.json; do [ -f "$f" ] && cp "$f" "$OUT/$d-$(basename "$f")"; done
done
tail -c 100000 /tmp/sb/split/ours.log > "$OUT/ours.log" 2>/dev/null
tail -c 30000 /tmp/sb/agent/agent-ours.log > "$OUT/agent-ours.log" 2>/dev/null
tail -c 100000 /tmp/sb/split/llama-server.log > "$OUT/llama-server.log" 2>/dev/null
log done
