"""The simulator: a discrete-event run of the same role state machines, on one core, at any scale.

``python -m nlevel.sim`` (:mod:`~nlevel.sim.cli`); the timing model and :func:`simulate`
(:mod:`~nlevel.sim.model`); the event engine (:mod:`~nlevel.sim.engine`) and the loop's port
in simulated time (:mod:`~nlevel.sim.port`); the optional mypyc build of the hot modules
(:mod:`~nlevel.sim.build`).

May import: :mod:`nlevel.roles`, :mod:`nlevel.model`, :mod:`nlevel.config`,
:mod:`nlevel.ranges`, :mod:`nlevel.stats`, :mod:`nlevel.errors` and its own modules.
Never mpi4py, threads, nor :mod:`nlevel.runtime`. The engine only decides when each step
of every rank's :class:`~nlevel.roles.loop.Loop` happens: the logic is the roles'.
"""

from .cli import main
from .model import (
    DEFAULT_MSG_TIME,
    DEFAULT_SERVICE_TIME,
    SimReport,
    default_times,
    make_durations,
    parse_plan,
    parse_task_time,
    read_task_times,
    simulate,
)

__all__ = [
    "DEFAULT_SERVICE_TIME",
    "DEFAULT_MSG_TIME",
    "SimReport",
    "default_times",
    "parse_task_time",
    "parse_plan",
    "read_task_times",
    "make_durations",
    "simulate",
    "main",
]
