"""What a user's script sees: nlevel beside ``mpi4py.util.sync.Counter``, each in a fresh script per run.

    .venv/bin/python bench/user_script.py [--quick] [--repeat 5] [--cases short-ulfm] [--cpu] [--json FILE]

``bench/compare.py`` times a farm inside a process that has run one already: imports, the
first window and the code's first execution are paid before it starts the clock. A user's
script pays them. Here each run is a fresh ``nlevel-mpiexec -n N python script.py``; the
script imports mpi4py (the user's own cost: the counter's script pays it too), waits at a
barrier, takes its start, then imports nlevel (or the counter) and runs its loop until its
last call returns (nlevel: the call that returns -1, once the job is over on every rank; the
counter: its collective ``free``). Each rank records when it started, imported, got its first
id and returned from its last call; on one node their clocks (``perf_counter``, the system's
monotonic clock) are one clock, and the job's times are

* ``import``: until the last rank has imported nlevel (the counter: ``from mpi4py.util.sync
  import Counter``);
* ``first call``: from then until the last rank's first call returned (the counter: making it
  and its first ``next``);
* ``from the first call``: from the moment every rank has made its first call to the last
  call's return (issue 35's measure: "a user's script from its first get_task_id to its
  last"; from each rank's own first call, a rank that imported faster would count the
  others' import as its wait);
* ``script``: from the start to the last call's return (the import included).

The cases are issue 35's: a 2-task farm at 2 ranks; 600
tasks of [2, 5] ms at 2 ranks; 1,200 at 4 ranks under ``--with-ft ulfm``; zero-work tasks at
2 ranks. Overhead is ``1 - sum(task time) / (N x time)``. The two scripts run alternately,
``--repeat`` times each; medians are reported, with the smallest and largest value.

``--cpu`` adds, per rank and per thread (main, nlevel-server, nlevel-pulse, MPI's own), the CPU
time and the voluntary (waits) and involuntary (preemptions) context switches from the import to
the last call, and where each rank's time went besides its tasks (its first call, its later calls,
from its last task to its last return): on a shared machine CPU time moves far less than wall
time. ``--source DIR`` measures another checkout (a ``git worktree`` of another commit).

Bytecode: each run is a new interpreter, which compiles every module it finds no bytecode
for. An installed package has its bytecode; a checkout under ``PYTHONDONTWRITEBYTECODE=1``
has none, and compiling nlevel's ~30 modules then costs tens of milliseconds in every run.
By default (``--bytecode cached``) the runs share a private ``PYTHONPYCACHEPREFIX`` that one
unmeasured run of each script fills; ``--bytecode as-is`` keeps the environment's setting.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import provenance  # noqa: E402

NLEVEL = "nlevel (get_task_id)"
COUNTER = "one-sided counter (mpi4py.util.sync.Counter)"

# The two scripts. Before the start: mpi4py, and only sys, time, os (what any script has);
# json is imported after the last call. A task of [2, 5] ms sleeps a duration drawn from its id
# (a multiplicative hash: the `random` module would be an import nlevel does not make).
_HEAD = """\
import os, sys, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
TOTAL, LO, HI = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
clock = time.perf_counter
def work(i):
    if HI <= 0:
        return 0.0
    s = clock()
    time.sleep((LO + (HI - LO) * ((i * 2654435761) % 4294967296) / 4294967296) * 1e-3)
    return clock() - s
comm.Barrier()
start = clock()
"""
_TAIL = """\
last = clock()
import json
rows = comm.gather((start, imported, first, last, busy, n, CPU() if CPU else None, done, calls), 0)
if comm.rank == 0:
    print("RESULT " + json.dumps(rows))
"""
#: ``--cpu``: where each rank's CPU went, per thread, from its import (nlevel's, or the counter's) to
#: its last call. Run time per thread from /proc/.../schedstat (nanoseconds: /proc's stat counts
#: 10 ms ticks), its voluntary (it waited) and involuntary (it was preempted) context switches. A
#: Python thread that ends before the last call (nlevel's server thread and pulse are joined by the
#: last call; they are ``nlevel.runtime.rank.RunnerThread``s, not ``threading.Thread``s) is read
#: as it ends; the other threads are MPI's own (Open MPI's progress, PMIx).
_CPU_ON = """\
import threading
def _task(tid):
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        run = int(f.read().split()[0])
    with open(f"/proc/self/task/{tid}/status") as f:
        st = dict(ln.split(":", 1) for ln in f.read().splitlines() if "ctxt_switches" in ln)
    return [run, int(st["voluntary_ctxt_switches"]), int(st["nonvoluntary_ctxt_switches"])]
