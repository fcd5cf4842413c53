total = -3


def do_job(task_id):
    pass
