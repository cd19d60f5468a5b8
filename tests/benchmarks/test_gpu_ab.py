"""The A/B of two versions of our CUDA sources in one GPU call: `gpu_carry.py --ab REV` (which files it stores and
what it refuses) and `gpu.sh decode-ab`'s swaps, exercised here with stand-ins for the GPU machine's tools (cmake's
build, nvidia-smi, llama-bench), so that the first run on a lent GPU, whose minutes are few, does not fail on a
slip: the old sources swapped in and built, both versions measured, the tree left with this checkout's sources, and
a failed build leaving them there too. The measurement itself needs a GPU (benchmarks/RESULTS.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_carry  # noqa: E402

CUDA = "native/ggml/ggml-cuda"


def _git(repo: Path, *args: str) -> str:
    who = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    env = dict(os.environ, **who)
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A git checkout shaped like ours: two CUDA sources and a patch, committed once (tag `old`)."""
    r = tmp_path / "repo"
    (r / CUDA).mkdir(parents=True)
    (r / "patches").mkdir()
    (r / CUDA / "a.cu").write_text("old a\n")
    (r / CUDA / "b.cuh").write_text("same b\n")
    (r / "patches" / "fixture.patch").write_text("p\n")
    _git(r, "init", "-q")
    _git(r, "add", ".")
    _git(r, "commit", "-qm", "old")
    _git(r, "tag", "old")
    monkeypatch.setattr(gpu_carry, "REPO", r)
    return r


def test_ab_stores_the_changed_sources_at_the_revision(repo, tmp_path):
    (repo / CUDA / "a.cu").write_text("new a\n")
    (repo / CUDA / "c.cuh").write_text("a header added since: unused by the old sources\n")
    dest = tmp_path / "carry"
    dest.mkdir()
    assert gpu_carry.ab_sources(dest, "old") == ["a.cu"]
    assert (dest / "ab" / "a.cu").read_text() == "old a\n"
    assert not (dest / "ab" / "b.cuh").exists()
    assert (dest / "ab" / "REV").read_text().strip() == _git(repo, "rev-parse", "--short", "old").strip()


def test_a_second_revision_goes_to_its_own_folder(repo, tmp_path):
    (repo / CUDA / "a.cu").write_text("new a\n")
    dest = tmp_path / "carry"
    dest.mkdir()
    assert gpu_carry.ab_sources(dest, "old", "ab-2") == ["a.cu"]
    assert (dest / "ab-2" / "a.cu").read_text() == "old a\n"
    assert not (dest / "ab").exists()


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda r: None, "the same as the checkout's"),
        (lambda r: (r / "patches" / "fixture.patch").write_text("q\n"), "more than our CUDA sources differ"),
        (lambda r: (r / CUDA / "c.cu").write_text("c\n"), "files added or removed"),
    ],
)
def test_ab_refuses_what_a_swap_of_the_cuda_sources_cannot_build(repo, tmp_path, change, says):
    change(repo)
    dest = tmp_path / "carry"
    dest.mkdir()
    with pytest.raises(SystemExit, match=says):
        gpu_carry.ab_sources(dest, "old")


def _stand_ins(tmp_path: Path, build_fails: bool, record: bool = False) -> tuple[Path, Path]:
    """A tools folder for PATH (cmake, nvidia-smi) and a build folder with a llama-bench writing llama-bench's jsonl
    rows (tok/s falling with the depth); record: cmake's stand-in appends the tree's two CUDA sources, as each build
    found them, to built.txt."""
    tools = tmp_path / "tools"
    tools.mkdir()
    cuda = tmp_path / "carry" / "llama.cpp" / "ggml" / "src" / "ggml-cuda"
    built = tmp_path / "built.txt"
    log = f"cat {cuda}/attn-decode-fused.cu {cuda}/attn-decode-tc.cuh | tr '\\n' ' ' >> {built}; echo >> {built}\n"
    (tools / "cmake").write_text("#!/bin/sh\n" + (log if record else "") + f"exit {1 if build_fails else 0}\n")
    (tools / "nvidia-smi").write_text("#!/bin/sh\necho 'stand-in GPU'\n")
    build = tmp_path / "build"
    (build / "bin").mkdir(parents=True)
    (build / ".done").touch()
    bench = build / "bin" / "llama-bench"
    bench.write_text(
        "#!/usr/bin/env python3\n"
        "import json, sys\n"
        "a = sys.argv\n"
        "get = lambda k: a[a.index(k) + 1]\n"
        "for d in get('-d').split(','):\n"
        "    print(json.dumps({'n_gen': 64, 'n_depth': int(d), 'avg_ts': 200 - int(d) / 1000, 'stddev_ts': 1.0,\n"
        "                      'type_k': get('-ctk'), 'type_v': get('-ctv')}))\n"
    )
    for f in (tools / "cmake", tools / "nvidia-smi", bench):
        f.chmod(0o755)
    return tools, build


