"""-fa auto chosen by measurement (llama_vq/attn_choice.py) and every layer's attention checked on its device
(0018-llama-flash-attn-prefill-mode, llama-vq-placement.h), on the CPU, where both paths exist.

Timings are injected where the test is about the choice (the CPU's own would decide one way only); the cache is a
file of the test's own (LLAMA_VQ_ATTN_CACHE). A backend without a kernel is stood in for by LLAMA_VQ_ATTN_UNSUPPORTED,
which makes the placement check treat the named ops as unsupported on the layers' device.
"""

from __future__ import annotations

import json
import logging

import pytest


@pytest.fixture()
def choice_env(monkeypatch, tmp_path, llama_vq):
    from llama_vq import attn_choice

    path = tmp_path / "attn-choice.json"
    monkeypatch.setenv("LLAMA_VQ_ATTN_TUNE", "1")
    monkeypatch.setenv("LLAMA_VQ_ATTN_CACHE", str(path))
    monkeypatch.delenv("LLAMA_VQ_ATTN_UNSUPPORTED", raising=False)
    monkeypatch.delenv("LLAMA_VQ_FA_AUTO", raising=False)
    monkeypatch.setattr(attn_choice, "_warned", set())
    return path


class Counting:
    """A measure function returning fixed timings, counting its calls."""

    def __init__(self, timings):
        self.timings = timings
        self.calls = 0

    def __call__(self, *args):
        self.calls += 1
        return self.timings


def _dev(accelerator: bool):
    from llama_vq.attn_choice import Device

    return Device("Test0" if accelerator else "CPU", "a test device", accelerator, "test 1" if accelerator else "")


Q4_0, Q8_0, F16 = 2, 8, 1


@pytest.mark.parametrize(
    "accel,prompt,decode,expect",
    [
        # (flash, llama-vq) tok/s per batch kind
        (False, (100.0, 400.0), (20.0, 80.0), "off"),  # the CPU's static rule, confirmed
        (False, (400.0, 100.0), (80.0, 20.0), "on"),  # flash attention faster for both: the other way
        (False, (104.0, 100.0), (20.0, 20.0), "off"),  # 4 % is inside the margin: the static rule stays
        (True, (4700.0, 2200.0), (140.0, 148.0), "prefill"),  # the H100's shape of numbers
        (True, (1000.0, 1300.0), (140.0, 148.0), "off"),  # the split prefills faster
        (True, (4700.0, 2200.0), (170.0, 148.0), "on"),  # flash attention decodes faster
        (True, (None, 2200.0), (None, 148.0), "off"),  # flash attention refused on the device
    ],
)
def test_choice_follows_injected_timings_either_way(choice_env, smollm2_path, accel, prompt, decode, expect):
    from llama_vq import attn_choice

    t = attn_choice.Timings(prompt[0], prompt[1], decode[0], decode[1])
    m = Counting(t)
    c = attn_choice.choose(smollm2_path, Q8_0, Q4_0, n_ubatch=512, n_ctx=4096, measure_fn=m, device=_dev(accel))
    assert (c.mode, c.how, m.calls) == (expect, "measured", 1)


def test_choice_without_quantized_v_is_on_or_off_throughout(choice_env, smollm2_path):
    from llama_vq import attn_choice

    faster_vq = attn_choice.Timings(100.0, 300.0, 20.0, 60.0)
    c = attn_choice.choose(smollm2_path, F16, F16, measure_fn=Counting(faster_vq), device=_dev(True))
    assert c.mode == "off"
    mixed = attn_choice.Timings(300.0, 100.0, 20.0, 21.0)  # decode 5 % apart at most: flash attention stays
    c = attn_choice.choose(smollm2_path, F16, F16, n_ubatch=256, measure_fn=Counting(mixed), device=_dev(True))
    assert c.mode == "on"


def test_second_start_reads_the_cache_and_measures_nothing(choice_env, smollm2_path):
    from llama_vq import attn_choice

    m = Counting(attn_choice.Timings(400.0, 100.0, 80.0, 20.0))
    first = attn_choice.choose(smollm2_path, Q8_0, Q4_0, measure_fn=m, device=_dev(False))
    second = attn_choice.choose(smollm2_path, Q8_0, Q4_0, measure_fn=m, device=_dev(False))
    assert (first.how, second.how, m.calls) == ("measured", "cached", 1)
    assert second.mode == first.mode == "on" and second.timings == first.timings
    assert "cached" in second.why()
    doc = json.loads(choice_env.read_text())
    assert [e["mode"] for e in doc["entries"].values()] == ["on"]


