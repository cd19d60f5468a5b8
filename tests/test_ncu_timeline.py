"""benchmarks/ncu_timeline.py: the per-kernel table of one decode step, from an ncu CSV shaped as ncu 2025.3 writes it
(`--csv --print-units base --metrics gpu__time_duration.sum`, kernel names demangled, numbers with thousands
separators), for a llama-bench run whose prefill graphs come first and whose decode graphs each start with two
get_rows launches (the token embedding and another)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def load():
    spec = importlib.util.spec_from_file_location("ncu_timeline", ROOT / "benchmarks" / "ncu_timeline.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def row(i: int, name: str, value: str, unit: str = "nsecond") -> str:
    return (f'"{i}","1","llama-bench","h","{name}","1","7","(128, 1, 1)","(8, 1, 1)","0","9.0",'
            f'"Command line profiler metrics","gpu__time_duration.sum","{unit}","{value}"')


def decode_graph(attn_ns: str) -> list[tuple[str, str]]:
    return [("void k_get_rows_float<float, float>(const float *, int)", "2,000"),
            ("void k_get_rows_float<float, float>(const float *, int)", "1,000"),
            ("void k_attn_decode<(ggml_type)2, (ggml_type)2, 4, float>(attn_decode_params)", attn_ns),
            ("k_attn_decode_combine(const float *, int)", "7,000")]


def test_decode_steps_are_split_at_the_embedding_and_averaged_after_the_first(tmp_path, capsys):
    nt = load()
    kernels = [("void k_get_rows_float<float, float>(const float *, int)", "3,000"),
               ("void mul_mat_q<(ggml_type)12, 128, false>(const char *, int)", "900,000")]  # the prefill graph
    kernels += decode_graph("99,000") + decode_graph("60,000") + decode_graph("62,000")
    kernels += decode_graph("61,000")[:1]  # a last graph cut short by ncu's log
    lines = ["==PROF== Connected to process 1", HEADER]
    lines += [row(i, name, value) for i, (name, value) in enumerate(kernels)]
    csv = tmp_path / "tl.csv"
    csv.write_text("\n".join(lines) + "\n")

    segs = nt.steps(nt.rows_of(str(csv)))
    assert [len(s) for s in segs] == [4, 4, 4]
    total = nt.table(str(csv))
    out = capsys.readouterr().out
    # steps 2 and 3 averaged: attention 61 us, combine 7, get_rows 3
    assert abs(total - 71_000.0) < 1e-6
    assert "2 decode steps averaged, 4 kernels per step" in out
    assert "k_attn_decode<(ggml_type)2, (ggml_type)2, 4, float>" in out
    assert "61.0" in out and "k_attn_decode_combine" in out


def test_units_and_short_names(tmp_path):
    nt = load()
    csv = tmp_path / "u.csv"
    csv.write_text("\n".join([HEADER, row(0, "k(int)", "1.5", "usecond"), row(1, "k(int)", "2,500", "nsecond")]) + "\n")
    assert [r[2] for r in nt.rows_of(str(csv))] == [1500.0, 2500.0]
    assert nt.short("void mul_mat_vec_q<(ggml_type)12, 1, false>(const void *, int)") == \
        "mul_mat_vec_q<(ggml_type)12, 1, false>"
    assert nt.short("k_attn_decode_combine(const float *, int)") == "k_attn_decode_combine"
