#!/usr/bin/env bash
# Decode attention against the memory bound, on an NVIDIA GPU: how many bytes of the quantized K/V cache the fused decode
# kernels read per second (their effective bandwidth), both forms side by side in one binary (both products on tensor
# cores, the default where it exists; LLAMA_VQ_CUDA_FUSED_ATTN_TC=0: the earlier form), and decode speed at depth
# against flash attention on the same cache types and on f16.
#
# Here, once:   python3 benchmarks/carry.py .bench-carry         # patched tree, gguf-py, vocab (~30 MB)
# There (carry .bench-carry), in two calls of <= 10 minutes:
#   STEP=build   OUT=<dir> bash benchmarks/decode_bandwidth.sh   # CUDA sm_90 with the FA kernels, the synthetic models
#   STEP=measure OUT=<dir> bash benchmarks/decode_bandwidth.sh   # op tests, llama-bench tg at depth, ncu of the kernels
# (test-backend-ops perf times a case's last node alone, not the fused chain: the kernels are measured in llama-bench
# and under ncu)
# Env: CARRY (.bench-carry), BUILD (/tmp/gpu-build), MODEL_DIR (/tmp/models), WAIT (540 s for the build),
# DEPTHS_MIMO (0,32768,65536), DEPTHS_8B (0,32768), TEST_CELLS (1|127|256|4096), NCU_KERNELS (16), NO_NCU, REPS (2), PROXY=hip: the HIP path's settings as
# benchmarks/mi210.sh PROXY=cuda sets them (its decode form is k_attn_decode's f32 V*P).
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
: "${STEP:?set STEP to build or measure}"
. "$here/benchmarks/device_common.sh"
B=${BUILD:-/tmp/gpu-build}
bin=$B/bin
[ -d /usr/local/cuda/bin ] && export PATH=/usr/local/cuda/bin:$PATH
device_log "$STEP" "$OUT/$STEP.txt"

case "$STEP" in
build)
    gen llama8b llama --preset llama-3.1-8b
    gen mimo mimo --preset attn
    if [ ! -f "$B/.done" ]; then
        setsid bash -c "
            cmake -S '$here' -B '$B' -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_VQ_PATCHED_SRC='$C/llama.cpp' \
                -DLLAMA_VQ_BACKEND=cuda -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=ON \
                -DLLAMA_VQ_BUILD_TOOLS=ON -DPython3_EXECUTABLE=$(command -v python3) > '$B.log' 2>&1 &&
            cmake --build '$B' -j $(nproc) --target llama ggml ggml-base ggml-cpu ggml-cuda llama-common llama-bench \
                test-backend-ops >> '$B.log' 2>&1 && touch '$B/.done'" < /dev/null > /dev/null 2>&1 &
    fi
    end=$(( $(date +%s) + ${WAIT:-540} ))
    while [ ! -f "$B/.done" ] && [ "$(date +%s)" -lt "$end" ]; do
        if ! pgrep -f "cmake --build $B" > /dev/null && ! pgrep -f "cmake -S $here" > /dev/null && [ ! -f "$B/.done" ]; then
            log "build failed"; tail -40 "$B.log"; cp "$B.log" "$OUT/build.log"; exit 1
        fi
        sleep 5
    done
    [ -f "$B/.done" ] && log "built" || log "still building ($(grep -c '^\[' "$B.log") steps logged)"
    tail -2 "$B.log"
    # the kernels' resources (registers, spills, shared memory) as ptxas gave them
    for o in $(find "$B" -name 'attn-decode-fused.cu.o' | head -1); do
        cuobjdump --dump-resource-usage "$o" 2>/dev/null | grep -A1 -E "k_attn_decode" | grep -E "REG|Function" \
            | paste - - | sed -E 's/.*Function ([^ ]*).*REG:([0-9]+) STACK:([0-9]+) SHARED:([0-9]+) LOCAL:([0-9]+).*/\1 REG \2 STACK \3 LOCAL \5/' \
            | c++filt | sort | uniq | tee "$OUT/resources.txt" | grep -E "k_attn_decode_tc|q8_0|Q8_0" | head -20
    done
    ;;
