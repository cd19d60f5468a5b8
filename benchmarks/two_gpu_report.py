"""What benchmarks/two_gpu.py reads and judges: greedy agreement against the f16 floor, llama.cpp's per-device buffer
lines, and the report's tables. Pure functions on recorded data (no processes), standard library only: the GPU
machine's own python3 runs them.

Greedy agreement (docs/architecture.md, decision 8, applied to a split): two runs of the same prompts at temperature 0
with the top two log-probabilities of every generated token (llama-server's n_probs = 2). Up to their first
different token both runs decoded the same context, so the top-2 gap g = logprob(top 1) - logprob(top 2) (a logit
difference) is comparable step by step; |g_ref - g_run| is how far the second run moved the decision. The floor is the
largest such move between the f16 cache with flash attention on and off (one GPU): a split whose moves stay within it,
and whose texts differ only at a step the reference itself decided by less than it, is at the f16 floor.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Step:
    """One generated token: its id and the top two (id, logprob) the engine reported for that step."""

    id: int
    top: list[tuple[int, float]]

    @property
    def gap(self) -> float | None:
        return self.top[0][1] - self.top[1][1] if len(self.top) >= 2 else None


def steps_from_completion(doc: dict[str, Any]) -> list[Step]:
    """llama-server's /completion answer with n_probs -> one Step per generated token."""
    out = []
    for p in doc.get("completion_probabilities") or []:
        top = [(int(t["id"]), float(t["logprob"])) for t in p.get("top_logprobs", [])]
        out.append(Step(int(p["id"]), top))
    return out


@dataclass
class Agreement:
    """Two runs of the same prompts compared (reference first)."""

    prompts: int = 0
    tokens: int = 0  # steps compared (each prompt up to the shorter run)
    same: int = 0  # steps before each prompt's first different token
    identical: bool = True
    max_move: float = 0.0  # largest |g_ref - g_run| over the shared steps whose top two tokens match
    max_move_chosen: float = 0.0  # largest |logprob_ref - logprob_run| of the chosen token over the shared steps
    divergences: list[dict[str, Any]] = field(default_factory=list)  # prompt, step, the reference's gap there

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare(ref: list[list[Step]], run: list[list[Step]]) -> Agreement:
    """Prompt by prompt: tokens equal up to the first difference; the moves of the top-2 gap before it."""
    a = Agreement(prompts=min(len(ref), len(run)))
    for i, (r, c) in enumerate(zip(ref, run, strict=False)):
        n = min(len(r), len(c))
        a.tokens += n
        if len(r) != len(c):
            a.identical = False
        for k in range(n):
            if r[k].id != c[k].id:
                a.identical = False
                a.divergences.append(
                    {"prompt": i, "step": k, "gap_ref": r[k].gap, "gap_run": c[k].gap, "ref": r[k].id, "run": c[k].id}
                )
                break
            a.same += 1
            if r[k].top and c[k].top:
                a.max_move_chosen = max(a.max_move_chosen, abs(r[k].top[0][1] - c[k].top[0][1]))
            if len(r[k].top) >= 2 and len(c[k].top) >= 2 and r[k].top[1][0] == c[k].top[1][0]:
                a.max_move = max(a.max_move, abs(r[k].gap - c[k].gap))  # type: ignore[operator]
    return a


def verdict(a: Agreement, floor: Agreement | None, judge_moves: bool = True) -> tuple[bool, str]:
    """(at the floor, why): identical texts, or differences only where the reference's own top-2 gap was within the
    floor's largest move; with ``judge_moves``, also moves no larger than the floor's (for two runs that decode in the
    same batches: a run that decodes a prompt's tail in other batches than its reference rounds a quantized V
    differently, which the floor of the f16 cache does not bound)."""
    if floor is None:
        return a.identical, "identical" if a.identical else "different texts, no floor measured"
    limit = max(floor.max_move, floor.max_move_chosen)
    moves_ok = not judge_moves or (a.max_move <= limit and a.max_move_chosen <= limit)
    if a.identical:
        beyond = f", but moves {a.max_move:.4g} / {a.max_move_chosen:.4g} beyond the floor's {limit:.4g}"
        return moves_ok, "identical" + ("" if moves_ok else beyond)
    near_ties = all(d["gap_ref"] is not None and d["gap_ref"] <= limit for d in a.divergences)
    gaps = ", ".join("?" if d["gap_ref"] is None else f"{d['gap_ref']:.3g}" for d in a.divergences)
    why = (f"{len(a.divergences)} of {a.prompts} prompts differ, "
           + ("each at a near-tie within the floor" if near_ties else "not all at near-ties within the floor")
           + f" (reference gaps there: {gaps}; floor {limit:.4g})")
    return near_ties and moves_ok, why


