#!/usr/bin/env python3
"""Run llama-server's own pytest suite (tools/server/tests) against llama-server and llama-vq-server.

The same selection of the suite runs against both servers; the report gives passed/failed/skipped
per server and the tests that llama-server passes but llama-vq-server fails, each with the first
lines of its failure.

Offline: the suite starts the server from $LLAMA_SERVER_BIN_PATH with --hf-repo/--hf-file (or
--model-url) arguments.  This script generates a small wrapper per server that replaces those by
`-m <local gguf>` (SmolLM2-135M-Instruct Q4_1 by default, llama_vq.default_model_path()), adds
`--threads 1` unless a thread count is given, and execs the target: the llama-server binary, or
`python -m llama_vq.server.cli`. The router preset names no model: llama-server then runs in router
mode, llama-vq-server (which has no router mode) serves its embedded default model, the same SmolLM2.

The suite is copied to a temp dir (the vendored tree is left alone) with two changes:
  * conftest's session fixture no longer pre-starts every preset to download its model
    (ServerPreset.load_all: a download cache warm-up, nothing to download offline);
  * tests that need a file from a model hub are deselected by a small plugin (the multimodal
    tinygemma3 preset and its mmproj, LoRA adapters); the report lists them with the reason.
The speculative tests' draft file (downloaded by the suite into ./tmp) is the local model itself,
which shares the target's vocabulary.

The suite is laid out as in the tree (NAME/tools/server/tests, models/ beside it) so that its
relative template paths resolve. As upstream's tests.sh, tests marked slow are left out unless
--slow (test_tool_call's are real-model tests). Every module of unit/ runs unless --modules names some;
the report gives each module's counts for both servers side by side.

Each pytest runs under `nice -n 10` with pytest-timeout's per-test limit; needs pytest-timeout,
requests, wget, filelock, aiohttp, openai, prometheus_client, numpy in the running interpreter
(`pip install "llama-vq[test,upstream-suite]"`).

Usage:
  python benchmarks/upstream_suite.py [--servers llama-server,llama-vq-server] [--modules a,b]
      [--concurrent] [--timeout 90] [--slow] [--out report.json] [--load earlier.json] [-k EXPR]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_process import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "vendor" / "llama.cpp" / "tools" / "server" / "tests"
# `benchmarks/serve_bench.py build --llama-vq` builds llama-server from the same patched tree here
LLAMA_SERVER = ROOT / "build" / "server-bench" / "bin" / "llama-server"

TARGETS = {
    "llama-server": [str(LLAMA_SERVER)],
    "llama-vq-server": [sys.executable, "-m", "llama_vq.server.cli"],
}

# most important first: when time is short, the head of the list is what runs; then every other module
PRIORITY_MODULES = [
    "test_basic",
    "test_chat_completion",
    "test_completion",
    "test_tokenize",
    "test_security",
    "test_compat_anthropic",
    "test_compat_oai_responses",
    "test_slot_save",
    "test_metrics",
    "test_infill",
    "test_ctx_shift",
    "test_tool_call",
    "test_template",
    "test_sleep",
    "test_embedding",
    "test_rerank",
    "test_speculative",
    "test_kv_keep_only_active",
    "test_ignore_eos",
]


def all_modules() -> list[str]:
    """Every module of the suite's unit/, PRIORITY_MODULES first."""
    found = sorted(p.stem for p in (SUITE / "unit").glob("test_*.py"))
    return [m for m in PRIORITY_MODULES if m in found] + [m for m in found if m not in PRIORITY_MODULES]


# deselected: needs a file from a model hub (nothing can be downloaded here); by test source, fixture or module
DESELECT_PLUGIN = """
import inspect

MARKERS = {
    "ServerPreset.tinygemma3()": "multimodal model (tinygemma3 + mmproj) from a model hub",
    "mmproj_server": "multimodal model (tinygemma3 + mmproj) from a model hub",
    "url=http://example.com": "reaches example.com (no network here)",
}
MODULES = {
    "test_vision_api.py": "multimodal model (tinygemma3 + mmproj) and its test images from a model hub",
    "test_lora.py": "LoRA adapter files (stories15M_MOE's, Llama-3-8B's) from a model hub",
}


def pytest_collection_modifyitems(config, items):
    keep, drop = [], []
    for item in items:
        why = MODULES.get(item.nodeid.split("::")[0].rsplit("/", 1)[-1])
        fn = getattr(item, "function", None)
        try:
            src = inspect.getsource(fn) if fn else ""
        except (OSError, TypeError):
            src = ""
        names = getattr(item, "fixturenames", ())
        for marker, reason in MARKERS.items():
            if why is None and (marker in src or marker in names):
                why = reason
        (drop if why else keep).append(item)
        if why:
            with open(config.getoption("--deselect-log"), "a") as f:
                f.write(item.nodeid + "\\t" + why + "\\n")
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_addoption(parser):
    parser.addoption("--deselect-log", default="deselected.tsv")
"""

