"""benchmarks/spec_replay.py's arithmetic: totals, acceptance and the side-by-side ratios, from made-up replies.

No server, no model: <1 s. (The replay itself was run against llama-vq-server and llama-server by hand; the
server-side behaviour is tests/server/test_speculative.py's.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import spec_prompts  # noqa: E402
import spec_replay  # noqa: E402


def _task(tokens, wall, text="x", **timings):
    return {"completion_tokens": tokens, "wall_s": wall, "timings": timings, "text_sha256": text}


def test_totals_weigh_each_request_by_its_tokens_and_acceptance_is_accepted_over_drafted():
    tasks = [
        _task(100, 2.0, predicted_n=100, predicted_ms=1000.0, draft_n=80, draft_n_accepted=60),
        _task(300, 2.0, predicted_n=300, predicted_ms=1000.0, draft_n=20, draft_n_accepted=20),
    ]
    s = spec_replay.summarize(tasks)
    assert s["tok_s"] == pytest.approx(100.0)  # 400 tokens / 4 s, not the mean of 50 and 150
    assert s["predicted_per_second"] == pytest.approx(200.0)  # 400 tokens / 2 s of generation
    assert (s["draft_n"], s["draft_n_accepted"]) == (100, 80)
    assert s["acceptance"] == pytest.approx(0.8)


def test_a_server_without_draft_fields_or_timings_reports_wall_time_only():
    s = spec_replay.summarize([_task(50, 5.0)])
    assert s == {"completion_tokens": 50, "wall_s": 5.0, "tok_s": 10.0}


def test_side_by_side_gives_spec_over_plain_and_counts_identical_answers():
    plain = {"tasks": [_task(100, 10.0, "a", predicted_n=100, predicted_ms=8000.0), _task(100, 10.0, "b")]}
    spec = {
        "tasks": [
            _task(100, 4.0, "a", predicted_n=100, predicted_ms=2000.0, draft_n=90, draft_n_accepted=81),
            _task(100, 4.0, "c", draft_n=10, draft_n_accepted=0),
        ]
    }
    plain["summary"], spec["summary"] = spec_replay.summarize(plain["tasks"]), spec_replay.summarize(spec["tasks"])
    table, fig = spec_replay.side_by_side(plain, spec)
    assert fig["ratio"]["tok_s"] == pytest.approx(2.5)
    assert fig["ratio"]["predicted_per_second"] == pytest.approx(4.0)
    assert fig["same_answers"] == 1 and fig["tasks"] == 2
    assert "2.50x" in table and "100 / 81" in table and "81.0%" in table and "1/2 tasks" in table


def test_every_edit_asks_for_the_whole_file_with_the_file_in_the_prompt():
    for edit in spec_prompts.EDITS:
        msgs = spec_prompts.messages(edit)
        assert msgs[0]["role"] == "system" and msgs[1]["role"] == "user"
        assert edit in msgs[1]["content"] and spec_prompts.CODE in msgs[1]["content"]
        assert "complete updated file" in msgs[1]["content"]
