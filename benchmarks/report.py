#!/usr/bin/env python3
"""Tables, bytes-moved estimates and the tok/s-vs-depth plot from a benchmarks/run.py results.json.

    python benchmarks/report.py OUT/results.json [--out DIR]     # rewrites results.md and the PNG

Everything here is derived from the JSON, so a run made on another machine can be reported here.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

# bytes per element of a cache type (block size / bytes per block)
ELT_BYTES = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q4_0": 18 / 32,
    "q4_1": 20 / 32,
    "q5_0": 22 / 32,
    "q5_1": 24 / 32,
    "iq4_nl": 18 / 32,
}
BASELINE = "fa-off_f16-f16"


# ----------------------------------------------------------------------------
# model facts (from the GGUF header)


def model_bytes(path) -> dict:
    """Weight bytes read per decoded token and the attention shape, from the GGUF header.

    Weights read per token: every tensor except token_embd (one row is gathered); for MoE expert
    tensors only n_expert_used / n_expert of the bytes (what a single token touches).
    """
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import synth_models  # noqa: PLC0415
    except Exception as e:  # noqa: BLE001 - the report still works without these figures
        return {"error": f"gguf header not read: {e!r}"}
    kv, tensors = synth_models.read_gguf_header(
        path, keys=lambda k: not k.startswith("tokenizer."), tensors=True
    )
    g = {k: v.value for k, v in kv.items()}
    arch = g["general.architecture"]

    def get(k, default=None):
        return g.get(f"{arch}.{k}", default)

    n_layer = int(get("block_count"))
    n_head = get("attention.head_count")
    n_head = n_head[0] if isinstance(n_head, list) else n_head
    n_head_kv = get("attention.head_count_kv", n_head)
    kv_heads = list(n_head_kv) if isinstance(n_head_kv, list) else [int(n_head_kv)] * n_layer
    n_embd = int(get("embedding_length"))
    head_k = int(get("attention.key_length", n_embd // n_head))
    head_v = int(get("attention.value_length", n_embd // n_head))
    pattern = get("attention.sliding_window_pattern")
    swa = list(pattern) if isinstance(pattern, list) else [0] * n_layer
    n_swa = int(get("attention.sliding_window", 0) or 0)
    n_expert = int(get("expert_count", 0) or 0)
    n_used = int(get("expert_used_count", 0) or 0)
    total = sum(t.nbytes for t in tensors)
    per_token = 0.0
    for t in tensors:
        if t.name == "token_embd.weight":
            continue
        if "_exps." in t.name and n_expert:
            per_token += t.nbytes * n_used / n_expert
        else:
            per_token += t.nbytes
    return dict(
        arch=arch,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=int(n_head),
        kv_heads=kv_heads[:n_layer],
        head_k=head_k,
        head_v=head_v,
        swa=swa[:n_layer],
        n_swa=n_swa,
        file_bytes=total,
        weight_bytes_per_token=per_token,
        n_expert=n_expert,
        n_expert_used=n_used,
    )


def kv_bytes_per_token(m: dict, type_k: str, type_v: str, depth: float) -> float:
    """KV bytes one decode step reads at ``depth`` cached tokens (ideal: cells in use, no padding).

    Full-attention layers read ``depth`` cells; sliding-window layers min(depth, n_swa).
    """
    total = 0.0
    for il in range(m["n_layer"]):
        cells = min(depth, m["n_swa"]) if (m["swa"][il] and m["n_swa"]) else depth
        total += (
            cells
            * m["kv_heads"][il]
            * (m["head_k"] * ELT_BYTES[type_k] + m["head_v"] * ELT_BYTES[type_v])
        )
    return total


# ----------------------------------------------------------------------------
# aggregation


def _test_name(r: dict) -> str:
    if r["n_prompt"] and not r["n_gen"]:
        return f"pp{r['n_prompt']}"
    if r["n_gen"] and not r["n_prompt"]:
        return f"tg{r['n_gen']}"
    return f"pp{r['n_prompt']}+tg{r['n_gen']}"


def aggregate(res: dict) -> dict:
    """(model, config, test, depth) -> {mean, std, n}: all samples of all rounds pooled."""
    samples = defaultdict(list)
    for r in res["records"]:
        key = (r["_model"], r["_config"], _test_name(r), int(r["n_depth"]))
        samples[key] += list(r.get("samples_ts") or [r["avg_ts"]])
    out = {}
    for key, s in samples.items():
        mean = sum(s) / len(s)
        std = math.sqrt(sum((x - mean) ** 2 for x in s) / (len(s) - 1)) if len(s) > 1 else 0.0
        out[key] = dict(mean=mean, std=std, n=len(s))
    return out


def _config_label(cfg: str) -> str:
    fa, kv = cfg.split("_", 1)
    k, v = kv.split("-")
    return f"FA {fa[3:]}, K {k} / V {v}"


def _config_order(statuses: list[dict]) -> list[str]:
    seen = []
    for s in statuses:
        if s["config"] not in seen:
            seen.append(s["config"])
    return seen


def _status_of(res: dict, model: str, cfg: str) -> dict:
    sts = [s for s in res["statuses"] if s["model"] == model and s["config"] == cfg]
    bad = [s for s in sts if s["status"] != "ok"]
    return bad[0] if bad else (sts[0] if sts else {"status": "not run"})


def _depth_label(d: int) -> str:
    return f"{d // 1024}K" if d and d % 1024 == 0 else str(d)


# ----------------------------------------------------------------------------
# markdown


def markdown(res: dict) -> str:
    agg = aggregate(res)
    mach = res.get("machine", {})
    prov = res.get("provenance", {})
    par = res.get("params", {})
    lines = []
    where = mach.get("gpus") and f"GPU: {'; '.join(mach['gpus'])}; " or ""
    lines.append(f"### {res['backend'].upper()} run {res.get('date_utc', '')}")
    lines.append("")
    cpu = f"CPU: {mach.get('cpu_model', '?')} ({mach.get('cpu_cores', '?')} cores visible)"
    lines.append(f"- Machine: {where}{cpu}")
    series = ", ".join(prov.get("patch_series", [])) or "none"
    dirty = " (patches/ had uncommitted changes)" if prov.get("patches_dirty") else ""
    lines.append(
        f"- llama.cpp {prov.get('llama_cpp_commit', '?')} "
        f"(llama-cpp-python {prov.get('llama_cpp_python', '?')}) + patches: {series}{dirty}; "
        f"repo {prov.get('repo_commit', '?')}"
    )
    if prov.get("note"):
        lines.append(f"- Note: {prov['note']}")
    bf = res.get("built_from", {})
    if bf.get("prebuilt"):
        bpatches = (bf.get("build_config") or {}).get("patches")
        if bpatches:
            built = ", ".join(bpatches)
        elif "series_matches_current" in bf:
            built = (
                "the series above (tree exported by run.py)"
                if bf["series_matches_current"]
                else "an OLDER series than the one above"
            )
        else:
            built = "unknown (no _build_config.json)"
        lines.append(f"- Tools: prebuilt ({bf['prebuilt']}); patches built in: {built}")
    elif bf:
        lines.append("- Tools: built by this run from the exported patched tree (the series above)")
    lines.append(f"- Command: `{res.get('command', '')}`")
    nr = par.get("rounds", 1)
    rounds = f", {nr} interleaved rounds pooled" if nr > 1 else ""
    lines.append(
        f"- llama-bench: pp{par.get('n_prompt')} / tg{par.get('n_gen')} at depths "
        f"{', '.join(str(d) for d in par.get('depths', []))}, -r {par.get('reps')}"
        f"{', -t ' + str(par['threads']) if par.get('threads') else ''}"
        f"{rounds}; "
        f"wall {res.get('wall_s')} s"
    )
    lines.append("")
    cfgs = _config_order(res["statuses"])
    for model in res["models"]:
        tests = sorted(
            {(k[2], k[3]) for k in agg if k[0] == model},
            key=lambda x: (x[0][:2] != "pp", x[0], x[1]),
        )
        if not tests:
            tests = []
        mi = res["models"][model]
        lines.append(f"#### {model}: tok/s (mean ± std over samples)")
        lines.append("")
        desc = _model_desc(mi)
        if desc:
            lines.append(desc)
            lines.append("")
        hdr = "| config | " + " | ".join(f"{t} @ d{_depth_label(d)}" for t, d in tests) + " |"
        lines.append(hdr)
        lines.append("|" + "---|" * (len(tests) + 1))
        for cfg in cfgs:
            st = _status_of(res, model, cfg)
            cells = []
            for t, d in tests:
                v = agg.get((model, cfg, t, d))
                cells.append(f"{v['mean']:.1f} ± {v['std']:.1f}" if v else st["status"])
            lines.append(f"| {_config_label(cfg)} | " + " | ".join(cells) + " |")
        lines.append("")
        lines.append(f"#### {model}: ratio to FA off, f16/f16 (same run)")
        lines.append("")
        lines.append(hdr)
        lines.append("|" + "---|" * (len(tests) + 1))
        for cfg in cfgs:
            st = _status_of(res, model, cfg)
            cells = []
            for t, d in tests:
                v = agg.get((model, cfg, t, d))
                b = agg.get((model, BASELINE, t, d))
                cells.append(
                    f"{v['mean'] / b['mean']:.3f}x"
                    if (v and b)
                    else (st["status"] if not v else "n/a")
                )
            lines.append(f"| {_config_label(cfg)} | " + " | ".join(cells) + " |")
        lines.append("")
        bad = [s for s in res["statuses"] if s["model"] == model and s["status"] != "ok"]
        if bad:
            lines.append("Not measured:")
            lines.append("")
            for s in bad:
                lines.append(
                    f"- {_config_label(s['config'])}: **{s['status']}** — {s.get('reason', '')}"
                )
            lines.append("")
        lines += _memory_table(res, model, cfgs)
        lines += _bytes_table(res, agg, model, cfgs)
    return "\n".join(lines) + "\n"


def _model_desc(mi: dict) -> str:
    if "n_layer" not in mi:
        return ""
    kvh = sorted(set(mi["kv_heads"]))
    n_swa_layers = sum(1 for x in mi["swa"] if x)
    s = (
        f"{mi['arch']}: {mi['n_layer']} layers, n_embd {mi['n_embd']}, {mi['n_head']} heads, "
        f"KV heads {'/'.join(map(str, kvh))}, head K {mi['head_k']} / V {mi['head_v']}"
    )
    if n_swa_layers:
        s += f", {n_swa_layers} sliding-window layers (window {mi['n_swa']})"
    if mi.get("n_expert"):
        s += f", {mi['n_expert']} experts ({mi['n_expert_used']} used)"
    s += (
        f"; file {mi['file_bytes'] / 2**30:.2f} GiB, weights read per token "
        f"{mi['weight_bytes_per_token'] / 2**30:.3f} GiB."
    )
    return s


def _pad256(n: int) -> int:
    return (n + 255) // 256 * 256


def _memory_table(res: dict, model: str, cfgs: list[str]) -> list[str]:
    """KV and compute-buffer sizes llama.cpp logged, for the contexts of the tests at each depth."""
    par = res.get("params", {})
    n_gen = par.get("n_gen") or 0
    n_prompt = par.get("n_prompt") or 0
    rows = []
    ctx_sizes = set()
    by_cfg = {}
    for cfg in cfgs:
        sts = [
            s
            for s in res["statuses"]
            if s["model"] == model and s["config"] == cfg and s.get("buffers")
        ]
        if not sts:
            continue
        m = {}
        for b in sts[0]["buffers"]:
            if b["kv"]:
                m[b["n_ctx"]] = b
        by_cfg[cfg] = m
        ctx_sizes |= set(m)
    if not by_cfg:
        return []
    # llama-bench's context for a test is depth + n_prompt + n_gen, which llama.cpp pads to 256:
    # show the decode (tg) contexts, and the prefill ones when there is no tg test
    n_test = n_gen or n_prompt
    wanted = sorted({_pad256(d + n_test) for d in par.get("depths", [])} & ctx_sizes)
    out = [
        "",
        f"#### {model}: memory from llama.cpp's log (MiB; KV = all caches, compute = per device)",
        "",
    ]
    out.append("| config | n_ctx | K | V | KV total | V vs f16 V | compute buffers |")
    out.append("|---|---|---|---|---|---|---|")
    base = by_cfg.get(BASELINE, {})
    for cfg, m in by_cfg.items():
        for c in wanted:
            b = m.get(c)
            if not b:
                continue
            k = sum(x["k_mib"] for x in b["kv"])
            v = sum(x["v_mib"] for x in b["kv"])
            tot = sum(x["total_mib"] for x in b["kv"])
            bv = base.get(c)
            ratio = f"{v / sum(x['v_mib'] for x in bv['kv']):.4f}" if bv else "n/a"
            comp = ", ".join(f"{dev} {mib:.1f}" for dev, mib in b["compute"].items())
            rows.append(
                f"| {_config_label(cfg)} | {c} | {k:.1f} | {v:.1f} | {tot:.1f} | {ratio} | {comp} |"
            )
    out += rows
    out.append("")
    return out


def _bytes_table(res: dict, agg: dict, model: str, cfgs: list[str]) -> list[str]:
    mi = res["models"].get(model, {})
    if "weight_bytes_per_token" not in mi:
        return []
    n_gen = res.get("params", {}).get("n_gen") or 0
    if not n_gen:
        return []
    t = f"tg{n_gen}"
    out = [
        "",
        f"#### {model}: bytes moved per decode step vs measured time "
        f"({t}; KV read at depth + {n_gen}/2, ideal)",
        "",
        "| config | depth | weights MiB | KV MiB | total MiB | measured ms/token | implied GB/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for cfg in cfgs:
        _, kv = cfg.split("_", 1)
        k, v = kv.split("-")
        for d in res.get("params", {}).get("depths", []):
            a = agg.get((model, cfg, t, d))
            if not a:
                continue
            w = mi["weight_bytes_per_token"]
            kvb = kv_bytes_per_token(mi, k, v, d + n_gen / 2)
            ms = 1000.0 / a["mean"]
            mib = f"{w / 2**20:.0f} | {kvb / 2**20:.0f} | {(w + kvb) / 2**20:.0f}"
            gbs = (w + kvb) / (ms / 1000) / 1e9
            out.append(f"| {_config_label(cfg)} | {d} | {mib} | {ms:.2f} | {gbs:.0f} |")
    out.append("")
    return out


# ----------------------------------------------------------------------------
# plot


def plot(res: dict, path: Path) -> str | None:
    """tok/s against depth: a panel per model and test, a line per config. Returns an error."""
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except Exception as e:  # noqa: BLE001
        return f"matplotlib unavailable ({e!r}): run benchmarks/report.py where it is"
    agg = aggregate(res)
    models = list(res["models"])
    tests = sorted({k[2] for k in agg}, key=lambda x: (x[:2] != "pp", x))
    if not tests:
        return "no measurements to plot"
    fig, axes = plt.subplots(
        len(models), len(tests), figsize=(6 * len(tests), 4 * len(models)), squeeze=False
    )
    cfgs = _config_order(res["statuses"])
    mach = res.get("machine", {})
    label = (mach.get("gpus") or [mach.get("cpu_model", "?")])[0].split(",")[0]
    for i, model in enumerate(models):
        for j, t in enumerate(tests):
            ax = axes[i][j]
            for cfg in cfgs:
                pts = sorted(
                    (k[3], v["mean"], v["std"])
                    for k, v in agg.items()
                    if k[0] == model and k[1] == cfg and k[2] == t
                )
                if not pts:
                    continue
                style = "-" if cfg.startswith("fa-off") else "--"
                ax.errorbar(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    yerr=[p[2] for p in pts],
                    fmt=style + "o",
                    ms=3,
                    capsize=2,
                    label=_config_label(cfg),
                )
            ax.set_title(f"{model} {t} ({res['backend']}: {label})", fontsize=9)
            ax.set_xlabel("depth (tokens in cache)")
            ax.set_ylabel("tok/s")
            ax.grid(alpha=0.3)
            ax.set_ylim(bottom=0)
            ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def write_all(res: dict, out: Path) -> None:
    md = markdown(res)
    err = plot(res, out / "tok_s_vs_depth.png")
    if err:
        md += f"\n(plot not written: {err})\n"
    else:
        md += "\n![tok/s vs depth](tok_s_vs_depth.png)\n"
    (out / "results.md").write_text(md)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("results", type=Path)
    ap.add_argument(
        "--out", type=Path, help="folder for results.md and the PNG (default: beside the JSON)"
    )
    a = ap.parse_args(argv)
    res = json.loads(a.results.read_text())
    out = a.out or a.results.parent
    out.mkdir(parents=True, exist_ok=True)
    write_all(res, out)
    print(out / "results.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
