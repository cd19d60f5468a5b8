#!/usr/bin/env bash
# A ROCm/HIP toolchain for compiling llama-vq for AMD GPUs (gfx90a, MI210) on a machine without one:
# a Debian unstable chroot holding Debian's ROCm 6.4 packages (hipcc, clang as the HIP compiler,
# libamdhip64, hipBLAS, rocBLAS), at the exact versions listed in scripts/hip-toolchain.lock.
#
#   scripts/hip-toolchain.sh provision       # create or check the chroot (idempotent, cached)
#   scripts/hip-toolchain.sh build           # scripts/build.sh wheel (LLAMA_VQ_BACKEND=hip, tools on, backends as
#                                            # modules: LLAMA_VQ_BACKEND_DL=ON, the ROCm image's build) on a copy of
#                                            # this checkout in the chroot, then the llama-vq-hip wheel split from it
#                                            # (scripts/wheels.sh split hip) into dist/hip; last line: JSON report
#   scripts/hip-toolchain.sh run CMD [ARGS]  # any command in the chroot, in this checkout
#   scripts/hip-toolchain.sh ephemeral CMD   # CMD in a throwaway overlay of the chroot (changes dropped)
#   scripts/hip-toolchain.sh lock            # print the locked packages' installed versions (lock lines)
#
# Needs root (debootstrap, chroot and bind mounts). Environment:
#   LLAMA_VQ_HIP_CHROOT   where the chroot lives (default ~/.cache/llama-vq/hip-toolchain/<suite>)
#   LLAMA_VQ_HIP_MIRROR   Debian archive URL to bootstrap from. Default: the first Debian mirror of this
#                         host's apt configuration. To reproduce the lock after unstable moved on, use a
#                         snapshot of the archive at the lock's date (snapshot/archive/debian/<SNAPSHOT>/).
#   GPU_TARGETS           AMD targets for `build` (default gfx90a); CMAKE_ARGS, LLAMA_VQ_BUILD_TOOLS pass through;
#                         LLAMA_VQ_BACKEND_DL=OFF links the backend into libggml instead (no llama-vq-hip wheel)
#   CCACHE_DIR            the host's ccache directory, shared with the chroot (default: ccache's own)
# The chroot sees this checkout at the same path, the host's ccache directory, CA certificates and pip
# configuration (so pip reaches the same package index as on the host).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
lock="$here/scripts/hip-toolchain.lock"
log() { printf 'hip-toolchain: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

lock_value() { sed -n "s/^$1=//p" "$lock" | head -n1; }
suite=$(lock_value suite)
packages=$(sed -n 's/^pkg //p' "$lock")   # "name=version" lines
lock_hash=$(sha256sum "$lock" | cut -c1-12)
cache=${LLAMA_VQ_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llama-vq}
root=${LLAMA_VQ_HIP_CHROOT:-$cache/hip-toolchain/$suite}
stamp="$root/.llama-vq-hip-toolchain"

need_root() {
    [ "$(id -u)" = 0 ] && return 0
    die "provisioning and entering the HIP chroot needs root (debootstrap, chroot, mount). Run it as root \
(e.g. sudo -E $0 $*), or on a machine where you are root. Nothing was changed."
}

host_mirror() {
    if [ -n "${LLAMA_VQ_HIP_MIRROR:-}" ]; then echo "$LLAMA_VQ_HIP_MIRROR"; return; fi
    local m
    m=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | sed -n 's/^URIs:[[:space:]]*//p' \
        | tr ' ' '\n' | grep -E '/debian/?$' | head -n1 || true)
    [ -n "$m" ] || m=$(sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]*\/debian\)[[:space:]].*/\2/p' \
        /etc/apt/sources.list 2>/dev/null | head -n1 || true)
    [ -n "$m" ] || die "no Debian mirror in this host's apt configuration: set LLAMA_VQ_HIP_MIRROR"
    echo "$m"
}

mounted() { grep -q " $1 " /proc/self/mounts; }

bind() {  # bind SRC DST(inside root)
    local dst="$root$2"
    [ -e "$1" ] || return 0
    if [ -d "$1" ]; then mkdir -p "$dst"; else mkdir -p "$(dirname "$dst")"; touch "$dst"; fi
    mounted "$dst" || mount --bind "$1" "$dst"
}

