"""Liveness is a heartbeat (issue 34): who beats to whom, when a lease expires, and the busy time beats carry."""

from __future__ import annotations

from nlevel.config import Config
from nlevel.model.hierarchy import build
from nlevel.model.plan import Plan
from nlevel.roles.events import Kill, Received, Send, Tick
from nlevel.roles.messages import Heartbeat, Report
from nlevel.roles.station import Station
from nlevel.roles.recovery import beat_period
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
    assert beats(slave.handle(Tick())) == []  # (its parent heard it at the start)
    now[0] += beat_period(5.0)
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
    assert master.watching.running_now(now[0]) == 2.5  # (1.5 s at its beat, and a second since)
    master.handle(Received(1, Report(tasks=1, busy=2.6)))
    assert master.watching.running_now(now[0]) == 0.0 and master.server.busy_below == 2.6


def test_the_progress_line_counts_running_tasks_as_busy():
    """4 ranks, 10 s in, every rank 9.5 s into one long task: about 5 % waste, not 100 %."""
    (master, *others), now = stations()
    now[0] = 10.0
    for st in others:
        [(_, beat)] = beats(st.handle(Tick(running=9.5)))
        master.handle(Received(st.rank, beat))
    master.handle(Tick(running=9.5))
    assert abs(model_state(master, 4, 10.0)["measured"] - 0.05) < 1e-9


def test_the_timeline_and_the_decisions_stay_bounded_over_a_long_job():
    """Issue 35: one bin per 0.1 s per server, and one planner decision every few seconds, grew with the job."""
    from nlevel.roles.autoplan import KEPT, AutoPlanner
    from nlevel.stats import TIMELINE_MAX
    from nlevel.runtime.report import timeline

    (master, *_), now = stations()
    line = master.timeline
    for k in range(100_000):  # a day of 0.9 s steps, a range served at each
        line.note(k + 1, k * 0.9)
    assert len(line.bins) <= TIMELINE_MAX + 1 and sum(line.bins.values()) == 100_000
    out = timeline({0: (line.width, line.bins), 3: (0.1, {10: 5})}, 0.1)
    assert len(out["served"]["0"]) <= TIMELINE_MAX and sum(out["served"]["0"]) == 100_000
    assert sum(out["served"]["3"]) == 5
    planner = AutoPlanner(64, Config(levels=0), Plan(2))
    for k in range(1000):
        planner._record({"time": k, "switch": k % 100 == 0})
    assert len(planner.decisions) <= KEPT + 11 and planner.made == 1001
    assert sum(1 for d in planner.decisions if d.get("switch")) == 10


