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
