"""The start watch: when a death before MPI is up means the job can never start (no MPI, no processes)."""

import json
import sys

import pytest

from nlevel.runtime import launch, startwatch
from nlevel.runtime.startwatch import Watch

from .test_launch import restore_signals  # noqa: F401  (main() installs signal handlers: put pytest's back)

ALL = {0: 100, 1: 101, 2: 102}


def test_a_rank_gone_before_any_up_file_stops_the_start_after_the_grace():
    w = Watch(grace=0.5)
    assert w.observe(ALL, {0, 1, 2}, set(), set(), 0.0) is None
    assert w.observe({0: 100, 2: 102}, {0, 2}, set(), set(), 1.0) is None  # rank 1 gone: wait the grace
    v = w.observe({0: 100, 2: 102}, {0, 2}, set(), set(), 1.6)
    assert v is not None and (v.rank, v.pid, v.detected_at, v.how) == (1, 101, 1.0, "died")
    assert v.to_records(1) == [{"rank": 1, "pid": 101, "detected_at": 1.0, "attempt": 1, "how": "died"}]


def test_an_up_file_ends_the_watch_for_good():
    w = Watch(grace=0.5)
    w.observe(ALL, {0, 1, 2}, set(), set(), 0.0)
    assert w.observe({0: 100, 2: 102}, {0, 1, 2}, set(), set(), 1.0) is None
    assert w.observe({0: 100, 2: 102}, {0, 1, 2}, {0}, set(), 1.2) is None  # the fence completed after all
    assert w.over
    assert w.observe({0: 100}, {0, 1, 2}, set(), set(), 9.0) is None
    assert w.ended(set()) is None


def test_processes_that_are_not_nlevels_are_never_restarted():
    w = Watch(grace=0.5)
    w.observe(ALL, set(), set(), set(), 0.0)
    assert w.observe({0: 100}, set(), set(), set(), 5.0) is None  # no start file: another program
    assert w.observe({0: 100}, set(), set(), set(), 9.0) is None


def test_a_new_process_in_a_dead_ranks_slot_is_still_a_death():
    w = Watch(grace=0.0)
    w.observe(ALL, {0}, set(), set(), 0.0)
    v = w.observe({0: 100, 1: 555, 2: 102}, {0}, set(), set(), 0.1)
    assert v is not None and v.rank == 1 and v.pid == 101


def test_a_rank_that_left_an_exit_status_is_reported_as_exited():
    w = Watch(grace=0.0)
    w.observe(ALL, {0, 1, 2}, set(), set(), 0.0)
    v = w.observe({0: 100, 1: 101}, {0, 1, 2}, set(), {102}, 0.1)
    assert v is not None and v.how == "exited" and v.to_records(2)[0]["how"] == "exited"


def test_every_rank_dead_by_the_verdict_is_recorded():
    w = Watch(grace=0.5)
    w.observe({**ALL, 3: 103}, {0}, set(), set(), 0.0)
    w.observe({0: 100, 2: 102, 3: 103}, {0}, set(), set(), 0.1)
    v = w.observe({0: 100}, {0}, set(), set(), 0.7)
    assert v is not None and v.rank == 1
    assert [(r["rank"], r["pid"], r["attempt"]) for r in v.to_records(1)] == [(1, 101, 1), (2, 102, 1), (3, 103, 1)]


def test_a_job_that_aborted_after_a_death_is_a_start_failure_and_one_without_is_not():
    w = Watch(grace=5.0)
    w.observe(ALL, {0, 1, 2}, set(), set(), 0.0)
    assert w.ended(set()) is None  # it ended non-zero with no death seen: its own error, not retried
    w.observe({0: 100, 1: 101}, {0, 1, 2}, set(), set(), 0.1)
    v = w.ended(set())
    assert v is not None and v.rank == 2


