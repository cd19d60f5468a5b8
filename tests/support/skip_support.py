"""Skips that CI accepts: a limit of the machine, stated as such (tests/conftest.py, pytest_runtest_makereport).

With LLAMA_VQ_CI=1 (set by .ci/run) every other skip is a failure: a HIP compile without root, a kernel emulation
without the exported sources, a declared test dependency that is missing. Evidence that silently turns into a skip
is how a suite passes without testing what it names.
"""

from __future__ import annotations

from typing import NoReturn

import pytest

PREFIX = "platform limit: "
CI_ENV = "LLAMA_VQ_CI"


def skip_platform_limit(reason: str) -> NoReturn:
    """Skip because this machine cannot run the test at all (another CPU architecture, a SIMD level it lacks, a level
    another test of the suite already covers on it); allowed in CI."""
    pytest.skip(PREFIX + reason)


def is_platform_limit(reason: str) -> bool:
    return reason.startswith(PREFIX)
