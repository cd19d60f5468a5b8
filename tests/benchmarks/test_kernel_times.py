"""benchmarks/kernel_times.py: ncu's CSV turned into the GPU time of a decoded token per kernel and family."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import kernel_times  # noqa: E402

HEADER = (
    '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
    '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
)


def _row(i: int, kernel: str, unit: str, value: str) -> str:
    return (
        f'"{i}","1","llama-bench","h","{kernel}","1","7","(128, 1, 1)","(12, 8, 1)","0","9.0",'
        f'"Command line profiler metrics","gpu__time_duration.sum","{unit}","{value}"'
    )


ATTN = "void k_attn_decode<8, 3, 8, float, 1>(attn_decode_params)"
CSV = (
    "\n".join(
        [
            "==PROF== Connected to process 1",
            HEADER,
            _row(0, ATTN, "ns", "10,000"),
            _row(1, "k_attn_decode_combine(const float *, const float2 *)", "ns", "3000"),
            _row(2, "void mul_mat_vec_q<(ggml_type)2, 1>(const void *)", "us", "5.5"),
            _row(3, ATTN, "ns", "12000"),
        ]
    )
    + "\n"
)


def test_names_families_and_units():
    rows = kernel_times.read_ncu_csv(CSV)
    assert rows == [
        ("k_attn_decode", 10.0),
        ("k_attn_decode_combine", 3.0),
        ("mul_mat_vec_q", 5.5),
        ("k_attn_decode", 12.0),
    ]
    by_name, by_fam = kernel_times.per_token(rows, tokens=2)
    assert by_name["k_attn_decode"] == (1.0, 11.0)
    assert by_fam == {"attention (ours)": 11.0, "combine (ours)": 1.5, "matrix products": 2.75}


def test_report_side_by_side(tmp_path, capsys):
    f = tmp_path / "a.csv"
    f.write_text(CSV)
    assert kernel_times.main(["--tokens", "2", f"ours={f}", f"again={f}"]) == 0
    out = capsys.readouterr().out
    assert "| attention (ours) | 11.0 | 11.0 |" in out and "| **all** | 15.2 | 15.2 |" in out


def test_not_ncu_csv_is_an_error(tmp_path, capsys):
    f = tmp_path / "b.csv"
    f.write_text("no profile here\n")
    assert kernel_times.main([f"x={f}"]) == 1
    assert "no ncu CSV header" in capsys.readouterr().err


def test_two_runs_differing_in_tokens_leave_the_fill_out(tmp_path, capsys):
    long_, short = tmp_path / "n3.csv", tmp_path / "n1.csv"
    long_.write_text(CSV)
    short.write_text("\n".join(CSV.splitlines()[:3]) + "\n")  # the first kernel only: "the fill"
    assert kernel_times.main(["--tokens", "2", f"d={long_},{short}"]) == 0
    out = capsys.readouterr().out
    # left: one k_attn_decode (12 us), the combine (3), the product (5.5), over 2 tokens
    assert "| attention (ours) | 6.0 |" in out and "| combine (ours) | 1.5 |" in out
