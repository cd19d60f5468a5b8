#!/usr/bin/env bash
# Diagnostic, one call on a CUDA machine: how much of the quantized caches' decode cost is llama.cpp's Hadamard
# rotation of quantized K/V (on by default; LLAMA_ATTN_ROT_DISABLE=1 turns it off) rather than the attention kernels.
# An 8-layer Llama-3.1-8B-shaped model (generated there), FA off, tg64 at depths 0 and 8192, -r 3; then the OUT_PROD
# checks against the CPU. Here: python3 benchmarks/carry.py .bench-carry ...; there: OUT=<folder> bash benchmarks/rotation_check.sh
set -u
. "$(dirname "${BASH_SOURCE[0]}")/device_common.sh"
t0=$(date +%s); log() { echo "[rot $(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/rot.txt"; }
gen llama8b-l8 llama --preset llama-3.1-8b --n-layer 8
log build
build_tools /tmp/b off
bin=/tmp/b/build/bin
log built
wait_model llama8b-l8
ls -la "$M" | tee -a "$OUT/rot.txt"
bench() { bench_tg "$OUT/rot.txt" "$M/synth-llama8b-l8.gguf" "-n 64 -d 0,8192 -r 3" "$@"; } # label ctk ctv env...
bench rot-default f16 f16
bench rot-default q4_0 q4_0
bench rot-off q4_0 q4_0 LLAMA_ATTN_ROT_DISABLE=1
bench rot-off q8_0 q8_0 LLAMA_ATTN_ROT_DISABLE=1
bench rot-default q8_0 q8_0
bench rot-off q4_0 f16 LLAMA_ATTN_ROT_DISABLE=1
bench rot-default f16 f16
log tests
"$bin/test-backend-ops" test -j 8 -b CUDA0 -o OUT_PROD > "$OUT/tbo.log" 2>&1; grep -E "tests passed|FAIL" "$OUT/tbo.log" | tail -3 | tee -a "$OUT/rot.txt"
log done
