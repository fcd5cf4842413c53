"""Record the failure run the overhead notebook draws: a region-master killed mid-job.

``python bench/failure_run.py`` runs 9 processes (3 levels, 2 regions) under
``mpiexec --with-ft ulfm``, SIGKILLs the region-master of the second region once 30 % of
the tasks are committed (found from outside by :mod:`nlevel.testing.inject`), and saves the run
report, with the kill's wall time added under ``"kills"``, to
``bench/results/failure_run.json``. The notebook reads the report's ``timeline``
(requests served per server per 0.1 s) and ``failures``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from nlevel.testing import inject  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=9)
    p.add_argument("--tasks", type=int, default=6000)
    p.add_argument("--task-ms", type=float, default=5.0)
    p.add_argument("--out", default=os.path.join(HERE, "results", "failure_run.json"))
    a = p.parse_args()
    plan = inject.plan_of(3, (2,))
    with tempfile.TemporaryDirectory() as d:
        res = inject.run(
            a.size, plan,
            ["--tasks", str(a.tasks), "--task-min", str(a.task_ms), "--task-spread", "0",
             "--checkpoint", "run.h5", "--checkpoint-interval", "0.1", "--report", "r.json", "--quiet"],
            inject.Schedule(role="region-master", after_committed=int(0.3 * a.tasks)),
            ft="ulfm", cwd=d, checkpoint="run.h5", report="r.json", timeout=300,
        )
    if res.report is None or res.hung or res.returncode != 0:
        print(f"failure run did not complete: rc={res.returncode} hung={res.hung}\n{res.stderr[-2000:]}", file=sys.stderr)
        return 1
    report = res.report
    report["kills"] = [{"rank": k.rank, "role": k.role, "time": k.time, "signal": k.signal} for k in res.kills]
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1, default=str)
    f0 = report["failures"][0]
    print(f"wrote {a.out}: killed rank {f0['rank']} ({f0['role']}), recovered in {f0['recovery_ms']} ms, "
          f"{report['committed']}/{report['total']} committed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
