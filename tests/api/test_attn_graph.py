"""The attention graph llama.cpp really computes with a quantized cache and flash attention off.

Read node by node through the scheduler's eval callback: V*softmax(KQ) is one OUT_PROD on the quantized V cache
(patch 0007-quantized-v-cache-without-flash-attn), and the Hadamard rotations of a quantized cache sit next to their
consumers (patch 0008-graph-attn-rotations-next-to-their-consumers).
"""

from __future__ import annotations

import ctypes
import re

import pytest
from v_cache_support import GGML, N_THREADS, make


@pytest.fixture(scope="module")
def ggml(llama_vq) -> GGML:
    from llama_vq._cdll import LIB_DIR

    return GGML(LIB_DIR)


# With a quantized cache, llama.cpp rotates q/k/v by a Hadamard matrix (attn_rot_k/v). Patch
# 0008-graph-attn-rotations-next-to-their-consumers builds each rotation right next to its consumer, which is what
# lets a backend fuse them (0009-cuda-fuse-attn-rotations): the K and V
# rotations just before their cache stores, the queries' just before K*Q, the output's just after the CONT that
# un-permutes it. This reads the graph llama.cpp really computes (the scheduler's eval callback, node by node).


class _GgmlTensor(ctypes.Structure):  # struct ggml_tensor (ggml.h) of the pinned llama.cpp
    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


GGML_TYPES = {"f16": 1, "q4_0": 2, "q8_0": 8}
VIEW_OPS = {"RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE"}


def _graph_nodes(llama_vq, ggml, path, type_k, type_v, n_tokens=4, **kw) -> list[dict]:
    """The nodes of one decode of n_tokens, FA off, in the order the backend computes them."""
    import llama_cpp

    nodes: list[dict] = []

    @llama_cpp.ggml_backend_sched_eval_callback
    def record(t, ask, user_data):  # noqa: ARG001
        if ask:
            x = ctypes.cast(t, ctypes.POINTER(_GgmlTensor)).contents
            node = {
                "addr": t,
                "op": ggml.op_name(x.op).decode(),
                "hint": x.op_params[1],
                "type": x.type,
                "src": list(x.src),
                "view_src": x.view_src,
                "name": x.name.decode(),
            }
            if x.src[0]:  # the first source's type, and the tensor a view of it looks at (e.g. the V cache)
                s0 = ctypes.cast(x.src[0], ctypes.POINTER(_GgmlTensor)).contents
                root = ctypes.cast(s0.view_src or x.src[0], ctypes.POINTER(_GgmlTensor)).contents
                node["src0_type"], node["src0_root"] = s0.type, root.name.decode()
            nodes.append(node)
        return False  # never stop to look at data: the graph runs as one piece

    llm = make(llama_vq, path, n_ctx=256, **kw)  # the weights; its own context is not used
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch = 256, 32, 32
    params.n_threads = params.n_threads_batch = N_THREADS
    params.type_k, params.type_v = GGML_TYPES[type_k], GGML_TYPES[type_v]
    params.flash_attn_type = 0  # LLAMA_FLASH_ATTN_TYPE_DISABLED
    params.cb_eval, params.cb_eval_user_data = record, None
    ctx = llama_cpp.llama_init_from_model(llm._model.model, params)
    assert ctx
    try:
        toks = llm.tokenize(b"The quick brown fox jumps")[:n_tokens]
        assert (
            llama_cpp.llama_decode(
                ctx, llama_cpp.llama_batch_get_one((llama_cpp.llama_token * len(toks))(*toks), len(toks))
            )
            == 0
        )
    finally:
        llama_cpp.llama_free(ctx)
    assert any(n["name"].startswith("kq") for n in nodes), "node names unreadable: struct layout changed?"
    return nodes


