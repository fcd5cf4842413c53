"""A test app (issue 38) whose do_job returns three numbers for task 7 where it declares two result fields."""

import time

result_fields = ("a", "b")
total = 60


def do_job(task_id):
    time.sleep(0.002)
    return (1.0, 2.0, 3.0) if task_id == 7 else (float(task_id), 0.0)
