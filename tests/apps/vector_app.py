"""A test app with two result fields and a finish() hook that writes what it was given."""

import json

result_fields = ("double", "square")
total = 60


def add_arguments(parser):
    parser.add_argument("--finish-out", default="finish.json")


def setup(options):
    global _out
    _out = options.finish_out


def do_job(task_id):
    return (2.0 * task_id, float(task_id) ** 2)


def finish(ids, values, options):
    with open(options.finish_out, "w") as f:
        json.dump({"ids": ids.tolist(), "values": values.tolist()}, f)
