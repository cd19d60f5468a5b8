"""Per-thread CPU time and voluntary context switches of a Linux process, read from /proc/PID/task/*.

benchmarks/serve_bench.py reports the compute threads' switches per token from two readings;
tests/server/test_server_threads.py asserts on the same readings of a live server.
"""

from __future__ import annotations

from pathlib import Path


def thread_counters(pid: int) -> dict[str, tuple[int, int]]:
    """Per thread of pid: (utime + stime in clock ticks, voluntary_ctxt_switches), from /proc/PID/task/*."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            status = (task / "status").read_text().splitlines()
        except OSError:  # the thread ended meanwhile
            continue
        vcsw = next(int(ln.split()[1]) for ln in status if ln.startswith("voluntary_ctxt_switches"))
        out[task.name] = (int(fields[11]) + int(fields[12]), vcsw)
    return out
