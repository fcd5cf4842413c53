"""The discrete-event simulator (:mod:`nlevel.sim`): exactly-once, timing, shape, determinism, CLI."""

from __future__ import annotations

import json

import pytest

from nlevel.config import Config
from nlevel.errors import ConfigError, PlanError
from nlevel.model.calibration import Calibration, save_calibration
from nlevel.model.hierarchy import build
from nlevel.model.plan import Plan
from nlevel.sim import default_times, main, make_durations, parse_plan, parse_task_time, simulate
from nlevel.sim.engine import SimCosts, Engine
from nlevel.sim.port import SimPort

MS = 1e-3


def durations(n, lo=2 * MS, hi=5 * MS, seed=0):
    return make_durations(n, task_time=(lo, hi), seed=seed)


@pytest.fixture(autouse=True)
def no_calibration(tmp_path, monkeypatch):
    """Tests do not read the machine's calibration file."""
    monkeypatch.setenv("NLEVEL_CALIBRATION", str(tmp_path / "no-calibration.json"))


# -- the same roles, exactly once -----------------------------------------------------------
CASES = [
    (1, Plan(chunk=1)),
    (8, Plan(chunk=1)),
    (8, Plan()),  # automatic chunks
    (16, Plan(chunk=3)),
    (16, Plan(3, (4,), chunk=1)),
    (17, Plan(3, (3,), prefetch=1.0, chunk=1)),
    (64, Plan(3, (8,), chunk=1)),
    (64, Plan(4, (4, 4), chunk=1)),
    (16, Plan(3, (4,), chunk=1, serve_only="all")),
    (16, Plan(chunk=1, serve_only="master")),
]


@pytest.mark.parametrize("procs,plan", CASES, ids=lambda c: getattr(c, "describe", lambda: str(c))())
def test_every_task_committed_exactly_once(procs, plan):
    total = 20 * procs + 7
    config = Config(levels=plan.levels, regions=plan.regions, chunk=plan.chunk, serve_only=plan.serve_only, lease=1e9)
    engine = Engine(build(procs, plan), config, durations(total), SimCosts(msg_time=2.5e-4, service_time=3e-5))
    result = engine.run()
    ledger = result.ledger
    assert ledger.complete() and ledger.recomputed == 0
    assert result.tasks_run == total
    assert all(s.done_serving and s.ended for s in result.stations)
    assert all(s.server is None or s.server.unexpected == 0 for s in result.stations)


class _Counted(SimPort):
    """A simulated port that counts the master's controls and checkpoint writes."""

    def __init__(self, outbox):
        super().__init__(outbox)
        self.looks = 0
        self.writes: list[bool] = []

    def heartbeat(self):
        self.looks += 1
        return ""

    def write_checkpoint(self, ledger, final):
        self.writes.append(final)
        return ""


@pytest.mark.parametrize("ft", ["on", "off"])
def test_every_rank_runs_the_loops_own_steps_and_the_job_ends_with_the_release(ft):
    """Issue 35: the simulator drives each rank through its Loop: the master's control and checkpoint
    steps run at its ticks (a write once 50 new commits are in, as configured, then the final one),
    and the job ends as a real one does: every rank's Ending up, the master's release to everyone."""
    plan = Plan(3, (4,), chunk=1)
    config = Config(levels=3, regions=(4,), chunk=1, lease=1e9, checkpoint_every=50, checkpoint_interval=1e9,
                    fault_tolerance=ft)
    engine = Engine(build(16, plan), config, durations(320), SimCosts(msg_time=2.5e-4, service_time=3e-5))
    port = engine.ports[0] = engine.loops[0].port = _Counted(engine.outbox)
    result = engine.run()
    assert result.ledger.complete() and result.ledger.recomputed == 0
    assert port.looks > 0  # (the control step: a real master beats its checkpoint's lock there)
    assert port.writes.count(True) == 1 and port.writes[-1] is True
    assert port.writes.count(False) >= 1
    assert all(st.closing.released is not None for st in result.stations)


def test_makespan_is_at_least_the_work_per_process():
    for procs, plan in CASES:
        d = durations(10 * procs)
        r = simulate(procs, plan, d, 3e-5, 2.5e-4)
        workers = build(procs, plan).workers()
        assert r.makespan >= sum(d) / workers - 1e-12
        assert r.makespan >= max(d)
        assert r.committed == r.tasks_run == len(d) and r.recomputed == 0
        assert r.overhead == pytest.approx(1 - sum(d) / (procs * r.makespan))


def test_timing_model_for_one_slave():
    # A serve-only master and one slave, constant tasks T: the slave claims each id from the
    # master's board (a few one-sided operations, no message), runs it, and at the end
    # reports once; the master handles that report, writes, and publishes the end.
    t, msg, svc, k = 1.0, 0.1, 0.01, 5
    r = simulate(2, Plan(chunk=1, serve_only="master"), [t] * k, svc, msg, atomic_time=1e-6)
    assert k * t + msg + svc < r.makespan < k * t + 2 * msg + 5 * svc + 100 * k * 1e-6
    assert r.requests["slave"]["message_ms"] < 1e3 * 20 * 1e-6  # a claim: a few operations, no message
    # One process alone runs everything in-process: no overhead at all.
    assert simulate(1, Plan(chunk=1), [t] * k, svc, msg).overhead == pytest.approx(0.0, abs=1e-3)