def _snap():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            out[int(tid)] = _task(tid)
        except OSError:
            pass
    return out
_ended = {}
def _record(name):
    try:
        _ended[threading.get_native_id()] = (name, _task(threading.get_native_id()))
    except OSError:
        pass
def _measured_run(run):
    def measured_run(self):
        try:
            run(self)
        finally:
            _record(self.name)
    return measured_run
threading.Thread.run = _measured_run(threading.Thread.run)
def _measured_init(init):  # (a RunnerThread: read inside its target, before it counts as ended)
    def measured_init(self, target, name):
        def body():
            try:
                target()
            finally:
                _record(name)
        init(self, body, name)
    return measured_init
_at = {}
def MARK():
    _at.update(_snap())
def CPU():
    now, main = _snap(), threading.main_thread().native_id
    names = {t.native_id: t.name for t in threading.enumerate()}
    out = {}
    for tid in set(now) | set(_ended):
        name, end = _ended.get(tid) or (names.get(tid, "mpi"), now.get(tid))
        name = "main" if tid == main else name
        a = _at.get(tid, [0, 0, 0])
        d = [e - b for e, b in zip(end, a)]
        o = out.setdefault(name, [0, 0, 0, 0])
        o[0] += d[0]; o[1] += d[1]; o[2] += d[2]; o[3] += 1
    return out
"""
_BODY = {
    NLEVEL: """\
import nlevel
if CPU:  # (nlevel's runner threads are not threading's: read them as they end too)
    _rt = getattr(sys.modules.get("nlevel.runtime.rank"), "RunnerThread", None)
    if _rt is not None:
        _rt.__init__ = _measured_init(_rt.__init__)
imported = clock()
MARK()
busy, n, calls, done = 0.0, 0, 0.0, clock()
tid = nlevel.get_task_id(TOTAL)
first = clock()
while tid >= 0:
    busy += work(tid)
    n += 1
    done = clock()
    tid = nlevel.get_task_id(TOTAL)
    if tid >= 0:
        calls += clock() - done
""",
    COUNTER: """\
from mpi4py.util.sync import Counter
imported = clock()
MARK()
busy, n, calls, done = 0.0, 0, 0.0, clock()
counter = Counter(comm=comm)
tid = counter.next()
first = clock()
while tid < TOTAL:
    busy += work(tid)
    n += 1
    done = clock()
    tid = counter.next()
    if tid < TOTAL:
        calls += clock() - done