# llama.cpp's own lines (INFO, shown with -lv 4) naming each device's buffers; device names as llama.cpp prints them
# (CUDA0, ROCm1, CUDA_Host, RPC0[host:port], CPU_Mapped)
_BUFFER_LINES = {
    "model": re.compile(r"load_tensors: +(\S+) model buffer size = +([0-9.]+) MiB"),
    "kv": re.compile(r"llama_kv_cache: +(\S+) KV buffer size = +([0-9.]+) MiB"),
    "compute": re.compile(r"sched_reserve: +(\S+) compute buffer size = +([0-9.]+) MiB"),
}
_FACTS = {
    "flash_attn": re.compile(r"llama_context: flash_attn += (\S+)"),
    "attn_scratch_mib": re.compile(r"llama_context: attn_scratch += (\d+) MiB"),
    # the context's line (llama-vq's placement check: "attention mode prefill (static rule)"), or as builds before it
    "mode": re.compile(
        r"(?:attention mode ((?:prefill|on|off) \(.*\))"
        r"|(prefill mode: .*|attention without flash attention for every batch.*))$"
    ),
    "pipeline_parallel": re.compile(r"llama_context: (pipeline parallelism enabled)"),
    "attn_fusions": re.compile(r"llama-vq: attention fusions run: (.*)$"),
    "rotation_fusions": re.compile(r"llama-vq: rotation fusions run: (.*)$"),
    "f16_gemm": re.compile(r"(LLAMA_VQ_CUDA_FORCE_F16_GEMM=1: F16 GEMM)"),
    "n_ctx": re.compile(r"llama_context: n_ctx += (\d+)"),
}


def parse_log(text: str) -> dict[str, Any]:
    """Per device MiB of model, KV (the full and the sliding-window caches summed) and compute buffers, and the facts
    each run logs once (flash_attn, attn_scratch, the attention mode chosen, pipeline parallelism, fusion counts)."""
    devices: dict[str, dict[str, float]] = {}
    for kind, rx in _BUFFER_LINES.items():
        for m in rx.finditer(text):
            d = devices.setdefault(m.group(1), {})
            d[kind] = round(d.get(kind, 0.0) + float(m.group(2)), 2)
    facts: dict[str, Any] = {}
    for name, rx in _FACTS.items():
        for line in text.splitlines():
            m = rx.search(line)
            if m:
                facts.setdefault(name, next(g for g in m.groups() if g is not None))
    return {"devices": devices, **facts}


def parse_devices(text: str) -> list[str]:
    """`--list-devices` output -> ["CUDA0: NVIDIA H200 (...)", ...] (no entry for "(none)")."""
    out, on = [], False
    for line in text.splitlines():
        if line.strip() == "Available devices:":
            on = True
            continue
        m = re.match(r"^\s+(\w+\d+): (.*)$", line) if on else None
        if m:
            out.append(f"{m.group(1)}: {m.group(2)}")
    return out


def _f(x: Any, nd: int = 1) -> str:
    return f"{x:.{nd}f}" if isinstance(x, (int, float)) else ""


def _ratio(a: Any, b: Any) -> str:
    return f"{a / b:.2f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else ""


