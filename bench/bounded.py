"""Does any rank's memory grow with the job? 10^8 zero-work ids on 8 ranks, ULFM, ``--levels auto``.

    python bench/bounded.py [--ids 100000000] [--procs 8] [--ft ulfm|none] [--out bench/results/bounded.json]

Each rank runs a user's own ``get_task_id`` loop (``bench/scripts/bounded_loop.py``) and records
its resident memory right after its first call (the farm is set up) and its peak (``VmHWM``) at
the end; the checkpoint is written throughout (every 2 s), and the report says how often, with
how many bytes (each write appends what is new to the journal; see docs/checkpoint.md). The
target (issue 35): every rank's peak within 50 MB of its start. Each rank's growth is also
split by kind (``growth_parts_mb``: the heap, mapped files, shared memory, from the first call
to the end): only the heap can grow with the job's state; a library's code paged in once, or a
peer's shared-memory segment, is a fixed cost of the process. Writes the result with its command
and commit (:mod:`provenance`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import provenance  # noqa: E402

SCRIPT = os.path.join(ROOT, "bench", "scripts", "bounded_loop.py")
TARGET_MB = 50.0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ids", type=int, default=10**8)
    p.add_argument("--procs", type=int, default=8)
    p.add_argument("--ft", default="ulfm", help="mpiexec --with-ft value, or none")
    p.add_argument("--timeout", type=float, default=3600.0)
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "bounded.json"))
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    work = tempfile.mkdtemp(prefix="bounded.")
    launcher = [os.path.join(os.path.dirname(sys.executable), "nlevel-mpiexec"),
                *(["--with-ft", a.ft] if a.ft != "none" else []), "-n", str(a.procs)]
    cmd = [*launcher, sys.executable, SCRIPT, str(a.ids), os.path.join(work, "run.h5"), work]
    env = dict(os.environ, PYTHONPATH=ROOT, NLEVEL_TTY="0", NLEVEL_LEVELS="auto")
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=a.timeout)
    wall = time.monotonic() - t0
    rows = []
    for name in sorted(os.listdir(work)):
        if name.startswith("mem-"):
            with open(os.path.join(work, name)) as f:
                rows.append(json.load(f))
    report = {}
    if os.path.exists(os.path.join(work, "report.json")):
        with open(os.path.join(work, "report.json")) as f:
            report = json.load(f)
    growth = [r["peak_mb"] - r["start_mb"] for r in rows]
    for r in rows:
        if r.get("start_parts_mb") and r.get("end_parts_mb"):
            r["growth_parts_mb"] = {k: round(r["end_parts_mb"][k] - r["start_parts_mb"][k], 1)
                                    for k in r["start_parts_mb"]}
    out = {
        "provenance": provenance.record(),
        "ids": a.ids, "procs": a.procs, "ft": a.ft, "returncode": proc.returncode, "wall_s": round(wall, 1),
        "ranks": sorted(rows, key=lambda r: r["rank"]),
        "max_growth_mb": round(max(growth), 1) if growth else None, "target_mb": TARGET_MB,
        "met": bool(growth) and max(growth) <= TARGET_MB and proc.returncode == 0,
        "plan_history": report.get("plan_history"), "committed": report.get("committed"),
        "checkpoint_writes": (report.get("checkpoint") or {}).get("writes"),
        # (writes, appends, compactions, bytes written, the last write's time: a write costs what is new)
        "checkpoint": report.get("checkpoint"),
        "stderr_tail": proc.stderr[-2000:] if proc.returncode else "",
    }
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"{a.ids:,} ids on {a.procs} ranks ({a.ft}): rc {proc.returncode}, {wall:.0f} s; peak RSS growth per rank "
          f"{', '.join(f'{g:.1f}' for g in growth)} MB (target <= {TARGET_MB:g}): {'MET' if out['met'] else 'NOT MET'}")
    for r in out["ranks"]:
        if "growth_parts_mb" in r:
            print(f"  rank {r['rank']}: " + ", ".join(f"{k} {v:+.1f}" for k, v in r["growth_parts_mb"].items()) + " MB")
    return 0 if out["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