@pytest.mark.parametrize(
    "change",
    [
        {"type_v": Q8_0},
        {"n_ubatch": 256},
        {"n_ctx": 65536},  # a deeper context: another depth
        {"device": "driver"},
    ],
)
def test_a_changed_key_measures_again(choice_env, smollm2_path, change):
    from llama_vq import attn_choice

    m = Counting(attn_choice.Timings(100.0, 400.0, 20.0, 80.0))
    base = {"type_v": Q4_0, "n_ubatch": 512, "n_ctx": 4096}
    dev = _dev(True)
    attn_choice.choose(smollm2_path, Q8_0, base["type_v"], n_ubatch=base["n_ubatch"], n_ctx=base["n_ctx"],
                       measure_fn=m, device=dev)  # fmt: skip
    kw = {**base, **{k: v for k, v in change.items() if k != "device"}}
    if "device" in change:
        dev = attn_choice.Device(dev.name, dev.description, True, "test 2")
    c = attn_choice.choose(smollm2_path, Q8_0, kw["type_v"], n_ubatch=kw["n_ubatch"], n_ctx=kw["n_ctx"],
                           measure_fn=m, device=dev)  # fmt: skip
    assert (c.how, m.calls) == ("measured", 2)
    # and the first key is still there: the change did not overwrite it
    assert len(json.loads(choice_env.read_text())["entries"]) == 2


def test_a_corrupt_cache_file_is_ignored_with_one_warning(choice_env, smollm2_path, caplog):
    from llama_vq import attn_choice

    choice_env.write_text('{"version": 1, "entries": {"half a')
    m = Counting(attn_choice.Timings(100.0, 400.0, 20.0, 80.0))
    with caplog.at_level(logging.WARNING, logger="llama_vq.attn_choice"):
        a = attn_choice.choose(smollm2_path, Q8_0, Q4_0, n_ubatch=512, measure_fn=m, device=_dev(False))
        choice_env.write_text("not json at all")
        b = attn_choice.choose(smollm2_path, Q8_0, Q4_0, n_ubatch=256, measure_fn=m, device=_dev(False))
    assert (a.how, b.how, a.mode, m.calls) == ("measured", "measured", "off", 2)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(choice_env) in warnings[0].getMessage()


def test_an_unreadable_cache_file_is_ignored_with_one_warning(choice_env, smollm2_path, caplog):
    from llama_vq import attn_choice

    choice_env.mkdir()  # a folder where the file should be: neither readable nor writable as a file
    m = Counting(attn_choice.Timings(100.0, 400.0, 20.0, 80.0))
    with caplog.at_level(logging.WARNING, logger="llama_vq.attn_choice"):
        a = attn_choice.choose(smollm2_path, Q8_0, Q4_0, measure_fn=m, device=_dev(False))
        b = attn_choice.choose(smollm2_path, Q8_0, Q4_0, measure_fn=m, device=_dev(False))
    assert (a.mode, b.mode, m.calls) == ("off", "off", 2)
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


def test_measuring_off_keeps_the_static_rule(choice_env, smollm2_path, monkeypatch):
    from llama_vq import attn_choice

    monkeypatch.setenv("LLAMA_VQ_ATTN_TUNE", "0")
    m = Counting(attn_choice.Timings(400.0, 100.0, 80.0, 20.0))
    c = attn_choice.choose(smollm2_path, Q8_0, Q4_0, measure_fn=m, device=_dev(True))
    assert (c.mode, c.how, c.why(), m.calls) == ("prefill", "static", "static rule", 0)
    assert not choice_env.exists()


# --- the real library: the measurement, Llama(flash_attn="auto"), the placement check ------------------------------


def _make(llama_vq, path, **kw):
    args = {"n_ctx": 512, "n_batch": 128, "n_ubatch": 128, "n_threads": 2, "verbose": False,
            "type_k": "q8_0", "type_v": "q4_0"}  # fmt: skip
    args.update(kw)
    return llama_vq.Llama(str(path), **args)


