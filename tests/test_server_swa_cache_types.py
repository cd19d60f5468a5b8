"""Server side of per-layer cache types (issue 12): --cache-type-k-swa / --cache-type-v-swa and the state identity."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.kv_store import cache_types_identity
from server.settings import SettingsError, parse_settings


@pytest.fixture()
def model_file(tmp_path: Path) -> Path:
    p = tmp_path / "m.gguf"
    p.write_bytes(b"GGUF")
    return p


def test_swa_cache_types_default_to_the_full_layers_types(model_file):
    s = parse_settings(["-m", str(model_file), "-ctk", "q4_0", "-ctv", "q4_0"], {})
    assert (s.cache_type_k_swa, s.cache_type_v_swa) == (None, None)


def test_swa_cache_type_flags_and_variables(model_file):
    s = parse_settings(["-m", str(model_file), "--cache-type-k-swa", "F16", "--cache-type-v-swa", "q8_0"], {})
    assert (s.cache_type_k_swa, s.cache_type_v_swa) == ("f16", "q8_0")
    env = {"LLAMA_VQ_CACHE_TYPE_K_SWA": "q4_0", "LLAMA_VQ_CACHE_TYPE_V_SWA": "f16"}
    s = parse_settings(["-m", str(model_file), "--cache-type-v-swa", "q8_0"], env)
    assert (s.cache_type_k_swa, s.cache_type_v_swa) == ("q4_0", "q8_0")  # the flag wins over its variable


def test_unknown_swa_cache_type_is_refused_naming_the_flag(model_file):
    with pytest.raises(SettingsError, match=r"--cache-type-k-swa 'q3_k': must be one of"):
        parse_settings(["-m", str(model_file), "--cache-type-k-swa", "q3_k"], {})


def test_state_identity_records_swa_types_only_when_they_differ():
    assert cache_types_identity("q4_0", "q4_0") == {"type_k": "q4_0", "type_v": "q4_0"}
    assert cache_types_identity("q4_0", "q4_0", "q4_0", None) == {"type_k": "q4_0", "type_v": "q4_0"}
    assert cache_types_identity("q4_0", "q4_0", "f16", None) == {
        "type_k": "q4_0", "type_v": "q4_0", "type_k_swa": "f16", "type_v_swa": "q4_0"}
    # two configurations that differ only in their SWA layers have different identities
    assert cache_types_identity("q8_0", "q4_1", "f16", "f16") != cache_types_identity("q8_0", "q4_1")
