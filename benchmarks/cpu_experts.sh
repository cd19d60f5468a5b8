#!/usr/bin/env bash
# The CPU-work benchmark of the MiMo deployment's shape: llama-vq-server against llama-server
# built from the same tree, same flags, both up at once, in alternating rounds (benchmarks/serve_bench.py
# throughput --rounds), with the routed experts in CPU memory (-ngl 999 -ot exps=CPU) and -t = every core:
# tok/s per client count, the ratio ours / llama-server (median of the rounds' paired ratios), and each server's
# compute threads (voluntary context switches per generated token each, busy share of the wall time).
#
# The model: tools/synth_models.py mimo --preset cpu-moe (MiMo-V2-Flash's attention shape, 48 layers, with 64
# routed experts of 512, 8 used, Q8_0: 25.3 GB, of which 20.1 GB experts), generated into MODEL_DIR once and
# reused by later calls; q8_0 K / q4_1 V, flash attention off.
#
# On the GPU machine (our build's llama_vq importable by PY, llama-server from the same build in BIN):
#   OUT=<results> BIN=<build>/bin PY=<python> bash benchmarks/cpu_experts.sh
# Check on a CPU machine with a small model (no GPU: NGL empty, 4 layers):
#   OUT=/tmp/ce BIN=build/server-bench/bin PY=.venv/bin/python NGL= N_LAYER=4 CLIENTS=1,4 ROUNDS=2 MAX_TOKENS=16 \
#       bash benchmarks/cpu_experts.sh
# Env: OUT (required), BIN (the folder of llama-server) or LLAMA_SERVER (its path), PY (runs llama-vq-server and,
# unless BENCH_PY says otherwise, serve_bench.py and the model's generator: needs httpx, numpy and gguf), MODEL (an
# existing GGUF instead of the generated one), MODEL_DIR (/tmp/models), PRESET (cpu-moe), N_LAYER (the preset's),
# TOKENIZER (a GGUF to copy the tokenizer from; default SmolLM2's), NGL (999; empty: no -ngl), THREADS (all: every
# core this process may use), CLIENTS (1,4,8), ROUNDS (3), REQUESTS (2 per client), MAX_TOKENS (64), CTX (4096),
# CTK (q8_0), CTV (q4_1), EXTRA (more flags for both servers), REQUEST_TIMEOUT (s, 300), GEN_ONLY=1 (generate the
# model and stop: a call of its own where a call's time is short; the next call finds it in MODEL_DIR).
# Writes OUT/cpu_experts.txt (machine, command, the rows as they run, the tables), OUT/throughput.json and .md, and
# the tails of both servers' logs. Takes (GPU machine, 16 cores) ~2 min to generate the model the first time, ~1
# min to load both servers, ~4 min for 3 rounds of 1/4/8 clients.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
: "${OUT:?set OUT to the results folder}"
PY=${PY:-python3}
BENCH_PY=${BENCH_PY:-$PY}
MODEL_DIR=${MODEL_DIR:-/tmp/models}
PRESET=${PRESET:-cpu-moe}
NGL=${NGL-999}
mkdir -p "$OUT" "$MODEL_DIR"
txt=$OUT/cpu_experts.txt
: > "$txt"
say() { echo "[cpu_experts $SECONDS s] $*" | tee -a "$txt"; }

model=${MODEL:-$MODEL_DIR/synth-$PRESET${N_LAYER:+-$N_LAYER}.gguf}
if [ ! -f "$model" ]; then
    say "generating $model (tools/synth_models.py mimo --preset $PRESET${N_LAYER:+ --n-layer $N_LAYER})"
    "$BENCH_PY" "$here/tools/synth_models.py" mimo "$model.tmp" --preset "$PRESET" ${N_LAYER:+--n-layer "$N_LAYER"} \
        ${TOKENIZER:+--tokenizer-from "$TOKENIZER"} >> "$txt" 2>&1 || { say "generation failed"; tail -20 "$txt"; exit 1; }
    mv "$model.tmp" "$model"
fi
say "model $model: $(du -h "$model" | cut -f1)"
[ -z "${GEN_ONLY:-}" ] || exit 0
LLAMA_SERVER=${LLAMA_SERVER:-${BIN:?set BIN to the folder of llama-server (or LLAMA_SERVER to its path)}/llama-server}
[ -x "$LLAMA_SERVER" ] || { say "no llama-server at $LLAMA_SERVER"; exit 1; }

{
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "commit: $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) CPUs usable," \
        "$(grep -m1 -o 'avx512f' /proc/cpuinfo || grep -m1 -o 'avx2' /proc/cpuinfo || echo 'no AVX2')"
    echo "memory: $(grep MemTotal /proc/meminfo | tr -s ' ' | cut -d' ' -f2-)"
    command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
    "$PY" -c "import llama_vq; print('llama_vq:', llama_vq.build_info())"
} 2>&1 | tee -a "$txt"

extra="-ot exps=CPU${NGL:+ -ngl $NGL}${EXTRA:+ $EXTRA}"
cmd=("$BENCH_PY" "$here/benchmarks/serve_bench.py" throughput --model "$model" --llama-server "$LLAMA_SERVER"
     --python "$PY" --threads "${THREADS:-all}" --ctk "${CTK:-q8_0}" --ctv "${CTV:-q4_1}" --fa off
     --ctx "${CTX:-4096}" --clients "${CLIENTS:-1,4,8}" --rounds "${ROUNDS:-3}" --requests "${REQUESTS:-2}"
     --max-tokens "${MAX_TOKENS:-64}" --extra "$extra" --request-timeout "${REQUEST_TIMEOUT:-300}"
     --out "$OUT/bench")
say "command: ${cmd[*]}"
export PYTHONUNBUFFERED=1
set +e
"${cmd[@]}" 2>&1 | grep --line-buffered -v '^|' | tee -a "$txt"
rc=${PIPESTATUS[0]}
set -e
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$txt"
if [ -f "$OUT/bench/throughput.json" ]; then
    cp "$OUT/bench/throughput.json" "$OUT/bench/throughput.md" "$OUT/"
    cat "$OUT/throughput.md" >> "$txt"
    "$BENCH_PY" "$here/benchmarks/serve_bench.py" summary "$OUT/throughput.json" --ratio-clients 4 >> "$txt" 2>&1 || true
fi
for k in ours llama-server; do
    [ -f "$OUT/bench/$k.log" ] && tail -c 60000 "$OUT/bench/$k.log" > "$OUT/$k.log"
done
say "done (serve_bench rc $rc)"
exit "$rc"