def test_llama_auto_measures_once_then_reads_the_cache(choice_env, llama_vq, smollm2_path, monkeypatch):
    from llama_vq import attn_choice

    calls = []
    real = attn_choice.measure

    def counted(*a):
        calls.append(a)
        return real(*a)

    monkeypatch.setattr(attn_choice, "measure", counted)
    first = _make(llama_vq, smollm2_path, flash_attn="auto")
    assert first.flash_attn_why.startswith("measured at depth 256, ubatch 128")
    t = json.loads(choice_env.read_text())["entries"]
    (entry,) = t.values()
    timings = entry["timings"]
    assert all(timings[k] and timings[k] > 0 for k in timings), timings  # both paths ran on the CPU
    assert first.flash_attn_mode == entry["mode"]
    first.close()
    second = _make(llama_vq, smollm2_path, flash_attn="auto")
    assert second.flash_attn_why.startswith("cached")
    assert second.flash_attn_mode == first.flash_attn_mode
    assert len(calls) == 1


def test_llama_auto_follows_the_measured_mode(choice_env, llama_vq, smollm2_path, monkeypatch):
    from llama_vq import attn_choice

    # flash attention faster for prompts, llama-vq's for decode: prefill mode, even on the CPU
    monkeypatch.setattr(attn_choice, "measure", Counting(attn_choice.Timings(900.0, 100.0, 20.0, 80.0)))
    llm = _make(llama_vq, smollm2_path, flash_attn="auto")
    assert llm.flash_attn_mode == "prefill"
    assert llm.flash_attn_why.startswith("measured")
    monkeypatch.setenv("LLAMA_VQ_ATTN_TUNE", "0")
    static = _make(llama_vq, smollm2_path, flash_attn="auto")
    assert (static.flash_attn_mode, static.flash_attn_why) == ("off", "static rule")


def test_attention_layers_say_each_kind_its_paths_types_and_device(choice_env, llama_vq, smollm2_path, mimo_path):
    llm = _make(llama_vq, smollm2_path, flash_attn="prefill")
    (full,) = llm.attention_layers
    assert (full.kind, full.prompt, full.decode, full.type_k, full.type_v, full.device, full.n_layers) == (
        "full", "flash", "llama-vq", "q8_0", "q4_0", "CPU", 30,
    )  # fmt: skip
    assert full.line() == (
        "attention, full-attention layers (30): prompt flash attention, decode llama-vq's; K q8_0, V q4_0; CPU"
    )
    off = _make(llama_vq, smollm2_path, flash_attn="off").attention_layers
    assert [(a.prompt, a.decode) for a in off] == [("llama-vq", "llama-vq")]
    mimo = _make(llama_vq, mimo_path, flash_attn="on", n_batch=64, n_ubatch=64, swa_full=False, type_k_swa="f16",
                 type_v_swa="f16").attention_layers  # fmt: skip
    kinds = {a.kind: a for a in mimo}
    assert set(kinds) == {"full", "swa"}
    assert (kinds["swa"].type_k, kinds["swa"].type_v, kinds["full"].type_v) == ("f16", "f16", "q4_0")
    assert all((a.prompt, a.decode) == ("flash", "flash") for a in mimo)


def test_a_mode_whose_attention_would_leave_its_device_is_refused(choice_env, llama_vq, smollm2_path, monkeypatch):
    from llama_vq.errors import ContextCreationError

    monkeypatch.setenv("LLAMA_VQ_ATTN_UNSUPPORTED", "FLASH_ATTN_EXT")
    with pytest.raises(ContextCreationError) as e:
        _make(llama_vq, smollm2_path, flash_attn="on")
    msg = str(e.value)
    parts = ["-fa on", "30 full-attention layer(s)", "K q8_0, V q4_0", "would leave CPU", "Fix: -fa auto"]
    parts += ["FLASH_ATTN_EXT for prompt batches", "FLASH_ATTN_EXT for decode batches"]
    for part in parts:
        assert part in msg, msg
    with pytest.raises(ContextCreationError, match="-fa prefill .*FLASH_ATTN_EXT for prompt batches"):
        _make(llama_vq, smollm2_path, flash_attn="prefill")
    # the other path has its kernels: off runs
    assert _make(llama_vq, smollm2_path, flash_attn="off").flash_attn_mode == "off"


