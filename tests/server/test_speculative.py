"""Speculative decoding in the server (llama-server's engine and flags): drafts change the speed, not the text.

1. MTP: the MiMo-shaped model with one NextN block (tools/synth_models.py, preset tiny-mtp), served with
   ``--spec-type draft-mtp`` and a q4_0 V cache without flash attention (the target's and the MTP draft
   context's), drafts tokens and gives the greedy
   tokens of the same server without drafting: with a random MTP head (drafts rejected) and with an echo head
   on a prompt the trunk continues with repeats (drafts accepted).
2. n-gram self-speculation (``--spec-type ngram-simple``) on Qwen2.5-Coder-0.5B-Instruct, asked to repeat a code
   file with one edit: the same greedy answer as without, and accepted drafts.

"The same tokens" allows one thing: a verification batch scores several positions at once, and its logits differ
from one-token decoding in the last bits (measured on the tiny MiMo model with q4_0 V: up to 0.26 in a logit;
f16 V: 0.01). Where the plain run's two best tokens are closer than that, either may win, and the two answers
part there. So: the answers must be equal, or part only at a position where the plain run's top two log
probabilities are within NEAR_TIE, after which nothing is compared.

Runs against ``llama-vq-server`` (tests/support/server_support.py's ServerProcess, llama-server's engine and flags);
``LLAMA_VQ_SPEC_TEST_SERVER=/path/to/llama-server`` runs the same tests against a stock llama-server instead.
CPU cost: MTP ~20 s; n-gram ~40 s on 2 idle cores (two servers each, ~200 generated tokens per Qwen request).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_support import ServerProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

NEAR_TIE = 0.5  # nats between the plain run's top two tokens: 2x the largest batch-vs-single logit change seen
# the MTP draft context takes its cache types from -ctkd/-ctvd (f16 by default), not from -ctk/-ctv
MTP_FLAGS = ("-ctv", "q4_0", "-ctvd", "q4_0", "-fa", "off", "-np", "1")


class _LlamaServer:
    """A stock llama-server with ServerProcess's interface (url, wait_ready, stop)."""

    def __init__(self, binary: str, model: Path, *flags: str, log_dir: Path) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"llama-server-{port}.log"
        self._log = self.log_path.open("wb")
        cmd = [binary, "--model", str(model), "--host", "127.0.0.1", "--port", str(port), "--ctx-size", "1024", *flags]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, deadline_s: float = 180.0) -> None:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}:\n{self.log_path.read_text()}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"llama-server not ready after {deadline_s} s:\n{self.log_path.read_text()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _serve(model: Path, *flags: str, log_dir: Path):
    binary = os.environ.get("LLAMA_VQ_SPEC_TEST_SERVER")
    if binary:
        srv = _LlamaServer(binary, model, *flags, log_dir=log_dir)
    else:
        srv = ServerProcess(model, *flags, log_dir=log_dir)
    try:
        srv.wait_ready()
    except BaseException:
        srv.stop()
        raise
    return srv


def _run(model: Path, flags: tuple[str, ...], log_dir: Path, request) -> Any:  # noqa: ANN001
    srv = _serve(model, *flags, log_dir=log_dir)
    try:
        return request(srv.url)
    finally:
        srv.stop()


def _near_tie(top: list[dict[str, Any]]) -> float:
    """The gap in log probability between the two best tokens of one position."""
    lp = sorted((t["logprob"] for t in top), reverse=True)
    return lp[0] - lp[1] if len(lp) > 1 else float("inf")


def _assert_same_up_to_a_near_tie(plain_ids: list, spec_ids: list, plain_tops: list[list[dict[str, Any]]]) -> int:
    """Equal sequences, or equal up to a position where the plain run's top two tokens were a near tie.

    Returns how many tokens agree."""
    n = min(len(plain_ids), len(spec_ids))
    i = next((k for k in range(n) if plain_ids[k] != spec_ids[k]), n)
    if i == n:
        assert len(plain_ids) == len(spec_ids), (len(plain_ids), len(spec_ids))
        return n
    gap = _near_tie(plain_tops[i])
    assert gap < NEAR_TIE, (
        f"token {i}: speculative {spec_ids[i]!r} vs plain {plain_ids[i]!r}, and the plain run's top two were "
        f"{gap:.3f} nats apart (not a near tie): drafting changed the greedy result"
    )
    return i


# ---- 1. MTP on the MiMo-shaped model --------------------------------------------------------------------------


def _write_mimo_mtp(tmp_path_factory, smollm2_path, mtp_head: str) -> Path:
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import synth_models
    finally:
        sys.path.remove(str(ROOT / "tools"))
    path = tmp_path_factory.mktemp("mimo-mtp") / f"mimo-tiny-mtp-{mtp_head}.gguf"
    return synth_models.write_mimo_like(path, preset="tiny-mtp", mtp_head=mtp_head, tokenizer_from=smollm2_path, seed=7)


@pytest.fixture(scope="module")
def mimo_mtp_path(tmp_path_factory, smollm2_path) -> Path:
    """Random MTP head: its drafts are (almost) never accepted; each one is verified and thrown away."""
    return _write_mimo_mtp(tmp_path_factory, smollm2_path, "random")


@pytest.fixture(scope="module")
def mimo_mtp_echo_path(tmp_path_factory, smollm2_path) -> Path:
    """Echo MTP head (drafts repeat the last token): accepted wherever the trunk repeats a token."""
    return _write_mimo_mtp(tmp_path_factory, smollm2_path, "echo")


