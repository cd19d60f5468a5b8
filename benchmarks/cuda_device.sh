#!/usr/bin/env bash
# The CUDA benchmark as one call on a GPU machine that cannot fetch anything.
#
# Here:   python3 benchmarks/carry.py .bench-carry      (patched tree + gguf-py + vocab, ~30 MB,
#                                                        in a folder .git/info/exclude ignores)
# There:  OUT=<results folder> bash benchmarks/cuda_device.sh [extra run.py arguments]
#
# Builds llama-bench for sm_90 from the carried patched tree, generates the synthetic models in
# /tmp while it compiles, runs the matrix under a time budget (DEADLINE seconds from the start;
# configs not started by then are reported as skipped) and leaves results.json, results.md,
# tok_s_vs_depth.png, logs.tar.xz, build.log and run.log in $OUT.
#
# CUDA_FA=off (default here) compiles ggml-cuda without its flash-attention kernels: the build takes
# ~200 s instead of roughly twice that, which is what a 10-minute device share allows; the FA-on
# configs are then reported as skipped. CUDA_FA=on measures them too.
set -u
. "$(dirname "${BASH_SOURCE[0]}")/device_common.sh"
python3 "$here/benchmarks/run.py" --backend cuda --src "$C/llama.cpp" --build-dir /tmp/bench-build \
    --jobs "$(nproc)" --targets llama-bench --cuda-fa "${CUDA_FA:-off}" --tokenizer-from "$C/vocab.gguf" --model-dir "$M" \
    --out "$OUT" --pack-logs --deadline "${DEADLINE:-400}" --timeout "${CONFIG_TIMEOUT:-90}" "$@" \
    2>&1 | tee "$OUT/run.log"