comm.Barrier()  # (every rank done before the window goes)
counter.free()
""",
}


def script(name: str, cpu: bool = False) -> str:
    """The text of script ``name`` (:data:`NLEVEL` or :data:`COUNTER`); ``cpu``: with :data:`_CPU_ON`."""
    head = _HEAD.replace("comm.Barrier()\n", (_CPU_ON if cpu else "CPU = None\ndef MARK():\n    pass\n")
                         + "comm.Barrier()\n", 1)
    return head + _BODY[name] + _TAIL


SCRIPTS = {name: script(name) for name in _BODY}

#: key: (what it is, processes, nlevel-mpiexec options, tasks (full, quick), task time [lo, hi] ms)
CASES: dict[str, tuple[str, int, list[str], tuple[int, int], tuple[float, float]]] = {
    "two": ("2-task farm", 2, [], (2, 2), (0.0, 0.0)),
    "short": ("600 x [2, 5] ms", 2, [], (600, 100), (2.0, 5.0)),
    "short-ulfm": ("1,200 x [2, 5] ms, --with-ft ulfm", 4, ["--with-ft", "ulfm"], (1200, 200), (2.0, 5.0)),
    "zero": ("zero-work", 2, [], (100_000, 20_000), (0.0, 0.0)),
}


def launcher() -> str:
    """The nlevel-mpiexec beside this Python (the venv's), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "nlevel-mpiexec")
    return here if os.access(here, os.X_OK) else "nlevel-mpiexec"


def launch(script: str, n: int, opts: list[str], total: int, work: tuple[float, float], env: dict[str, str],
           workdir: str, timeout: float) -> dict[str, Any]:
    """One fresh run of ``script``: the command, and the job's times (the slowest rank's) or its error."""
    cmd = [launcher(), "-n", str(n), *opts, sys.executable, script, str(total), str(work[0]), str(work[1])]
    run: dict[str, Any] = {"command": " ".join(cmd), "load_before": os.getloadavg()[0]}
    try:
        p = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**run, "error": f"timed out after {timeout:.0f} s"}
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if p.returncode != 0 or line is None:
        return {**run, "error": f"exit {p.returncode}: {(p.stderr or p.stdout)[-2000:]}"}
    rows = json.loads(line[len("RESULT "):])
    start, imported, first, last = (max(r[i] for r in rows) for i in range(4))
    times = {"import_s": imported - start, "first_call_s": first - imported, "from_first_call_s": last - imported,
             "script_s": last - min(r[0] for r in rows)}
    busy, done = sum(r[4] for r in rows), sum(r[5] for r in rows)
    if done != total:
        return {**run, "error": f"{done} tasks ran, not {total}"}
    # Where each rank's time went besides its tasks (sums over ranks): its first call, its later calls
    # (the last one's wait for the job's end excepted), and from its last task's end to its last return.
    run["ranks_first_call_s"] = sum(r[2] - r[1] for r in rows)
    run["ranks_in_calls_s"] = sum(r[8] for r in rows)
    run["ranks_end_s"] = sum(r[3] - r[7] for r in rows)
    if rows[0][6] is not None:  # (--cpu: each rank's threads, [ns on a CPU, waits, preemptions, threads])
        run["cpu"] = [r[6] for r in rows]
    run.update(times, busy_s=busy, tasks=total,
               overhead_from_first_call=1.0 - busy / (n * times["from_first_call_s"]),
               overhead_script=1.0 - busy / (n * times["script_s"]),
               tasks_per_s_from_first_call=total / times["from_first_call_s"],
               tasks_per_s_script=total / times["script_s"])
    return run


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median, smallest and largest of each measure over the runs that worked."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"failed": len(runs)}
    keys = [k for k, v in ok[0].items() if isinstance(v, float) and k != "load_before"]
    out: dict[str, Any] = {k: statistics.median(r[k] for r in ok) for k in keys}
    out["range"] = {k: [min(r[k] for r in ok), max(r[k] for r in ok)] for k in keys}
    out["runs"], out["failed"] = len(ok), len(runs) - len(ok)
    return out


def measure(repeat: int, quick: bool, bytecode: str, timeout: float, cases: list[str] | None = None,
            log: Any = None, cpu: bool = False, source: str = ROOT) -> dict[str, Any]:
    """Every case, both scripts alternately ``repeat`` times; the runs and their summaries (``cpu``: with
    each rank's CPU time per thread, see :data:`_CPU_ON`; ``source``: the nlevel checkout measured)."""
    env = dict(os.environ, PYTHONPATH=source + os.pathsep + os.environ.get("PYTHONPATH", ""), NLEVEL_TTY="0")
    out: dict[str, Any] = {"bytecode": bytecode, "repeat": repeat, "cases": {}}
    with tempfile.TemporaryDirectory(prefix="nlevel-user-script-") as workdir:
        if bytecode == "cached":
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = os.path.join(workdir, "pycache")
        paths = {}
        for name in SCRIPTS:
            text = script(name, cpu)
            paths[name] = os.path.join(workdir, "nlevel_script.py" if name == NLEVEL else "counter_script.py")
            with open(paths[name], "w") as f:
                f.write(text)
            if bytecode == "cached":  # (not measured: fills the bytecode cache, as an installed package has it)
                warm = launch(paths[name], 2, [], 2, (0.0, 0.0), env, workdir, timeout)
                if "error" in warm:
                    out.setdefault("warm_up_errors", {})[name] = warm["error"]
        for case in cases or list(CASES):
            label, n, opts, totals, work = CASES[case]
            total = totals[1 if quick else 0]
            runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SCRIPTS}
            for i in range(repeat):
                for s in (SCRIPTS if i % 2 == 0 else reversed(list(SCRIPTS))):  # (alternate who goes first)
                    if log:
                        log(f"{case}: {s}, run {i + 1}/{repeat}")
                    runs[s].append(launch(paths[s], n, opts, total, work, env, workdir, timeout))
            out["cases"][case] = {"case": label, "procs": n, "mpiexec_options": opts, "tasks": total, "task_ms": list(work),
                                  "median": {s: summary(r) for s, r in runs.items()}, "runs": runs}
            if cpu:
                out["cases"][case]["cpu"] = {s: cpu_summary(r, total) for s, r in runs.items()}
    out["targets"] = targets(out)
    return out


