"""Server side of per-layer cache types: llama-vq-server's --cache-type-k-swa / --cache-type-v-swa (and
their LLAMA_VQ_* variables) reach the engine, whose SWA sub-cache is then allocated with them (llama.cpp's own
report in the log), on a MiMo-shaped synthetic model with flash attention off.

CPU cost: three short server runs on a tiny synthetic model; a few seconds.
"""

from __future__ import annotations

import re

import httpx
import pytest
from server_support import ServerProcess, running

pytestmark = pytest.mark.slow

# llama.cpp's report of each KV cache it allocates: "llama_kv_cache: size = ... K (q4_0): ... MiB, V (q4_0): ..."
KV_REPORT = re.compile(r"llama_kv_cache: size = .*?K \((\w+)\): .*?V \((\w+)\)")


def test_options_and_settings_map_swa_types_to_ggml_types():
    from llama_vq.server.options import split_argv
    from llama_vq.server.settings import Settings

    ours, rest = split_argv(
        ["-m", "x.gguf", "--cache-type-k-swa", "F16", "--cache-type-v-swa=q8_0", "-ctk", "q4_0"], {}
    )
    assert rest == ["-m", "x.gguf", "-ctk", "q4_0"]  # llama-server's own flags pass untouched
    s = Settings.build(ours, {})
    assert (s.cache_type_k_swa, s.cache_type_v_swa) == (1, 8)  # GGML_TYPE_F16, GGML_TYPE_Q8_0
    env = {"LLAMA_VQ_CACHE_TYPE_K_SWA": "q4_0", "LLAMA_VQ_CACHE_TYPE_V_SWA": "f16"}
    s = Settings.build(split_argv(["--cache-type-v-swa", "q8_0"], env)[0], {})
    assert (s.cache_type_k_swa, s.cache_type_v_swa) == (2, 8)  # the flag wins over its variable
    assert Settings.build({}, {}).cache_type_k_swa is None  # default: the full layers' type


def test_unknown_swa_cache_type_is_refused_naming_the_flag(mimo_path, tmp_path):
    s = ServerProcess(mimo_path, "--cache-type-k-swa", "q3_k", log_dir=tmp_path)
    try:
        assert s.proc.wait(timeout=60) != 0
        assert "--cache-type-k-swa" in s.log() and "q3_k" in s.log()
    finally:
        s.stop()


def _served_kv_reports(mimo_path, tmp_path, *flags: str) -> list[tuple[str, str]]:
    # -lv 4: llama.cpp's INFO lines (its KV cache report) into the log
    with running(mimo_path, "-fa", "off", "-lv", "4", *flags, log_dir=tmp_path) as s:
        r = httpx.post(
            s.url + "/completion",
            json={"prompt": "Hello there, general", "n_predict": 4, "temperature": 0},
            timeout=120,
        )
        assert r.status_code == 200 and r.json()["tokens_predicted"] == 4, r.text
        return KV_REPORT.findall(s.log())


SWA_FLAGS = ("-ctk", "q4_0", "-ctv", "q4_0", "--cache-type-k-swa", "f16", "--cache-type-v-swa", "q8_0")


def test_swa_layers_get_their_own_types_in_the_served_context_without_fit(mimo_path, tmp_path):
    # the full layers' cache first, then the SWA layers' (llama_kv_cache_iswa's order)
    assert _served_kv_reports(mimo_path, tmp_path, *SWA_FLAGS, "-fit", "off") == [("q4_0", "q4_0"), ("f16", "q8_0")]


def test_swa_layers_get_their_own_types_in_the_served_context_with_fit(mimo_path, tmp_path):
    # -fit on (llama-server's default) creates a probe context before the served one: both must get the SWA types
    assert _served_kv_reports(mimo_path, tmp_path, *SWA_FLAGS) == [("q4_0", "q4_0"), ("f16", "q8_0")]


def test_without_swa_flags_every_layer_has_the_full_type(mimo_path, tmp_path):
    assert _served_kv_reports(mimo_path, tmp_path, "-ctk", "q8_0", "-ctv", "q8_0") == [("q8_0", "q8_0")] * 2
