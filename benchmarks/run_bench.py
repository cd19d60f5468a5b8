"""benchmarks/run.py's runs: one cache configuration through llama-bench, its status, and the buffer sizes
llama.cpp logs."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


@dataclass
class Config:
    fa: str  # "off" | "on"
    type_k: str
    type_v: str

    @property
    def key(self) -> str:
        return f"fa-{self.fa}_{self.type_k}-{self.type_v}"


# ----------------------------------------------------------------------------
# llama-bench log parsing (buffer sizes)

_RE_NCTX = re.compile(r"llama_context: n_ctx\s*=\s*(\d+)")
_RE_KV = re.compile(
    r"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*(\d+) cells,\s*(\d+) layers"
    r".*?K \((\w+)\):\s*([\d.]+) MiB, "
    r"V \((\w+)\):\s*([\d.]+) MiB"
)
_RE_CB = re.compile(r"(\S+) compute buffer size =\s*([\d.]+) MiB")


def parse_buffers(log: str) -> list[dict]:
    """Per context created: n_ctx, KV caches (iSWA models have two), compute buffers."""
    ctxs: list[dict] = []
    cur: dict | None = None
    for line in log.splitlines():
        m = _RE_NCTX.search(line)
        if m:
            cur = {"n_ctx": int(m.group(1)), "kv": [], "compute": {}}
            ctxs.append(cur)
            continue
        if cur is None:
            continue
        m = _RE_KV.search(line)
        if m:
            cur["kv"].append(
                dict(
                    total_mib=float(m.group(1)),
                    cells=int(m.group(2)),
                    layers=int(m.group(3)),
                    type_k=m.group(4),
                    k_mib=float(m.group(5)),
                    type_v=m.group(6),
                    v_mib=float(m.group(7)),
                )
            )
            continue
        m = _RE_CB.search(line)
        if m:
            # a context may reserve more than once: the buffer is the largest
            dev, mib = m.group(1), float(m.group(2))
            cur["compute"][dev] = max(mib, cur["compute"].get(dev, 0.0))
    return ctxs


def _classify_failure(rc: int, err: str) -> tuple[str, str]:
    tail = [ln for ln in err.strip().splitlines() if ln.strip()][-6:]
    reason_lines = [
        ln
        for ln in err.splitlines()
        if re.search(r"error|requires|not supported|abort|assert", ln, re.I)
    ][-3:]
    reason = " | ".join(s.strip() for s in (reason_lines or tail))[:400]
    if "failed to create context" in err:
        return "unsupported", reason
    if rc < 0:
        return "failed", f"killed by signal {-rc}: {reason}"
    return "failed", f"rc={rc}: {reason}"


def run_config(
    bench: Path, model: Path, model_name: str, cfg: Config, a, log_dir: Path
) -> tuple[list[dict], dict]:
    cmd = [
        str(bench),
        "-m",
        str(model),
        "-fa",
        cfg.fa,
        "-ctk",
        cfg.type_k,
        "-ctv",
        cfg.type_v,
        "-d",
        ",".join(str(d) for d in a.depths),
        "-r",
        str(a.reps),
        "-o",
        "jsonl",
        "-v",
    ]
    if a.p:
        cmd += ["-p", str(a.p)]
    else:
        cmd += ["-p", "0"]
    cmd += ["-n", str(a.n) if a.n else "0"]
    if a.threads:
        cmd += ["-t", str(a.threads)]
    if a.backend in ("cuda", "hip"):
        cmd += ["-ngl", "99"]
    cmd += a.extra
    status = dict(
        model=model_name,
        config=cfg.key,
        fa=cfg.fa,
        type_k=cfg.type_k,
        type_v=cfg.type_v,
        command=shlex.join(cmd),
    )
    print(f"[bench] {model_name} {cfg.key}: {shlex.join(cmd)}", flush=True)
    t0 = time.time()
    log_path = log_dir / f"{model_name}_{cfg.key}.log"
    try:
        with open(log_path, "w") as ferr:
            p = subprocess.run(
                cmd, stdout=subprocess.PIPE, stderr=ferr, text=True, timeout=a.timeout
            )
        rc, out = p.returncode, p.stdout
    except subprocess.TimeoutExpired as e:
        rc, out = None, (e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or ""))
    err = log_path.read_text(errors="replace")
    status["wall_s"] = round(time.time() - t0, 1)
    records = []
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            rec["_model"] = model_name
            rec["_config"] = cfg.key
            records.append(rec)
    if rc is None:
        status["status"] = "timeout"
        status["reason"] = f"over {a.timeout} s"
    elif rc == 0:
        status["status"] = "ok"
    else:
        status["status"], status["reason"] = _classify_failure(rc, err)
    if records and status["status"] != "ok":
        status["partial"] = True
    status["buffers"] = parse_buffers(err)
    print(
        f"[bench]   -> {status['status']} in {status['wall_s']} s"
        + "".join(
            f"; {r.get('n_prompt')}+{r.get('n_gen')}@d{r.get('n_depth')}: "
            f"{r.get('avg_ts', 0):.1f} t/s"
            for r in records
        )
        + (f" ({status.get('reason')})" if status.get("reason") else ""),
        flush=True,
    )
    return records, status


# ----------------------------------------------------------------------------


