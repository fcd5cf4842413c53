"""The benchmark suite and the overhead notebook, end to end, on small data made here.

``bench/suite.py --quick`` runs on 2 processes with tiny counts (items 1, 2 and 4; the
reliability item launches four more jobs and is left to the real suite), then
``notebooks/overhead.ipynb`` is executed with nbclient against that JSON plus the saved
``bench/results/sim_points.json``: whole, with a small synthetic report in the
failure-run format (every figure must be drawn), and its data and failure-run cells
only, without a failure run (the cell must say so and draw nothing). Figures go to a
temporary directory, not notebooks/figures/.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import ROOT

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("matplotlib")
pytest.importorskip("ipykernel")

pytestmark = pytest.mark.slow  # a quick benchmark suite on 2 ranks, then the notebook twice

NOTEBOOK = Path(ROOT) / "notebooks" / "overhead.ipynb"
FIGURES = ("overhead_vs_procs", "twait_vs_rho", "plan_vs_procs_task_time")


def execute(env: dict[str, str], only_setup_and_last: bool = False) -> str:
    """Execute the notebook with ``env`` set; return the text of every output (errors fail the test).

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
    return "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


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
    assert set(result["median"]) == {"zero-work", "2-5 ms", "60-180 ms"}
    assert {"nlevel (defaults: auto)", "classic, master serves"} <= set(result["median"]["2-5 ms"])
    assert result["sweep"] == []  # below 4 processes the planner decides nothing, so there is no sweep
    assert "zero-work, chunksize 1" in data["futures"]["2"]["result"]["median"]
    assert [r["total"] for r in data["memory"] if r["levels"] == 2] == [10**6, 10**7, 10**8, 10**9]


@pytest.mark.timeout(300)
def test_notebook_without_failure_run(suite_json: Path, tmp_path: Path) -> None:
    text = execute({"NLEVEL_BENCH_SUITE": str(suite_json), "NLEVEL_FIGURES": str(tmp_path),
                    "NLEVEL_FAILURE_RUN": str(tmp_path / "no-such-run.json")}, only_setup_and_last=True)
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
    text = execute({"NLEVEL_BENCH_SUITE": str(suite_json), "NLEVEL_FIGURES": str(tmp_path),
                    "NLEVEL_FAILURE_RUN": str(failure)})
    assert "has not been recorded" not in text
    for name in (*FIGURES, "failure_timeline"):
        assert (tmp_path / f"{name}.png").stat().st_size > 10_000, name