def _completion(url: str, prompt: str, n_probs: int = 0) -> dict[str, Any]:
    body = {
        "prompt": prompt,
        "n_predict": 32,
        "temperature": 0.0,
        "seed": 0,
        "return_tokens": True,
        "n_probs": n_probs,
    }
    r = httpx.post(url + "/completion", json=body, timeout=300)
    r.raise_for_status()
    return r.json()


def _mtp_plain_and_drafted(model: Path, prompt: str, log_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    plain = _run(model, MTP_FLAGS, log_dir, lambda url: _completion(url, prompt, n_probs=2))
    spec = _run(
        model,
        (*MTP_FLAGS, "--spec-type", "draft-mtp", "--spec-draft-n-max", "3"),
        log_dir,
        lambda url: _completion(url, prompt),
    )
    assert len(plain["tokens"]) == 32
    assert spec["timings"].get("draft_n", 0) > 0, f"no MTP drafts: {spec['timings']}"
    tops = [p["top_logprobs"] for p in plain["completion_probabilities"]]
    agreed = _assert_same_up_to_a_near_tie(plain["tokens"], spec["tokens"], tops)
    assert agreed >= 8, f"the answers part after {agreed} tokens (at a near tie)"
    return plain, spec


def test_mtp_drafting_on_a_q4_0_v_cache_keeps_the_greedy_tokens(mimo_mtp_path, tmp_path):
    _mtp_plain_and_drafted(mimo_mtp_path, "The quick brown fox jumps over the lazy dog. The quick brown fox", tmp_path)


def test_accepted_mtp_drafts_on_a_q4_0_v_cache_keep_the_greedy_tokens(mimo_mtp_echo_path, tmp_path):
    # this trunk answers a run of "a" with more of them: the echo head's drafts are right there
    _, spec = _mtp_plain_and_drafted(mimo_mtp_echo_path, "a" * 36, tmp_path)
    assert spec["timings"]["draft_n_accepted"] > 0, spec["timings"]


# ---- 2. n-gram self-speculation on the Qwen coder model ---------------------------------------------------------

NGRAM_FLAGS = ("-np", "1")
NGRAM_SPEC = ("--spec-type", "ngram-simple", "--spec-draft-n-max", "32")

# a code edit whose answer repeats the prompt's code, the case n-gram self-speculation drafts well (the same task as
# benchmarks/spec_replay.py's second edit, on the class up to its get(): ~200 tokens to repeat)
EDIT_CODE = '''\
import time
from collections import OrderedDict


class LRUCache:
    """A least-recently-used cache with an optional time-to-live per entry."""

    def __init__(self, capacity=128, ttl=None):
        self.capacity = capacity
        self.ttl = ttl
        self._data = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key, default=None):
        item = self._data.get(key)
        if item is None:
            self.misses += 1
            return default
        value, stamp = item
        if self.ttl is not None and time.monotonic() - stamp > self.ttl:
            del self._data[key]
            self.misses += 1
            return default
        self._data.move_to_end(key)
        self.hits += 1
        return value

'''
EDIT_SYSTEM = "You are a careful coding assistant. You edit code exactly as asked and change nothing else."
EDIT_ASK = (
    "Change the default capacity from 128 to 256."
    " Reply with the complete updated file in one ```python code block and nothing else.\n\n```python\n"
)


def _edit_request(url: str, logprobs: bool = False) -> dict[str, Any]:
    chat = [{"role": "system", "content": EDIT_SYSTEM}, {"role": "user", "content": EDIT_ASK + EDIT_CODE + "```"}]
    body: dict[str, Any] = {"messages": chat, "temperature": 0.0, "max_tokens": 400, "seed": 0}
    if logprobs:
        body.update(logprobs=True, top_logprobs=2)
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    return r.json()


def test_ngram_self_speculation_on_a_code_edit_keeps_the_greedy_text_and_accepts_drafts(qwen_coder_path, tmp_path):
    plain = _run(qwen_coder_path, NGRAM_FLAGS, tmp_path, lambda url: _edit_request(url, logprobs=True))
    spec = _run(qwen_coder_path, (*NGRAM_FLAGS, *NGRAM_SPEC), tmp_path, _edit_request)
    text_plain = plain["choices"][0]["message"]["content"]
    text_spec = spec["choices"][0]["message"]["content"]
    assert "256" in text_plain and "class LRUCache" in text_plain, text_plain  # the model did the edit
    timings = spec.get("timings", {})
    assert timings.get("draft_n_accepted", 0) > 0, f"no accepted n-gram drafts: {timings}"
    if text_spec != text_plain:
        # the plain run's token at the first differing character must have been a near tie
        n = min(len(text_plain), len(text_spec))
        k = next((i for i in range(n) if text_plain[i] != text_spec[i]), n)
        pos = 0
        for tok in plain["choices"][0]["logprobs"]["content"]:
            pos += len(tok["token"])
            if pos > k:
                gap = _near_tie(tok["top_logprobs"])
                assert gap < NEAR_TIE, (
                    f"answers part at character {k} ({text_plain[max(0, k - 40) : k + 20]!r} vs "
                    f"{text_spec[max(0, k - 40) : k + 20]!r}); the plain run's top two there were {gap:.3f} nats apart"
                )
                break
        assert k > len(text_plain) // 2, f"the answers part early, at character {k} of {len(text_plain)}"
