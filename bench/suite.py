"""The benchmark suite: nlevel beside the tools users would pick instead, in one run.

    .venv/bin/python bench/suite.py [--quick] [--procs 2,4,8] [--json bench/results/suite.json]

It launches every MPI benchmark itself through ``nlevel-mpiexec`` (which turns on
``--oversubscribe``, non-busy polling ``mpi_yield_when_idle`` and ``--bind-to none`` when
more processes than cores are asked for), prints ONE table, and writes the JSON with the
settings, the machine, and whether each run was oversubscribed:

1. **Dispatch throughput** (zero-work tasks/s) at each process count, with
   ``bench/compare.py``: the raw mpi4py request/reply round-trip rate between two ranks
   (the physical limit), nlevel (auto plan, forced 2 and 3 levels, through the Farm API),
   the hand-written classic master-slave (``bench/classic.py``: one id per request, master
   serving or computing); and ``bench/futures_bench.py``: ``MPIPoolExecutor.map`` with
   chunksize 1 and a tuned chunksize.
2. **The paper's micro benchmark scaled by 1/1000**: sleeping tasks uniform in [2, 5] ms
   (300 per process, issue 12's workload) and [60, 180] ms (100 per process): overhead
   fraction ``1 - sum(task) / (N x wall)``, every process counted, for each system (nlevel
   also with two-sided grants, to compare with its one-sided default).
3. **Cost of reliability**: ``python -m nlevel.run`` on [2, 5] ms tasks, with and without
   ``mpiexec --with-ft ulfm``, with and without ``--checkpoint``: wall time from the run
   report, ratio to the plain run, and the checkpoint's bytes per task.
4. **Memory** of the master and region-masters as total grows to 10^9 ids
   (``bench/memory.py``, no MPI).
5. **A user's script**, with ``bench/user_script.py``: a fresh ``nlevel-mpiexec -n N python
   script.py`` per run, timed from its start (after ``from mpi4py import MPI``) through
   ``import nlevel`` and its first ``get_task_id`` to its last call, beside the same script with
   ``mpi4py.util.sync.Counter``, alternately, medians of ``--script-repeat`` runs: a 2-task farm
   and 600 [2, 5] ms tasks at 2 ranks, 1,200 at 4 ranks under ULFM, zero-work tasks (issue 35).
   Items 1-2 time farms in a process that has run one already; this is what a script pays.

Also kept in the JSON for the notebook: the T_wait-vs-rho sweep (nlevel runs at one id
per request over a range of task times, with each run's decisions).

Dask is not measured: it is not installed with nlevel, and dask-mpi's ~650 tasks/s on
this machine (shared/DESIGN.md) puts it far below every row here.

``--quick`` shrinks every count (one repeat, fewer tasks) so the whole suite runs in a
few minutes: its numbers show that everything works, not how fast. Ratios, not absolute
times, are the figures to compare; on an oversubscribed machine (N > cores, marked with
``*``) even ratios move between runs.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

import memory  # noqa: E402
import provenance  # noqa: E402
import user_script  # noqa: E402

# Counts per mode: (full, quick).
COUNTS: dict[str, tuple[int, int]] = {
    "repeat": (3, 1),
    "zero": (100_000, 20_000),  # zero-work tasks per nlevel / classic run
    "futures_zero": (20_000, 2_000),  # zero-work tasks per MPIPoolExecutor chunksize-1 run
    "futures_zero_tuned": (100_000, 20_000),
    "tasks_per_proc": (300, 20),  # [2, 5] ms tasks per process (the workload: 600 tasks on 2 ranks, 1,200 on 4)
    "long_tasks_per_proc": (100, 2),  # [60, 180] ms tasks per process
    "rtt": (20_000, 5_000),  # raw round trips timed
    "memory_steps": (20_000, 3_000),
    "script_repeat": (7, 2),  # fresh scripts per case and system (item 5)
}
FT_VARIANTS = {  # name: (mpiexec options, nlevel.run options)
    "plain": ([], []),
    "checkpoint": ([], ["--checkpoint", "ck.h5"]),
    "--with-ft ulfm": (["--with-ft", "ulfm"], []),
    "--with-ft ulfm + checkpoint": (["--with-ft", "ulfm"], ["--checkpoint", "ck.h5"]),
}
CLASSIC = "classic, master serves"
NLEVEL = "nlevel (defaults: auto)"
COUNTER = "one-sided counter (mpi4py.util.sync.Counter)"


def cores() -> int:
    """Cores this process may run on (what nlevel-mpiexec compares N with)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def launcher() -> str:
    """The nlevel-mpiexec beside this Python (the venv's), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "nlevel-mpiexec")
    return here if os.access(here, os.X_OK) else shutil.which("nlevel-mpiexec") or "nlevel-mpiexec"


def mpirun(n: int, args: list[str], workdir: str, timeout: float, mpi_opts: list[str] | None = None) -> dict[str, Any]:
    """Run ``nlevel-mpiexec -n n [mpi_opts] python ARGS`` in ``workdir``; return the command, status and output."""
    cmd = [launcher(), "-n", str(n), *(mpi_opts or []), "python", *args]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), NLEVEL_TTY="0")
    dry = subprocess.run([launcher(), "--dry-run", *cmd[1:]], capture_output=True, text=True, env=env).stdout.strip()
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out, err = -1, str(exc.stdout or ""), f"timed out after {timeout:.0f} s"
    result = {"command": " ".join(cmd), "effective": dry, "returncode": rc, "seconds": time.perf_counter() - t0,
              "load_before": os.getloadavg()[0]}
    if rc != 0:
        result["error"] = (err or out)[-2000:]
        print(f"  FAILED ({rc}): {' '.join(cmd)}\n{result['error']}", file=sys.stderr, flush=True)
    return result


def load_json(path: str) -> Any:
    with open(path) as f:
        return json.load(f)


def run_compare(n: int, c: dict[str, int], workdir: str, timeout: float, ulfm: bool = False) -> dict[str, Any]:
    """Items 1 and 2 for nlevel, classic, the one-sided counter and the raw round trip at ``n`` processes
    (bench/compare.py); ``ulfm``: under ``mpiexec --with-ft ulfm``, [2, 5] ms tasks only."""
    out = os.path.join(workdir, f"compare-{n}{'-ulfm' if ulfm else ''}.json")
    args = [os.path.join(HERE, "compare.py"), "--zero", str(c["zero"] if not ulfm else 1000),
            "--tasks-per-proc", str(c["tasks_per_proc"]),
            "--long-tasks-per-proc", str(c["long_tasks_per_proc"] if not ulfm else 0), "--rtt", str(c["rtt"] if not ulfm else 0),
            "--repeat", str(c["repeat"]), *([] if ulfm else ["--sweep"]), "--json", out]
    run = mpirun(n, args, workdir, timeout, ["--with-ft", "ulfm"] if ulfm else None)
    if run["returncode"] == 0:
        run["result"] = load_json(out)
    return run


def run_futures(n: int, c: dict[str, int], workdir: str, timeout: float) -> dict[str, Any]:
    """Items 1 and 2 for ``mpi4py.futures.MPIPoolExecutor`` at ``n`` processes (bench/futures_bench.py)."""
    out = os.path.join(workdir, f"futures-{n}.json")
    args = ["-m", "mpi4py.futures", os.path.join(HERE, "futures_bench.py"), "--zero", str(c["futures_zero"]),
            "--zero-tuned", str(c["futures_zero_tuned"]), "--tasks-per-proc", str(c["tasks_per_proc"]),
            "--long-tasks-per-proc", str(c["long_tasks_per_proc"]), "--repeat", str(c["repeat"]), "--json", out]
    run = mpirun(n, args, workdir, timeout)
    if run["returncode"] == 0:
        run["result"] = load_json(out)
    return run


def run_reliability(n: int, c: dict[str, int], workdir: str, timeout: float) -> dict[str, Any]:
    """Item 3: ``python -m nlevel.run`` on [2, 5] ms tasks with and without ULFM and a checkpoint."""
    tasks = c["tasks_per_proc"] * n
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in FT_VARIANTS}
    for _ in range(c["repeat"]):
        for name, (mpi_opts, run_opts) in FT_VARIANTS.items():
            for f in ("ck.h5", "r.json"):
                if os.path.exists(os.path.join(workdir, f)):
                    os.unlink(os.path.join(workdir, f))
            args = ["-m", "nlevel.run", "--tasks", str(tasks), "--quiet", "--report", "r.json", *run_opts]
            run = mpirun(n, args, workdir, timeout, mpi_opts)
            if run["returncode"] == 0:
                report = load_json(os.path.join(workdir, "r.json"))
                run.update(wall_s=report["wall_s"], overhead=report["overhead"], committed=report["committed"],
                           checkpoint=report.get("checkpoint"))
                if run_opts:
                    size = os.path.getsize(os.path.join(workdir, "ck.h5"))
                    run.update(checkpoint_bytes=size, checkpoint_bytes_per_task=size / tasks)
            runs[name].append(run)
    med: dict[str, dict[str, float]] = {}
    for name, rs in runs.items():
        ok = [r for r in rs if r["returncode"] == 0]
        if ok:
            med[name] = {k: statistics.median(r[k] for r in ok) for k in ("wall_s", "overhead", "checkpoint_bytes_per_task")
                         if k in ok[0]}
    return {"procs": n, "tasks": tasks, "oversubscribed": n > cores(), "median": med, "runs": runs,
            "checkpoint_bytes_per_task_at_1e5": checkpoint_bytes_per_task(10**5, workdir)}


def checkpoint_bytes_per_task(total: int, workdir: str) -> float:
    """Bytes per task of a checkpoint holding ``total`` completed tasks with one result each.

    The runs above are small, so their files are mostly HDF5's fixed size; this is the
    cost per task at scale (bench/checkpoint_io.py's record, written by nlevel.runtime.checkpoint).
    """
    import checkpoint_io
    from nlevel.runtime import checkpoint as ck

    path = os.path.join(workdir, "per-task.h5")
    meta = ck.RunMeta(total, *ck.fingerprint("bench", {"case": "per-task"}), "{}", "bench")
    ck.write(path, meta, checkpoint_io.case(1, total, total))
    size = os.path.getsize(path)
    os.unlink(path)
    return size / total


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    info: dict[str, Any] = {"host": platform.node(), "cores": cores(), "cpu_count": os.cpu_count(),
                            "platform": platform.platform(), "python": platform.python_version()}
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        info["cpu"] = names[0] if names else platform.processor()
    except OSError:
        info["cpu"] = platform.processor()
    try:
        import mpi4py
        from mpi4py import MPI

        info["mpi4py"] = mpi4py.__version__
        info["mpi"] = MPI.Get_library_version().replace("\x00", "").splitlines()[0].strip()  # may end in a NUL
    except Exception as exc:  # the table still says what ran
        info["mpi"] = f"unknown ({exc})"
    import nlevel

    info["nlevel"] = nlevel.__version__
    try:
        info["git"] = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True,
                                     timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return info


# -- the table --------------------------------------------------------------------------------
def _n(n: int) -> str:
    return f"{n}*" if n > cores() else str(n)


def _pct(x: float | None) -> str:
    return "failed" if x is None else f"{100 * x:.1f} %"


def _x(a: float | None, b: float | None) -> str:
    return "" if a is None or not b else f"{a / b:.2f}"


def rows(data: dict[str, Any]) -> list[list[str]]:
    """The table's rows: measure, N, system, value, ratio, what the ratio is to."""
    out: list[list[str]] = []
    work = [("2-5 ms", "[2, 5] ms overhead"), ("60-180 ms", "[60, 180] ms overhead")]
    for n in data["settings"]["procs"]:
        cmp = (data["compare"].get(str(n)) or {}).get("result") or {}
        fut = (data["futures"].get(str(n)) or {}).get("result") or {}
        med, fmed = cmp.get("median", {}), fut.get("median", {})
        zero = med.get("zero-work", {})
        base = (zero.get(CLASSIC) or {}).get("tasks_per_s")
        rtt = max((cmp.get("round_trips_per_s") or {}).values(), default=None)  # the faster of buffer and pickle
        if rtt:
            out.append(["1 zero-work tasks/s", _n(n), "raw mpi4py round trip, 2 ranks (Send/Recv)", f"{rtt:,.0f}",
                        _x(rtt, base), "classic"])
            pk = cmp["round_trips_per_s"].get("pickle")
            out.append(["1 zero-work tasks/s", _n(n), "raw mpi4py round trip, 2 ranks (pickle)", f"{pk:,.0f}",
                        _x(pk, base), "classic"])
        for s, m in zero.items():
            per = f"; {1e6 / m['tasks_per_s']:.1f} us/task = {rtt / m['tasks_per_s']:.2f} x RTT" if rtt else ""
            out.append(["1 zero-work tasks/s", _n(n), s, f"{m['tasks_per_s']:,.0f}{per}", _x(m["tasks_per_s"], base),
                        "classic"])
        for case, m in fmed.items():
            if case.startswith("zero-work"):
                out.append(["1 zero-work tasks/s", _n(n), f"MPIPoolExecutor.map, {case.split(', ')[1]}",
                            f"{m['tasks_per_s']:,.0f}", _x(m["tasks_per_s"], base), "classic"])
        two = med.get("2 tasks", {})
        c2 = (two.get(COUNTER) or {}).get("wall_s")
        for s, m in two.items():
            out.append(["0 a farm of 2 tasks, wall", _n(n), s, f"{1e3 * m['wall_s']:.1f} ms",
                        f"+{1e3 * (m['wall_s'] - c2):.1f} ms" if c2 is not None else "", "counter"])
        if not cmp:
            out.append(["1-2", _n(n), "nlevel / classic (bench/compare.py)", "failed", "", ""])
        if not fut:
            out.append(["1-2", _n(n), "MPIPoolExecutor (bench/futures_bench.py)", "failed", "", ""])
        for w, label in work:
            by = med.get(w, {})
            b = (by.get(CLASSIC) or {}).get("overhead")
            for s, m in by.items():
                out.append([f"2 {label}", _n(n), s, _pct(m["overhead"]), _x(m["overhead"], b), "classic"])
            f = fmed.get(f"{w}, chunksize 1")
            if f:
                out.append([f"2 {label}", _n(n), "MPIPoolExecutor.map, chunksize 1", _pct(f["overhead"]),
                            _x(f["overhead"], b), "classic"])
    for n, run in (data.get("compare_ulfm") or {}).items():
        by = ((run.get("result") or {}).get("median") or {}).get("2-5 ms", {})
        b = (by.get(COUNTER) or {}).get("overhead")
        for s, m in by.items():
            out.append(["2 [2, 5] ms overhead, --with-ft ulfm", _n(int(n)), s, _pct(m["overhead"]),
                        _x(m["overhead"], b), "counter"])
        if not by:
            out.append(["2 [2, 5] ms overhead, --with-ft ulfm", _n(int(n)), "bench/compare.py", "failed", "", ""])
    rel = data.get("reliability") or {}
    rmed = rel.get("median", {})
    plain = (rmed.get("plain") or {}).get("wall_s")
    for name in FT_VARIANTS if rel else ():
        m = rmed.get(name)
        if m is None:
            out.append(["3 reliability, wall", _n(rel.get("procs", 0)), f"nlevel.run, {name}", "failed", "", ""])
            continue
        bpt = f"; {m['checkpoint_bytes_per_task']:.1f} B/task" if "checkpoint_bytes_per_task" in m else ""
        out.append(["3 reliability, wall", _n(rel["procs"]), f"nlevel.run, {name}",
                    f"{m['wall_s']:.3f} s{bpt}", _x(m["wall_s"], plain), "plain"])
    if rel.get("checkpoint_bytes_per_task_at_1e5"):
        out.append(["3 checkpoint size", "-", "10^5 tasks with one result each",
                    f"{rel['checkpoint_bytes_per_task_at_1e5']:.1f} B/task", "", ""])
    if data.get("user_script"):
        out += user_script.rows(data["user_script"])
    for r in data.get("memory", []):
        out.append(["4 memory, peak", "-", f"{r['levels']} levels, total {r['total']:.0e} ids",
                    f"{r['peak_mib']:.2f} MiB; {r['record_ranges']} ranges", "", ""])
    return out


def targets(data: dict[str, Any]) -> list[str]:
    """The issue's targets, measured (recorded, not asserted)."""
    lines = []
    for n in data["settings"]["procs"]:
        cmp = (data["compare"].get(str(n)) or {}).get("result") or {}
        fut = (data["futures"].get(str(n)) or {}).get("result") or {}
        zero = cmp.get("median", {}).get("zero-work", {})
        if not zero:
            continue
        nl = zero[NLEVEL]["tasks_per_s"]
        rtt = max((cmp.get("round_trips_per_s") or {}).values(), default=None)
        f1 = (fut.get("median", {}).get("zero-work, chunksize 1") or {}).get("tasks_per_s")
        parts = []
        if rtt:
            parts.append(f"per-task time {rtt / nl:.2f} x the raw round trip (target <= 2)")
        if CLASSIC in zero:
            parts.append(f"throughput {nl / zero[CLASSIC]['tasks_per_s']:.2f} x classic (target >= 1 at 4)")
        if f1:
            parts.append(f"{nl / f1:.0f} x MPIPoolExecutor chunksize 1 (target: well above)")
        short = cmp.get("median", {}).get("2-5 ms", {})
        if CLASSIC in short:
            parts.append(f"[2, 5] ms overhead {short[NLEVEL]['overhead'] / short[CLASSIC]['overhead']:.2f} x classic "
                         "(target < 1 at 8)")
        if COUNTER in zero:
            need = 0.9 if n <= 2 else 1.0
            r = nl / zero[COUNTER]["tasks_per_s"]
            parts.append(f"zero-work {r:.2f} x the one-sided counter (target >= {need:g}): {'MET' if r >= need else 'NOT MET'}")
        if COUNTER in short:
            floor = 0.01 if n <= 2 else 0.02
            limit = max(floor, 2 * short[COUNTER]["overhead"])
            o = short[NLEVEL]["overhead"]
            parts.append(f"[2, 5] ms overhead {100 * o:.2f} % against max({100 * floor:.0f} %, 2 x counter's "
                         f"{100 * short[COUNTER]['overhead']:.2f} %) = {100 * limit:.2f} %: {'MET' if o <= limit else 'NOT MET'}")
        two = cmp.get("median", {}).get("2 tasks", {})
        if COUNTER in two and NLEVEL in two:
            d = two[NLEVEL]["wall_s"] - two[COUNTER]["wall_s"]
            parts.append(f"2-task farm {1e3 * d:+.1f} ms against the counter (target <= +50 ms): "
                         f"{'MET' if d <= 0.05 else 'NOT MET'}")
        p50 = request_p50(cmp)
        if p50 is not None:
            parts.append(f"request p50 {p50:.1f} us from nlevel's report, zero-work, auto"
                         + (f" (target <= 20 us at 2): {'MET' if p50 <= 20 else 'NOT MET'}" if n <= 2 else ""))
        lines.append(f"N={_n(n)}: " + "; ".join(parts))
    for n, run in (data.get("compare_ulfm") or {}).items():
        short = ((run.get("result") or {}).get("median") or {}).get("2-5 ms", {})
        if COUNTER in short and NLEVEL in short:
            limit = max(0.02, 2 * short[COUNTER]["overhead"])
            o = short[NLEVEL]["overhead"]
            lines.append(f"N={_n(int(n))}, --with-ft ulfm: [2, 5] ms overhead {100 * o:.2f} % against {100 * limit:.2f} %: "
                         f"{'MET' if o <= limit else 'NOT MET'}")
    lines += [f"a user's script, {t}" for t in (data.get("user_script") or {}).get("targets", [])]
    return lines


def request_p50(cmp: dict[str, Any]) -> float | None:
    """Median over runs of the slaves' request p50 (us) in nlevel's own report, zero-work tasks, defaults."""
    vals = []
    for r in ((cmp.get("runs") or {}).get("zero-work") or {}).get(NLEVEL, []):
        req = ((r.get("report") or {}).get("requests") or {}).get("slave") or {}
        p = (req.get("total") or {}).get("p50")
        if p is not None:
            vals.append(1e3 * p)  # (the report's request times are in ms)
    return statistics.median(vals) if vals else None


def format_table(table: list[list[str]]) -> str:
    head = ["measure", "N", "system", "value", "ratio", "ratio to"]
    widths = [max(len(r[i]) for r in [head, *table]) for i in range(len(head))]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in table]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The command line (also what ``docs/render.py --check`` parses a saved result's command with)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small counts, one repeat: checks that it all runs (noisy)")
    p.add_argument("--procs", default="2,4,8", help="process counts, comma-separated (default 2,4,8)")
    p.add_argument("--ft-procs", type=int, default=4, help="process count of the reliability runs (default 4)")
    p.add_argument("--only", default="dispatch,reliability,memory,script",
                   help="sections to run, comma-separated from dispatch (items 1-2), reliability, memory, script")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per MPI launch (default 1800)")
    p.add_argument("--json", default=os.path.join(HERE, "results", "suite.json"), help="where to write the results")
    p.add_argument("--notebook", action="store_true",
                   help="then execute notebooks/overhead.ipynb on this JSON, writing notebooks/figures/*.png")
    for k in COUNTS:
        p.add_argument(f"--{k.replace('_', '-')}", type=int, help=f"override (full {COUNTS[k][0]}, quick {COUNTS[k][1]})")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    c = {k: (getattr(args, k) if getattr(args, k) is not None else v[1 if args.quick else 0]) for k, v in COUNTS.items()}
    procs = [int(x) for x in args.procs.split(",") if x.strip()]
    only = set(args.only.split(","))
    started = time.time()
    data: dict[str, Any] = {
        "started": _dt.datetime.fromtimestamp(started, _dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.relpath(sys.executable, ROOT) if sys.executable.startswith(ROOT) else "python",
                             "bench/suite.py", *(argv if argv is not None else sys.argv[1:])]),
        "provenance": provenance.record(argv=[os.path.abspath(__file__), *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine(),
        "settings": {
            "quick": args.quick, "procs": procs, "ft_procs": args.ft_procs, "counts": c,
            "oversubscribed": {str(n): n > cores() for n in [*procs, args.ft_procs]},
            "oversubscription": "nlevel-mpiexec adds --oversubscribe, --bind-to none and "
            "OMPI_MCA_mpi_yield_when_idle=1 when N > cores (each run's 'effective' command shows it); "
            "nlevel polls with backoff (poll_max 1e-4 s), mpi4py.futures with its default backoff "
            f"(MPI4PY_FUTURES_BACKOFF={os.environ.get('MPI4PY_FUTURES_BACKOFF', '0.001 default')}), "
            "classic blocks in Recv",
            "overhead": "1 - sum(task time) / (N x wall), every process counted",
        },
        "skipped": {"dask": "not measured: not a dependency of nlevel, and dask-mpi runs ~650 zero-work tasks/s here "
                            "(shared/DESIGN.md), far below every other row"},
        "compare": {}, "futures": {}, "compare_ulfm": {}, "reliability": {}, "memory": [], "user_script": {},
    }
    with tempfile.TemporaryDirectory(prefix="nlevel-suite-") as workdir:
        if "dispatch" in only:
            for n in procs:
                print(f"N={n}: nlevel, classic, raw round trip ...", file=sys.stderr, flush=True)
                data["compare"][str(n)] = run_compare(n, c, workdir, args.timeout)
                print(f"N={n}: MPIPoolExecutor ...", file=sys.stderr, flush=True)
                data["futures"][str(n)] = run_futures(n, c, workdir, args.timeout)
            ft_n = args.ft_procs
            print(f"N={ft_n}: nlevel, classic, counter under --with-ft ulfm ...", file=sys.stderr, flush=True)
            data["compare_ulfm"] = {str(ft_n): run_compare(ft_n, c, workdir, args.timeout, ulfm=True)}
        else:
            procs = []
            data["settings"]["procs"] = []
        if "reliability" in only:
            print(f"N={args.ft_procs}: reliability (ULFM, checkpoint) ...", file=sys.stderr, flush=True)
            data["reliability"] = run_reliability(args.ft_procs, c, workdir, args.timeout)
    if "script" in only:
        print("a user's script (fresh processes), nlevel and the counter ...", file=sys.stderr, flush=True)
        data["user_script"] = user_script.measure(c["script_repeat"], args.quick, "cached", args.timeout)
    if "memory" in only:
        print("memory ...", file=sys.stderr, flush=True)
        try:
            data["memory"] = [memory.run(t, c["memory_steps"], levels=lv) for lv in (2, 3) for t in memory.TOTALS]
        except Exception as exc:  # (one section's failure must not throw away the others' 20 minutes)
            data["memory_error"] = f"{type(exc).__name__}: {exc}"
            print(f"memory: FAILED: {data['memory_error']}", file=sys.stderr, flush=True)
    data["seconds"] = time.time() - started
    data["table"] = rows(data)
    data["targets"] = targets(data)
    m = data["machine"]
    print(f"nlevel benchmark suite{' (QUICK: small counts, one run each; noisy)' if args.quick else ''}: "
          f"{m['cores']} cores ({m['cpu']}), {m.get('mpi', '').split(',')[0]}, load {os.getloadavg()[0]:.1f}; "
          f"median of {c['repeat']}")
    print(format_table(data["table"]))
    print(f"* oversubscribed (N > {cores()} cores): ranks share cores; non-busy polling is on. "
          "Overhead = 1 - sum(task) / (N x wall), every process counted. Ratios are what to compare.")
    for line in data["targets"]:
        print(f"targets, {line}")
    print("Dask: " + data["skipped"]["dask"])
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
        print(f"wrote {args.json} ({data['seconds']:.0f} s)")
    failed = [r for r in [*data["compare"].values(), *data["futures"].values(), *data["compare_ulfm"].values()]
              if r.get("returncode") != 0]
    failed += [m for c in (data["user_script"].get("cases") or {}).values() for m in c["median"].values()
               if m.get("failed")]
    if args.notebook and args.json:
        run_notebook(args.json)
    return 1 if failed else 0


def run_notebook(suite_json: str) -> None:
    """Execute notebooks/overhead.ipynb on ``suite_json``; it saves its figures to notebooks/figures/."""
    import nbclient
    import nbformat

    path = os.path.join(ROOT, "notebooks", "overhead.ipynb")
    os.environ["NLEVEL_BENCH_SUITE"] = os.path.abspath(suite_json)  # the kernel inherits it
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": os.path.dirname(path)}}).execute()
    print(f"executed {os.path.relpath(path, ROOT)}: figures in notebooks/figures/")


if __name__ == "__main__":
    sys.exit(main())
