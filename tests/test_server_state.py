"""KV state persistence (--state-dir) of a real llama-vq-server with SmolLM2, across restarts.

Greedy outputs after a restore are compared with a fresh server's for the same prompt. Exact text
equality is expected: the restored KV bytes are the ones a fresh run computes, and only the last
prompt token (or the new suffix) is evaluated on top of them. It is the same assumption llama_cpp
makes when it reuses its in-memory prefix, which every second request in these tests exercises too.
CPU cost: about 8 short server runs and ~30 generations of <= 16 tokens; about 30-45 s on 2 cores.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from server_support import ServerProcess

from server.kv_store import MAGIC, SUFFIX, encode, read_header

pytestmark = pytest.mark.slow

PROMPT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined movable metal type, oil-based ink and a wooden screw press. Within fifty years"
)
MORE = " printing shops had opened in more than two hundred European cities, and"
STATE_FLAGS = ("--state-min-tokens", "8")


def _complete(s: ServerProcess, prompt: str, max_tokens: int = 16) -> dict:
    r = httpx.post(
        s.url + "/v1/completions",
        timeout=120,
        json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
    )
    assert r.status_code == 200, r.text
    return r.json()


def _text(resp: dict) -> str:
    return resp["choices"][0]["text"]


def _files(d: Path) -> list[Path]:
    return sorted(d.glob("*" + SUFFIX))


def _assert_recomputed_as_foreign(s: ServerProcess) -> None:
    """The state file on disk is refused as another configuration's: nothing restored, all recomputed."""
    s.wait_ready()
    r = _complete(s, PROMPT)
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert s.metrics()["llama_vq_kv_state_restored_tokens_total"] == 0
    assert "belong to another model or configuration" in s.log()


@pytest.fixture(scope="module")
def fresh(smollm2_path, tmp_path_factory):
    """Reference outputs from a server without --state-dir."""
    s = ServerProcess(smollm2_path, log_dir=tmp_path_factory.mktemp("fresh"))
    try:
        s.wait_ready()
        yield {p: _text(_complete(s, p)) for p in (PROMPT, PROMPT + MORE)}
    finally:
        s.stop()


@pytest.fixture()
def state_dir(smollm2_path, tmp_path):
    """A state directory with the state of PROMPT's request, written by a server that exited 0."""
    d = tmp_path / "kv"
    s = ServerProcess(smollm2_path, "--state-dir", str(d), *STATE_FLAGS, log_dir=tmp_path)
    s.wait_ready()
    _complete(s, PROMPT)
    assert s.terminate() == 0, s.log()
    assert len(_files(d)) == 1, s.log()
    return d


def test_restart_restores_the_prefix_and_gives_the_fresh_greedy_tokens(
    smollm2_path, tmp_path, state_dir, fresh
):
    s = ServerProcess(smollm2_path, "--state-dir", str(state_dir), *STATE_FLAGS, log_dir=tmp_path)
    try:
        s.wait_ready()
        same = _complete(s, PROMPT)
        n_prompt = same["usage"]["prompt_tokens"]
        assert same["usage"]["prompt_tokens_details"]["cached_tokens"] == n_prompt - 1
        assert _text(same) == fresh[PROMPT]
        assert s.metrics()["llama_vq_kv_state_restored_tokens_total"] >= n_prompt

        s.stop()  # and once more from disk, now with a longer prompt sharing the prefix
        s = ServerProcess(
            smollm2_path, "--state-dir", str(state_dir), *STATE_FLAGS, log_dir=tmp_path
        )
        s.wait_ready()
        longer = _complete(s, PROMPT + MORE)
        assert longer["usage"]["prompt_tokens_details"]["cached_tokens"] >= n_prompt
        assert _text(longer) == fresh[PROMPT + MORE]
        assert "restored KV state" in s.log()
    finally:
        s.stop()


