"""llama-vq-server's own flags have one source of defaults (llama_vq/server/options.py FLAGS): the settings take
theirs from it, --help prints them, and docs/server.md states the same values. No server started."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from llama_vq.server.options import DEFAULTS, FLAGS, help_text, split_argv
from llama_vq.server.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
WITH_DEFAULT = [f for f in FLAGS if f.default_text is not None]


def test_settings_defaults_are_the_flags_defaults():
    fields = {f.name: f.default for f in dataclasses.fields(Settings)}
    for f in FLAGS:
        assert fields[f.name] == f.default == DEFAULTS[f.name], f.flag
        assert getattr(Settings.build({}, {}), f.name) == f.default, f.flag


def test_help_prints_every_flag_with_its_default_and_variable():
    text = help_text()
    for f in FLAGS:
        (line,) = [x for x in text.splitlines() if x.strip().startswith(f.flag + " ")]
        assert f.env in line
        if f.default_text is not None:
            assert f"(default {f.default_text}; env: {f.env})" in line, line


@pytest.mark.parametrize("flag", WITH_DEFAULT, ids=lambda f: f.flag)
def test_docs_state_the_flags_default(flag):
    docs = (ROOT / "docs" / "server.md").read_text()
    stated = [m.group(1) for m in re.finditer(rf"{re.escape(flag.flag)}[^(\n|]*\(default ([^,);]+)", docs)]
    assert stated, f"docs/server.md states no default for {flag.flag}"
    assert set(stated) == {flag.default_text}, (
        f"docs/server.md: {flag.flag} default {stated}, FLAGS: {flag.default_text}"
    )


def test_a_flag_overrides_its_variable_and_both_convert():
    ours, rest = split_argv(
        ["--state-budget", "1K", "-c", "64"], {"LLAMA_VQ_STATE_BUDGET": "2K", "LLAMA_VQ_DRAIN_TIMEOUT": "0.5"}
    )
    assert ours == {"state_budget": 1024, "drain_timeout": 0.5} and rest == ["-c", "64"]
