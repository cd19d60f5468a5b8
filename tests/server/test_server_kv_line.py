"""llama-vq-server's start-up line: the KV cache's types, attention mode and bytes, and what f16 would take.

The bytes in the line are checked against the same cache made by llama_vq.Llama in this process (the f16 figure
against an f16 cache made the same way), so the line cannot drift from what llama.cpp allocates.
"""

from __future__ import annotations

import re

import pytest
from server_support import running

from llama_vq.server.kv_line import MIB, kv_cache_line

N_CTX = 1024


def _kv_bytes(llama_vq, model, type_k: str, type_v: str) -> int:
    llm = llama_vq.Llama(
        str(model), n_ctx=N_CTX, type_k=type_k, type_v=type_v, flash_attn=False, n_threads=1, verbose=False
    )
    try:
        return llm.kv_cache_info().total_bytes
    finally:
        llm.close()


@pytest.mark.slow
def test_server_prints_one_kv_cache_line_with_types_attention_and_bytes(llama_vq, smollm2_path, tmp_path):
    with running(smollm2_path, "-ctk", "q8_0", "-ctv", "q4_0", "-fa", "off", log_dir=tmp_path) as srv:
        log = srv.log()
    lines = [line for line in log.splitlines() if "KV cache:" in line]
    assert len(lines) == 1, log[-3000:]
    m = re.search(
        r"KV cache: K q8_0, V q4_0, (\d+) cells, ([\d.]+) MiB \(f16: ([\d.]+) MiB, ([\d.]+)x\); attention: off ",
        lines[0],
    )
    assert m, lines[0]
    cells, mib, f16_mib, ratio = int(m[1]), float(m[2]), float(m[3]), float(m[4])
    assert cells == N_CTX
    quant = _kv_bytes(llama_vq, smollm2_path, "q8_0", "q4_0")
    f16 = _kv_bytes(llama_vq, smollm2_path, "f16", "f16")
    assert mib == round(quant / MIB, 1) and f16_mib == round(f16 / MIB, 1), (lines[0], quant, f16)
    assert ratio == round(f16 / quant, 2) and ratio > 2  # q8_0 K + q4_0 V: (2 + 2) / (34/32 + 18/32) = 2.46


@pytest.mark.slow
def test_the_embedded_model_is_served_with_a_quantized_v_unless_the_user_names_the_types(tmp_path):
    with running(None, log_dir=tmp_path / "default") as srv:
        log = srv.log()
    (line,) = [line for line in log.splitlines() if "KV cache:" in line]
    # no flags: q8_0 K / q4_0 V, and -fa auto resolves to llama-vq's attention on the CPU
    assert "KV cache: K q8_0, V q4_0, " in line and "attention: off" in line, line
    with running(None, "-ctv", "f16", log_dir=tmp_path / "f16") as srv:
        log = srv.log()
    (line,) = [line for line in log.splitlines() if "KV cache:" in line]
    assert "K f16, V f16" in line, line  # the user's choice stands, and the other type keeps llama.cpp's default


def test_kv_cache_line_counts_sliding_window_layers_in_their_own_types():
    kv = {
        "type_k": "q8_0",
        "type_v": "q4_0",
        "n_cells": 4096,
        "k_bytes": 34 * MIB + 16 * MIB,  # full layers q8_0 (34 MiB), sliding-window layers f16 (16 MiB)
        "v_bytes": 18 * MIB + 16 * MIB,
        "flash_attn": 2,
        "type_k_swa": "f16",
        "type_v_swa": "f16",
        "swa_k_bytes": 16 * MIB,
        "swa_v_bytes": 16 * MIB,
    }
    line = kv_cache_line(kv)
    # f16 of the full layers: 64 + 64 MiB; the sliding-window layers are f16 already: 16 + 16 MiB
    assert "84.0 MiB (f16: 160.0 MiB, 1.90x)" in line, line
    assert "sliding-window layers: K f16, V f16" in line and "attention: prefill" in line, line