@pytest.mark.parametrize("damage", ["truncate", "flip-payload", "garbage"])
def test_damaged_state_file_is_skipped_with_a_warning_and_recomputed(
    smollm2_path, tmp_path, state_dir, fresh, damage
):
    (f,) = _files(state_dir)
    raw = f.read_bytes()
    f.write_bytes(
        {
            "truncate": raw[: len(raw) // 2],
            "flip-payload": raw[:-100] + bytes(b ^ 0x5A for b in raw[-100:]),
            "garbage": b"\0" * 64,
        }[damage]
    )
    s = ServerProcess(smollm2_path, "--state-dir", str(state_dir), *STATE_FLAGS, log_dir=tmp_path)
    try:
        s.wait_ready()
        r = _complete(s, PROMPT)
        assert _text(r) == fresh[PROMPT]
        assert "skipping KV state file" in s.log()
        m = s.metrics()
        assert m["llama_vq_kv_state_restored_tokens_total"] == 0
        assert m["llama_vq_kv_state_rejected_total"] >= 1
    finally:
        s.stop()


def test_state_that_llama_cpp_refuses_is_skipped_and_recomputed(
    smollm2_path, tmp_path, state_dir, fresh
):
    """A file with valid checksums whose KV payload llama.cpp cannot read (wrong sequence magic)."""
    (f,) = _files(state_dir)
    header, tokens, offset = read_header(f, json.loads(_raw_header(f))["identity"])
    payload = bytearray(f.read_bytes()[offset:])
    payload[0] ^= 0xFF
    prefix, body = encode(header["identity"], tokens, bytes(payload))
    f.write_bytes(prefix + body)
    s = ServerProcess(smollm2_path, "--state-dir", str(state_dir), *STATE_FLAGS, log_dir=tmp_path)
    try:
        s.wait_ready()
        assert _text(_complete(s, PROMPT)) == fresh[PROMPT]
        assert "llama.cpp refused it" in s.log()
        assert s.metrics()["llama_vq_kv_state_rejected_total"] >= 1
    finally:
        s.stop()


def test_state_of_other_cache_types_is_never_loaded(smollm2_path, tmp_path, state_dir):
    s = ServerProcess(
        smollm2_path, "--state-dir", str(state_dir), *STATE_FLAGS, "-ctk", "q8_0", log_dir=tmp_path
    )
    try:
        _assert_recomputed_as_foreign(s)
    finally:
        s.stop()
    assert len(_files(state_dir)) == 2  # the f16 file is left alone; the q8_0 one is added


def _raw_header(f: Path) -> bytes:
    raw = f.read_bytes()
    assert raw.startswith(MAGIC)
    n = int.from_bytes(raw[len(MAGIC) : len(MAGIC) + 4], "little")
    return raw[len(MAGIC) + 4 : len(MAGIC) + 4 + n]



def test_state_files_shrink_by_the_cache_type_ratio(smollm2_path, tmp_path, record_property, build):
    """KV payload = fixed part + n_tokens x (bytes of a K cell + bytes of a V cell), cells as allocated.

    Measured with flash attention on (any build); with the V patch in the build, q8_0 K / q4_0 V
    with flash attention off too, which must write exactly as many KV bytes.
    """
    configs = [
        ("f16", "f16", "on"),
        ("f16", "q8_0", "on"),
        ("f16", "q4_0", "on"),
        ("q8_0", "q4_0", "on"),
    ]
    if build.nonfa_quantized_v:
        configs.append(("q8_0", "q4_0", "off"))
    payload, files = {}, {}
    cell = {}  # bytes of one KV cell of K and of V (all layers), as llama.cpp allocated them (/health)
    n_tokens = 0
    for k, v, fa in configs:
        d = tmp_path / f"{k}-{v}-{fa}"
        s = ServerProcess(
            smollm2_path,
            "--state-dir",
            str(d),
            *STATE_FLAGS,
            "-ctk",
            k,
            "-ctv",
            v,
            "-fa",
            fa,
            log_dir=tmp_path,
        )
        try:
            h = s.wait_ready()
            kv, n_ctx = h["kv_cache_bytes"], h["n_ctx"]
            assert kv["k"] % n_ctx == 0 and kv["v"] % n_ctx == 0, h
            cell[("k", k)], cell[("v", v)] = kv["k"] // n_ctx, kv["v"] // n_ctx
            r = _complete(s, PROMPT, max_tokens=1)  # the state holds exactly the prompt
            n_tokens = r["usage"]["prompt_tokens"]
            assert s.terminate() == 0
        finally:
            s.stop()
        (f,) = _files(d)
        header, _, _ = read_header(f, json.loads(_raw_header(f))["identity"])
        payload[(k, v, fa)], files[(k, v, fa)] = header["payload_bytes"], f.stat().st_size
    shown = {
        f"K {k} / V {v} / FA {fa}": f"{files[c]} B file, {payload[c]} B KV"
        for c in configs
        for k, v, fa in [c]
    }
    record_property("state_files", shown)
    print(f"\nstate files for {n_tokens} prompt tokens (SmolLM2-135M, CPU):", shown)
    # Expected sizes from what the library allocated per cell (not from this test's idea of the model's shape)
    v_tok = {t: n_tokens * cell[("v", t)] for t in ("f16", "q8_0", "q4_0")}
    k_tok = {t: n_tokens * cell[("k", t)] for t in ("f16", "q8_0")}
    p = {(k, v): payload[(k, v, "on")] for k, v, fa in configs if fa == "on"}
    # Exact: the V part shrinks by the per-cell bytes; K and the fixed part are unchanged.
    assert p[("f16", "f16")] - p[("f16", "q4_0")] == v_tok["f16"] - v_tok["q4_0"]
    assert p[("f16", "f16")] - p[("f16", "q8_0")] == v_tok["f16"] - v_tok["q8_0"]
    assert p[("f16", "q4_0")] - p[("q8_0", "q4_0")] == k_tok["f16"] - k_tok["q8_0"]
    # the fixed part (metadata) is the same for every configuration
    fixed = {c: payload[c] - k_tok[c[0]] - v_tok[c[1]] for c in configs}
    assert len(set(fixed.values())) == 1 and 0 <= fixed[configs[0]] < 4096, fixed
    if ("q8_0", "q4_0", "off") in payload:  # the V patch stores q4_0 V row-major: same bytes
        assert payload[("q8_0", "q4_0", "off")] == p[("q8_0", "q4_0")]
    # The file adds a header (identity with the patch list, checksums) and 4 bytes per token id.
    for c in configs:
        assert 0 < files[c] - payload[c] - 4 * n_tokens < 4096
    # the README's "V part of a q4_0-V file is 3.56x smaller than with f16", from the files' V parts
    v_f16 = p[("f16", "f16")] - fixed[configs[0]] - k_tok["f16"]
    v_q4 = p[("f16", "q4_0")] - fixed[configs[0]] - k_tok["f16"]
    assert round(v_f16 / v_q4, 2) == 3.56, (v_f16, v_q4)
    record_property("state_fixed_bytes", fixed[configs[0]])


def test_state_saved_with_kv_rotation_is_never_loaded_without_it(smollm2_path, tmp_path):
    """llama.cpp rotates quantized K/V (Hadamard) unless LLAMA_ATTN_ROT_DISABLE is set: the stored rows differ."""
    d = tmp_path / "kv"
    flags = ("--state-dir", str(d), *STATE_FLAGS, "-ctk", "q8_0", "-ctv", "q8_0")
    s = ServerProcess(smollm2_path, *flags, log_dir=tmp_path)
    s.wait_ready()
    _complete(s, PROMPT)
    assert s.terminate() == 0, s.log()
    assert len(_files(d)) == 1, s.log()

    s = ServerProcess(smollm2_path, *flags, log_dir=tmp_path, env={"LLAMA_ATTN_ROT_DISABLE": "1"})
    try:
        _assert_recomputed_as_foreign(s)
    finally:
        s.stop()
    assert len(_files(d)) == 2