def test_a_finished_farm_is_not_kept_alive_by_its_exit_guard():
    """Issue 35: atexit kept every Farm (its runtime, ledger and windows) of a process alive."""
    import subprocess
    import sys

    code = (
        "import gc, weakref\n"
        "from nlevel import Farm\n"
        "refs = []\n"
        "for _ in range(3):\n"
        "    with Farm(5) as f:\n"
        "        for t in f: pass\n"
        "    refs.append(weakref.ref(f._rt)); del f\n"
        "gc.collect()\n"
        "print(sum(r() is not None for r in refs))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "0", out.stdout


def test_a_million_failed_tasks_are_listed_in_part_and_counted_by_error():
    """Issue 35: failed-task records bounded and summarised (the report, the release, stderr)."""
    from nlevel.roles.messages import TaskFailure
    from nlevel.runtime.report import FAILED_LINES, FAILED_LISTED, failed_lines, failed_summary, failed_tasks

    led = Ledger(10**6)
    for tid in range(10**5):
        led.failed[tid] = TaskFailure(tid, "raised", "ValueError: bad input" if tid % 10 else "KeyError: x", 1, "h")
    listed = failed_tasks(led)
    assert len(listed) == FAILED_LISTED and listed[0]["id"] == 0
    s = failed_summary(led)
    assert s["count"] == 10**5 and s["by_error"][0] == {"kind": "raised", "error": "ValueError: bad input",
                                                         "ids": 90_000}
    lines = failed_lines(listed, len(led.failed)).splitlines()
    assert len(lines) == FAILED_LINES + 1 and "and 99,980 more failed tasks" in lines[-1]


def test_a_parent_that_itself_did_not_run_for_a_while_gives_its_children_a_lease_again():
    """A loaded machine can stop the parent rather than the child: what it has not read yet may be
    the children's beats, so after a gap of half a lease or more it does not judge on what it missed."""
    (master, *_), now = stations()
    now[0] = 1.0
    master.handle(Tick())
    now[0] = 30.0  # (the master's process did not run for 29 s)
    assert not [e for e in master.handle(Tick()) if isinstance(e, Kill)]
    for r in (1, 2, 3):
        master.handle(Received(r, Heartbeat(0)))  # (their beats were waiting in its queue)
    for t in (32.0, 34.0):
        now[0] = t
        assert not [e for e in master.handle(Tick()) if isinstance(e, Kill)]
    now[0] = 35.6  # (ranks 1-3 silent for 5.6 s now, the master running all along)
    assert sorted(e.rank for e in master.handle(Tick()) if isinstance(e, Kill)) == [1, 2, 3]


def test_a_rank_that_outlives_its_kill_by_a_lease_is_given_up():
    """A frozen or cut-off node: its ranks stop beating, and the kill asked of a rank on their host is
    never carried out (every process there is stopped). A lease after the kill they are given up."""
    from nlevel.roles.events import GiveUp

    (master, *_), now = stations()
    kills, given_up = {}, {}
    for t in range(1, 80):
        now[0] = t * 0.25
        for e in master.handle(Tick()):
            if isinstance(e, Kill):
                kills.setdefault(e.rank, now[0])
            elif isinstance(e, GiveUp):
                given_up.setdefault(e.rank, (now[0], e.why))
        master.handle(Received(1, Heartbeat(0)))  # (rank 1 beats; 2 and 3 are stopped)
    assert sorted(kills) == [2, 3] and sorted(given_up) == [2, 3]
    for r in (2, 3):
        at, why = given_up[r]
        assert 5.0 < at - kills[r] <= 5.0 + 0.5, (r, at, kills[r])
        assert "silent for a lease" in why and "still there a lease after it was killed" in why


def test_a_rank_killed_in_time_is_never_given_up():
    from nlevel.roles.events import Died, GiveUp

    (master, *_), now = stations()
    seen = []
    for t in range(1, 80):
        now[0] = t * 0.25
        effects = master.handle(Tick())
        seen += [e for e in effects if isinstance(e, GiveUp)]
        if any(isinstance(e, Kill) and e.rank == 2 for e in effects):
            master.handle(Died((2,)))  # (killed from its host: MPI reports it)
        for r in (1, 3):
            master.handle(Received(r, Heartbeat(0)))
    assert seen == []


def test_without_fault_tolerance_a_rank_given_up_stops_the_job_and_under_it_the_job_goes_on():
    from nlevel.roles.events import Died
    from nlevel.roles.recovery import GIVEN_UP

    for ft in (False, True):
        now = [0.0]
        cfg = Config(levels=2, fault_tolerance="on" if ft else "off", lease=5.0)
        h = build(4, Plan(2))
        master = Station(h, 0, cfg, lambda: now[0], LocalBoards(), 100, Ledger(100))
        master.handle(Died((3,), f"{GIVEN_UP}: was silent for a lease", tell=True))
        assert master.server.stopped is (not ft) and master.stop_reason == ("" if ft else "rank given up")
        assert [f.how for f in master.recovery.failures] == [f"{GIVEN_UP}: was silent for a lease"]


def test_a_rank_given_up_that_lives_on_cannot_give_up_others():
    """Its node thawed or its link mended, a region-master given up finds its children silent (they
    beat to their new parent) and gives them up in turn: the others must not believe it."""
    from nlevel.roles.events import Died
    from nlevel.roles.messages import Gone
    from nlevel.roles.recovery import GIVEN_UP

    now = [0.0]
    cfg = Config(levels=2, fault_tolerance="on", lease=5.0)
    master = Station(build(4, Plan(2)), 0, cfg, lambda: now[0], LocalBoards(), 100, Ledger(100))
    master.handle(Died((3,), f"{GIVEN_UP}: was silent for a lease", tell=True))
    assert master.recovery.given_up == {3}
    master.handle(Received(3, Gone((2,), f"{GIVEN_UP}: was silent for a lease")))
    assert 2 not in master.failed
    master.handle(Received(1, Gone((2,), "exited")))  # (a live rank's news stands)
    assert 2 in master.failed