def test_markers_and_mark(tmp_path, monkeypatch):
    monkeypatch.setenv(startwatch.START_DIR, str(tmp_path))
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    monkeypatch.setattr(startwatch, "_marked", set())
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)  # (MPI not initialised yet, as at a rank's start)
    startwatch.mark("start")
    startwatch.mark("up")
    startwatch.mark("up")
    (tmp_path / "12345").write_text("2\n")  # (an exit status: not a marker)
    assert startwatch.markers(str(tmp_path)) == ({3}, {3}, set(), set())
    startwatch.mark("run")
    startwatch.mark("done")
    assert startwatch.markers(str(tmp_path))[2:] == ({3}, {3})
    assert startwatch.markers(str(tmp_path / "gone")) == (set(), set(), set(), set())


def test_a_rank_that_initialised_mpi_before_importing_nlevel_is_up_at_once(tmp_path, monkeypatch):
    class MPI:
        @staticmethod
        def Is_initialized():
            return True

    monkeypatch.setenv(startwatch.START_DIR, str(tmp_path))
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    monkeypatch.setattr(startwatch, "_marked", set())
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", MPI)
    startwatch.mark("start")
    assert startwatch.markers(str(tmp_path)) == (set(), {0}, set(), set())


def test_a_restarted_job_says_so_once(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv(startwatch.START_DIR, str(tmp_path))
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    monkeypatch.setattr(startwatch, "_marked", set())
    monkeypatch.setenv(startwatch.FAILURES, json.dumps([{"rank": 2, "pid": 9, "detected_at": 1.0, "attempt": 1,
                                                          "how": "died"}, {"rank": 5, "pid": 8, "detected_at": 1.0,
                                                                           "attempt": 1, "how": "stopped"}]))
    startwatch.mark("run", say=True)
    assert capsys.readouterr().err == ("nlevel: started again by nlevel-mpiexec (attempt 2): rank(s) 2, 5 died "
                                       "before MPI was up\n")


def test_mark_does_nothing_outside_the_launcher(tmp_path, monkeypatch):
    monkeypatch.delenv(startwatch.START_DIR, raising=False)
    monkeypatch.setattr(startwatch, "_marked", set())
    startwatch.mark("start")
    assert startwatch._marked == set()


def test_a_rank_stopped_during_the_start_is_named_once_after_the_grace():
    w = Watch(grace=0.5, stop_grace=2.0)
    assert w.stuck({1: 101}, False, False, 0.0) == []
    assert w.stuck({}, False, False, 1.0) == []  # continued: its clock starts over
    assert w.stuck({1: 101}, False, False, 1.5) == []
    assert w.stuck({1: 101}, False, False, 3.6) == [(1, 101)]
    assert w.stuck({1: 101}, False, False, 9.0) == []  # (named once)
    w.observe(ALL, {0, 1, 2}, set(), set(), 9.0)
    w.observe({0: 100, 2: 102}, {0, 1, 2}, set(), set(), 9.1)
    v = w.observe({0: 100, 2: 102}, {0, 1, 2}, set(), set(), 9.7)
    assert v is not None and v.how == "stopped"


def test_stops_while_the_farm_runs_are_the_leases_business_and_after_its_end_the_launchers():
    w = Watch(stop_grace=2.0)
    assert w.stuck({1: 101}, True, False, 0.0) == [] and w.running
    assert w.stuck({1: 101}, False, False, 5.0) == []
    assert w.stuck({0: 100}, True, True, 6.0) == []  # (the master stopped after its last work: the job is over)
    assert w.stuck({0: 100}, True, False, 8.5) == [(0, 100)] and w.done


def test_earlier_failures_become_starting_records(monkeypatch):
    gone = [{"rank": 4, "pid": 77, "detected_at": 10.0, "attempt": 1, "how": "died"}]
    recs = startwatch.start_records(12.5, {startwatch.FAILURES: json.dumps(gone)})
    assert len(recs) == 1
    r = recs[0]
    assert (r["rank"], r["role"], r["held"], r["requeued"], r["recovery_ms"]) == (4, "starting", 0, 0, 2500.0)
    assert "pid 77" in r["how"] and "started the job again" in r["how"]
    assert startwatch.earlier_failures({startwatch.FAILURES: "not json"}) == []
    assert startwatch.earlier_failures({startwatch.FAILURES: '[{"rank": "x"}]'}) == []
    assert startwatch.earlier_failures({}) == []


@pytest.mark.parametrize("bad", ["-1", "two", ""])
def test_start_retries_must_be_a_count(bad, monkeypatch):
    monkeypatch.delenv(startwatch.RETRIES, raising=False)
    with pytest.raises(SystemExit, match=f"--start-retries must be a whole number >= 0, got {bad!r}"):
        launch._start_retries(["--start-retries", bad, "-n", "2", "app"])
    monkeypatch.setenv(startwatch.RETRIES, bad)
    with pytest.raises(SystemExit, match=f"NLEVEL_START_RETRIES must be a whole number >= 0, got {bad!r}"):
        launch._start_retries(["-n", "2", "app"])


def test_start_retries_is_taken_out_of_the_mpiexec_options(monkeypatch):
    monkeypatch.delenv(startwatch.RETRIES, raising=False)
    assert launch._start_retries(["--start-retries", "0", "-n", "2", "app"]) == (["-n", "2", "app"], 0)
    assert launch._start_retries(["-n", "2", "app"]) == (["-n", "2", "app"], 2)
    assert launch._start_retries(["-n", "2", "--mca", "btl", "self", "--start-retries", "1", "app"]) == \
        (["-n", "2", "--mca", "btl", "self", "app"], 1)
    # (the user's own script may have an option of that name: not the launcher's)
    assert launch._start_retries(["-n", "2", "app", "--start-retries", "7"]) == (["-n", "2", "app", "--start-retries", "7"], 2)


def test_a_bad_start_retries_is_one_line_and_exit_2(monkeypatch, capsys, restore_signals):
    monkeypatch.delenv(startwatch.RETRIES, raising=False)
    assert launch.main(["--start-retries", "-3", "-n", "2", "python", "app.py"]) == 2
    assert capsys.readouterr().err == "nlevel-mpiexec: error: --start-retries must be a whole number >= 0, got '-3'\n"


def test_stale_open_mpi_sessions_are_removed_and_live_ones_kept(tmp_path):
    import os

    dead = 2**22 + 1  # (above any pid_max, at most 2**22 on Linux: no such process)
    (tmp_path / f"ompi.{dead}" / "1").mkdir(parents=True)
    (tmp_path / f"ompi.{dead}" / f"pmix.vm.tool.{dead}").write_text("x")
    (tmp_path / f"ompi.{os.getpid()}").mkdir()  # a live one
    (tmp_path / "ompi.vm.0").mkdir()  # not a pid: not ours to judge
    (tmp_path / "other.123").mkdir()
    assert launch.remove_stale_sessions(str(tmp_path)) == [str(tmp_path / f"ompi.{dead}")]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"ompi.{os.getpid()}", "ompi.vm.0", "other.123"])