measure)
    [ -f "$B/.done" ] || { log "not built"; exit 1; }
    if [ "${PROXY:-}" = hip ]; then
        export LLAMA_VQ_CUDA_FUSED_ATTN_MMA=0 LLAMA_VQ_CUDA_FUSED_ATTN_TC=0 LLAMA_VQ_CUDA_FUSED_ATTN=1
    fi
    # 1. correctness against the CPU with the fusions counted (tc=: runs of the form with both products on tensor
    # cores): every chain fused (LLAMA_VQ_CUDA_FUSED_ATTN=1: 1-8 tokens), cases up to TEST_CELLS cells
    LLAMA_VQ_CUDA_FUSED_ATTN=1 LLAMA_VQ_CUDA_FUSION_STATS=1 timeout 300 "$bin/test-backend-ops" test -b CUDA0 \
        -o ATTN_DECODE_FUSED -p "n_kv=(${TEST_CELLS:-1|127|256|4096})," > "$OUT/tbo.log" 2>&1
    log "ATTN_DECODE_FUSED: rc $? $(grep -E 'tests passed|attention fusions run' "$OUT/tbo.log" | tr '\n' ' ')"
    grep -E "FAIL" "$OUT/tbo.log" | head -5
    # 2. decode at depth (llama-bench tg64, the depth filled first): ours in prefill mode (its decode is the fused
    # kernel) with both forms, and flash attention on f16; the attention's effective bandwidth is the step time the
    # depth adds over the K/V bytes read (RESULTS.md)
    wait_model mimo; wait_model llama8b
    tg() { # SHAPE DEPTHS FA CTK CTV TC
        LLAMA_VQ_CUDA_FUSED_ATTN_TC=$6 "$bin/llama-bench" -m "$M/synth-$1.gguf" -ngl 99 -fa "$3" -ctk "$4" -ctv "$5" \
            -p 0 -n 64 -d "$2" -r "${REPS:-2}" -o jsonl 2>/dev/null | python3 -c "import json,sys
for l in sys.stdin:
    r=json.loads(l); print('tg64 $1 fa=$3 $4/$5 TC=$6 depth', r['n_depth'], round(r['avg_ts'],2), '+-', round(r['stddev_ts'],2))" \
            | tee -a "$OUT/$STEP.txt"
    }
    dm=${DEPTHS_MIMO:-0,32768,65536}
    tg mimo "$dm" prefill q8_0 q4_1 1; tg mimo "$dm" prefill q8_0 q4_1 0; tg mimo "$dm" on f16 f16 1
    # 3. the kernels of a few decode steps at 64K on the MiMo shape under Nsight Compute (clocks as found)
    if command -v ncu > /dev/null && [ -z "${NO_NCU:-}" ]; then
        timeout 150 ncu --clock-control none -k regex:k_attn_decode --launch-count "${NCU_KERNELS:-16}" \
            --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
            "$bin/llama-bench" -m "$M/synth-mimo.gguf" -ngl 99 -fa prefill -ctk q8_0 -ctv q4_1 -p 0 -n 2 -d 65536 -r 1 \
            > "$OUT/ncu.txt" 2>&1
        grep -E "k_attn_decode|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Grid Size|Registers Per|Theoretical Occ" \
            "$OUT/ncu.txt" | head -80
    fi
    d8=${DEPTHS_8B:-0,32768}
    tg llama8b "$d8" prefill q4_0 q4_0 1; tg llama8b "$d8" prefill q4_0 q4_0 0; tg llama8b "$d8" on f16 f16 1
    ;;
*) echo "STEP: build or measure" >&2; exit 2 ;;
esac