WRAPPER = """#!{python}
# generated by benchmarks/upstream_suite.py: llama-server's test suite offline
import os, sys
MODEL = {model!r}
TARGET = {target!r}
DROP = {{"--hf-repo", "-hf", "-hfr", "--hf-file", "-hff", "--model-url", "-mu"}}
args, dropped, has_model, has_threads = [], False, False, False
it = iter(sys.argv[1:])
for a in it:
    if a in DROP:
        next(it, None)
        dropped = True
        continue
    if a in ("-m", "--model"):
        has_model = True
    if a in ("-t", "--threads"):
        has_threads = True
    args.append(a)
if dropped and not has_model:
    args = ["-m", MODEL] + args
if not has_threads:
    args += ["--threads", "1"]
os.execv(TARGET[0], TARGET + args)
"""


def default_model() -> str:
    out = subprocess.run(
        [sys.executable, "-c", "import llama_vq; print(llama_vq.default_model_path())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip().splitlines()[-1]


def prepare(work: Path, name: str, model: str) -> Path:
    """A copy of the suite for one server's pass (its own tmp/, slot files, logs) and its wrapper."""
    # laid out as in the tree, one tree per server: tests name files by paths relative to tools/server/tests
    # ("../../../models/templates/...") and test_tools_builtin reads and greps its own file from the root
    root = work / name
    suite = root / "tools" / "server" / "tests"
    for sub in ("models", "tools/mtmd"):
        if not (root / sub).exists() and (SUITE.parents[2] / sub).exists():
            (root / sub).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(SUITE.parents[2] / sub, root / sub)
    shutil.copytree(SUITE, suite, ignore=shutil.ignore_patterns("tmp", "__pycache__", ".pytest_cache"))
    for p in suite.rglob("*"):
        p.chmod(p.stat().st_mode | 0o200)
    conftest = suite / "conftest.py"
    text = conftest.read_text()
    assert "ServerPreset.load_all()" in text, "conftest.py changed upstream"
    conftest.write_text(text.replace("ServerPreset.load_all()", "pass  # offline: nothing to pre-download"))
    (suite / "offline_deselect.py").write_text(DESELECT_PLUGIN)
    tmp = suite / "tmp"
    tmp.mkdir(exist_ok=True)
    # test_speculative's draft (download_file keeps a file that is already there)
    os.symlink(model, tmp / "stories15M-q4_0.gguf")
    w = work / f"wrap-{name}"
    w.write_text(WRAPPER.format(python=sys.executable, model=model, target=TARGETS[name]))
    w.chmod(0o755)
    return suite


def first_lines(failure: ET.Element | None, n: int = 4) -> str:
    if failure is None:
        return ""
    text = failure.text or ""
    elines = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("E ")]
    elines = [ln for ln in elines if ln]
    if not elines:
        msg = failure.get("message") or ""
        elines = [ln for ln in msg.splitlines() if ln.strip()]
    return "\n".join(elines[:n])


def parse_junit(path: Path) -> dict[str, dict]:
    out: dict[str, dict] = {}
    if not path.exists():
        return out
    for case in ET.parse(path).getroot().iter("testcase"):
        cls = case.get("classname", "")
        node = cls.replace(".", "/") + ".py::" + case.get("name", "")
        if case.find("skipped") is not None:
            status, reason = "skipped", (case.find("skipped").get("message") or "")
        elif case.find("failure") is not None:
            status, reason = "failed", first_lines(case.find("failure"))
        elif case.find("error") is not None:
            status, reason = "error", first_lines(case.find("error"))
        else:
            status, reason = "passed", ""
        out[node] = {"status": status, "reason": reason, "time": float(case.get("time") or 0)}
    return out


def start_server_run(
    name: str, suite: Path, work: Path, modules: list[str], timeout: int, kexpr: str | None, slow: bool
) -> tuple[subprocess.Popen, float]:
    junit = work / f"junit-{name}.xml"
    deselect_log = work / f"deselected-{name}.tsv"
    env = dict(os.environ)
    env["LLAMA_SERVER_BIN_PATH"] = str(work / f"wrap-{name}")
    env["PORT"] = str(free_port())
    env.pop("DEBUG", None)
    env.pop("DEBUG_EXTERNAL", None)
    cmd = ["nice", "-n", "10", sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "offline_deselect"]
    cmd += [f"--deselect-log={deselect_log}", f"--timeout={timeout}", f"--junitxml={junit}", "-q", "-rN"]
    if kexpr:
        cmd += ["-k", kexpr]
    if not slow:  # as upstream's tests.sh without SLOW_TESTS=1
        cmd += ["-m", "not slow"]
    cmd += [f"unit/{m}.py" for m in modules]
    print(f"[{name}] {' '.join(cmd[4:])}", flush=True)
    with open(work / f"pytest-{name}.log", "w") as log:
        # its own process group: the servers it starts go with it if this script is stopped
        proc = subprocess.Popen(
            cmd,
            cwd=suite,
            env={**env, "PYTHONPATH": str(suite)},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc, time.time()


def collect(name: str, work: Path, rc: int, wall: float) -> dict:
    junit = work / f"junit-{name}.xml"
    deselect_log = work / f"deselected-{name}.tsv"
    cases = parse_junit(junit)
    deselected = []
    if deselect_log.exists():
        deselected = [ln.split("\t") for ln in deselect_log.read_text().splitlines() if ln]
    counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    for c in cases.values():
        counts[c["status"]] += 1
    # pytest's own count also has the tests marked slow (-m "not slow"); the plugin's list has the reasons
    tail = (work / f"pytest-{name}.log").read_text(errors="replace")[-2000:]
    found = re.findall(r"(\d+) deselected", tail)
    counts["deselected"] = max(len(deselected), int(found[-1]) if found else 0)
    print(f"[{name}] rc={rc} wall={wall:.0f}s {counts}", flush=True)
    return {"rc": rc, "wall_s": round(wall, 1), "counts": counts, "cases": cases, "deselected": deselected}


def merge(a: dict, b: dict) -> dict:
    cases = {**a["cases"], **b["cases"]}
    deselected = a["deselected"] + b["deselected"]
    counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    for c in cases.values():
        counts[c["status"]] += 1
    counts["deselected"] = a["counts"]["deselected"] + b["counts"]["deselected"]
    wall = round(a["wall_s"] + b["wall_s"], 1)
    return {"rc": max(a["rc"], b["rc"]), "wall_s": wall, "counts": counts, "cases": cases, "deselected": deselected}


def module_counts(r: dict) -> dict[str, dict[str, int]]:
    """passed/failed(+errors)/skipped/deselected per module of one server's results."""
    out: dict[str, dict[str, int]] = {}
    for node, c in r["cases"].items():
        m = Path(node.split("::")[0]).stem
        row = out.setdefault(m, {"passed": 0, "failed": 0, "skipped": 0, "deselected": 0})
        row["failed" if c["status"] == "error" else c["status"]] += 1
    for node, _why in r["deselected"]:
        m = Path(node.split("::")[0]).stem
        out.setdefault(m, {"passed": 0, "failed": 0, "skipped": 0, "deselected": 0})["deselected"] += 1
    return out


def print_module_table(report: dict) -> None:
    """One row per module: each server's passed / failed / skipped, deselected (offline) once."""
    names = list(report["servers"])
    per = {n: module_counts(report["servers"][n]) for n in names}
    report["per_module"] = per
    print("\n| module | " + " | ".join(f"{n} passed / failed / skipped" for n in names) + " | deselected |")
    print("|---|" + "---|" * len(names) + "---|")
    for m in report["modules"]:
        cells = []
        for n in names:
            c = per[n].get(m, {"passed": 0, "failed": 0, "skipped": 0, "deselected": 0})
            cells.append(f"{c['passed']} / {c['failed']} / {c['skipped']}")
        desel = max((per[n].get(m, {}).get("deselected", 0) for n in names), default=0)
        print(f"| {m} | " + " | ".join(cells) + f" | {desel} |")
    for n in names:
        reasons: dict[str, int] = {}
        for _node, why in report["servers"][n]["deselected"]:
            reasons[why] = reasons.get(why, 0) + 1
        for why, k in reasons.items():
            print(f"deselected ({n}): {k} x {why}")
        break


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", default="llama-server,llama-vq-server")
    ap.add_argument("--modules", default=None, help="comma-separated (default: every module)")
    ap.add_argument("--timeout", type=int, default=120, help="per-test timeout (s)")
    ap.add_argument("--model", default=None, help="local gguf used for every preset")
    ap.add_argument("-k", dest="kexpr", default=None, help="pytest -k expression")
    ap.add_argument(
        "--slow",
        action="store_true",
        help="also the tests marked slow (upstream's SLOW_TESTS=1; test_tool_call's are real-model tests)",
    )
    ap.add_argument("--out", default=None, help="write the JSON report here")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs, junit)")
    ap.add_argument(
        "--concurrent", action="store_true", help="run the servers' passes at the same time (each on its own port)"
    )
    ap.add_argument(
        "--load",
        action="append",
        default=[],
        metavar="REPORT.json",
        help="take a server's results from an earlier --out report instead of running it (repeatable)",
    )
    a = ap.parse_args()

    model = a.model or default_model()
    names = a.modules.split(",") if a.modules else all_modules()
    modules = [m.strip().removesuffix(".py") for m in names if m.strip()]
    servers = [s.strip() for s in a.servers.split(",") if s.strip()]
    work = Path(tempfile.mkdtemp(prefix="upstream-suite-"))
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "model": os.path.basename(model),
        "modules": modules,
        "timeout_s": a.timeout,
        "slow": a.slow,
        "servers": {},
    }
    for path in a.load:  # earlier passes (of other modules, say): their cases are merged
        earlier = json.loads(Path(path).read_text())
        report["modules"] = [m for m in earlier["modules"] if m not in modules] + modules
        for name, r in earlier["servers"].items():
            if name in report["servers"]:
                r = merge(report["servers"][name], r)
            report["servers"][name] = r
            servers = [s for s in servers if s != name]
    running: list[tuple[str, subprocess.Popen, float]] = []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        for name in servers:
            suite = prepare(work, name, model)
            running.append((name, *start_server_run(name, suite, work, modules, a.timeout, a.kexpr, a.slow)))
            if not a.concurrent:
                name, proc, t0 = running[-1]
                report["servers"][name] = collect(name, work, proc.wait(), time.time() - t0)
                running.pop()
        while running:
            name, proc, t0 = running[0]
            report["servers"][name] = collect(name, work, proc.wait(), time.time() - t0)
            running.pop(0)
    finally:
        for _, proc, _ in running:  # stopped early: pytest and the servers it started
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

    print()
    print(f"modules: {' '.join(report['modules'])}")
    print_module_table(report)
    for name, r in report["servers"].items():
        c = r["counts"]
        print(
            f"{name}: {c['passed']} passed, {c['failed']} failed, {c['error']} errors, "
            f"{c['skipped']} skipped, {c['deselected']} deselected ({r['wall_s']:.0f} s)"
        )
    if "llama-server" in report["servers"] and "llama-vq-server" in report["servers"]:
        ref = report["servers"]["llama-server"]["cases"]
        new = report["servers"]["llama-vq-server"]["cases"]
        only = {
            n: new.get(n, {"status": "missing", "reason": ""})
            for n, c in ref.items()
            if c["status"] == "passed" and new.get(n, {}).get("status") != "passed"
        }
        gained = [n for n, c in new.items() if c["status"] == "passed" and ref.get(n, {}).get("status") != "passed"]
        report["llama_server_only_passes"] = only
        report["llama_vq_server_only_passes"] = gained
        print(f"\nllama-server passes, llama-vq-server does not ({len(only)}):")
        for n, c in only.items():
            print(f"  {n} [{c['status']}]")
            for ln in c["reason"].splitlines():
                print(f"      {ln[:200]}")
        print(f"\nllama-vq-server passes, llama-server does not ({len(gained)}):")
        for n in gained:
            print(f"  {n}")
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1))
    if a.keep:
        print(f"\nwork dir: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