def test_a_rank_read_between_its_fork_and_its_exec_is_still_found_once_it_runs():
    # Soak trial 58 (8 processes, a slave SIGSEGV'd during the start) hung: the launcher had read
    # that child's /proc/PID/environ after mpiexec forked it and before it exec'd, while it still
    # showed mpiexec's environment (no rank), and cached "not a rank" for good; its death was never seen.
    import os
    import time

    if "OMPI_COMM_WORLD_RANK" in os.environ:
        pytest.skip("under mpiexec the child's environment before its exec already names a rank")
    pid = os.fork()  # (not subprocess: Popen returns only once its child has exec'd)
    if pid == 0:  # pragma: no cover - the child: a second as mpiexec's fork, then the rank
        try:
            time.sleep(1.0)
            os.execve(sys.executable, [sys.executable, "-c", "import time; time.sleep(30)"],
                      {"OMPI_COMM_WORLD_RANK": "3"})
        finally:
            os._exit(1)
    try:
        known: dict[int, int] = {}
        deadline = time.monotonic() + 0.5
        while pid not in known and time.monotonic() < deadline:
            launch._ranks_of(launch.os.getpid(), known)
        assert launch._ranks_of(launch.os.getpid(), known)[0].get(3) is None  # (still mpiexec's environment)
        deadline = time.monotonic() + 10.0
        found = None
        while found is None and time.monotonic() < deadline:
            time.sleep(0.05)
            found = launch._ranks_of(launch.os.getpid(), known)[0].get(3)
        assert found == pid
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