def _rotations_by_neighbour(nodes: list[dict]) -> dict[str, int]:
    at = {n["addr"]: n for n in nodes}

    def root(addr):  # the tensor a view (chain) looks at
        n = at.get(addr)
        return n["view_src"] if n and n["view_src"] else addr

    found = {"store": 0, "kq": 0, "output": 0, "apart": 0}
    for i, n in enumerate(nodes):
        if n["op"] != "MUL_MAT" or n["hint"] != 1:  # GGML_HINT_SRC0_IS_HADAMARD
            continue
        prev2 = nodes[i - 2 : i]
        if (
            len(prev2) == 2
            and prev2[0]["op"] == "CONT"
            and prev2[1]["op"] == "RESHAPE"
            and prev2[1]["src"][0] == prev2[0]["addr"]
            and n["src"][1] == prev2[1]["addr"]
        ):
            found["output"] += 1
            continue
        j = i + 1
        while j < len(nodes) and nodes[j]["op"] in VIEW_OPS:
            j += 1
        c = nodes[j] if j < len(nodes) else {"op": None}
        if c["op"] == "SET_ROWS" and root(c["src"][0]) == n["addr"]:
            found["store"] += 1
        elif c["op"] == "MUL_MAT" and root(c["src"][1]) == n["addr"]:
            found["kq"] += 1
        else:
            found["apart"] += 1
    return found


@pytest.mark.parametrize(
    "model,type_k,type_v,expect",
    [
        ("smollm2", "q4_0", "q4_0", {"store": 2, "kq": 1, "output": 1}),
        ("smollm2", "f16", "q8_0", {"store": 1, "kq": 0, "output": 1}),
        ("smollm2", "q8_0", "f16", {"store": 1, "kq": 1, "output": 0}),
        ("mimo", "q4_0", "q4_0", {"store": 2, "kq": 1, "output": 1}),  # iSWA: full and sliding-window layers
    ],
)
def test_attention_rotations_sit_next_to_their_consumers(llama_vq, ggml, request, model, type_k, type_v, expect):
    path = request.getfixturevalue("smollm2_path" if model == "smollm2" else "mimo_path")
    nodes = _graph_nodes(llama_vq, ggml, path, type_k, type_v)
    n_layer = sum(1 for n in nodes if n["name"].startswith("kq-") and n["op"] == "MUL_MAT")
    assert n_layer > 0
    found = _rotations_by_neighbour(nodes)
    assert found == {**{k: v * n_layer for k, v in expect.items()}, "apart": 0}, found


@pytest.mark.parametrize(
    "model,type_k,type_v", [("smollm2", "f16", "q4_0"), ("smollm2", "q8_0", "q8_0"), ("mimo", "q4_0", "q4_0")]
)
def test_quantized_v_without_flash_attn_is_one_out_prod_on_the_cache(llama_vq, ggml, request, model, type_k, type_v):
    """Per layer, kq*v is one OUT_PROD whose src0 is a view of the quantized V cache
    (the op tests/kernels/test_out_prod_reference.py checks against float64); nothing copies or dequantizes V any
    more."""
    path = request.getfixturevalue("smollm2_path" if model == "smollm2" else "mimo_path")
    nodes = _graph_nodes(llama_vq, ggml, path, type_k, type_v)
    n_layer = sum(1 for n in nodes if n["name"].startswith("kq-") and n["op"] == "MUL_MAT")
    assert n_layer > 0
    out_prods = [n for n in nodes if n["op"] == "OUT_PROD"]
    assert len(out_prods) == n_layer, [n["name"] for n in out_prods]
    v_cache = re.compile(r"cache_\w*v_l\d+")
    for n in out_prods:
        assert n["src0_type"] == GGML_TYPES[type_v] and v_cache.fullmatch(n["src0_root"]), n
    copies = [
        n
        for n in nodes
        if n["op"] in ("CPY", "CONT", "DUP")
        and n.get("src0_type") == GGML_TYPES[type_v]
        and v_cache.fullmatch(n.get("src0_root", ""))
    ]
    assert not copies, [n["name"] for n in copies]
