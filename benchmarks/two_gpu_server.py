"""benchmarks/two_gpu.py's server part: llama-vq-server on the layer split.

A chat and a streamed completion; a prompt in slot 0, asked twice (processed whole, then reused from the slot), saved
at the drain (SIGTERM) into --state-dir and restored at the next start with the same split, where the same request
must reuse it and give the same tokens as its second run before the restart (and the same log-probabilities when both
decode the prompt's tail in the same batches); -sm row refused with its message, and what llama-server itself does
with -sm row on these devices.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from two_gpu_proc import completion, grep_int, request, stop, stream, tail
from two_gpu_report import compare, steps_from_completion, verdict

if TYPE_CHECKING:
    from two_gpu import Runner


def check(r: Runner, name: str, ok: bool | None, detail: str) -> None:
    """One line of the server table; ok None: not judged (the detail says why), not a failure."""
    r.doc["server"].append({"check": name, "ok": ok, "detail": detail})
    r.log(f"server: {name}: {({True: 'ok', False: 'FAILED', None: 'not judged'})[ok]} ({detail})")
    if ok is False:
        r.doc["failures"].append(f"server: {name}")


def server_part(r: Runner) -> None:
    a = r.a
    n_dev = 2 if r.two else 1
    split = ["-sm", "layer", "-ts", "1,1"] if n_dev == 2 else ["-sm", "none", "-mg", "0"]
    state = Path(tempfile.mkdtemp(prefix="two-gpu-state-"))
    args = ["-m", str(a.model), "-ngl", "99", "-np", "2", "-c", str(2 * (a.slot_prompt + 512)), "-lv", "4",
            "-fit", "off", "-fa", "off", "-ctk", a.ctk, "-ctv", a.ctv, *split, *r.rpc_args(), "--state-dir", str(state)]
    if a.threads:
        args += ["-t", str(a.threads)]
    try:
        try:
            p, url = r.start("vq-server", "vq", args)
        except RuntimeError as e:
            check(r, f"llama-vq-server starts on {n_dev} device(s)", False, str(e)[-300:])
            return
        where = "; ".join(r.devices) or "the CPU"
        check(r, f"llama-vq-server starts on {n_dev} device(s) ({' '.join(split)})", True, where)
        try:
            _requests(r, p, url, args, state)
        finally:
            stop(p)
    finally:
        shutil.rmtree(state, ignore_errors=True)
    row_split(r)


def _requests(r: Runner, p, url: str, args: list[str], state: Path) -> None:  # noqa: ANN001
    a = r.a
    r.ensure_tokens(url)
    st, body = request("POST", url + "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Name three things a GPU does."}], "max_tokens": 16,
        "temperature": 0})
    try:
        j = json.loads(body)
        text, n = j["choices"][0]["message"]["content"], j["usage"]["completion_tokens"]
        check(r, "chat (/v1/chat/completions)", st == 200 and isinstance(text, str) and n > 0,
              f"{st}, {n} tokens: {text[:60]!r}")
    except (ValueError, KeyError, IndexError, TypeError):
        check(r, "chat (/v1/chat/completions)", False, f"{st}: {body[:200]!r}")
    lines = stream(url + "/v1/completions", {"prompt": "Two GPUs of one host", "max_tokens": 16, "temperature": 0,
                                             "stream": True, "ignore_eos": True})
    chunks = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
    texts = [c["choices"][0].get("text", "") for c in chunks if c.get("choices")]
    check(r, "streamed completion (/v1/completions, stream)",
          bool(lines) and lines[-1] == "data: [DONE]" and sum(1 for t in texts if t) >= 8,
          f"{len(chunks)} chunks, ends {lines[-1] if lines else ''!r}: {''.join(texts)[:60]!r}")

    req = {"prompt": r.tokens[:a.slot_prompt], "n_predict": 16, "temperature": 0, "n_probs": 2,
           "cache_prompt": True, "id_slot": 0}
    first = completion(url, req)  # the prompt processed whole
    second = completion(url, req)  # the same request: its prompt reused from the slot
    stop(p)
    names = {x.name for x in state.iterdir()}
    files = ", ".join(sorted(f"{x.name} {x.stat().st_size} B" for x in state.iterdir()))
    check(r, "SIGTERM drains and saves the slot (--state-dir)", p.returncode == 0 and "slot-0.bin" in names,
          f"exit {p.returncode}; {files}")
    try:
        p2, url2 = r.start("vq-server-restart", "vq", args)
    except RuntimeError as e:
        check(r, "restart with the same split", False, str(e)[-300:])
        return
    try:
        restored = grep_int((r.logs / "vq-server-restart.log").read_text(errors="replace"), "state dir: ",
                            " tokens of earlier prompts restored")
        after = completion(url2, req)
    finally:
        stop(p2)
    n = [x["timings"]["prompt_n"] for x in (first, second, after)]
    check(r, "the restart restores the slot on the split", restored > 0, f"{restored} tokens restored")
    check(r, "the restored prompt is reused", n[2] < n[0] // 2,
          f"prompt tokens processed: {n[0]} at first, {n[1]} asked again, {n[2]} after the restart")
    # the tail of the prompt may be decoded in other batches after the restore (n[1] != n[2]): texts judged, the
    # moves reported
    ag = compare([steps_from_completion(second)], [steps_from_completion(after)])
    floor = r.floor()
    ok, why = verdict(ag, floor, judge_moves=n[1] == n[2])
    if floor is None and not ag.identical:
        ok, why = None, "different texts, not judged: no floor measured (run the floor part too)"
    r.doc["agreement"]["server: asked again before the restart -> after the restore"] = {
        **ag.as_dict(), "ok": {True: "yes", False: "NO", None: "not judged"}[ok], "why": why}
    check(r, "the same tokens after the restore as before it", ok,
          f"{why}; largest moves {ag.max_move:.3g} / {ag.max_move_chosen:.3g}; tokens processed {n[1]} / {n[2]}")


def row_split(r: Runner) -> None:
    """-sm row: llama-vq-server refuses it before loading; llama-server (when in BIN) shows what it would have done."""
    a = r.a
    args = ["-m", str(a.model), "-ngl", "99", "-sm", "row", "-fa", "off", "-ctk", a.ctk, "-ctv", a.ctv, "-c", "4096",
            "-fit", "off", *r.rpc_args()]
    p, _url = r.start("vq-row", "vq", args, expect_exit=True)
    log = r.logs / "vq-row.log"
    text = log.read_text(errors="replace")
    refused = "llama-vq-server: -sm row" in text and "has no row split" in text
    if p.poll() is None:
        stop(p)
        detail = "it started"
    elif not refused and "does not support split buffers" in text:
        detail = (f"exit {p.returncode} while loading, not refused: this libllama-vq-server predates the split_mode "
                  "parameter (rebuild the llama-vq-server target)")
    else:
        detail = f"exit {p.returncode}: {tail(log, 1)[:160]}..."
    check(r, "-sm row refused by llama-vq-server", p.returncode not in (None, 0) and refused, detail)
    if a.engine != "llama-server":
        return
    p, url = r.start("llama-server-row", "llama-server", args, expect_exit=True)
    if p.poll() is None:
        st = request("POST", url + "/completion", {"prompt": "Hello", "n_predict": 4})[0]
        stop(p)
        detail = f"llama-server with -sm row: loaded and answered {st} (no device here needs a split buffer)"
    else:
        lines = (r.logs / "llama-server-row.log").read_text(errors="replace").splitlines()
        err = [x for x in lines if "split buffers" in x] or [tail(r.logs / "llama-server-row.log", 1)]
        detail = f"llama-server with -sm row: exit {p.returncode}, {err[0][:200]}"
    r.doc["notes"].append(detail)
    r.log(detail)
