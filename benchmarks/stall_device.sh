#!/usr/bin/env bash
# Issue 10's GPU-only stall at 8 clients, bisected in one call on a CUDA machine with no network: our engine driven
# in-process (benchmarks/engine_stall.py: serve_bench's prompts and client rounds 1/2/4/8, 4 requests of 128 tokens
# each) on the MiMo-shaped model (tools/synth_models.py mimo --preset attn), -np 8, q8_0 K / q4_0 V, FA off, -ngl 999,
# once per variant (environment switches, server flags), each in its own process; a stall prints the last batches and
# the stacks. Then, if time is left, test-backend-ops ATTN_DECODE_FUSED (patch 0023) against the CPU.
# Its first run (2026-12-01, H200) found the stall to need CUDA graphs and a quantized V's OUT_PROD on its GEMM path;
# patch 0024 keeps such graphs out of CUDA graphs, so with it every variant should now run through: a regression check.
# Here, once:
#   python3 benchmarks/carry.py .stage/carry --tokenizer-from <SmolLM2 GGUF>
#   .venv/bin/python benchmarks/pack_python.py .stage/py.tar.xz
# There (carry .stage):  CARRY=.stage/carry OUT=<results> bash benchmarks/stall_device.sh
# Env: VARIANTS (labels to run, default all, in order), DEADLINE (s after the start; no variant starts after it,
# default 470), STALL_S (10).
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CARRY=${CARRY:-$here/.stage/carry}
. "$here/benchmarks/device_common.sh"
txt=$OUT/stall.txt
engine_build stall "$txt" test-backend-ops
log built
wait_model mimo
export PYTHONUNBUFFERED=1
base="-c 4096 -np 8 -ctk q8_0 -ctv q4_0 -fa off -t 8 -ngl 999"

# hunt LABEL "EXTRA FLAGS" [ENV=VALUE ...]
hunt() {
    local label=$1 extra=$2 flags="$base $2"; shift 2
    case " ${VARIANTS:-$label} " in *" $label "*) ;; *) return ;; esac
    if late "${DEADLINE:-470}"; then log "skipped (deadline): $label"; return; fi
    env "$@" timeout 120 "$PY" "$here/benchmarks/engine_stall.py" "$M/synth-mimo.gguf" --flags "$flags" \
        --stall-s "${STALL_S:-10}" > "$OUT/hunt-$label.log" 2>&1
    local rc=$?
    log "$label ($* | $extra): rc $rc; $(grep -E '^clients' "$OUT/hunt-$label.log" | sed 's/ tok.s.*//' | tr '\n' ' ')"
    grep -A5 '^STALL' "$OUT/hunt-$label.log" | cut -c1-1500 | tee -a "$txt"
}
hunt base "" LLAMA_VQ_CUDA_FUSED_ATTN=0
hunt fused-attn "" LLAMA_VQ_CUDA_FUSED_ATTN=1
hunt no-graphs "" LLAMA_VQ_CUDA_FUSED_ATTN=0 GGML_CUDA_DISABLE_GRAPHS=1
hunt no-rot-fusion "" LLAMA_VQ_CUDA_FUSED_ATTN=0 LLAMA_VQ_CUDA_FUSE_ROTATION=0
hunt no-state-copies "--cache-ram 0 --ctx-checkpoints 0" LLAMA_VQ_CUDA_FUSED_ATTN=0
hunt v-f16 "-ctv f16" LLAMA_VQ_CUDA_FUSED_ATTN=0
hunt kv-f16 "-ctk f16 -ctv f16" LLAMA_VQ_CUDA_FUSED_ATTN=0

if ! late "${DEADLINE:-470}"; then
    log "test-backend-ops ATTN_DECODE_FUSED against the CPU (0023, fused)"
    LLAMA_VQ_CUDA_FUSED_ATTN=1 LLAMA_VQ_CUDA_FUSION_STATS=1 timeout 100 "$B/bin/test-backend-ops" test -j 8 -b CUDA0 -o ATTN_DECODE_FUSED \
        > "$OUT/tbo-fused.log" 2>&1
    log "rc $?: $(grep -E 'tests passed' "$OUT/tbo-fused.log" | tail -1); $(grep -c FAIL "$OUT/tbo-fused.log") FAIL; \
$(grep -o 'attention fusions run: .*' "$OUT/tbo-fused.log" | tail -1)"
    grep FAIL "$OUT/tbo-fused.log" | head -8 | cut -c1-300 | tee -a "$txt"
fi
log done