def _carry(tmp_path: Path, second: bool = False) -> Path:
    """A carry with a tree holding this checkout's version of one CUDA source and REV's in ab/; second: also a second
    revision's in ab-2/, which differs from the checkout in another file."""
    c = tmp_path / "carry"
    cuda = c / "llama.cpp" / "ggml" / "src" / "ggml-cuda"
    cuda.mkdir(parents=True)
    (cuda / "attn-decode-fused.cu").write_text("new\n")
    (cuda / "attn-decode-tc.cuh").write_text("new tc\n")
    (c / "ab").mkdir()
    (c / "ab" / "attn-decode-fused.cu").write_text("old\n")
    (c / "ab" / "REV").write_text("abc1234\n")
    if second:
        (c / "ab-2").mkdir()
        (c / "ab-2" / "attn-decode-tc.cuh").write_text("old-2 tc\n")
        (c / "ab-2" / "REV").write_text("def5678\n")
    return c


def _decode_ab(tmp_path: Path, build_fails: bool, second: bool = False) -> subprocess.CompletedProcess:
    tools, build = _stand_ins(tmp_path, build_fails, record=True)
    models = tmp_path / "models"
    models.mkdir()
    for m in ("mimo", "llama8b"):
        (models / f"synth-{m}.gguf").touch()
    env = dict(
        os.environ,
        PATH=f"{tools}:{os.environ['PATH']}",
        CARRY=str(_carry(tmp_path, second)),
        BUILD=str(build),
        MODEL_DIR=str(models),
        OUT=str(tmp_path / "out"),
    )
    return subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu.sh"), "decode-ab"], capture_output=True, text=True, env=env, timeout=120
    )


def test_decode_ab_measures_both_versions_and_leaves_this_checkouts_sources(tmp_path):
    r = _decode_ab(tmp_path, build_fails=False)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [json.loads(x) for x in (tmp_path / "out" / "ab.jsonl").read_text().splitlines()]
    assert [(x["config"], x["model"], x["n_depth"]) for x in rows] == [
        (side, model, d)
        for side in ("old", "new")
        for model, depths in (("mimo", (0, 32768, 65536)), ("llama8b", (0, 32768)))
        for d in depths
    ]
    assert "building old (abc1234)" in r.stdout and "building new (this checkout)" in r.stdout
    assert "effective bandwidth" in r.stdout
    cuda = tmp_path / "carry" / "llama.cpp" / "ggml" / "src" / "ggml-cuda"
    assert (cuda / "attn-decode-fused.cu").read_text() == "new\n"


def test_decode_ab_puts_this_checkouts_sources_back_when_a_build_fails(tmp_path):
    r = _decode_ab(tmp_path, build_fails=True)
    assert r.returncode == 1
    assert "build of old failed" in r.stdout
    cuda = tmp_path / "carry" / "llama.cpp" / "ggml" / "src" / "ggml-cuda"
    assert (cuda / "attn-decode-fused.cu").read_text() == "new\n"
    assert not (tmp_path / "build" / ".done").exists(), "the build folder is left for `gpu.sh rebuild`"


def test_decode_ab_measures_a_second_revision_between_the_first_and_this_checkout(tmp_path):
    r = _decode_ab(tmp_path, build_fails=False, second=True)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [json.loads(x) for x in (tmp_path / "out" / "ab.jsonl").read_text().splitlines()]
    assert [x["config"] for x in rows if x["model"] == "mimo" and x["n_depth"] == 0] == ["old", "old-2", "new"]
    assert "building old-2 (def5678)" in r.stdout
    # each version built with its own files, the checkout's where it stored none
    assert (tmp_path / "built.txt").read_text().splitlines() == [
        "old new tc ",
        "new old-2 tc ",
        "new new tc ",
    ]
    cuda = tmp_path / "carry" / "llama.cpp" / "ggml" / "src" / "ggml-cuda"
    assert (cuda / "attn-decode-fused.cu").read_text() == "new\n"
    assert (cuda / "attn-decode-tc.cuh").read_text() == "new tc\n"


def test_first_call_runs_the_op_tests_then_the_ab_on_the_mimo_shape(tmp_path):
    """`gpu.sh first-call` on a machine whose build is there (its `build` then only says so): the op tests of the
    fused decode attention with the tensor-core form forced, then decode-ab on the MiMo shape alone at 0/64K."""
    tools, build = _stand_ins(tmp_path, build_fails=False)
    tbo = build / "bin" / "test-backend-ops"
    tbo.write_text(
        "#!/bin/sh\necho \"TC=$LLAMA_VQ_CUDA_FUSED_ATTN_TC $*\"\necho '12/12 tests passed'\n"
        "echo 'attention fusions run: 12 (tc=12)'\n"
    )
    tbo.chmod(0o755)
    models = tmp_path / "models"
    models.mkdir()
    (models / "synth-mimo.gguf").touch()
    env = dict(
        os.environ,
        PATH=f"{tools}:{os.environ['PATH']}",
        CARRY=str(_carry(tmp_path)),
        BUILD=str(build),
        MODEL_DIR=str(models),
        OUT=str(tmp_path / "out"),
    )
    r = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu.sh"), "first-call"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ATTN_DECODE_FUSED: rc 0 12/12 tests passed attention fusions run: 12 (tc=12)" in r.stdout
    assert "TC=1 test -b CUDA0 -o ATTN_DECODE_FUSED" in (tmp_path / "out" / "tbo-decode.log").read_text()
    rows = [json.loads(x) for x in (tmp_path / "out" / "ab.jsonl").read_text().splitlines()]
    assert [(x["config"], x["model"], x["n_depth"]) for x in rows] == [
        (side, "mimo", d) for side in ("old", "new") for d in (0, 65536)
    ]
