"""Schemathesis against the app's own OpenAPI schema: no 5xx, no response outside the schema.

The app runs in-process (ASGI) with SmolLM2. Valid requests generate at most 24 tokens and each
operation gets 30 examples per mode, so the file takes about a minute on 2 idle cores.
"""

from __future__ import annotations

import time

import pytest
import schemathesis
from hypothesis import HealthCheck, given, seed, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

pytestmark = pytest.mark.slow

MAX_EXAMPLES = 30  # per operation and mode; enough to reach every field, bounded for CI time
SEED = 20261201  # the same examples on every run and machine: a failure reproduces
MAX_NEW = 24  # generated tokens per valid request (see _cap_generation)
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
    negative_data_rejection,
]


@pytest.fixture(scope="module")
def app(smollm2_path):
    import llama_vq  # noqa: F401  (binds llama_cpp before the server imports it)
    from server.app import create_app
    from server.engine import Engine
    from server.metrics import Metrics
    from server.settings import parse_settings

    cfg = parse_settings(
        [
            "-m",
            str(smollm2_path),
            "--ctx-size",
            "128",
            "--max-queue",
            "64",
            "--max-body-size",
            "256K",
        ],
        {},
    )
    metrics = Metrics()
    engine = Engine(cfg, metrics, cfg.model)
    engine.start()
    deadline = time.monotonic() + 120
    while engine.status == "loading" and time.monotonic() < deadline:
        time.sleep(0.05)  # poll the load, not a readiness guess
    assert engine.status == "ready", engine.load_error
    yield create_app(cfg, engine, metrics, manage_engine=False)
    engine.shutdown()


@pytest.fixture(scope="module")
def api_schema(app):
    return schemathesis.openapi.from_asgi("/openapi.json", app)


OPERATIONS = [
    ("GET", "/health"),
    ("GET", "/metrics"),
    ("GET", "/v1/models"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
]
CASES = [(m, p, GenerationMode.POSITIVE) for m, p in OPERATIONS] + [
    (m, p, GenerationMode.NEGATIVE) for m, p in OPERATIONS if m == "POST"
]


def _cap_generation(body: dict) -> None:
    """At most MAX_NEW tokens per valid request: the fuzzer's max_tokens is either absent or huge,
    which would let every example run to the end of the context (CPU time, not coverage)."""
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if key == "max_tokens" or value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value > MAX_NEW:
                body[key] = MAX_NEW


# Hypothesis driven directly (schemathesis' own pytest loader does not run on pytest 9 yet).
@pytest.mark.parametrize(
    ("method", "path", "mode"), CASES, ids=[f"{m} {p} {g.value}" for m, p, g in CASES]
)
def test_no_server_error_and_no_schema_violation(api_schema, method, path, mode):
    operation = api_schema[path][method]
    statuses: list[int] = []

    # Health checks stay on, but too_slow: every example is a real request to the model (tens of ms each).
    @seed(SEED)
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case):
        if mode is GenerationMode.POSITIVE and isinstance(case.body, dict):
            _cap_generation(case.body)
        statuses.append(case.call_and_validate(checks=CHECKS, timeout=120).status_code)

    check()
    if mode is GenerationMode.POSITIVE:  # the fuzzing reached the model, not only the validators
        assert 200 in statuses, sorted(set(statuses))
    print(f"{method} {path} {mode.value}: {len(statuses)} calls, statuses {sorted(set(statuses))}")
