"""Survive versus roll back (the paper's Table 3), measured here.

    python bench/rollback.py [--trials 3] [--size 8] [--levels 3] [--regions 2] [--n 3000]

For each trial, with the same workload (``tests/apps/logging_app.py``):

* **plain**: failure-free, plain mpiexec;
* **ft**: failure-free, ``--with-ft ulfm`` (its overhead over *plain* is the cost of FT);
* **survive**: ``--with-ft ulfm``, one slave SIGKILLed once ``--at`` of the ids are
  committed; the job finishes on the survivors;
* **roll back**: plain mpiexec, the whole job SIGKILLed at the same point, then the same
  command rerun from the checkpoint; its time is the first run up to the kill plus the rerun.

Wall times are from launch to exit (they include MPI start-up and Python imports, ~10 s on
this VM, which a roll-back pays twice); ``compute`` is the report's ``wall_s`` (inside
nlevel; for the roll-back, the rerun's alone: the killed run writes no report). Prints medians and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nlevel.testing import inject  # noqa: E402
from nlevel.testing.inject import Schedule, plan_of  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import provenance  # noqa: E402

APP = "tests.apps.logging_app"


def _env(d: str) -> dict[str, str]:
    logs = os.path.join(d, "logs")
    os.makedirs(logs, exist_ok=True)
    return {**os.environ, "NLEVEL_TEST_LOG_DIR": logs, "NLEVEL_TTY": "0",
            "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _app(a: argparse.Namespace) -> list[str]:
    return [APP, "--n", str(a.n), "--sleep-ms", str(a.sleep_ms), "--checkpoint", "run.h5",
            "--checkpoint-interval", "0.1", "--report", "r.json", "--quiet"]


def _row(res: inject.RunResult, d: str, a: argparse.Namespace) -> dict[str, Any]:
    audit = inject.audit(a.n, [os.path.join(d, "logs")], os.path.join(d, "run.h5"), res.report, res.kills,
                         a.size, plan_of(a.levels, tuple(int(x) for x in a.regions.split(",") if x)))
    return {"wall_s": res.wall, "compute_s": (res.report or {}).get("wall_s"), "returncode": res.returncode,
            "hung": res.hung, "complete": audit["lost"] == 0, "re_executed": audit["re_executed"],
            "kills": [vars(k) for k in res.kills]}


def once(a: argparse.Namespace, base: str, name: str, ft: str | None, sched: Schedule | None) -> dict[str, Any]:
    d = tempfile.mkdtemp(prefix=name + "-", dir=base)
    plan = plan_of(a.levels, tuple(int(x) for x in a.regions.split(",") if x))
    res = inject.run(a.size, plan, _app(a), sched, ft=ft, cwd=d, env=_env(d), checkpoint="run.h5",
                     report="r.json", timeout=a.timeout)
    return _row(res, d, a)


def rollback(a: argparse.Namespace, base: str, at: int) -> dict[str, Any]:
    """Kill the whole job once ``at`` ids are committed, rerun the same command."""
    d = tempfile.mkdtemp(prefix="rollback-", dir=base)
    plan = plan_of(a.levels, tuple(int(x) for x in a.regions.split(",") if x))
    marker = f"rollback-{uuid.uuid4().hex[:10]}"
    env = _env(d)
    env[inject.MARKER_VAR] = marker
    cmd = inject.command(a.size, _app(a), plan, None)
    t0 = time.time()
    job = subprocess.Popen(cmd, cwd=d, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    ck = os.path.join(d, "run.h5")
    deadline = time.monotonic() + a.timeout
    killed_at = None
    try:
        while time.monotonic() < deadline and job.poll() is None:
            c = inject.committed(ck) if os.path.exists(ck) else None
            if c is not None and c >= at:
                killed_at = time.time()
                break
            time.sleep(0.01)
    finally:
        inject.kill_job(job, marker)
    first = (killed_at or time.time()) - t0
    done_at_kill = len(inject.committed_ids(ck)) if os.path.exists(ck) else 0
    res = inject.run(a.size, plan, _app(a), None, cwd=d, env=_env(d), checkpoint="run.h5",
                     report="r.json", timeout=a.timeout)
    row = _row(res, d, a)
    row.update({"first_run_s": first, "rerun_s": res.wall, "wall_s": first + res.wall,
                "committed_at_kill": done_at_kill, "landed": killed_at is not None})
    return row


def build_parser() -> argparse.ArgumentParser:
    """The command line (also what ``docs/render.py --check`` parses a saved result's command with)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--size", type=int, default=8)
    p.add_argument("--levels", type=int, default=3)
    p.add_argument("--regions", default="2")
    p.add_argument("--n", type=int, default=3000)
    p.add_argument("--sleep-ms", type=float, default=5.0)
    p.add_argument("--at", type=float, default=0.5, help="share of ids committed at the kill [default 0.5]")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "rollback.json"))
    return p


