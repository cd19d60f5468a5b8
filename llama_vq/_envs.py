"""Every ``LLAMA_VQ_*`` environment variable that any code of this repository reads, declared once.

One entry per variable: its layer (who reads it), its type, its default as a user writes it, and what it does.
Python code of the package reads its variables through ``get()``; the native library, the build and the scripts
read theirs themselves, and tests/repo/test_env_registry.py scans the tree so that a read of an undeclared name, or a
declared name that nothing reads, fails. docs/knobs.md is generated from this table (``python tools/knobs.py
write``; the test checks that the page is current).

This module imports nothing of the package, so tools/ load it by path without a built library.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

# who reads a variable, in the order docs/knobs.md lists them
LAYERS: dict[str, str] = {
    "package": "the Python package at run time (llama_vq)",
    "server": "llama-vq-server: each flag of its own also comes from its variable (the flag wins; docs/server.md)",
    "native": "the native library at run time (our patches and native/ sources in libllama and libggml; the llama.cpp "
    "tools llama-vq builds read them too). Each is read once per process unless it says otherwise",
    "build": "the build (pyproject.toml -> CMake, scripts/)",
    "tests": "the test suite (tests/)",
    "tools": "tools/ and benchmarks/",
}


@dataclass(frozen=True)
class EnvVar:
    """One variable: ``layer`` is a key of LAYERS (a variable read by two layers names both, first the main one),
    ``type`` its values (int, bool, path, size, seconds, a ggml type, a choice "a|b|c"), ``default`` as a user
    writes it (None: unset means "not given", as the meaning says)."""

    name: str
    layers: tuple[str, ...]
    type: str
    default: str | None
    meaning: str
    where: str = ""  # the patch (by its name in patches/series) or source that reads a native variable


def _v(name: str, layers: str, type_: str, default: str | None, meaning: str, where: str = "") -> EnvVar:
    return EnvVar(name, tuple(layers.split(",")), type_, default, meaning, where)


VARS: tuple[EnvVar, ...] = (
    # ---- the Python package ----
    _v(
        "LLAMA_VQ_CACHE",
        "package,build",
        "path",
        None,
        "where downloaded files are kept (the default model, checked by sha256; scripts/hip-toolchain.sh's chroot). "
        "Unset: $XDG_CACHE_HOME/llama-vq, else ~/.cache/llama-vq",
    ),
    _v(
        "LLAMA_VQ_CHAT_LOG_VERBOSITY",
        "package",
        "int",
        "1",
        "the log threshold of llama.cpp's chat layer (common/): 1 errors only, 2 adds the warnings that print a "
        "model output that failed to parse (StreamEnd.parse_error holds it either way)",
    ),
    _v(
        "LLAMA_VQ_CPU_VARIANT",
        "package",
        "x64|haswell|skylakex|icelake",
        None,
        "a wheel build (backends as modules): the CPU module to load instead of the best one this CPU runs; refused, "
        "with the fix, when the build lacks it or this CPU cannot run it",
    ),
    # ---- llama-vq-server (llama_vq/server/options.py FLAGS: the variable of --state-dir is LLAMA_VQ_STATE_DIR) ----
    _v("LLAMA_VQ_STATE_DIR", "server", "path", None, "--state-dir: keep prompt caches on disk across restarts"),
    _v("LLAMA_VQ_STATE_BUDGET", "server", "size", "8G", "--state-budget: disk budget of --state-dir"),
    _v(
        "LLAMA_VQ_CACHE_TYPE_K_SWA",
        "server,native",
        "ggml type",
        None,
        "K cache type of an iSWA model's sliding-window layers (--cache-type-k-swa; the llama.cpp tools read it "
        "through libllama). Unset: the full layers' type (-ctk)",
        "0010-llama-swa-layer-cache-types",
    ),
    _v(
        "LLAMA_VQ_CACHE_TYPE_V_SWA",
        "server,native",
        "ggml type",
        None,
        "V cache type of the sliding-window layers (--cache-type-v-swa), as LLAMA_VQ_CACHE_TYPE_K_SWA",
        "0010-llama-swa-layer-cache-types",
    ),
    _v(
        "LLAMA_VQ_DRAIN_TIMEOUT",
        "server",
        "seconds",
        "3",
        "--drain-timeout: on SIGTERM/SIGINT, how long running requests may finish",
    ),
    _v("LLAMA_VQ_MAX_BODY_SIZE", "server", "size", "64M", "--max-body-size: largest request body accepted, else 413"),
    _v(
        "LLAMA_VQ_SSE_KEEPALIVE",
        "server",
        "seconds",
        "10",
        "--sse-keepalive: an SSE comment this often while a streamed request's prompt is processed (0: off)",
    ),
    # ---- the native library ----
    _v(
        "LLAMA_VQ_ATTN_TUNE",
        "package",
        "1|0",
        "1",
        "-fa auto measured on the device (llama_vq/attn_choice.py, cached on disk); 0 keeps the static rule",
        "llama_vq/attn_choice.py",
    ),
    _v(
        "LLAMA_VQ_ATTN_CACHE",
        "package",
        "path",
        None,
        "the file -fa auto's measured choices are cached in (default $XDG_CACHE_HOME/llama-vq/attn-choice.json, "
        "else ~/.cache/llama-vq/attn-choice.json)",
        "llama_vq/attn_choice.py",
    ),
    _v(
        "LLAMA_VQ_ATTN_TUNE_DEPTH",
        "package",
        "tokens",
        None,
        "cap on the depth -fa auto's measurement runs at (default 32768 on an accelerator; on the CPU 2048, less for "
        "shapes wider than SmolLM2's)",
        "llama_vq/attn_choice.py",
    ),
    _v(
        "LLAMA_VQ_FA_AUTO",
        "native",
        "on|off|prefill",
        None,
        "the mode the native -fa auto tries first (the placement check still applies); llama_vq sets it from the "
        "measured choice while a context is created",
        "0018-llama-flash-attn-prefill-mode",
    ),
    _v(
        "LLAMA_VQ_ATTN_UNSUPPORTED",
        "native,tests",
        "ggml op names, comma-separated",
        None,
        "for tests: the attention placement check treats these ops as unsupported on a layer's device (the refusal "
        "of a mode that would move a layer's attention off its device)",
        "0018-llama-flash-attn-prefill-mode",
    ),
    _v(
        "LLAMA_VQ_ATTN_SCRATCH_MIB",
        "native",
        "MiB",
        "256",
        "the scratch budget of the attention without flash attention: a batch whose scores would take more is "
        "computed in splits of its tokens (also llama_vq_set_attn_scratch(), --attn-scratch, "
        "Llama(attn_scratch_mib=))",
        "0017-llama-attn-split-scratch-budget; native/llama/src/llama-vq-attn.h",
    ),
    _v(
        "LLAMA_VQ_ATTN_V_F16",
        "native",
        "0|1",
        "0",
        "when the attention without flash attention is split, 1 dequantizes a quantized V once per stream to f16 "
        "(n_kv x d_v x n_head_kv x 2 bytes more scratch) and every chunk's V*P reads that copy; 0 has each chunk read "
        "the quantized V. 1 trades memory for prefill speed on a GPU",
        "native/llama/src/llama-vq-attn.h",
    ),
    _v(
        "LLAMA_VQ_DECODE_TOKENS",
        "native",
        "tokens",
        "8",
        "prefill mode (flash_attn='prefill', -fa prefill): a batch of at most this many tokens per sequence decodes "
        "without flash attention, a larger one runs it",
        "0018-llama-flash-attn-prefill-mode",
    ),
    _v(
        "LLAMA_VQ_RPC_DEAD_PEER_S",
        "native",
        "seconds",
        "30",
        "users of --rpc: how long a client waits for an RPC host that stopped acknowledging (power loss, a cut "
        "link) before dropping it and failing the requests that need it (TCP_USER_TIMEOUT, Linux)",
        "0019-rpc-lost-server-fails-its-graphs",
    ),
    _v(
        "LLAMA_VQ_STATE_COALESCE",
        "native",
        "unset|0|1",
        None,
        "how a KV state is read: unset groups device reads only, 1 host buffers too, 0 never (upstream's "
        "per-range reads); read at every call, so that a test compares the bytes both ways in one process",
        "0011-llama-kv-state-grouped-device-reads",
    ),
    _v(
        "LLAMA_VQ_STATE_STATS",
        "native",
        "0|1",
        "0",
        "1 prints the grouped state copies and the ranges they held at exit (tests prove the grouped reads ran)",
        "0011-llama-kv-state-grouped-device-reads",
    ),
    _v(
        "LLAMA_VQ_CPU_KQ_SHORT",
        "native",
        "1|0",
        "1",
        "the CPU's K*Q of a quantized K for short batches with GQA-shared rows; 0 runs upstream's (tests compare "
        "both ways)",
        "0012-cpu-kq-quantized-k-gqa-shared-rows; native/ggml/ggml-cpu/llama-vq-kq-short.c",
    ),
    _v(
        "LLAMA_VQ_CPU_OP_LOG",
        "native",
        "0|1",
        "0",
        "1 writes one line to stderr at the first run of each CPU kernel of ours in the process (quantized "
        "OUT_PROD, short-row K*Q): tests and operators see that it ran, e.g. in an rpc-server",
        "native/ggml/ggml-cpu/llama-vq-op-log.h",
    ),
    _v(
        "LLAMA_VQ_CUDA_FUSED_ATTN",
        "native",
        "auto|1|0",
        None,
        "the fused decode attention (K*Q -> softmax -> V*P in one kernel pair). Unset: one query token per stream, "
        "on NVIDIA sm_80+ with V*P on tensor cores and on HIP with the f32 V*P; 1 every chain it supports; 0 none "
        "(the separate ops)",
        "0013-cuda-fused-decode-attention; native/ggml/ggml-cuda/attn-fusion.cu",
    ),
    _v(
        "LLAMA_VQ_CUDA_FUSED_ATTN_MMA",
        "native",
        "1|0",
        "1",
        "0 runs the fused attention's f32 V*P (HIP's form) on an NVIDIA GPU: tests check HIP's path there",
        "native/ggml/ggml-cuda/attn-decode-fused.cu",
    ),
    _v(
        "LLAMA_VQ_CUDA_FUSED_ATTN_TC",
        "native",
        "unset|0|1",
        "unset",
        "the fused decode attention with both products on tensor cores (k_attn_decode_tc): unset = where it measured"
        " faster (9-16 query columns, >= 8192 cells), 0 = never, 1 = wherever it is compiled (side-by-side runs)",
        "native/ggml/ggml-cuda/attn-decode-fused.cu",
    ),
    _v(
        "LLAMA_VQ_CUDA_FUSE_ROTATION",
        "native",
        "1|0",
        "1",
        "0 runs the attention's Hadamard rotations as separate kernels (kill switch; tests compare both)",
        "0009-cuda-fuse-attn-rotations; native/ggml/ggml-cuda/rotation-fusion.cu",
    ),
    _v(
        "LLAMA_VQ_CUDA_FUSION_STATS",
        "native",
        "0|1",
        "0",
        "1 prints how often each fused kernel ran at exit: a test tells a fused run from an unfused one with the "
        "same result",
        "0009-cuda-fuse-attn-rotations, 0013-cuda-fused-decode-attention",
    ),
    _v(
        "LLAMA_VQ_CUDA_FORCE_F16_GEMM",
        "native",
        "0|1",
        "0",
        "1 takes the F16 GEMM branch of quantized OUT_PROD and K*Q on NVIDIA too: HIP's only prefill branch, tested "
        "on an NVIDIA GPU (PROXY=cuda bash benchmarks/mi210.sh)",
        "native/ggml/ggml-cuda/dequantize-x8.cuh",
    ),
    _v(
        "LLAMA_VQ_CUDA_OUT_PROD_MMA",
        "native",
        "1|0|2",
        "1",
        "V*P of a quantized V on tensor cores (NVIDIA sm_80+), the split attention's chunk's softmax taken into it: "
        "1 the chunks at long contexts (more than 128 columns per V matrix in at most 64 output tiles of 128 x 128), "
        "0 never (dequantize + cuBLAS: the HIP path's settings on NVIDIA), 2 every shape it takes (the op tests "
        "reach it this way)",
        "native/ggml/ggml-cuda/out-prod-q.cu",
    ),
    # ---- the build ----
    _v(
        "LLAMA_VQ_BACKEND",
        "build",
        "auto|cpu|cuda|hip",
        "auto",
        "the backend to build (auto: what this machine has); CMake's -DGGML_CUDA / -DGGML_HIP in CMAKE_ARGS win",
    ),
    _v(
        "LLAMA_VQ_BUILD_TOOLS",
        "build",
        "OFF|ON",
        "OFF",
        "ON also builds llama-bench, llama-perplexity, ggml-rpc-server, test-backend-ops and test-save-load-state "
        "into llama_vq/bin (scripts/run.sh test turns it on)",
    ),
    _v(
        "LLAMA_VQ_TOOLS",
        "build",
        "names",
        None,
        "with LLAMA_VQ_BUILD_TOOLS=ON, only these tools (comma-separated names of that list)",
    ),
    _v(
        "LLAMA_VQ_BACKEND_DL",
        "build",
        "OFF|ON|auto",
        "auto",
        "ON: ggml backends as modules loaded at import, the CPU one per SIMD level of LLAMA_VQ_CPU_VARIANTS (the "
        "wheels, the ROCm image); auto: ON when the backend is an x86-64 CPU and LLAMA_VQ_CPU_FEATURES is host (so a "
        "source install and scripts/run.sh's set-up build what the base wheel ships), OFF (linked in) otherwise",
    ),
    _v(
        "LLAMA_VQ_CPU_VARIANTS",
        "build",
        "auto|all|host|names",
        "auto",
        "the CPU modules of a build with backends as modules: all (the base wheel's x64, haswell, skylakex, icelake: "
        "scripts/wheels.sh cpu, scripts/run.sh test), host (the one this CPU runs best) or those names, "
        "comma-separated; auto: all with LLAMA_VQ_BACKEND_DL=ON, host with LLAMA_VQ_BACKEND_DL=auto",
    ),
    _v(
        "LLAMA_VQ_CPU_FEATURES",
        "build",
        "host|avx2|avx512|generic",
        "host",
        "the x86 SIMD level of a build without LLAMA_VQ_BACKEND_DL (host: what this CPU reports; another level keeps "
        "LLAMA_VQ_BACKEND_DL=auto's CPU build linked in at that level)",
    ),
    _v(
        "LLAMA_VQ_PATCHED_SRC",
        "build",
        "path",
        None,
        "scripts/wheels.sh: build from this exported patched tree (tools/patches.py export) instead of fetching "
        "and patching",
    ),
    _v(
        "LLAMA_VQ_HIP_CHROOT",
        "build",
        "path",
        None,
        "scripts/hip-toolchain.sh: where its Debian chroot lives. Unset: $LLAMA_VQ_CACHE/hip-toolchain/<suite>",
    ),
    _v(
        "LLAMA_VQ_HIP_MIRROR",
        "build",
        "URL",
        None,
        "scripts/hip-toolchain.sh: the Debian archive to bootstrap from. Unset: the first Debian mirror of this "
        "host's apt configuration",
    ),
    _v(
        "LLAMA_VQ_HIP_BUILD_DIR",
        "build,tests",
        "path",
        None,
        "set by scripts/run.sh test: the folder of the HIP build it started in the background, which "
        "tests/packaging/test_hip_build.py then waits for",
    ),
    # ---- the test suite ----
    _v(
        "LLAMA_VQ_CI",
        "tests",
        "0|1",
        None,
        "1 (set by .ci/run): a skip fails unless its reason is a platform limit (tests/support/skip_support.py)",
    ),
    _v(
        "LLAMA_VQ_HIP_FA",
        "tests",
        "OFF|ON",
        "OFF",
        "ON: the test HIP build compiles flash attention's kernels too (tests/packaging/test_hip_build.py)",
    ),
    _v(
        "LLAMA_VQ_TEST_THREADS",
        "tests",
        "int",
        "2",
        "threads of the tests that run models on the CPU (tests/api/test_v_cache.py, test_swa_cache_types.py)",
    ),
    _v(
        "LLAMA_VQ_TEST_SERVER_CWD",
        "tests",
        "path",
        None,
        "the working directory of the servers the tests start. Unset: the test's log folder, so that the "
        "installed package is under test, not the checkout's",
    ),
    _v(
        "LLAMA_VQ_SPEC_TEST_SERVER",
        "tests",
        "path",
        None,
        "runs tests/server/test_speculative.py against this stock llama-server binary instead of llama-vq-server",
    ),
    _v(
        "LLAMA_VQ_GGML_LIB_DIR",
        "tests",
        "path",
        None,
        "tests/kernels/test_out_prod_reference.py: the folder of the libggml-base and libggml-cpu to test. Unset: the "
        "package's",
    ),
    _v(
        "LLAMA_VQ_WHEEL_DIR",
        "tests",
        "path",
        None,
        "a folder that holds the llama-vq wheel the wheel tests install (nothing is built then)",
    ),
    _v(
        "LLAMA_VQ_CUDA_WHEEL_DIR",
        "tests",
        "path",
        None,
        "a folder that holds a llama-vq-cuda wheel: tests/packaging/test_wheels.py installs it beside the base wheel",
    ),
    # ---- tools and benchmarks ----
    _v(
        "LLAMA_VQ_GGUF_PY",
        "tools",
        "path",
        None,
        "the gguf-py folder that the synthetic-model writer and the benchmarks import gguf from. Unset: the "
        "pinned llama.cpp's (vendor/llama.cpp/gguf-py)",
    ),
    _v(
        "LLAMA_VQ_TOKENIZER_GGUF",
        "tools",
        "path",
        None,
        "a GGUF whose tokenizer the synthetic models take. Unset: the SmolLM2 test model",
    ),
    _v(
        "LLAMA_VQ_SMOLLM2",
        "tools",
        "path",
        None,
        "the SmolLM2 GGUF the benchmarks run. Unset: the package's default model (python -m llama_vq.models path)",
    ),
)

BY_NAME: dict[str, EnvVar] = {v.name: v for v in VARS}

# switches that served measurements and went once those were recorded: (name, what it chose, what holds now).
# Nothing may read or set them (tests/repo/test_env_registry.py).
REMOVED: tuple[tuple[str, str, str], ...] = (
    ("LLAMA_VQ_CUDA_OUT_PROD_MAX_COLS", "OUT_PROD's vector/GEMM switch point", "`out_prod_q_use_vec`'s bounds"),
    (
        "LLAMA_VQ_CUDA_OUT_PROD_SHORT_KV",
        "the 64-column bound's V length",
        "`OUT_PROD_Q_SHORT_KV`: 4096 on NVIDIA, 0 on HIP",
    ),
    ("LLAMA_VQ_CUDA_OUT_PROD_COPY_SRC1", "a copy of the softmax before the F32 GEMM", "the F32 GEMM reads it in place"),
    ("LLAMA_VQ_CUDA_OUT_PROD_GEMM_FP32", "full-f32 GEMM math", "TF32, as ggml's cuBLAS handles"),
    ("LLAMA_VQ_CUDA_GRAPHS_QGEMM", "GEMM-path OUT_PROD graphs in CUDA graphs", "never"),
    ("LLAMA_VQ_CUDA_FUSE_ROPE", "K's rope apart from its rotation + store", "always folded where it fits"),
    ("LLAMA_VQ_CUDA_FUSED_ATTN_TAIL", "the output's permute, copy and rotation left to their kernels", "always taken"),
    (
        "LLAMA_VQ_CUDA_FUSED_ATTN_PDL",
        "the two fused kernels launched plainly",
        "programmatic dependent launches (`GGML_CUDA_PDL=0` turns PDL off for all)",
    ),
    ("LLAMA_VQ_CUDA_FUSED_ATTN_NBUF", "one tile buffer forced", "two where cp.async and the shared memory allow"),
    ("LLAMA_VQ_CUDA_FUSED_ATTN_BPSM", "blocks per SM the splits aim at", "`AD_SPLIT_BPSM` 4"),
    ("LLAMA_VQ_CUDA_FUSED_ATTN_MIN_TILES", "tiles per split at least", "`AD_SPLIT_MIN_TILES` 1"),
    ("LLAMA_VQ_CUDA_FUSED_ATTN_MAX_COLS", "fuse up to N query columns per KV head", "`ATTN_DECODE_MAX_COLS` 128"),
    (
        "LLAMA_VQ_CUDA_OUT_PROD_MMA_MAX_TILES",
        "the tensor-core V*P's bound in output tiles",
        "`OUT_PROD_Q_MMA_MAX_TILES` 64",
    ),
    (
        "LLAMA_VQ_CUDA_OUT_PROD_SPLIT_K",
        "the GEMM path's split-K off (0) or bounded to N output tiles",
        "split-K where the output has fewer than two tiles per SM",
    ),
    (
        "LLAMA_VQ_CUDA_SOFTMAX_VP",
        "the split's chunk's softmax as its own kernel (0)",
        "taken into the V*P wherever `ggml_cuda_out_prod_q_softmax_supported` allows",
    ),
)


def set_value(name: str, value: str | None) -> None:
    """Set (or with None, remove) the declared variable ``name`` in this process's environment, for native code that
    reads it. KeyError for a name that is not declared here."""
    BY_NAME[name]
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def get(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The value of the declared variable ``name`` (its default when unset or empty). KeyError for a name that is
    not declared here: declare it first."""
    var = BY_NAME[name]
    value = (os.environ if environ is None else environ).get(name)
    return value if value else var.default
