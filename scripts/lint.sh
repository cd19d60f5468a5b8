#!/usr/bin/env bash
# The checks that run first, in seconds (scripts/run.sh test calls this before pytest):
#   ruff's lint (pyproject.toml [tool.ruff]) over the repository's Python and its format check over llama_vq,
#   tests and tools (benchmarks/ is linted, not yet formatted: its serving scripts are being reworked);
#   mypy over llama_vq, llama_vq.server included ([tool.mypy]); the history lint (tools/_history.py); no import
#   circles in llama_vq/ and tools/ (tools/_imports.py); docs/knobs.md is the registry's (tools/knobs.py check).
# Python: $PYTHON (default: .venv's, where scripts/run.sh installs ruff and mypy with the test extra).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
py=${PYTHON:-.venv/bin/python}
"$py" -m ruff check --quiet .
"$py" -m ruff format --check --quiet llama_vq tests tools
"$py" -m mypy
"$py" tools/_history.py
"$py" tools/_imports.py
"$py" tools/knobs.py check
echo "llama-vq: lint passed (ruff, ruff format, mypy, history, import circles, knobs.md)" >&2