def test_reports_queue_at_the_master_one_at_a_time():
    # Four slaves finish their one 10 s task together; the master (serve-only) handles their
    # reports one service time apart, then releases everyone.
    svc = 0.5
    r = simulate(5, Plan(chunk=1, serve_only="master"), [10.0] * 4, svc, 0.0)
    assert 10.0 + 4 * svc <= r.makespan <= 10.0 + 5 * svc + 1e-3
    assert r.servers["master"]["messages"] == 4


# -- the shape ---------------------------------------------------------------------------------
def test_classic_overhead_grows_with_processes():
    overheads = []
    for procs in (4, 16, 64, 256):
        r = simulate(procs, Plan(chunk=1), durations(10 * procs), 3e-5, 2.5e-4)
        overheads.append(r.overhead)
    assert overheads == sorted(overheads), overheads
    assert overheads[-1] > 2 * overheads[0]


def test_three_levels_beat_classic_when_the_master_is_saturated():
    procs, svc, msg = 64, 2e-3, 1e-4  # 63 ranks reporting every 50 ms: 2.5x what the master handles
    d = make_durations(100 * procs, task_time=(10 * MS, 20 * MS), seed=1)
    classic = simulate(procs, Plan(chunk=1), d, svc, msg)
    three = simulate(procs, Plan(3, (8,), chunk=1), d, svc, msg)
    assert classic.servers["master"]["busy"] > 0.9  # saturated
    assert three.overhead < 0.5 * classic.overhead, (three.overhead, classic.overhead)


def test_auto_plan_beats_a_saturated_classic():
    procs, svc, msg = 256, 1e-3, 2e-5
    # 50 tasks each: with fewer, the end of the job (the last tasks' spread) dominates.
    d = make_durations(50 * procs, task_time=(20 * MS, 50 * MS), seed=2)
    classic = simulate(procs, Plan(chunk=1), d, svc, msg)
    auto = simulate(procs, None, d, svc, msg)  # --levels auto: the in-job planner decides
    assert auto.plan.levels >= 3 or auto.plan.chunk > 1
    assert auto.predicted_overhead is not None and auto.predicted_overhead <= 0.10
    assert classic.overhead > 0.3
    assert auto.overhead < 0.5 * classic.overhead  # (it ran classic-sized until the first measurements)


# -- determinism and inputs ------------------------------------------------------------------
def test_deterministic_for_a_seed():
    a = simulate(32, Plan(3, (4,), chunk=1), durations(640, seed=5), 3e-5, 2.5e-4)
    b = simulate(32, Plan(3, (4,), chunk=1), durations(640, seed=5), 3e-5, 2.5e-4)
    c = simulate(32, Plan(3, (4,), chunk=1), durations(640, seed=6), 3e-5, 2.5e-4)
    assert (a.makespan, a.overhead, a.events) == (b.makespan, b.overhead, b.events)
    assert a.makespan != c.makespan


def test_durations():
    d = make_durations(1000, task_time=(2.0, 5.0), seed=3)
    assert len(d) == 1000 and 2.0 <= min(d) and max(d) <= 5.0 and d == make_durations(1000, task_time=(2.0, 5.0), seed=3)
    assert make_durations(3, task_time=(4.0, 4.0)) == [4.0, 4.0, 4.0]
    s = make_durations(500, samples=[14.0, 800.0], seed=1)
    assert set(s) == {14.0, 800.0}


def test_parse_task_time_and_plan():
    assert parse_task_time("2:5") == (2.0, 5.0)
    assert parse_task_time("3.4") == (3.4, 3.4)
    classic = parse_plan("classic", 8)
    assert (classic.levels, classic.chunk, classic.serve_only) == (2, 1, "none")
    plan = parse_plan("levels=3,regions=128,prefetch=3,chunk=2,serve_only=master", 32768)
    assert (plan.levels, plan.regions, plan.prefetch, plan.chunk, plan.serve_only) == (3, (128,), 3.0, 2, "master")
    assert parse_plan("levels=4,regions=16x8", 32768).regions == (16, 8)
    assert parse_plan("levels=3", 64, chunk=0).regions == (8,)  # default regions, --chunk applies
    with pytest.raises(PlanError, match="needs at least 256 processes"):
        parse_plan("levels=3,regions=128", 8)
    for bad in ("0", "-1", "5:2", "a:b", "2:", ":5", "1:2:3", "nan", "inf"):
        with pytest.raises(ConfigError, match="--task-time"):
            parse_task_time(bad)
    for bad in ("levels=x", "foo", "levels=3,regions=", "depth=3", "serve_only=some", "levels=1"):
        with pytest.raises((ConfigError, PlanError)):
            parse_plan(bad, 64)