unmount_all() {
    local m
    # innermost first
    for m in $(awk -v r="$root/" 'index($2, r) == 1 { print $2 }' /proc/self/mounts | sort -r); do
        umount -l "$m" 2>/dev/null || true
    done
}

# One user of the chroot at a time (build, run, ephemeral, provision): each unmounts what is mounted under the
# chroot when it ends, and an overlay needs its lower layer to hold still.
take_lock() {
    [ -n "${locked:-}" ] && return 0
    mkdir -p "$(dirname "$root")"
    exec 9>"$root.lock"
    if ! flock -n 9; then
        log "waiting for another user of $root (up to 2 h)"
        flock -w 7200 9 || die "$root is still in use after 2 h"
    fi
    locked=1
}

provision() {
    need_root provision
    take_lock
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$lock_hash" ]; then
        log "chroot ready (cached): $root"
        return 0
    fi
    if ! command -v debootstrap >/dev/null && command -v apt-get >/dev/null; then
        log "installing debootstrap"
        apt-get install -y -q debootstrap >/dev/null 2>&1 \
            || { apt-get update -q >/dev/null && apt-get install -y -q debootstrap >/dev/null; } || true
    fi
    command -v debootstrap >/dev/null || die "debootstrap is missing: install it (Debian/Ubuntu: apt-get install debootstrap)"
    local mirror t0=$SECONDS
    mirror=$(host_mirror)
    unmount_all
    if [ ! -f "$stamp" ]; then
        # never delete through a bind mount (this checkout is bound into the chroot while it is in use)
        ! grep -q " $root/" /proc/self/mounts || die "something is still mounted under $root: unmount it first"
        rm -rf "$root" "$root".*.log
        mkdir -p "$root"
        log "debootstrap --variant=minbase $suite from the host's Debian mirror into $root"
        # unstable's Release file carries a Valid-Until date; a frozen mirror or a snapshot is past it,
        # and its signing key may be newer than this host's keyring: the lock's versions are the check.
        debootstrap --variant=minbase --no-check-gpg "$suite" "$root" "$mirror" >"$root.debootstrap.log" 2>&1 \
            || die "debootstrap failed; see $root.debootstrap.log"
        echo "deb [trusted=yes] $mirror $suite main" > "$root/etc/apt/sources.list"
        printf 'Acquire::Check-Valid-Until "false";\nAPT::Install-Recommends "false";\n' \
            > "$root/etc/apt/apt.conf.d/90llama-vq"
    else
        log "the lock changed since $root was provisioned: installing the locked versions into it"
    fi
    log "installing the pinned packages ($(echo "$packages" | wc -l) of them)"
    mount_all
    chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
    # shellcheck disable=SC2086
    chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --allow-downgrades \
        $packages >"$root.apt.log" 2>&1 \
        || die "installing the pinned packages failed (the mirror may have moved past the lock: use \
LLAMA_VQ_HIP_MIRROR with a snapshot of $(lock_value snapshot)); see $root.apt.log"
    verify
    chroot "$root" apt-get clean
    echo "$lock_hash" > "$stamp"
    log "chroot ready in $((SECONDS - t0)) s: $root"
}

