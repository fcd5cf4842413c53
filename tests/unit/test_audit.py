"""The fault audit's double-commit count reads the checkpoint, not the report's re-reports."""

from __future__ import annotations

import h5py
import numpy as np

from nlevel.testing.audit import checkpoint_doubles


def test_a_result_recorded_twice_is_a_double_commit(tmp_path):
    path = tmp_path / "run.h5"
    with h5py.File(path, "w") as f:
        f["result_ids"] = np.array([3, 1, 2, 2, 7, 3], np.int64)
    assert checkpoint_doubles(path) == 2
    with h5py.File(path, "w") as f:
        f["result_ids"] = np.array([0, 1, 2], np.int64)
    assert checkpoint_doubles(path) == 0
    assert checkpoint_doubles(tmp_path / "missing.h5") is None


def test_a_rank_that_died_of_its_own_task_widens_the_radius_like_a_killed_one(tmp_path):
    from nlevel.model.plan import Plan
    from nlevel.testing.audit import audit

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "exec-2.log").write_text("5\n6\n")  # rank 2 ran 5 and 6, then its task killed its process
    (logs / "exec-3.log").write_text("5\n6\n7\n")
    plain = audit(8, [logs], tmp_path / "missing.h5", None, [], 4, Plan(2))
    assert plain["re_executed_elsewhere"] == [5, 6]  # (nobody known dead: every re-run is suspect)
    told = audit(8, [logs], tmp_path / "missing.h5", None, [], 4, Plan(2), also_dead=[2])
    assert told["re_executed_elsewhere"] == [] and told["re_executed"] == 2