def main() -> None:
    p = build_parser()
    a = p.parse_args()
    base = tempfile.mkdtemp(prefix="nlevel-rollback-")
    at = int(a.n * a.at)
    rows: dict[str, list[dict[str, Any]]] = {"plain": [], "ft": [], "survive": [], "roll back": []}
    try:
        for k in range(a.trials):
            rows["plain"].append(once(a, base, "plain", None, None))
            rows["ft"].append(once(a, base, "ft", "ulfm", None))
            rows["survive"].append(once(a, base, "survive", "ulfm",
                                        Schedule(role="slave", after_committed=at, seed=k)))
            rows["roll back"].append(rollback(a, base, at))
            print(f"trial {k + 1}/{a.trials}: " + ", ".join(
                f"{name} {r[-1]['wall_s']:.1f} s" + ("" if r[-1]["returncode"] == 0 else f" (exit {r[-1]['returncode']}"
                                                       f"{', hung' if r[-1]['hung'] else ''})")
                for name, r in rows.items()), flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    def med(name: str, key: str) -> float | None:
        xs = [r[key] for r in rows[name] if r.get(key) is not None]
        return statistics.median(xs) if xs else None

    plain_w, plain_c = med("plain", "wall_s"), med("plain", "compute_s")
    print(f"\nrollback: {a.size} processes, levels {a.levels}, regions {a.regions}, {a.n} tasks of "
          f"{a.sleep_ms} ms, kill at {a.at:.0%} committed, {a.trials} trial(s), medians")
    print(f"{'run':<10} {'wall s':>8} {'vs plain':>9} {'compute s':>10} {'ok':>6} {'re-executed':>12}")
    summary = {}
    for name in rows:
        w, c = med(name, "wall_s"), med(name, "compute_s")
        ok = sum(1 for r in rows[name] if r["returncode"] == 0 and r["complete"])
        summary[name] = {"wall_s": w, "compute_s": c, "ok": ok, "of": len(rows[name])}
        rel = f"{(w / plain_w - 1) * 100:+.1f}%" if w and plain_w else "-"
        print(f"{name:<10} {w if w is not None else float('nan'):>8.2f} {rel:>9} "
              f"{c if c is not None else float('nan'):>10.2f} {ok:>3}/{len(rows[name]):<2} "
              f"{statistics.median([r['re_executed'] for r in rows[name]]) if rows[name] else 0:>12}")
    fto = summary["ft"]["compute_s"]
    if fto and plain_c:
        print(f"failure-free overhead of --with-ft ulfm (compute): {(fto / plain_c - 1) * 100:+.1f}% (target <= 5%)")
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    prov = provenance.record()  # (before the file is opened: truncating a tracked result makes the tree "dirty")
    with open(a.out, "w") as f:
        json.dump({"provenance": prov, "args": vars(a), "summary": summary, "runs": rows}, f, indent=1)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