verify() {  # every locked package at its locked version
    local bad=0 line name want have
    while read -r line; do
        name=${line%%=*}; want=${line#*=}
        have=$(chroot "$root" dpkg-query -W -f='${Version}' "$name" 2>/dev/null || true)
        if [ "$have" != "$want" ]; then log "$name: locked $want, installed '${have}'"; bad=1; fi
    done <<< "$packages"
    [ $bad = 0 ] || die "the chroot does not match scripts/hip-toolchain.lock"
    local date
    date=$(sed -n 's/^Date: //p' "$root"/var/lib/apt/lists/*_InRelease 2>/dev/null | head -n1)
    date=$(date -u -d "$date" +%Y%m%dT%H%M%SZ 2>/dev/null || echo unknown)
    [ "$date" = "$(lock_value snapshot)" ] \
        || log "note: the mirror's $suite is at $date, the lock at $(lock_value snapshot) (locked versions installed anyway)"
}

mount_all() {
    mounted "$root/proc" || mount -t proc proc "$root/proc"
    bind /dev /dev
    bind /dev/pts /dev/pts
    bind /sys /sys
    mkdir -p "$root/tmp"
    # host trust and pip configuration: the chroot's pip reaches the index the host's pip reaches
    bind /etc/ssl/certs /etc/ssl/certs
    bind /etc/resolv.conf /etc/resolv.conf
    bind /etc/pip.conf /etc/pip.conf
    bind /etc/xdg/pip /etc/xdg/pip
    bind "$HOME/.config/pip" /root/.config/pip
    local d
    for d in $(env | sed -n 's/^PIP_[A-Z_]*=\(\/[^ :]*\)$/\1/p'); do
        [ -d "$d" ] && bind "$d" "$d"
    done
    for d in $(cat /etc/pip.conf /etc/xdg/pip/pip.conf "$HOME/.config/pip/pip.conf" 2>/dev/null \
               | grep -oE '(file://)?/[^ ]+' | sed 's|^file://||'); do
        d=${d%/simple}; d=${d%/simple/}   # a local index's files lie next to its simple/ pages
        [ -e "$d" ] && [ "${d#/etc/}" = "$d" ] && bind "$d" "$d"
    done
    bind "$here" "$here"
    local cc
    cc=${CCACHE_DIR:-$(ccache -k cache_dir 2>/dev/null || echo "$HOME/.cache/ccache")}
    mkdir -p "$cc" "$cache/sdist"
    bind "$cc" /root/.cache/ccache
    bind "$cache/sdist" /root/.cache/llama-vq/sdist  # the pinned llama.cpp sdist, fetched once
}

in_chroot() {  # in_chroot DIR CMD [ARGS]: run CMD in DIR inside the chroot
    need_root run
    [ -f "$stamp" ] || die "no provisioned chroot at $root: run '$0 provision' first"
    local dir=$1
    shift
    take_lock
    mount_all
    [ -n "${overlay_tmp:-}" ] || trap unmount_all EXIT
    local pass=()
    mapfile -t pass < <(env | grep -E '^(PIP_[A-Z_]+|LLAMA_VQ_[A-Z_]+|CMAKE_ARGS|GPU_TARGETS|CCACHE_[A-Z_]+)=' \
                        | grep -vE '^(CCACHE_DIR|LLAMA_VQ_CACHE|LLAMA_VQ_HIP_[A-Z_]+)=' || true)
    chroot "$root" env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin TERM=dumb LANG=C.UTF-8 \
        CCACHE_DIR=/root/.cache/ccache LLAMA_VQ_CACHE=/root/.cache/llama-vq \
        "${pass[@]}" bash -c 'cd "$0" && exec "$@"' "$dir" "$@"
}

# `ephemeral`: CMD in a throwaway copy of the chroot (an overlay over it; whatever CMD changes is dropped), e.g.
# to run a Dockerfile's steps, which add users and install packages, without touching the cached toolchain
ephemeral() {
    need_root ephemeral
    [ -f "$stamp" ] || die "no provisioned chroot at $root: run '$0 provision' first"
    take_lock
    overlay_tmp=$(mktemp -d "${TMPDIR:-/tmp}/hip-ephemeral.XXXXXX")
    mkdir -p "$overlay_tmp/upper" "$overlay_tmp/work" "$overlay_tmp/root"
    mount -t overlay overlay -o "lowerdir=$root,upperdir=$overlay_tmp/upper,workdir=$overlay_tmp/work" \
        "$overlay_tmp/root"
    root=$overlay_tmp/root
    trap 'unmount_all; umount -l "$overlay_tmp/root"; rm -rf "$overlay_tmp"' EXIT
    in_chroot / "$@"
}

# `build`: a copy of this checkout (tracked and untracked, not ignored files) at a fixed path in the chroot, so that
# the build directory there is incremental and never touches this checkout's own build/ and llama_vq/lib.
build() {
    need_root build
    take_lock
    [ -f "$stamp" ] || provision
    local src=/src/llama-vq
    mkdir -p "$root$src"
    find "$root$src" -mindepth 1 -maxdepth 1 ! -name build ! -name vendor ! -name dist -exec rm -rf {} +
    (cd "$here" && git ls-files -z -co --exclude-standard | tar --null -T - -cf -) | tar -C "$root$src" -xf -
    log "building llama-vq for ${GPU_TARGETS:-gfx90a} in the chroot (scripts/build.sh wheel; build dir $root$src/build)"
    in_chroot "$src" env LLAMA_VQ_BACKEND=hip GPU_TARGETS="${GPU_TARGETS:-gfx90a}" \
        LLAMA_VQ_BUILD_TOOLS="${LLAMA_VQ_BUILD_TOOLS:-ON}" LLAMA_VQ_BACKEND_DL="${LLAMA_VQ_BACKEND_DL:-ON}" \
        bash scripts/hip-toolchain.sh _build-inside
}

# inside the chroot, in the copy: a venv for the build tools, then the users' build entry point, then (a DL build) the
# llama-vq-hip wheel split from its wheel
build_inside() {
    [ -x /opt/hip-venv/bin/python ] || python3 -m venv /opt/hip-venv
    rm -rf dist
    PYTHON=/opt/hip-venv/bin/python bash scripts/build.sh wheel dist
    if [ "${LLAMA_VQ_BACKEND_DL:-OFF}" = ON ]; then
        PYTHON=/opt/hip-venv/bin/python bash scripts/wheels.sh split hip dist/llama_vq-*.whl dist/hip
    fi
    /opt/hip-venv/bin/python - <<'PY'
# one JSON line: what the wheel holds, which GPU targets libggml-hip carries code for, which of our kernels; for a DL
# build, the llama-vq-hip wheel's files and the code objects of its libggml-hip (ROCm's LLVM tools)
import glob, json, re, subprocess, sys, tempfile, zipfile
whl = glob.glob("dist/llama_vq-*.whl")
z = zipfile.ZipFile(whl[0]) if len(whl) == 1 else None
names = z.namelist() if z else []
need = ["llama_vq/lib/libggml-hip.so", "llama_vq/lib/libllama.so", "llama_vq/bin/test-backend-ops",
        "llama_vq/lib/libllama-vq-server.so", "llama_vq/lib/libmtmd.so", "llama_vq/server/cli.py"]
cfg = json.loads(z.read("llama_vq/_build_config.json")) if z else {}
lib = z.read(need[0]) if z and need[0] in names else b""
kernels = ["k_out_prod_q_vec", "k_out_prod_q_combine", "mul_mat_vec_q_short", "k_fwht_set_rows", "k_cont_fwht",
           "k_attn_decode", "k_attn_decode_combine",
           "dequantize_x8_rows"]
report = {
    "wheel": whl, "missing": [n for n in need if n not in names], "backend": cfg.get("backend"),
    "gpu_targets": cfg.get("gpu_targets"), "lib_mb": round(len(lib) / 2**20, 1),
    "offload_targets": sorted({m.decode() for m in re.findall(rb"amdgcn-amd-amdhsa--gfx[0-9a-z]+", lib)}),
    "kernels": [k for k in kernels if k.encode() in lib],
    "backend_dl": cfg.get("backend_dl"), "cpu_modules": sorted(n.rsplit("/", 1)[-1] for n in names if "/libggml-cpu" in n),
}
hip = glob.glob("dist/hip/llama_vq_hip-*.whl")
if cfg.get("backend_dl"):
    report["hip_wheel"] = [h.rsplit("/", 1)[-1] for h in hip]
    if len(hip) == 1:
        h = zipfile.ZipFile(hip[0])
        report["hip_wheel_files"] = sorted(n for n in h.namelist() if ".dist-info/" not in n and n[-1] != "/")
        with tempfile.TemporaryDirectory() as d:
            h.extract("llama_vq/lib/libggml-hip.so", d)
            out = subprocess.run([sys.executable, "tests/support/hip_code_objects.py", f"{d}/llama_vq/lib/libggml-hip.so",
                                  *kernels], capture_output=True, text=True)
            report["code_objects"] = json.loads(out.stdout) if out.returncode == 0 else out.stderr[-2000:]
print(json.dumps(report))
sys.exit(0 if z and cfg.get("backend") == "hip" else 1)
PY
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
    provision) provision ;;
    run) in_chroot "$here" "$@" ;;
    ephemeral) ephemeral "$@" ;;
    build) build ;;
    _build-inside) build_inside ;;
    lock) need_root lock
          # shellcheck disable=SC2046
          chroot "$root" dpkg-query -W -f='pkg ${Package}=${Version}\n' $(echo "$packages" | sed 's/=.*//') ;;
    *) sed -n "2,24p" "$0" >&2; exit 2 ;;
esac
