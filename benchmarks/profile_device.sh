#!/usr/bin/env bash
# Issue 10's 4-client target on the GPU, diagnosed in one call on a CUDA machine with no network: where the engine's
# time goes at 1/2/4/8 clients (benchmarks/engine_profile.py: the engine in-process, serve_bench's prompts and client
# rounds, its llama.cpp calls and batch-loop phases timed) on the MiMo-shaped model (tools/synth_models.py mimo
# --preset attn), -np 8, q8_0 K / q4_0 V, FA off, -ngl 999; once per variant (the KV layout, CUDA graphs), each in its
# own process, after a check of the state reads (state_read_check.py; skipped with NO_STATE_CHECK=1). The switches
# this script once moved (OUT_PROD's switch point, the stall's bisection: old patches 0025, 0027, 0028) served their
# measurements (RESULTS.md, engine section) and are gone (docs/knobs.md).
# Here, once:
#   python3 benchmarks/carry.py .stage/carry --tokenizer-from <SmolLM2 GGUF>
#   .venv/bin/python benchmarks/pack_python.py .stage/py.tar.xz
# There (carry .stage):  CARRY=.stage/carry OUT=<results> bash benchmarks/profile_device.sh
# Env: VARIANTS (labels to run, default all, in order), DEADLINE (s after the start; no variant starts after it,
# default 300), BUILD_DIR (/tmp/serve-build), PERF=1 (V*P op timings at MiMo's full layers around the vector/GEMM
# switch point, and OUT_PROD's test against the CPU).
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CARRY=${CARRY:-$here/.stage/carry}
. "$here/benchmarks/device_common.sh"
txt=$OUT/profile.txt
engine_build profile "$txt" llama-server test-backend-ops
log built
wait_model mimo
export PYTHONUNBUFFERED=1
base="-c 4096 -np 8 -ctk q8_0 -ctv q4_0 -fa off -t 8 -ngl 999"

# the state reads of patches 0021 + 0026 (grouped, into pinned memory) against range by range: same bytes, times
if [ -z "${NO_STATE_CHECK:-}" ]; then
    log "state reads, grouped against range by range (benchmarks/state_read_check.py)"
    timeout 120 "$PY" "$here/benchmarks/state_read_check.py" "$M/synth-mimo.gguf" --flags "$base" 2>&1 \
        | grep -E '^(after|same|STATES|  )' | tee -a "$txt"
fi

# profile LABEL "EXTRA FLAGS" [ENV=VALUE ...]
profile() {
    local label=$1 extra=$2; shift 2
    case " ${VARIANTS:-$label} " in *" $label "*) ;; *) return ;; esac
    if late "${DEADLINE:-300}"; then log "skipped (deadline): $label"; return; fi
    log "$label ($* | $extra)"
    env "$@" timeout 120 "$PY" "$here/benchmarks/engine_profile.py" "$M/synth-mimo.gguf" --flags "$base $extra" \
        2>&1 | grep -E '^(clients|  )' | tee -a "$txt"
}
profile default ""
profile split "--no-kv-unified"
profile no-graphs "" GGML_CUDA_DISABLE_GRAPHS=1

# PERF=1: V*P at MiMo's full-attention layers (4 KV heads, GQA 16) for 2-8 sequences, 1K-64K cells (old patch 0028's
# perf cases), then OUT_PROD against the CPU
if [ -n "${PERF:-}" ] && ! late "${DEADLINE:-300}"; then
    log "test-backend-ops perf OUT_PROD, MiMo full layers"
    timeout 150 "$B/bin/test-backend-ops" perf -b CUDA0 -o OUT_PROD -p "n_head_kv=4,gqa=16" 2>&1 \
        | grep -E "^ +OUT_PROD" | sed -E 's/ +/ /g' | tee -a "$txt"
    log "test-backend-ops OUT_PROD against the CPU"
    timeout 120 "$B/bin/test-backend-ops" test -j 8 -b CUDA0 -o OUT_PROD > /tmp/tbo-out-prod-default.log 2>&1
    log "rc $?: $(grep -E 'tests passed' /tmp/tbo-out-prod-default.log | tail -1)"
fi

log done