def markdown(doc: dict[str, Any]) -> str:
    """The report's tables from two_gpu.py's JSON document."""
    p = doc["params"]
    out = [
        f"# Two devices, layer split: {doc['model']}",
        "",
        f"{doc['date']}; devices: {'; '.join(doc['devices']) or 'none'}; engine {doc['engine']}; "
        f"K {p['ctk']} / V {p['ctv']}; n_ctx {p['ctx']}; fidelity: {len(p['prompts'])} prompts of "
        f"{'/'.join(map(str, p['prompts']))} tokens, {p['n_predict']} greedy tokens each",
        "",
    ]
    if doc.get("notes"):
        out += [f"- {n}" for n in doc["notes"]] + [""]

    out += [
        "## Greedy agreement (n_probs 2, temperature 0)",
        "",
        "| pair (reference -> run) | tokens | same before first difference | identical | largest gap move "
        "| largest chosen-logprob move | at the f16 floor | why |",
        "|---|---|---|---|---|---|---|---|",
    ]
    order = ("floor", "", "server", "context")  # the floor, the one -> two device pairs, the restore, context
    rank = {k: max(i for i, p in enumerate(order) if k.startswith(p)) for k in doc["agreement"]}
    for name, a in sorted(doc["agreement"].items(), key=lambda kv: rank[kv[0]]):
        out.append(
            f"| {name} | {a['tokens']} | {a['same']} | {'yes' if a['identical'] else 'no'} | "
            f"{a['max_move']:.4g} | {a['max_move_chosen']:.4g} | {a.get('ok', '')} | {a.get('why', '')} |"
        )
    out.append("")

    runs = doc["runs"]
    bench = doc.get("bench", [])
    if bench:
        out += [
            "## Speed at depth 0 (llama-bench, tok/s +- std)",
            "",
            "| group | attention | test | one device | two devices | two / one |",
            "|---|---|---|---|---|---|",
        ]
        keyed: dict[tuple, dict[str, dict]] = {}
        for r in bench:
            test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
            keyed.setdefault((r["group"], r["fa"], test), {})[r["split_mode"]] = r
        for (group, fa, test), by in keyed.items():
            one, two = by.get("none"), by.get("layer")
            cell = lambda r: f"{r['avg_ts']:.1f} +- {r['stddev_ts']:.1f}" if r else ""  # noqa: E731
            out.append(
                f"| {group} | {fa} | {test} | {cell(one)} | {cell(two)} | "
                f"{_ratio(two and two['avg_ts'], one and one['avg_ts'])} |"
            )
        out.append("")

    speed = [(n, r) for n, r in runs.items() if r.get("speed")]
    if speed:
        out += [
            f"## Speed through the server (llama-server's timings, tok/s): depth 0 and {p['depth']}",
            "",
            f"pp{p['pp']} / tg{p['tg']} at depth 0: a fresh {p['pp']}-token prompt, then {p['tg']} tokens; "
            f"fill: the {p['depth']}-token prompt in one request (average over the depth); then pp{p['pp']} on "
            f"top of it (the cached prompt reused) and tg{p['tg']} after that",
            "",
            f"| run | devices | pp{p['pp']} d0 | tg{p['tg']} d0 | fill 0-{p['depth']} | pp{p['pp']} d{p['depth']} | "
            f"tg{p['tg']} d{p['depth']} | cached reused |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for n, r in speed:
            s = r["speed"]
            out.append(
                f"| {n} | {r['n_dev']} | {_f(s.get('pp_d0'))} | {_f(s.get('tg_d0'))} | {_f(s.get('fill'))} | "
                f"{_f(s.get('pp_depth'))} | {_f(s.get('tg_depth'))} | {s.get('reused', '')} |"
            )
        pairs = [(n, n[:-2] + "-2") for n, _ in speed if n.endswith("-1") and n[:-2] + "-2" in runs]
        if pairs:
            out += [
                "",
                "| two / one device | pp d0 | tg d0 | fill | pp at depth | tg at depth |",
                "|---|---|---|---|---|---|",
            ]
            for one, two in pairs:
                a, b = runs[one].get("speed", {}), runs[two].get("speed", {})
                out.append(
                    f"| {two[:-2]} | "
                    + " | ".join(_ratio(b.get(k), a.get(k)) for k in ("pp_d0", "tg_d0", "fill", "pp_depth", "tg_depth"))
                    + " |"
                )
        out.append("")

    out += [
        "## Buffers per device (MiB, llama.cpp's log lines)",
        "",
        "| run | device | model | KV | compute |",
        "|---|---|---|---|---|",
    ]
    for n, r in runs.items():
        for dev, b in r.get("log", {}).get("devices", {}).items():
            out.append(f"| {n} | {dev} | {_f(b.get('model'), 2)} | {_f(b.get('kv'), 2)} | {_f(b.get('compute'), 2)} |")
    out += [
        "",
        "## What each run chose (llama.cpp's log; fusion counts printed at exit with LLAMA_VQ_CUDA_FUSION_STATS=1)",
        "",
        "| run | flash_attn | attention mode | attn_scratch MiB | pipeline parallelism | fusions | error |",
        "|---|---|---|---|---|---|---|",
    ]
    for n, r in runs.items():
        log = r.get("log", {})
        fusions = "; ".join(x for x in (log.get("attn_fusions"), log.get("rotation_fusions"), log.get("f16_gemm")) if x)
        out.append(
            f"| {n} | {log.get('flash_attn', '')} | {log.get('mode', '')} | {log.get('attn_scratch_mib', '')} | "
            f"{'enabled' if log.get('pipeline_parallel') else ''} | {fusions} | {r.get('error', '')} |"
        )
    out.append("")

    if doc.get("server"):
        out += ["## llama-vq-server on the split", "", "| check | result | detail |", "|---|---|---|"]
        for c in doc["server"]:
            result = {True: "ok", False: "FAILED", None: "not judged"}[c["ok"]]
            out.append(f"| {c['check']} | {result} | {c.get('detail', '')} |")
        out.append("")
    if doc.get("skipped"):
        out += ["## Not run", ""] + [f"- {s}" for s in doc["skipped"]] + [""]
    out.append(f"Result: {'every check passed' if not doc['failures'] else 'FAILED: ' + '; '.join(doc['failures'])}")
    return "\n".join(out) + "\n"