def test_calibration_is_the_default(tmp_path, monkeypatch):
    path = tmp_path / "cal.json"
    monkeypatch.setenv("NLEVEL_CALIBRATION", str(path))
    assert default_times()[2].startswith("built-in defaults")
    save_calibration(Calibration(1.5e-5, 7e-5, {}, "now", {}), str(path))
    with pytest.warns(UserWarning):  # measured "elsewhere": identity differs
        service, msg, source = default_times()
    assert (service, msg) == (1.5e-5, 7e-5) and str(path) in source


# -- the command line ------------------------------------------------------------------------
def test_cli_json_has_overhead_and_makespan(capsys):
    assert main(["--procs", "16", "--task-time", "2:5", "--tasks-per-proc", "10", "--plan", "levels=3,regions=4",
                 "--service-time", "3e-5", "--msg-time", "2.5e-4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert 0 <= out["overhead"] < 1 and out["makespan"] > 0
    assert out["tasks"] == out["committed"] == 160 and out["plan"]["levels"] == 3
    assert out["service_time"] == 3e-5 and out["times_source"] == "given"
    assert set(out["requests"]) == {"region-master L1", "slave"}


def test_cli_text_and_task_times_file(tmp_path, capsys):
    f = tmp_path / "dock.txt"
    f.write_text("# docking times, s\n14\n120\n\n800\n")
    assert main(["--procs", "8", "--task-times-file", str(f), "--tasks-per-proc", "5", "--plan", "auto"]) == 0
    text = capsys.readouterr().out
    assert "overhead" in text and "makespan" in text
    assert "the job ended before the sampling finished" in text  # 5 tasks of minutes each: nothing to sample


def test_cli_auto_says_what_the_model_predicted(capsys):
    assert main(["--procs", "64", "--task-time", "0.002:0.005", "--tasks-per-proc", "300", "--plan", "auto"]) == 0
    text = capsys.readouterr().out
    assert "the model predicted" in text and "planner's last reason" in text


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--procs", "0", "--task-time", "2:5"], "--procs must be an integer >= 1, got 0"),
        (["--procs", "-4", "--task-time", "2:5"], "got -4"),
        (["--procs", "8", "--task-time", "0"], "'0'"),
        (["--procs", "8", "--task-time=-2:5"], "'-2:5'"),
        (["--procs", "8", "--task-time", "5:2"], "'5:2'"),
        (["--procs", "8", "--task-time", "2-5"], "'2-5'"),
        (["--procs", "8", "--task-time", "2:5", "--plan", "levels=three"], "'three'"),
        (["--procs", "8", "--task-time", "2:5", "--plan", "tree"], "'tree'"),
        (["--procs", "8", "--task-time", "2:5", "--plan", "levels=3,regions=128"], "needs at least 256 processes"),
        (["--procs", "8", "--task-time", "2:5", "--tasks-per-proc", "0"], "--tasks-per-proc"),
        (["--procs", "8", "--task-time", "2:5", "--service-time", "0"], "--service-time"),
        (["--procs", "8", "--task-time", "2:5", "--msg-time", "-1"], "--msg-time"),
        (["--procs", "8", "--task-times-file", "/nonexistent/times.txt"], "/nonexistent/times.txt"),
    ],
)
def test_cli_bad_input_exits_2_naming_the_value(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("nlevel.sim: error: ") and needle in err and "Traceback" not in err


def test_cli_bad_file_line(tmp_path, capsys):
    f = tmp_path / "t.txt"
    f.write_text("3\nfast\n")
    assert main(["--procs", "4", "--task-times-file", str(f)]) == 2
    assert "line 2" in capsys.readouterr().err


def test_cli_malformed_number_is_argparse_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--procs", "many", "--task-time", "2:5"])
    assert exc.value.code == 2 and "'many'" in capsys.readouterr().err


def test_the_engine_heap_pops_events_by_time_then_by_scheduling_order():
    import random

    from nlevel.sim.heap import Event, pop, push

    rng = random.Random(3)
    heap: list = []
    want: list = []
    for seq in range(1, 3000):
        if want and rng.random() < 0.45:
            e = pop(heap)
            assert (e.t, e.seq) == min(want)
            want.remove((e.t, e.seq))
        else:
            t = float(rng.randrange(50))  # (many ties: the order they were scheduled in decides)
            push(heap, Event(t, seq, 0, 0, None))
            want.append((t, seq))
    out = [pop(heap) for _ in range(len(want))]
    assert [(e.t, e.seq) for e in out] == sorted(want) and not heap


def test_a_kill_or_drain_after_the_end_is_said_not_silently_dropped(capsys):
    """``1500`` for ``1500s`` is 1500 ideal makespans: valid, but it does nothing; the user is told."""
    assert main(["--procs", "8", "--tasks", "200", "--task-time", "1", "--drain", "2/spread@1500",
                 "--kill", "3@0.5", "--engine", "python"]) == 0
    err = capsys.readouterr().err
    assert "--drain 2/spread@1500 comes at 37500 s, after the job ended" in err
    assert "fraction of the ideal makespan, 25 s" in err
    assert "--kill" not in err  # (at half the ideal makespan: it happened)
