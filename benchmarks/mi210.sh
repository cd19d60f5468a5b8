#!/usr/bin/env bash
# For a user with an AMD MI210 (gfx90a) and ROCm >= 6.1: the figures this project could not measure without one.
# From the repository root:
#   bash benchmarks/mi210.sh [OUT]      # OUT default benchmarks/out/mi210-<UTC time>; send OUT/mi210.txt back
#                                       # (~1 h on an MI210, half of it the build)
# Steps, each logged into OUT/mi210.txt (the one report file; the other files in OUT are the logs behind it):
#   1. bare-metal build, the users' way: scripts/run.sh setup with LLAMA_VQ_BACKEND=hip and the tools (llama-bench,
#      llama-perplexity, test-backend-ops; flash attention's kernels included, for the FA-on references)
#   2. correctness on 64-wide wavefronts: test-backend-ops on the GPU against the CPU for every op our patches add or
#      change (quantized OUT_PROD, short-row K*Q, the rotation fusions with a proof that the fused kernel ran, the
#      fused decode attention in HIP's default f32 V*P form and as separate ops, quantized V without FA, copies)
#   3. speed: llama-bench, FA off, decode (tg) and prefill (pp512) on synthetic Llama-3.1-8B- (depths 0/8K/32K) and
#      MiMo-shaped (0/64K) models, f16/f16 and the quantized pairs, with HIP's default (the fused decode attention)
#      and with the separate ops (LLAMA_VQ_CUDA_FUSED_ATTN=0); ratios to f16/f16 of the same configuration; decode
#      attention's effective bandwidth (benchmarks/decode_bandwidth.py: the step time the depth adds over the K/V
#      bytes read) against the MI210's 1.6 TB/s (PEAK_TBS)
#   4. fidelity (docs/architecture.md, decision 8): KL divergence from f16/f16 (FA off) of quantized K/V with FA off
#      (llama-vq's path) and with FA on (upstream's reference path, FA_ON=1) and the FA on/off f16 floor, on KL_MODEL
#      (default SmolLM2: real weights), 512-token chunks of llama.cpp's own docs
#   5. two GPUs (opt-in, for a host with two MI210s: STEPS="2 3 4 5"; ~5 min): benchmarks/two_gpu.py on the MiMo-shaped
#      model, the deployment's layer split (-sm layer -ts 1,1) against one GPU (-sm none): q8_0 K / q4_1 V with FA off
#      and in the default mode (prefill), also with the experts in CPU memory (-ot exps=CPU); greedy text against the
#      f16 floor, decode and prefill at depth 0 and 64K, each GPU's KV and compute buffers, llama-vq-server on the
#      split (chat, stream, --state-dir across a restart, -sm row refused); its tables into the report, everything in
#      OUT/two-gpu. TWO_GPUS (0,1): the two GPUs' indices; TWO_GPU_ARGS: more two_gpu.py arguments
#   6. attention modes, side by side in one binary: for the 8B shape (0/8K/32K) and MiMo's (0/64K),
#      q4_0/q4_0 and q8_0/q4_1, prefill (pp512) and decode (tg64) with flash attention off (llama-vq's split
#      non-FA attention), on, in prefill mode (FA for prompts, llama-vq's for decode) and unbounded (the non-FA
#      attention without a scratch budget); prints which -fa to choose on this GPU (benchmarks/attn_modes.py) and
#      what -fa auto measures and picks there (llama-vq-tune-attn: llama_vq/attn_choice.py, the code a start runs); and
#      MiMo's split at 64K with V dequantized once per stream (LLAMA_VQ_ATTN_V_F16=1) beside its default
# Env: GPU_TARGETS (gfx90a), HIP_VISIBLE_DEVICES (0: one GPU), REPS (llama-bench repetitions, 2), TG (decode tokens,
#   64), DEPTHS_8B (0,8192,32768), DEPTHS_MIMO (0,65536), PAIRS_8B ("f16,f16 q4_0,q4_0 q8_0,q8_0": K,V pairs, f16
#   first), PAIRS_MIMO ("f16,f16 q4_0,q4_0 q8_0,q4_1"), KL_MODEL, KL_CHUNKS (8), STEPS ("2 3 4 6"), DEADLINE (s after
#   the start after which no further benchmark starts; default none).
# Tried on an NVIDIA GPU with the HIP path's settings, so that the first MI210 run does not fail on a
# typo: PROXY=cuda BIN=<folder with llama-bench, test-backend-ops, llama-perplexity> bash benchmarks/mi210.sh OUT
#   (no build; CUDA0 in place of ROCm0; LLAMA_VQ_CUDA_FUSED_ATTN=1 LLAMA_VQ_CUDA_FUSED_ATTN_MMA=0 (the f32 V*P, HIP's
#   form) LLAMA_VQ_CUDA_FORCE_F16_GEMM=1 (HIP's only prefill branch) LLAMA_VQ_CUDA_OUT_PROD_MMA=0 (HIP has no tensor-core
#   V*P: mma.sync) GGML_CUDA_PDL=0 (HIP has no PDL) exported;
#   FA_ON=0 unless the tools have FA kernels; the synthetic models' tokenizer from VOCAB; DEV (CUDA0); HIP_PATH=0 runs
#   the same with the NVIDIA default's settings instead)
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${1:-benchmarks/out/mi210-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
t0=$(date +%s)
report=$OUT/mi210.txt
log() { echo "[mi210 $(( $(date +%s) - t0 ))s] $*" | tee -a "$report"; }
late() { [ -n "${DEADLINE:-}" ] && [ $(( $(date +%s) - t0 )) -gt "$DEADLINE" ]; }
steps=" ${STEPS:-2 3 4 6} "
fail=0
py=${PY:-.venv/bin/python}

if [ "${PROXY:-}" = cuda ]; then
    : "${BIN:?PROXY=cuda needs BIN, a folder with llama-bench, test-backend-ops and llama-perplexity}"
    dev=${DEV:-CUDA0}
    export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
    fa_on=${FA_ON:-0}
    if [ "${HIP_PATH:-1}" = 1 ]; then
        export LLAMA_VQ_CUDA_FUSED_ATTN=1 LLAMA_VQ_CUDA_FUSED_ATTN_MMA=0 LLAMA_VQ_CUDA_FORCE_F16_GEMM=1 \
            LLAMA_VQ_CUDA_OUT_PROD_MMA=0 GGML_CUDA_PDL=0
        log "PROXY=cuda: an NVIDIA GPU with the HIP path's settings, not a gfx90a result"
        log "env: LLAMA_VQ_CUDA_FUSED_ATTN=1 LLAMA_VQ_CUDA_FUSED_ATTN_MMA=0 LLAMA_VQ_CUDA_FORCE_F16_GEMM=1 LLAMA_VQ_CUDA_OUT_PROD_MMA=0 GGML_CUDA_PDL=0"
    else
        log "PROXY=cuda HIP_PATH=0: the NVIDIA default (fused attention with tensor-core V*P, TF32 GEMM, PDL)"
    fi
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/machine.txt" 2>&1
    bin=$BIN
else
    dev=ROCm0
    export HIP_VISIBLE_DEVICES=${HIP_VISIBLE_DEVICES:-0} GPU_TARGETS=${GPU_TARGETS:-gfx90a}
    fa_on=${FA_ON:-1}
    { rocm-smi --showproductname --showmeminfo vram 2>&1; rocminfo 2>&1 | grep -E 'Marketing Name|gfx|Compute Unit'; } \
        > "$OUT/machine.txt"
    if [ -n "${BIN:-}" ]; then
        bin=$BIN
    else
        log "1. build (LLAMA_VQ_BACKEND=hip GPU_TARGETS=$GPU_TARGETS, tools on)"
        LLAMA_VQ_BACKEND=hip LLAMA_VQ_BUILD_TOOLS=ON bash scripts/run.sh setup > "$OUT/build.log" 2>&1 \
            || { tail -40 "$OUT/build.log"; log "build failed: $OUT/build.log"; exit 1; }
        bin=llama_vq/bin
    fi
    "$py" -c 'import json, llama_vq; print(json.dumps(llama_vq.build_info().as_dict(), default=str))' >> "$report" 2>&1
fi
cat "$OUT/machine.txt" >> "$report"
for tool in test-backend-ops llama-bench llama-perplexity; do
    [ -x "$bin/$tool" ] || { log "missing $bin/$tool"; exit 1; }
done
# the synthetic models' tokenizer (and KL's default model): SmolLM2, fetched by the setup
vocab=${VOCAB:-}
if [ -z "$vocab" ] || [ -z "${KL_MODEL:-}" ]; then
    smollm2=$("$py" -c 'from llama_vq import models; print(models.default_model_path(fetch=False))' 2>/dev/null) \
        || smollm2=
    vocab=${vocab:-$smollm2}
    KL_MODEL=${KL_MODEL:-$smollm2}
fi
models=${MODEL_DIR:-$OUT/models}
mkdir -p "$models"
# gen NAME ARGS...: a synthetic model, in the background from the start (tools/synth_models.py; never committed)
gen() {
    local name=$1; shift
    [ -f "$models/synth-$name.gguf" ] && return 0
    ( nice -n 5 "$py" tools/synth_models.py "$@" "$models/tmp-$name.gguf" --tokenizer-from "$vocab" \
        > "$OUT/gen-$name.log" 2>&1 && mv "$models/tmp-$name.gguf" "$models/synth-$name.gguf" ) &
}
[[ $steps == *" 3 "* || $steps == *" 6 "* ]] && gen llama8b llama --preset llama-3.1-8b
[[ $steps == *" 3 "* || $steps == *" 5 "* || $steps == *" 6 "* ]] && gen mimo mimo --preset attn
# generated NAME: whether gen's model NAME is complete (waits for it; logs and returns 1 if its generation failed)
generated() {
    while [ ! -f "$models/synth-$1.gguf" ]; do
        if ! pgrep -f "tmp-$1.gguf" > /dev/null; then log "model $1: generation failed"; cat "$OUT/gen-$1.log"; return 1; fi
        sleep 2
    done
}

if [[ $steps == *" 2 "* ]]; then
    log "2. test-backend-ops on $dev against the CPU"
    # tbo NAME [ENV=VALUE ...] -- ARGS...: one test-backend-ops run, its summary line (and failures) in the report
    tbo() {
        local name=$1 envs=(); shift
        while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
        shift
        env ${envs[@]+"${envs[@]}"} LLAMA_VQ_CUDA_FUSION_STATS=1 "$bin/test-backend-ops" test -b "$dev" "$@" \
            > "$OUT/tbo-$name.log" 2>&1 || fail=1
        local summary
        summary=$(grep -E "tests passed" "$OUT/tbo-$name.log" | tail -1)
        [ -n "$summary" ] || { summary="no summary (crashed?): $(tail -2 "$OUT/tbo-$name.log" | tr '\n' ' ')"; fail=1; }
        log "$name: $summary"
        grep -E "FAIL" "$OUT/tbo-$name.log" | head -5 | tee -a "$report"
    }
    # ran NAME KIND: the fusion counts the run printed at exit (LLAMA_VQ_CUDA_FUSION_STATS=1: "llama-vq: rotation
    # fusions run: set_rows=N ..." / "attention fusions run: attn=N ...") show that KIND's fused kernel ran: a test
    # passes whether it ran or not
    ran() {
        local n
        n=$(grep -hE "llama-vq: (rotation|attention) fusions run:" "$OUT/tbo-$1.log" | grep -oE "(^| )$2=[0-9]+" \
            | cut -d= -f2 | awk '{ s += $1 } END { print s + 0 }')
        if [ "$n" -gt 0 ]; then log "$1: the fused kernel ran ($2: $n)"; else log "$1: the fused kernel never ran ($2)"; fail=1; fi
    }
    tbo out-prod -- -o OUT_PROD
    if [ -n "${LLAMA_VQ_CUDA_FORCE_F16_GEMM:-}" ]; then  # PROXY=cuda: the HIP prefill branch must have run
        grep -q "LLAMA_VQ_CUDA_FORCE_F16_GEMM=1: F16 GEMM" "$OUT/tbo-out-prod.log" \
            && log "out-prod: the forced F16 GEMM branch (HIP's) ran" \
            || { log "out-prod: the forced F16 GEMM branch never ran"; fail=1; }
    fi
    tbo mul-mat-kq -- -o MUL_MAT -p "type_k="
    tbo attn-v-quant -- -o ATTN_V_QUANT
    for op in HADAMARD_SET_ROWS ROPE_HADAMARD_SET_ROWS CONT_HADAMARD HADAMARD_KQ; do
        tbo "$op" -- -o "$op"
    done
    ran HADAMARD_SET_ROWS set_rows
    ran ROPE_HADAMARD_SET_ROWS rope
    ran CONT_HADAMARD cont
    ran HADAMARD_KQ kq
    tbo rotations-unfused LLAMA_VQ_CUDA_FUSE_ROTATION=0 -- -o HADAMARD_SET_ROWS
    # the fused decode attention as HIP runs it by default (f32 V*P; =1: every chain it supports, not only
    # single-token decode), then the same graphs as separate ops
    tbo attn-fused LLAMA_VQ_CUDA_FUSED_ATTN=1 -- -o ATTN_DECODE_FUSED
    ran attn-fused attn
    ran attn-fused fold  # the combine folded into the kernel (few splits)
    ran attn-fused win   # K or V rows staged as 16-byte windows (rows not a multiple of 16 bytes)
    tbo attn-separate LLAMA_VQ_CUDA_FUSED_ATTN=0 -- -o ATTN_DECODE_FUSED
    for op in CPY SET_ROWS; do tbo "$op" -- -o "$op"; done
fi

if [[ $steps == *" 3 "* ]]; then
    log "3. speed: llama-bench, FA off, tg${TG:-64} and pp512, ratios to f16/f16"
    jsonl=$OUT/bench.jsonl
    for model in llama8b mimo; do
        generated "$model" || { fail=1; continue; }
        if [ "$model" = mimo ]; then depths=${DEPTHS_MIMO:-0,65536}; pairs=${PAIRS_MIMO:-f16,f16 q4_0,q4_0 q8_0,q4_1}
        else depths=${DEPTHS_8B:-0,8192,32768}; pairs=${PAIRS_8B:-f16,f16 q4_0,q4_0 q8_0,q8_0}; fi
        for cfg in default separate; do
            for pair in $pairs; do
                late && { log "deadline: $model $cfg $pair and later skipped"; continue; }
                k=${pair%,*} v=${pair#*,}
                fused=$([ "$cfg" = separate ] && echo 0 || echo "${LLAMA_VQ_CUDA_FUSED_ATTN:-}")
                LLAMA_VQ_CUDA_FUSED_ATTN=$fused "$bin/llama-bench" -m "$models/synth-$model.gguf" -ngl 99 -fa 0 \
                    -p 512 -n "${TG:-64}" -d "$depths" -r "${REPS:-2}" -ctk "$k" -ctv "$v" -o jsonl \
                    2> "$OUT/bench-$model-$cfg-$k-$v.log" \
                    | "$py" -c "import json, sys
for line in sys.stdin:
    r = json.loads(line); r.update(model='$model', config='$cfg'); print(json.dumps(r))" >> "$jsonl"
                [ "${PIPESTATUS[0]}" = 0 ] || { log "$model $cfg $k/$v: llama-bench failed"; fail=1; }
            done
        done
    done
    [ -s "$jsonl" ] && "$py" - "$jsonl" <<'EOF' | tee -a "$report"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
key = lambda r: (r["model"], r["config"], r["n_depth"], "tg" if r["n_gen"] else "pp")
base = {key(r): r["avg_ts"] for r in rows if r["type_k"] == "f16" and r["type_v"] == "f16"}
print("| model | config | K/V | test | depth | tok/s | ratio to f16 |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    b = base.get(key(r))
    ratio = f"{r['avg_ts'] / b:.3f}" if b else "n/a"
    t = f"tg{r['n_gen']}" if r["n_gen"] else f"pp{r['n_prompt']}"
    print(f"| {r['model']} | {r['config']} | {r['type_k']}/{r['type_v']} | {t} | {r['n_depth']} | {r['avg_ts']:.1f} | {ratio} |")
EOF
    # decode attention's effective bandwidth (the figure measured on NVIDIA GPUs: benchmarks/RESULTS.md), against the
    # MI210's 1.6 TB/s
    [ -s "$jsonl" ] && "$py" benchmarks/decode_bandwidth.py "$jsonl" --peak-tbs "${PEAK_TBS:-1.6}" | tee -a "$report"
fi

if [[ $steps == *" 4 "* ]]; then
    log "4. fidelity: KL from f16/f16 (FA off) on $(basename "${KL_MODEL:-none}"), ${KL_CHUNKS:-8} x 512 tokens"
    if [ -z "${KL_MODEL:-}" ] || [ ! -f "$KL_MODEL" ]; then
        log "no KL_MODEL (SmolLM2 not found): step 4 skipped"; fail=1
    else
        cat vendor/llama.cpp/README.md vendor/llama.cpp/docs/*.md 2> /dev/null > "$OUT/ppl-text.txt"
        [ -s "$OUT/ppl-text.txt" ] || cat "${TEXT_FROM:-.}"/*.md > "$OUT/ppl-text.txt"
        ppl() { # LABEL ARGS...
            local label=$1; shift
            "$bin/llama-perplexity" -m "$KL_MODEL" -f "$OUT/ppl-text.txt" -c 512 --chunks "${KL_CHUNKS:-8}" -ngl 99 "$@" \
                > "$OUT/ppl-$label.log" 2>&1 || { log "$label: failed ($(tail -1 "$OUT/ppl-$label.log"))"; fail=1; return; }
            grep -E "^(Mean +KLD|Same top p|Mean PPL\(Q\)/PPL\(base\))" "$OUT/ppl-$label.log" | sed "s/^/$label: /" \
                | tee -a "$report"
        }
        base=$OUT/kld-base-f16-fa-off
        ppl base -fa off --kl-divergence-base "$base"
        [ "$fa_on" = 1 ] && ppl f16-fa-on -fa on --kl-divergence-base "$base" --kl-divergence
        for kv in "q8_0 q8_0" "q4_0 q4_0" "q8_0 q4_1" "q8_0 q4_0"; do
            set -- $kv
            ppl "$1-$2-fa-off" -fa off -ctk "$1" -ctv "$2" --kl-divergence-base "$base" --kl-divergence
            [ "$fa_on" = 1 ] && ppl "$1-$2-fa-on" -fa on -ctk "$1" -ctv "$2" --kl-divergence-base "$base" --kl-divergence
        done
        rm -f "$base"
    fi
fi
if [[ $steps == *" 5 "* ]]; then
    log "5. two GPUs (${TWO_GPUS:-0,1}): MiMo's layer split against one GPU (benchmarks/two_gpu.py)"
    if generated mimo; then
        # the HIP path is what runs here (or PROXY=cuda exported its settings above): no separate hip part; no floor
        # without flash attention's kernels (then greedy agreement is judged identical or not)
        parts=floor,main,server,cpumoe
        [ "$fa_on" = 1 ] || parts=main,server,cpumoe
        CUDA_VISIBLE_DEVICES=${TWO_GPUS:-0,1} HIP_VISIBLE_DEVICES=${TWO_GPUS:-0,1} "$py" benchmarks/two_gpu.py \
            --bin "$bin" --model "$models/synth-mimo.gguf" --out "$OUT/two-gpu" --py "$py" --parts "$parts" \
            --deadline 0 ${TWO_GPU_ARGS:-} > "$OUT/two-gpu.log" 2>&1 || fail=1
        if [ -f "$OUT/two-gpu/two_gpu.md" ]; then cat "$OUT/two-gpu/two_gpu.md" >> "$report"
        else log "two_gpu.py wrote no report: $(tail -3 "$OUT/two-gpu.log" | tr '\n' ' ')"; fail=1; fi
        tail -1 "$OUT/two-gpu.log" | tee -a "$report"
    else
        fail=1
    fi
fi
if [[ $steps == *" 6 "* ]]; then
    log "6. attention modes: flash attention's prefill against llama-vq's split non-FA prefill, decode both ways"
    if [ "$fa_on" != 1 ]; then
        log "step 6 needs flash attention's kernels (FA_ON=1): skipped"; fail=1
    else
        for m in "llama8b q4_0 q4_0 0,8192,32768" "mimo q8_0 q4_1 0,65536"; do
            set -- $m
            generated "$1" || { fail=1; continue; }
            "$py" benchmarks/attn_modes.py --bin "$bin" --model "$models/synth-$1.gguf" --label "mi210-$1" \
                --ctk "$2" --ctv "$3" --depths "$4" --reps 1 --out "$OUT" > "$OUT/attn-modes-$1.out" 2>&1 || fail=1
            if [ -f "$OUT/attn-modes-mi210-$1.md" ]; then cat "$OUT/attn-modes-mi210-$1.md" >> "$report"
            else log "attn_modes.py wrote no table for $1: $(tail -3 "$OUT/attn-modes-$1.out" | tr '\n' ' ')"; fail=1; fi
            # what -fa auto measures and picks on this GPU (llama-vq-tune-attn, the code a start runs), at the
            # table's deepest depth: its pick should be the table's best mode
            d=${4##*,}
            log "-fa auto's own measurement for $1 ($2/$3, depth $d):"
            LLAMA_VQ_ATTN_CACHE="$OUT/attn-choice.json" LLAMA_VQ_ATTN_TUNE_DEPTH="$d" "$py" -m llama_vq.tune_attn \
                -m "$models/synth-$1.gguf" -ctk "$2" -ctv "$3" -ub 512 -c $(( 2 * d )) --force \
                >> "$report" 2> "$OUT/tune-attn-$1.out" || { log "llama-vq-tune-attn failed for $1"; fail=1; }
        done
        # the split with V dequantized once per stream (LLAMA_VQ_ATTN_V_F16=1; off by default: +5 % prefill on an
        # H100 for +233 MiB of compute buffer at 128K, ub 2048): set its pp512 at 64K beside the table's "off" row
        if generated mimo; then
            "$py" benchmarks/attn_modes.py --bin "$bin" --model "$models/synth-mimo.gguf" --label mi210-mimo-v-once \
                --ctk q8_0 --ctv q4_1 --depths 65536 --modes off --tg 0 --reps 1 --env LLAMA_VQ_ATTN_V_F16=1 \
                --out "$OUT" > "$OUT/attn-modes-mimo-v-once.out" 2>&1 || fail=1
            [ -f "$OUT/attn-modes-mi210-mimo-v-once.md" ] && cat "$OUT/attn-modes-mi210-mimo-v-once.md" >> "$report"
        fi
    fi
fi
[ "$fail" = 0 ] && log "done: $OUT" || log "done with failures: $OUT"
exit "$fail"
