"""Automatic range sizes: the task time sets them, a short job's length caps them (the tail)."""

from nlevel.model.cost import TAIL_RANGES, Costs, Workload, auto_ids, range_chunk
from nlevel.model.plan import Plan


def test_ranges_hold_the_chunk_target_of_work_unless_the_job_is_short():
    assert auto_ids(0.0035, 0.03, 256) == 8  # 30 ms of 3.5 ms tasks
    assert auto_ids(0.0035, 0.03, 256, ids_per_proc=300) == 300 // TAIL_RANGES  # 2 ranks x 300 tasks: 7
    assert auto_ids(0.0035, 0.03, 256, ids_per_proc=100) == 2  # 1,024 x 100 tasks: the tail would cost 1 point
    assert auto_ids(5.0, 0.03, 256, ids_per_proc=10) == 1  # long tasks: one id
    assert auto_ids(1e-6, 0.03, 256, ids_per_proc=1e9) == 256  # max_chunk holds


def test_the_cost_model_sizes_ranges_as_the_servers_do():
    costs = Costs(service_time=3e-5, msg_time=2e-6)
    short = Workload.uniform(1024, 0.002, 0.005, 102_400)
    assert range_chunk(Plan(3, (8,)), short, costs) == auto_ids(0.0035, costs.chunk_target, costs.max_chunk, 100)
    assert range_chunk(Plan(3, (8,), chunk=5), short, costs) == 5