def test_auto_never_picks_a_mode_whose_attention_would_leave_its_device(
    choice_env, llama_vq, smollm2_path, monkeypatch
):
    from llama_vq import attn_choice

    # measured: flash attention faster for everything; but the device "lacks" it
    monkeypatch.setattr(attn_choice, "measure", Counting(attn_choice.Timings(900.0, 100.0, 90.0, 20.0)))
    monkeypatch.setenv("LLAMA_VQ_ATTN_UNSUPPORTED", "FLASH_ATTN_EXT")
    llm = _make(llama_vq, smollm2_path, flash_attn="auto")
    assert llm.flash_attn_mode == "off"
    assert "on passed over by the placement check" in llm.flash_attn_why
    # and the V*P of llama-vq's attention missing: off and prefill (its decode) refused, flash attention throughout
    monkeypatch.setenv("LLAMA_VQ_ATTN_UNSUPPORTED", "OUT_PROD")
    monkeypatch.setenv("LLAMA_VQ_ATTN_TUNE", "0")
    llm = _make(llama_vq, smollm2_path, flash_attn="auto")
    assert llm.flash_attn_mode == "on"
    # nothing left: refused, naming both paths' ops
    from llama_vq.errors import ContextCreationError

    monkeypatch.setenv("LLAMA_VQ_ATTN_UNSUPPORTED", "OUT_PROD,FLASH_ATTN_EXT")
    with pytest.raises(ContextCreationError, match="no attention mode keeps every layer's attention on its device"):
        _make(llama_vq, smollm2_path, flash_attn="auto")


def test_tune_attn_command_prints_the_table_then_reads_the_cache(choice_env, llama_vq, smollm2_path, capsys):
    from llama_vq import tune_attn

    args = ["-m", str(smollm2_path), "-ctk", "q8_0", "-ctv", "q4_0", "-ub", "128", "-c", "512", "-t", "2"]
    assert tune_attn.main(args) == 0
    out = capsys.readouterr().out
    assert "flash attention" in out and "llama-vq" in out and "depth 256, ubatch 128" in out
    assert "-fa auto: " in out and "(measured, " in out
    assert tune_attn.main(args) == 0
    assert "(cached;" in capsys.readouterr().out


def test_server_measures_auto_then_reads_the_cache_and_says_so_per_layer_kind(llama_vq, smollm2_path, tmp_path):
    import httpx
    from server_support import running

    env = {"LLAMA_VQ_ATTN_TUNE": "1", "LLAMA_VQ_ATTN_CACHE": str(tmp_path / "attn-choice.json")}
    args = ("-ctk", "q8_0", "-ctv", "q4_0", "-ub", "128", "-b", "128", "-c", "512", "-t", "2")
    hows = []
    for run in ("first", "second"):
        with running(smollm2_path, *args, log_dir=tmp_path / run, env=env) as srv:
            props = httpx.get(srv.url + "/props", timeout=10).json()
            log = srv.log()
        att = props["attention"]
        hows.append(att["choice"]["how"])
        assert att["mode"] == att["choice"]["mode"]  # nothing passed over on the CPU
        assert att["layers"] == [
            {"kind": "full", "prompt": "flash" if att["mode"] != "off" else "llama-vq",
             "decode": "flash" if att["mode"] == "on" else "llama-vq",
             "type_k": "q8_0", "type_v": "q4_0", "device": "CPU", "n_layers": 30}
        ]  # fmt: skip
        assert f"attention mode {att['mode']} ({att['choice']['how']} at depth 256, ubatch 128" in log
        assert "attention, full-attention layers (30): prompt " in log
    assert hows == ["measured", "cached"]
    # -fa asked for: no choice to make, the layers still said
    with running(smollm2_path, *args, "-fa", "prefill", log_dir=tmp_path / "asked", env=env) as srv:
        att = httpx.get(srv.url + "/props", timeout=10).json()["attention"]
    assert (att["mode"], att["choice"]) == ("prefill", None)
    assert [(a["prompt"], a["decode"]) for a in att["layers"]] == [("flash", "llama-vq")]