def cpu_summary(runs: list[dict[str, Any]], total: int) -> dict[str, Any]:
    """``--cpu``: per thread kind (main, nlevel-server, nlevel-pulse, mpi: MPI's own threads), the median
    over runs of the sum over ranks: CPU ms, voluntary and involuntary context switches; and per task."""
    ok = [r for r in runs if "cpu" in r]
    if not ok:
        return {}
    names = sorted({name for r in ok for rank in r["cpu"] for name in rank})
    out: dict[str, Any] = {}
    for name in names + ["all"]:
        per_run = []
        for r in ok:
            sums = [0, 0, 0]
            for rank in r["cpu"]:
                for n, v in rank.items():
                    if name in (n, "all"):
                        sums = [a + b for a, b in zip(sums, v)]
            per_run.append(sums)
        cpu_ms = statistics.median(p[0] for p in per_run) / 1e6
        vol = statistics.median(p[1] for p in per_run)
        inv = statistics.median(p[2] for p in per_run)
        out[name] = {"cpu_ms": cpu_ms, "cpu_us_per_task": 1e3 * cpu_ms / total, "voluntary": vol,
                     "involuntary": inv, "waits_per_task": vol / total,
                     "cpu_ms_range": [min(p[0] for p in per_run) / 1e6, max(p[0] for p in per_run) / 1e6]}
    return out


def cpu_lines(data: dict[str, Any]) -> list[str]:
    """``--cpu``: one line per case, script and thread kind."""
    lines = []
    for case, c in data["cases"].items():
        for s, m in c["median"].items():
            if "ranks_first_call_s" in m:
                lines.append(f"time {case} | {s} | summed over ranks: first call {1e3 * m['ranks_first_call_s']:.1f} ms, "
                             f"later calls {1e3 * m['ranks_in_calls_s']:.1f} ms, last task's end to last return "
                             f"{1e3 * m['ranks_end_s']:.1f} ms")
        for s, kinds in (c.get("cpu") or {}).items():
            for name, m in kinds.items():
                lines.append(f"cpu {case} | {s} | {name}: {m['cpu_ms']:.1f} ms over all ranks "
                             f"({m['cpu_ms_range'][0]:.1f}-{m['cpu_ms_range'][1]:.1f}), {m['cpu_us_per_task']:.1f} us/task; "
                             f"waits {m['voluntary']:.0f} ({m['waits_per_task']:.2f}/task), preempted {m['involuntary']:.0f}")
    return lines


def targets(data: dict[str, Any]) -> list[str]:
    """Issue 35's targets, measured (recorded, not asserted)."""
    lines = []
    cases = data["cases"]

    def med(case: str, system: str) -> dict[str, Any]:
        return ((cases.get(case) or {}).get("median") or {}).get(system) or {}

    a, b = med("two", NLEVEL), med("two", COUNTER)
    if "from_first_call_s" in a and "from_first_call_s" in b:
        d = a["from_first_call_s"] - b["from_first_call_s"]
        lines.append(f"2-task farm, 2 ranks, first call to last: {1e3 * a['from_first_call_s']:.1f} ms against the "
                     f"counter's {1e3 * b['from_first_call_s']:.1f} ms ({1e3 * d:+.1f} ms; target <= +10 ms): "
                     f"{'MET' if d <= 0.010 else 'NOT MET'}; with the import: {1e3 * a['script_s']:.1f} ms against "
                     f"{1e3 * b['script_s']:.1f} ms ({1e3 * (a['script_s'] - b['script_s']):+.1f} ms)")
    for case, floor in (("short", 0.01), ("short-ulfm", 0.02)):
        a, b = med(case, NLEVEL), med(case, COUNTER)
        if "overhead_from_first_call" in a and "overhead_from_first_call" in b:
            o, c = a["overhead_from_first_call"], b["overhead_from_first_call"]
            limit = max(floor, 1.5 * c)
            lines.append(f"{CASES[case][0]}, {CASES[case][1]} ranks: overhead {100 * o:.2f} % against max({100 * floor:.0f} %, 1.5 x the counter's "
                         f"{100 * c:.2f} %) = {100 * limit:.2f} %: {'MET' if o <= limit else 'NOT MET'}; with the "
                         f"import: {100 * a['overhead_script']:.2f} % against {100 * b['overhead_script']:.2f} %")
    a, b = med("zero", NLEVEL), med("zero", COUNTER)
    if "tasks_per_s_from_first_call" in a and "tasks_per_s_from_first_call" in b:
        r = a["tasks_per_s_from_first_call"] / b["tasks_per_s_from_first_call"]
        lines.append(f"zero-work, 2 ranks: {a['tasks_per_s_from_first_call']:,.0f} tasks/s, {r:.2f} x the counter's "
                     f"(target >= 1): {'MET' if r >= 1 else 'NOT MET'}; with the import: "
                     f"{a['tasks_per_s_script'] / b['tasks_per_s_script']:.2f} x")
    return lines


