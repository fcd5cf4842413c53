"""Liveness is a heartbeat (issue 34): who beats to whom, when a lease expires, and the busy time beats carry."""

from __future__ import annotations

from nlevel.config import Config
from nlevel.model.hierarchy import build
from nlevel.model.plan import Plan
from nlevel.roles.events import Kill, Received, Send, Tick
from nlevel.roles.messages import Heartbeat, Report
from nlevel.roles.station import Station
from nlevel.roles.watch import beat_period
from nlevel.runtime.progress import model_state
from nlevel.roles.ledger import Ledger
from nlevel.testing.network import LocalBoards


def stations(size=4, plan=Plan(2), lease=5.0):
    now = [0.0]
    cfg = Config(levels=plan.levels, regions=plan.regions, fault_tolerance="on", lease=lease)
    boards = LocalBoards()
    h = build(size, plan)
    out = [Station(h, r, cfg, lambda: now[0], boards, 100, Ledger(100) if r == 0 else None) for r in range(size)]
    return out, now


def beats(effects):
    return [(e.dest, e.msg) for e in effects if isinstance(e, Send) and isinstance(e.msg, Heartbeat)]


def test_a_slave_beats_to_its_parent_once_per_beat_period():
    (master, slave, *_), now = stations()
    assert [d for d, _ in beats(slave.handle(Tick()))] == [0]
    now[0] += beat_period(5.0) / 2
    assert beats(slave.handle(Tick())) == []
    now[0] += beat_period(5.0)
    assert [d for d, _ in beats(slave.handle(Tick()))] == [0]


def test_a_silent_child_is_killed_after_a_lease_and_a_beating_one_never():
    (master, *_), now = stations()
    for t in range(1, 60):  # a minute of a long task: rank 1 beats, ranks 2 and 3 claim and report nothing
        now[0] = t * 0.5
        kills = [e for e in master.handle(Tick()) if isinstance(e, Kill)]
        master.handle(Received(1, Heartbeat(0)))
        if now[0] <= 5.0:
            assert kills == []
        if kills:
            assert sorted(k.rank for k in kills) == [2, 3] and 5.0 < now[0] <= 5.0 + 0.5 + 0.5
            break
    else:
        raise AssertionError("the silent children were never killed")
    assert 1 not in {k.rank for k in kills}


def test_a_task_that_runs_counts_as_busy_until_its_report():
    (master, slave, *_), now = stations()
    now[0] = 2.0
    [(_, beat)] = beats(slave.handle(Tick(running=1.5)))
    assert beat.running == 1.5
    master.handle(Received(1, beat))
    now[0] = 3.0
    assert master.running_now(now[0]) == 2.5  # (1.5 s at its beat, and a second since)
    master.handle(Received(1, Report(tasks=1, busy=2.6)))
    assert master.running_now(now[0]) == 0.0 and master.server.busy_below == 2.6


def test_the_progress_line_counts_running_tasks_as_busy():
    """4 ranks, 10 s in, every rank 9.5 s into one long task: about 5 % waste, not 100 %."""
    (master, *others), now = stations()
    now[0] = 10.0
    for st in others:
        [(_, beat)] = beats(st.handle(Tick(running=9.5)))
        master.handle(Received(st.rank, beat))
    master.handle(Tick(running=9.5))
    assert abs(model_state(master, 4, 10.0)["measured"] - 0.05) < 1e-9
