"""The benchmark suite and the overhead notebook, end to end, on small data made here.

``bench/suite.py --quick`` runs on 2 processes with tiny counts (items 1, 2 and 4; the
reliability item launches four more jobs and is left to the real suite), then
``notebooks/overhead.ipynb`` is executed with nbclient against that JSON plus the saved
``bench/results/sim_points.json``: whole, with a small synthetic report in the
failure-run format (every figure must be drawn), and its data and failure-run cells
only, without a failure run (the cell must say so and draw nothing). Figures go to a
temporary directory, not notebooks/figures/.

The whole run is checked against its inputs: every figure file is re-written by this run
(a stale file put there first is replaced) and is the very image the notebook displays, no
cell reports an error, and what the notebook prints (the inputs it read, the suite's table,
the counts of simulated and measured points) is what the JSON it reads says.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ..conftest import ROOT

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("matplotlib")
pytest.importorskip("ipykernel")

pytestmark = pytest.mark.slow  # a quick benchmark suite on 2 ranks, then the notebook twice

NOTEBOOK = Path(ROOT) / "notebooks" / "overhead.ipynb"
SIM_POINTS = Path(ROOT) / "bench" / "results" / "sim_points.json"  # the notebook's default, read as saved
FIGURES = ("overhead_vs_procs", "twait_vs_rho", "plan_vs_procs_task_time")
PNG = b"\x89PNG\r\n\x1a\n"


def text_of(nb: Any) -> str:
    """The text of every output of the executed notebook."""
    return "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


def execute(env: dict[str, str], only_setup_and_last: bool = False) -> Any:
    """Execute the notebook with ``env`` set; return it with its outputs (errors fail the test).

    ``only_setup_and_last`` runs just the first code cell (paths, data) and the last (the failure run).
    """
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the kernel inherits this process's environment
    try:
        nb = nbformat.read(NOTEBOOK, as_version=4)
        if only_setup_and_last:
            code = [c for c in nb.cells if c.cell_type == "code"]
            nb.cells = [code[0], code[-1]]
        nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return nb


@pytest.fixture(scope="module")
def suite_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("suite") / "suite.json"
    cmd = [sys.executable, os.path.join(ROOT, "bench", "suite.py"), "--quick", "--procs", "2", "--only", "dispatch,memory",
           "--zero", "2000", "--futures-zero", "300", "--futures-zero-tuned", "2000", "--tasks-per-proc", "10",
           "--long-tasks-per-proc", "1", "--rtt", "500", "--memory-steps", "300", "--timeout", "120", "--json", str(out)]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=200)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"bench/suite.py hung (killed after 200 s):\n{exc.stdout}\n{exc.stderr}")
    assert proc.returncode == 0, f"bench/suite.py failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert "| measure" in proc.stdout and "MPIPoolExecutor.map, chunksize 1" in proc.stdout
    return out


@pytest.mark.timeout(300)
def test_suite_json(suite_json: Path) -> None:
    data = json.loads(suite_json.read_text())
    cores = data["machine"]["cores"]
    assert data["settings"]["quick"] is True
    assert data["settings"]["oversubscribed"]["2"] is (2 > cores)
    result = data["compare"]["2"]["result"]
    assert result["round_trips_per_s"]["buffer"] > 0
    assert set(result["median"]) == {"2 tasks", "zero-work", "2-5 ms", "60-180 ms"}
    assert {"nlevel (defaults: auto)", "classic, master serves", "one-sided counter (mpi4py.util.sync.Counter)"} \
        <= set(result["median"]["2-5 ms"])
    assert "4" in data["compare_ulfm"] and data["compare_ulfm"]["4"]["returncode"] == 0
    assert result["sweep"] == []  # below 4 processes the planner decides nothing, so there is no sweep
    assert "zero-work, chunksize 1" in data["futures"]["2"]["result"]["median"]
    assert [r["total"] for r in data["memory"] if r["levels"] == 2] == [10**6, 10**7, 10**8, 10**9]


@pytest.mark.timeout(300)
def test_notebook_without_failure_run(suite_json: Path, tmp_path: Path) -> None:
    text = text_of(execute({"NLEVEL_BENCH_SUITE": str(suite_json), "NLEVEL_FIGURES": str(tmp_path),
                            "NLEVEL_FAILURE_RUN": str(tmp_path / "no-such-run.json")}, only_setup_and_last=True))
    assert "failure run has not been recorded" in text
    assert not (tmp_path / "failure_timeline.png").exists()


@pytest.mark.timeout(300)
def test_notebook_draws_every_figure(suite_json: Path, tmp_path: Path) -> None:
    # The format the failure run's report will have (lead's issue-6 brief); the numbers are made up for the test only.
    t0 = 1_800_000_000.0
    report = {"size": 7, "timeline": {"bin_s": 0.5, "t0": t0, "served": {"0": [5, 6, 6, 9, 9], "4": [4, 5, 0, 0, 0]}},
              "failures": [{"rank": 4, "role": "region-master", "detected_at": t0 + 1.1}]}
    failure = tmp_path / "failure_run.json"
    failure.write_text(json.dumps(report))
    # Stale figures from an earlier run: this run must replace every one of them.
    stale = b"a stale figure: the run must replace this file"
    names = (*FIGURES, "failure_timeline")
    for name in names:
        (tmp_path / f"{name}.png").write_bytes(stale)
        os.utime(tmp_path / f"{name}.png", (time.time() - 3600,) * 2)
    started = time.time()
    nb = execute({"NLEVEL_BENCH_SUITE": str(suite_json), "NLEVEL_FIGURES": str(tmp_path),
                  "NLEVEL_FAILURE_RUN": str(failure)})
    text = text_of(nb)
    assert "has not been recorded" not in text
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert [o for o in outputs if o["output_type"] == "error"] == []
    assert [o["text"] for o in outputs if o.get("name") == "stderr" and ("Error" in o["text"] or "Traceback" in o["text"])] == []
    shown = [base64.b64decode(o["data"]["image/png"]) for o in outputs if "image/png" in o.get("data", {})]
    for name in names:
        path = tmp_path / f"{name}.png"
        data = path.read_bytes()
        assert data.startswith(PNG) and path.stat().st_mtime >= started, f"{name}.png was not re-written by this run"
        assert len(data) > 10_000, name
        assert data in shown, f"{name}.png is not the figure the notebook displayed"
        assert f"saved {path}\n" in text
    assert len(shown) == len(names)

    # What it printed is what the JSON it read says.
    suite = json.loads(suite_json.read_text())
    sim = json.loads(SIM_POINTS.read_text())
    machine = suite["machine"]
    assert (f"suite: {suite_json} (QUICK, noisy; {suite['started']}, {machine['cores']} cores, "
            f"{machine.get('cpu')})") in text
    assert f"simulated points: {SIM_POINTS} ({len(sim['points'])} points)" in text
    head = ["measure", "N", "system", "value", "ratio", "ratio to"]
    rows = [head, *suite["table"]]
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(head))]
    table = "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows)
    assert len(suite["table"]) > 0 and table in text
    for line in suite.get("targets", []):
        assert f"targets, {line}" in text
    largest = max(p["procs"] for p in sim["points"].values())
    assert f"simulated up to {largest} processes" in text
    below = sum(1 for p in sim["points"].values() if p["plan_name"] == "classic" and p["requests"].get("slave")
                and 0.01 < p["servers"]["master"]["busy"] < 0.98 and p["requests"]["slave"]["wait_ms"] > 0)
    measured = sum(1 for n in suite["settings"]["procs"]
                   for row in ((suite["compare"].get(str(n)) or {}).get("result") or {}).get("sweep", [])
                   if len(row["report"].get("plan_history", [])) == 1 and (row["report"].get("requests") or {}).get("slave")
                   and row["report"].get("decisions"))
    assert below > 0 and f"{measured} measured runs, {below} simulated points below saturation" in text
