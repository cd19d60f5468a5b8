#!/usr/bin/env bash
# Issue 10's 4-client target on the GPU, diagnosed in one call on a CUDA machine with no network: where the engine's
# time goes at 1/2/4/8 clients (benchmarks/engine_profile.py: the engine in-process, serve_bench's prompts and client
# rounds, its llama.cpp calls and batch-loop phases timed) on the MiMo-shaped model (tools/synth_models.py mimo
# --preset attn), -np 8, q8_0 K / q4_0 V, FA off, -ngl 999; once per variant (OUT_PROD's vector/GEMM switch point of
# patch 0025, the KV layout), each in its own process, after a check of the state reads (state_read_check.py; skipped
# with NO_STATE_CHECK=1); then test-backend-ops OUT_PROD against the CPU with the switch point moved, and (time left)
# the stall's bisection with 0024's guard lifted (LLAMA_VQ_CUDA_GRAPHS_QGEMM=1).
# Here, once:
#   python3 benchmarks/carry.py .stage/carry --tokenizer-from <SmolLM2 GGUF>
#   .venv/bin/python benchmarks/pack_python.py .stage/py.tar.xz
# There (carry .stage):  CARRY=.stage/carry OUT=<results> bash benchmarks/profile_device.sh
# Env: VARIANTS (labels to run, default all, in order), DEADLINE (s after the start; no variant starts after it,
# default 300), STALL_VARIANTS (labels of the stall hunts, default none), BUILD_DIR (/tmp/serve-build), PERF=1 (V*P op
# timings at MiMo's full layers around the vector/GEMM switch point, and OUT_PROD's test with the default switch).
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
profile cols128 "" LLAMA_VQ_CUDA_OUT_PROD_MAX_COLS=128
profile cols64 "" LLAMA_VQ_CUDA_OUT_PROD_MAX_COLS=64
profile split "--no-kv-unified"
profile no-graphs "" GGML_CUDA_DISABLE_GRAPHS=1

if ! late "${DEADLINE:-300}"; then
    log "test-backend-ops OUT_PROD against the CPU, the vector kernel up to 128 columns"
    LLAMA_VQ_CUDA_OUT_PROD_MAX_COLS=128 timeout 120 "$B/bin/test-backend-ops" test -j 8 -b CUDA0 -o OUT_PROD \
        > /tmp/tbo-out-prod.log 2>&1
    log "rc $?: $(grep -E 'tests passed' /tmp/tbo-out-prod.log | tail -1); $(grep -c FAIL /tmp/tbo-out-prod.log) FAIL"
    grep FAIL /tmp/tbo-out-prod.log | head -8 | cut -c1-300 | tee -a "$txt"
fi

# PERF=1: V*P at MiMo's full-attention layers (4 KV heads, GQA 16) for 2-8 sequences, 1K-64K cells (patch 0028's
# perf cases): with the vector kernel up to 32 columns (the GEMM beyond), and up to 128 (the vector kernel always)
if [ -n "${PERF:-}" ] && ! late "${DEADLINE:-300}"; then
    for cols in 32 128; do
        log "test-backend-ops perf OUT_PROD, MiMo full layers, LLAMA_VQ_CUDA_OUT_PROD_MAX_COLS=$cols"
        LLAMA_VQ_CUDA_OUT_PROD_MAX_COLS=$cols timeout 150 "$B/bin/test-backend-ops" perf -b CUDA0 -o OUT_PROD \
            -p "n_head_kv=4,gqa=16" 2>&1 | grep -E "^ +OUT_PROD" | sed -E 's/ +/ /g' | tee -a "$txt"
    done
    log "test-backend-ops OUT_PROD against the CPU, the default switch point"
    timeout 120 "$B/bin/test-backend-ops" test -j 8 -b CUDA0 -o OUT_PROD > /tmp/tbo-out-prod-default.log 2>&1
    log "rc $?: $(grep -E 'tests passed' /tmp/tbo-out-prod-default.log | tail -1)"
fi

# the stall (RESULTS.md, engine section) with 0024's guard lifted: which part of the GEMM path hangs in a CUDA graph
hunt() {
    local label=$1; shift
    case " ${STALL_VARIANTS:-} " in *" $label "*) ;; *) return ;; esac
    if late "${DEADLINE:-300}"; then log "skipped (deadline): stall $label"; return; fi
    env LLAMA_VQ_CUDA_GRAPHS_QGEMM=1 "$@" timeout 90 "$PY" "$here/benchmarks/engine_stall.py" "$M/synth-mimo.gguf" \
        --flags "$base" --stall-s 8 > "/tmp/hunt-$label.log" 2>&1
    log "stall $label ($*): rc $?; $(grep -E '^clients' "/tmp/hunt-$label.log" | sed 's/ tok.s.*//' | tr '\n' ' ')"
    grep -A3 '^STALL' "/tmp/hunt-$label.log" | cut -c1-600 | tee -a "$txt"
}
hunt qgemm
hunt qgemm-f16 LLAMA_VQ_CUDA_FORCE_F16_GEMM=1
hunt qgemm-copy LLAMA_VQ_CUDA_OUT_PROD_COPY_SRC1=1  # the F32 branch with the softmax copied, not read in place
hunt qgemm-fp32 LLAMA_VQ_CUDA_OUT_PROD_GEMM_FP32=1  # the F32 branch without TF32 (patch 0028)
log done