def rows(data: dict[str, Any]) -> list[list[str]]:
    """Table rows (measure, N, system, value, ratio, ratio to), as bench/suite.py prints them."""
    out = []
    for c in data["cases"].values():
        n, case = str(c["procs"]), c["case"]
        base = c["median"].get(COUNTER) or {}
        for s, m in c["median"].items():
            if "script_s" not in m:
                out.append([f"5 a user's script: {case}", n, s, "failed", "", ""])
                continue
            if c["task_ms"][1] > 0:
                value = (f"{100 * m['overhead_from_first_call']:.2f} % from the first call, "
                         f"{100 * m['overhead_script']:.2f} % with the import")
                ratio = f"{m['overhead_from_first_call'] / base['overhead_from_first_call']:.2f}" \
                    if base.get("overhead_from_first_call") else ""
            elif c["tasks"] > 2:
                value = f"{m['tasks_per_s_from_first_call']:,.0f} tasks/s ({m['tasks_per_s_script']:,.0f} with the import)"
                ratio = f"{m['tasks_per_s_from_first_call'] / base['tasks_per_s_from_first_call']:.2f}" \
                    if base.get("tasks_per_s_from_first_call") else ""
            else:
                value = (f"{1e3 * m['from_first_call_s']:.1f} ms from the first call (first call "
                         f"{1e3 * m['first_call_s']:.1f}); import {1e3 * m['import_s']:.1f}; "
                         f"script {1e3 * m['script_s']:.1f}")
                ratio = f"{1e3 * (m['from_first_call_s'] - base['from_first_call_s']):+.1f} ms" \
                    if "from_first_call_s" in base else ""
            out.append([f"5 a user's script: {case}", n, s, value, ratio, "counter"])
    return out


def build_parser() -> argparse.ArgumentParser:
    """The command line (also what ``docs/render.py --check`` parses a saved result's command with)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer tasks, 2 runs each: checks that it works (noisy)")
    p.add_argument("--repeat", type=int, help="runs of each script per case (default 7; --quick 2)")
    p.add_argument("--cases", help="comma-separated, from: " + "; ".join(f"{k} ({v[0]}, {v[1]} ranks)"
                                                                         for k, v in CASES.items()) + " (default: all)")
    p.add_argument("--bytecode", choices=("cached", "as-is"), default="cached",
                   help="cached: a private bytecode cache filled before measuring (default); as-is: the environment's")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds allowed per launch (default 300)")
    p.add_argument("--cpu", action="store_true", help="also record each rank's CPU time and context switches per "
                   "thread, from the import to the last call (robust on a shared machine, unlike wall time)")
    p.add_argument("--source", default=ROOT, help="the nlevel checkout whose package the scripts import (default: "
                   "this one; e.g. a `git worktree` of another commit, to compare)")
    p.add_argument("--json", help="write the runs, their medians and the targets here (with the command and commit)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",")] if args.cases else None
    for c in cases or ():
        if c not in CASES:
            p.error(f"--cases: unknown case {c!r}; expected some of: {', '.join(CASES)}")
    repeat = args.repeat if args.repeat is not None else (2 if args.quick else 7)
    prov = provenance.record(argv=[os.path.abspath(__file__), *(argv if argv is not None else sys.argv[1:])])
    started = time.time()
    data = measure(repeat, args.quick, args.bytecode, args.timeout, cases,
                   log=lambda s: print(s, file=sys.stderr, flush=True), cpu=args.cpu,
                   source=os.path.abspath(args.source))
    data["seconds"] = time.time() - started
    for r in rows(data):
        print(" | ".join(r))
    for line in data["targets"]:
        print(f"targets, {line}")
    for line in cpu_lines(data):
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"provenance": prov, **data}, f, indent=1)
            f.write("\n")
        print(f"wrote {args.json}")
    failed = any(m.get("failed") for c in data["cases"].values() for m in c["median"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
