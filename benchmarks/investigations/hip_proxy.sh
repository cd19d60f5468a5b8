#!/usr/bin/env bash
# The decode path an MI210 (HIP) user gets, estimated on an NVIDIA GPU configured as HIP runs it (issue 26, item 4),
# side by side with the NVIDIA default, in one run:
#   nvidia      the default here (fused decode attention with tensor-core V*P on sm_80+, TF32 GEMM, PDL)
#   hip         HIP as it ships: no fused attention (HIP's auto is off), OUT_PROD's F16 GEMM branch (HIP's only one),
#               no programmatic dependent launches (GGML_CUDA_PDL=0: HIP has none). OUT_PROD's vector-kernel column
#               bound (32 on HIP, 48/64 here) does not matter for one sequence's decode (at most GQA = 16 columns).
#   hip-fused   the fused decode attention's portable form (f32 V*P) with the rest as `hip`: what
#               LLAMA_VQ_CUDA_FUSED_ATTN=1 gives HIP
# For each: llama-bench tg64 and pp512, FA off, f16/f16 and the quantized pairs, on the 8B shape at depth 0/8K/32K and
# the MiMo attention shape at 0/64K; ratios to the same config's f16/f16. What a proxy cannot show: wave64 occupancy,
# LDS bank conflicts, rocBLAS instead of cuBLAS, MI210's bandwidth and clocks.
# Here:   python3 benchmarks/carry.py .stage/carry --tokenizer-from <SmolLM2 GGUF>
# There:  CARRY=.stage/carry OUT=<results> [BIN=<folder with llama-bench>] bash benchmarks/investigations/hip_proxy.sh
# Env: CONFIGS (default "nvidia hip hip-fused"), REPS (2), DEADLINE (s from the start; later runs are skipped, 540),
# MODELS ("llama8b mimo"), JSONL (the records, default /tmp/hip_proxy.jsonl: a later call on the same machine skips
# what it holds and adds the rest; copied into OUT).
set -u
. "$(dirname "${BASH_SOURCE[0]}")/../device_common.sh"
device_log hip-proxy "$OUT/hip_proxy.txt"
gen llama8b llama --preset llama-3.1-8b
gen mimo mimo --preset attn
if [ -z "${BIN:-}" ]; then
    log "build llama-bench (FA kernels off)"
    build_tools /tmp/hip-proxy-build off llama-bench
    BIN=/tmp/hip-proxy-build/build/bin
fi
bin=$BIN

env_of() {
    case "$1" in
        nvidia) echo "X=1" ;;
        hip) echo "LLAMA_VQ_CUDA_FUSED_ATTN=0 LLAMA_VQ_CUDA_FORCE_F16_GEMM=1 GGML_CUDA_PDL=0" ;;
        hip-fused) echo "LLAMA_VQ_CUDA_FUSED_ATTN=1 LLAMA_VQ_CUDA_FUSED_ATTN_MMA=0 LLAMA_VQ_CUDA_FORCE_F16_GEMM=1 LLAMA_VQ_CUDA_OUT_PROD_MMA=0 GGML_CUDA_PDL=0" ;;
    esac
}

jsonl=${JSONL:-/tmp/hip_proxy.jsonl}
touch "$jsonl"
for model in ${MODELS:-llama8b mimo}; do
    wait_model "$model"
    if [ "$model" = mimo ]; then depths=0,65536; pairs="f16,f16 q4_0,q4_0 q8_0,q4_1"; else depths=0,8192,32768; pairs="f16,f16 q4_0,q4_0 q8_0,q8_0"; fi
    for cfg in ${CONFIGS:-nvidia hip hip-fused}; do
        for pair in $pairs; do
            late "${DEADLINE:-540}" && { log "deadline: $model $cfg $pair and later skipped"; continue; }
            k=${pair%,*} v=${pair#*,}
            grep -q "\"type_k\": \"$k\", \"type_v\": \"$v\".*\"model\": \"$model\", \"config\": \"$cfg\"" "$jsonl" \
                && { log "$model $cfg $k/$v: already measured"; continue; }
            # shellcheck disable=SC2046  # env_of: several VAR=VALUE words
            env $(env_of "$cfg") "$bin/llama-bench" -m "$M/synth-$model.gguf" -ngl 99 -fa 0 -p 512 -n 64 -d "$depths" \
                -r "${REPS:-2}" -ctk "$k" -ctv "$v" -o jsonl 2> "$OUT/bench-$model-$cfg-$k-$v.log" \
                | python3 -c "import json, sys
for line in sys.stdin:
    r = json.loads(line); r.update(model='$model', config='$cfg'); print(json.dumps(r))" >> "$jsonl"
            log "$model $cfg $k/$v done"
        done
    done
done
cp "$jsonl" "$OUT/hip_proxy.jsonl"
python3 - "$jsonl" <<'EOF' | tee -a "$OUT/hip_proxy.txt"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def key(r):
    return (r["model"], r["config"], r["n_depth"], "tg" if r["n_gen"] else "pp")
base = {key(r): r["avg_ts"] for r in rows if r["type_k"] == "f16" and r["type_v"] == "f16"}
print("| model | config | K/V | test | " + " | ".join(["depth", "tok/s", "ratio to f16"]) + " |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    if r["type_k"] == "f16" and r["type_v"] == "f16":
        continue
    b = base.get(key(r))
    ratio = f"{r['avg_ts'] / b:.3f}" if b else "n/a"
    t = "tg64" if r["n_gen"] else "pp512"
    print(f"| {r['model']} | {r['config']} | {r['type_k']}/{r['type_v']} | {t} | {r['n_depth']} | {r['avg_ts']:.1f} | {ratio} |")
EOF
log done
