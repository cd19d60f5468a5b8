#!/usr/bin/env bash
# gfx90a resources of every instance of our HIP kernels: VGPRs, AGPRs, SGPRs, LDS, scratch, spills and waves per SIMD,
# from clang's kernel-resource-usage remarks (what ggml's GGML_HIP_EXPORT_METRICS build prints), device code only.
#
#   benchmarks/investigations/hip_resources.sh [FILE.cu ...]   default: mmvq-short.cu out-prod-q.cu fwht-fused.cu attn-decode-fused.cu
#
# Exports pristine + series (tools/patches.py export) into build/hip-resources, then compiles each file for gfx90a in
# the HIP toolchain's chroot (scripts/hip-toolchain.sh: root, provisioned) with the flags of a Release ggml-hip build
# (-O3 -DNDEBUG -DGGML_USE_HIP). Prints one table row per kernel instance: file | kernel | VGPRs | AGPRs | SGPRs |
# LDS bytes | scratch bytes/lane | VGPR spill | waves/SIMD.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=$here/build/hip-resources
py=${PYTHON:-python3}
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(mmvq-short.cu out-prod-q.cu fwht-fused.cu attn-decode-fused.cu)

mkdir -p "$out"
"$py" "$here/tools/patches.py" export "$out/llama.cpp" >&2
src=$out/llama.cpp/ggml/src
for f in "${files[@]}"; do
    "$here/scripts/hip-toolchain.sh" run bash -c "cd '$src/ggml-cuda' && hipcc -x hip --offload-arch=gfx90a \
        --offload-device-only -O3 -DNDEBUG -DGGML_USE_HIP -std=c++17 -I'$src/../include' -I'$src' -I'$src/ggml-cuda' \
        -Rpass-analysis=kernel-resource-usage -c '$f' -o /dev/null" > "$out/$f.remarks" 2>&1 \
        || { tail -n 30 "$out/$f.remarks" >&2; exit 1; }
done

# remarks: "...: remark: Function Name: NAME [-R...]", then "...: remark:     KEY: VALUE [-R...]" lines of that kernel
"$py" - "$out" "${files[@]}" <<'PY'
import re, subprocess, sys
from pathlib import Path
out, files = Path(sys.argv[1]), sys.argv[2:]
keys = ["VGPRs", "AGPRs", "TotalSGPRs", "LDS Size [bytes/block]", "ScratchSize [bytes/lane]", "VGPRs Spill",
        "Occupancy [waves/SIMD]"]
print("| file | kernel | VGPRs | AGPRs | SGPRs | LDS bytes | scratch bytes/lane | VGPR spill | waves/SIMD |")
print("|---|---|---|---|---|---|---|---|---|")
for f in files:
    rows, cur = [], None
    for line in (out / f"{f}.remarks").read_text().splitlines():
        m = re.search(r"remark: (?:Function Name: (\S+)|\s+([^:]+): (\S+)) \[-Rpass", line)
        if not m:
            continue
        if m.group(1):
            cur = {"name": m.group(1)}
            rows.append(cur)
        elif cur is not None:
            cur[m.group(2).strip()] = m.group(3)
    names = subprocess.run(["c++filt"], input="\n".join(r["name"] for r in rows), capture_output=True,
                           text=True).stdout.splitlines()
    for r, name in zip(rows, names):
        m = re.match(r"_ZL15k_fwht_set_rowsILi(\d+)E([il])\d+(block_\w+?)Li32E.*Lb([01])EE", name)
        if m:  # c++filt of older binutils cannot read its function-pointer template argument
            idx = "int64_t" if m.group(2) == "l" else "int32_t"
            name = f"k_fwht_set_rows<{m.group(1)}, {idx}, {m.group(3)}, rope={m.group(4)}>("
        name = name.removeprefix("void ")  # then the parameter list off: the template arguments name the instance
        name = name[:name.index(">(") + 1] if ">(" in name else name.split("(")[0]
        print(f"| {f} | `{name}` | " + " | ".join(r.get(k, "") for k in keys) + " |")
PY
