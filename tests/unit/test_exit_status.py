"""The exit status of ``python -m nlevel.run``, from its report: 75 only when a resume has work to do."""

from __future__ import annotations

import pytest

from nlevel.runtime.cli import report_status


def report(committed: int, failed: int = 0, stopped: str | None = None, **extra) -> dict:
    return {"total": 120, "committed": committed, "complete": committed == 120, "stopped": stopped,
            "failed_tasks": [{"id": i} for i in range(failed)], **extra}


@pytest.mark.parametrize("r,status", [
    (report(120), 0),
    (report(119, failed=1), 1),
    (report(100, stopped="SIGUSR1"), 75),
    (report(100, failed=1, stopped="task timeout"), 75),  # (19 ids left: resume them)
    (report(120, stopped="SIGUSR1", checkpoint_error="disk full"), 1),
    (report(100, stopped="checkpoint", checkpoint_error="disk full"), 1),
])
def test_the_status_a_report_calls_for(r, status):
    assert report_status(r) == status


def test_a_job_stopped_with_every_id_committed_or_failed_is_not_resumed():
    """The third run of a hung task past --task-timeout quarantines it and stops: nothing is left,
    and 75 made a batch script resubmit a job with nothing to do."""
    assert report_status(report(119, failed=1, stopped="task timeout")) == 1
