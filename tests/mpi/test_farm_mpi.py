"""Farm behaviour on a real MPI world. Run by tests/e2e/test_mpi_suite.py under mpiexec -n 1, 4 and 7.

Every check ends in an allreduce so a failure on one rank fails every rank instead of
leaving the others waiting in a collective.
"""

from __future__ import annotations

import hashlib
import os
import time

import numpy as np
import pytest
from mpi4py import MPI

import nlevel.runtime.checkpoint as ckpt
from nlevel import CheckpointError, Config, ConfigError, Farm, PlanError, get_task_id

comm = MPI.COMM_WORLD
pytestmark = pytest.mark.mpi


def everywhere(ok: bool) -> bool:
    return bool(comm.allreduce(bool(ok), op=MPI.LAND))


def exactly_once(mine: list[int], expected: set[int]) -> bool:
    everyone = comm.allgather(mine)
    flat = [i for part in everyone for i in part]
    return len(flat) == len(set(flat)) and set(flat) == expected


def plans_for_size(size: int) -> list[Config]:
    out = [Config(levels=2)]
    if size >= 4:
        out.append(Config(levels=3))
        out.append(Config(levels=3, serve_only="all"))
    if size >= 8:
        out.append(Config(levels=4))
    out.append(Config(levels=2, chunk=3))
    return out


@pytest.mark.timeout(120)
def test_get_task_id_hands_out_every_id_once():
    total = 2000
    mine = []
    while (tid := get_task_id(total)) >= 0:
        mine.append(tid)
    assert everywhere(exactly_once(mine, set(range(total))))
    # A second loop on the same communicator starts a new farm.
    mine = []
    while (tid := get_task_id(17, None, comm)) >= 0:
        mine.append(tid)
    assert everywhere(exactly_once(mine, set(range(17))))


@pytest.mark.timeout(120)
def test_a_long_hand_runs_in_pieces_under_fault_tolerance():
    """Under fault tolerance a rank that computes hears its messages between two pieces of its hand,
    every ``Runner.piece`` seconds of tasks (a little more): a task that sleeps 0.6 of a piece makes
    pieces of 2 ids after the first. (Set by hand here: a farm under fault tolerance ends its process with
    os._exit, which would end this pytest run.)"""
    total = 12 * comm.Get_size()
    mine, pieces, cut = [], [], False
    with Farm(total, None, comm, config=Config(levels=2, chunk=16)) as farm:
        assert farm._rt.runner.piece == 0  # (without fault tolerance: whole ranges)
        look = farm._rt.runner.piece = 0.01
        for tid in farm:
            mine.append(tid)
            if tid == farm._lo:  # the first id of a piece
                pieces.append(farm._stop - farm._lo)
                hand = farm._rt.station.hand
                cut = cut or (hand is not None and hand[1] > farm._stop)  # (more of the range is left)
            time.sleep(0.6 * look)
    assert everywhere(exactly_once(mine, set(range(total))))
    assert everywhere(all(p <= 2 for p in pieces[1:])), pieces
    assert comm.allreduce(cut, op=MPI.LOR)  # (some range was longer than a piece)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("which", range(5))
def test_every_plan_on_this_world(which):
    configs = plans_for_size(comm.size)
    if which >= len(configs):
        pytest.skip(f"only {len(configs)} plans fit {comm.size} processes")
    mine = []
    with Farm(3000, config=configs[which]) as farm:
        for tid in farm:
            mine.append(tid)
    ok = exactly_once(mine, set(range(3000)))
    if comm.rank == 0:
        r = farm.report
        ok = ok and r is not None and r["complete"] and r["plan"]["levels"] == configs[which].levels
    assert everywhere(ok)


@pytest.mark.timeout(120)
def test_results_are_committed_with_their_ids(mpi_tmp_path):
    path = os.path.join(str(mpi_tmp_path), "results.h5")
    with Farm(500, path, fingerprint="results-test", config=Config(levels=3 if comm.size >= 4 else 2)) as farm:
        for tid in farm:
            farm.complete(tid * 1.5)
    ok = True
    if comm.rank == 0:
        meta, snap, _ = ckpt.read(path)
        ok = snap.n_completed == 500 and meta.total == 500
        ok = ok and np.array_equal(np.sort(snap.result_ids), np.arange(500))
        ok = ok and np.allclose(snap.result_values[np.argsort(snap.result_ids)], np.arange(500) * 1.5)
    assert everywhere(ok)


@pytest.mark.timeout(120)
def test_resume_never_reruns_recorded_tasks(mpi_tmp_path):
    path = os.path.join(str(mpi_tmp_path), "resume.h5")
    total = 400
    done = np.array([[0, 150], [200, 201], [300, 390]], dtype=np.int64)
    done_ids = {i for a, b in done for i in range(a, b)}
    if comm.rank == 0:
        fp, source = ckpt.fingerprint("resume-test", {})
        ckpt.write(path, ckpt.RunMeta(total, fp, source, "{}", "test"), ckpt.Snapshot(done, np.zeros(0, np.int64), np.zeros(0)))
    comm.Barrier()
    mine = []
    with Farm(total, path, fingerprint="resume-test") as farm:
        for tid in farm:
            mine.append(tid)
    ok = exactly_once(mine, set(range(total)) - done_ids)
    if comm.rank == 0:
        ok = ok and farm.report["resumed_from_checkpoint"] == len(done_ids)
    assert everywhere(ok)


@pytest.mark.timeout(120)
def test_bad_totals_fail_on_every_rank():
    with pytest.raises(ConfigError, match=r"total must be a non-negative integer, got -1"):
        Farm(-1)
    with pytest.raises(ConfigError, match=r"total must be a non-negative integer, got 2.5 \(float\)"):
        Farm(2.5)
    if comm.size > 1:
        with pytest.raises(ConfigError, match=r"different totals on different ranks \(min 10, max 1[0-9]\)"):
            Farm(10 + comm.rank % 2)
    # The failures left nothing behind: a normal farm still works.
    mine = [t for t in Farm(9)]
    assert everywhere(exactly_once(mine, set(range(9))))


@pytest.mark.timeout(120)
def test_foreign_checkpoint_is_refused_and_left_untouched(mpi_tmp_path):
    path = os.path.join(str(mpi_tmp_path), "foreign.h5")
    if comm.rank == 0:
        fp, source = ckpt.fingerprint("other-app", {"x": 1})
        ckpt.write(path, ckpt.RunMeta(50, fp, source, "{}", "test"), ckpt.Snapshot.empty())
    comm.Barrier()
    before = hashlib.sha256(open(path, "rb").read()).hexdigest()
    with pytest.raises(CheckpointError, match="fingerprint"):
        Farm(50, path, fingerprint="this-app")
    after = hashlib.sha256(open(path, "rb").read()).hexdigest()
    assert everywhere(before == after)


@pytest.mark.timeout(120)
def test_plan_that_does_not_fit_fails_on_every_rank():
    with pytest.raises(PlanError, match=f"needs at least {2 * (comm.size + 1)} processes"):
        Farm(10, config=Config(levels=3, regions=(comm.size + 1,)))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("completed_before_break", [True, False])
def test_ranks_leaving_early_give_their_ids_back(completed_before_break):
    ran = []
    left = 0
    with Farm(400, config=Config(levels=3 if comm.size >= 4 else 2)) as farm:
        for tid in farm:
            time.sleep(0.001)
            if comm.rank % 3 == 1 and len(ran) >= 2:
                left = 1
                if completed_before_break:
                    farm.complete()  # this task counts as done: it must not run again
                    ran.append(tid)
                break  # not completed: it is given back and runs elsewhere
            ran.append(tid)
    assert everywhere(exactly_once(ran, set(range(400))))
    assert comm.allreduce(left) == sum(1 for r in range(comm.size) if r % 3 == 1)


@pytest.mark.timeout(120)
def test_farm_on_a_sub_communicator():
    sub = comm.Split(comm.rank % 2, comm.rank)
    total = 100 + comm.rank % 2
    mine = []
    while (tid := get_task_id(total, None, sub)) >= 0:
        mine.append(tid)
    parts = sub.allgather(mine)
    flat = sorted(i for p in parts for i in p)
    sub.Free()
    assert everywhere(flat == list(range(total)))


@pytest.mark.timeout(120)
def test_vector_results_and_bad_results(mpi_tmp_path):
    path = os.path.join(str(mpi_tmp_path), "vec.h5")
    errors = []
    with Farm(90, path, fingerprint="vec", result_fields=("x", "y", "z")) as farm:
        for tid in farm:
            for bad in (1.0, (1.0, 2.0), ("a", 1, 2)):
                try:
                    farm.complete(bad)  # type: ignore[arg-type]
                except ValueError as exc:
                    errors.append(str(exc))
            farm.complete((tid, tid + 0.5, -tid))
    ok = all("must be 3 numbers (x, y, z)" in e for e in errors)
    if comm.rank == 0:
        ids, values = farm.results()
        order = np.argsort(ids)
        ok = ok and np.array_equal(ids[order], np.arange(90)) and values.shape == (90, 3)
        ok = ok and np.allclose(values[order], np.stack([np.arange(90), np.arange(90) + 0.5, -np.arange(90)], 1))
        _, snap, _ = ckpt.read(path)
        ok = ok and snap.result_values.shape == (90, 3)
    assert everywhere(ok)


@pytest.mark.timeout(120)
def test_checkpoint_is_written_periodically_on_any_world(mpi_tmp_path):
    # Also on one process, where rank 0 has no server loop.
    path = os.path.join(str(mpi_tmp_path), "periodic.h5")
    # (reports of at most 10 completions: the master commits in many batches, whatever the chunk size)
    cfg = Config(checkpoint_every=20, checkpoint_interval=60.0, chunk=1, report_every=10)
    with Farm(200, path, fingerprint="periodic", config=cfg) as farm:
        for tid in farm:
            time.sleep(0.0005)
    ok = True
    if comm.rank == 0:
        writes = farm.report["checkpoint"]["writes"]
        ok = writes is not None and writes >= 3  # periodic ones (coalesced) plus the final ones
        meta, snap, _ = ckpt.read(path)
        ok = ok and snap.n_completed == 200
    assert everywhere(ok)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("force", ["", "0.3@3x2", "0.2@3x2;0.6@2"])
def test_auto_plan_and_forced_switches_run_every_id_once(force, mpi_tmp_path):
    """levels=auto: measure, decide, and (forced here) switch plans mid-run, with results."""
    if force and comm.size < 4:
        pytest.skip("a 3-level plan needs at least 4 processes")
    path = os.path.join(str(mpi_tmp_path), f"auto{len(force)}.h5")
    first, _, second = force.partition(";")
    ran = []
    config = Config(levels=0, force_replan=first, replan_interval=0.2)
    with Farm(1500, path, fingerprint="auto", config=config) as farm:
        for tid in farm:
            time.sleep(0.0005)
            ran.append(tid)
            farm.complete(float(tid))
            if second and comm.rank == 0 and farm.committed and farm.committed > 900 and farm._rt.station.planner.force is None:
                farm._rt.station.planner.force = __import__("nlevel.model.plan", fromlist=["x"]).parse_force(second)
    ok = exactly_once(ran, set(range(1500)))
    if comm.rank == 0:
        r = farm.report
        ok = ok and r["complete"] and r["recomputed"] == 0
        switches = len(r["plan_history"]) - 1
        ok = ok and (switches >= (1 + bool(second)) if force else True)
        ids, values = farm.results()
        ok = ok and np.array_equal(np.sort(ids), np.arange(1500)) and np.allclose(values[np.argsort(ids)], np.arange(1500))
        _, snap, _ = ckpt.read(path)
        ok = ok and snap.n_completed == 1500
    assert everywhere(ok)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("levels", [2, 3])
def test_two_sided_grants_run_every_id_once(levels, capfd):
    """--grants two-sided: no window at all; every claim is a message, and the job says so once."""
    if levels == 3 and comm.size < 4:
        pytest.skip("3 levels need 4 processes")
    mine = list(Farm(700, config=Config(levels=levels, grants="two-sided")))
    err = capfd.readouterr().err
    said = err.count("grants are two-sided (--grants two-sided)") == (1 if comm.rank == 0 else 0)
    assert everywhere(exactly_once(mine, set(range(700))) and said)


@pytest.mark.timeout(60)
def test_a_board_question_unanswered_at_the_release_gives_up():
    """Two-sided grants: a parent released before it answered its child's board question leaves
    its loop; the child, released too, stops waiting (it had hung for good, 1 in ~7 4-rank jobs).
    Should the answer still come (the deputy's Release is only notice), it is dropped, and the
    next question gets its own answer."""
    from nlevel.roles.messages import BoardOp, BoardReply, Release
    from nlevel.runtime.transport import Transport
    from nlevel.runtime.window import MessageBoards

    if comm.size < 2:
        pytest.skip("needs 2 processes")
    transport = Transport(comm)
    boards = MessageBoards(transport, comm.rank, (8, 8), 1e-3, dead=lambda: ())
    seen: list[object] = []
    if comm.rank == 1:
        transport.send(1, Release(0, pending=True))  # (its own: what counts is that one is waiting)
        try:
            seen.append(boards(0, 0).get(0))
        except ConnectionError as exc:
            seen.append(str(exc))
    transport.comm.Barrier()
    if comm.rank == 0:  # the late answer, then the next question's
        for values in ((7,), (9,)):
            src, op = wait_for_message(transport)
            seen.append((src, op))
            transport.send(src, BoardReply(values))
    if comm.rank == 1:
        seen += [m for m in drain_messages(transport)]
        seen.append(boards(0, 0).get(0))
    transport.close()
    expected = {
        0: [(1, BoardOp(0, "read", 0, 1, 0))] * 2,
        1: ["the job was released while rank 0 had not answered a board operation", (1, Release(0, pending=True)), 9],
    }.get(comm.rank, [])
    assert everywhere(seen == expected), seen


def wait_for_message(transport, timeout: float = 10.0):
    """The next message ``transport.poll`` returns (None after ``timeout`` s)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = transport.poll()
        if got is not None:
            return got
        time.sleep(1e-3)
    return None


def drain_messages(transport, quiet: float = 0.5):
    """Every message ``transport.poll`` returns until none came for ``quiet`` s."""
    out = []
    while (got := wait_for_message(transport, quiet)) is not None:
        out.append(got)
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["error", "not atomic"])
def test_a_failed_window_self_test_falls_back_to_two_sided_grants(how, monkeypatch, capfd):
    """Set-up: one rank's fetch-and-add fails (or sees a value atomics cannot give): every rank
    falls back to messages, the job runs every id once, and rank 0 says why in one line."""
    from nlevel.runtime import window

    if how == "not atomic" and comm.size < 2:
        pytest.skip("one rank's value is always consistent")
    real = window.allocate
    last = comm.size - 1

    def broken(c, rank, slots):
        boards, seen, problem = real(c, rank, slots)
        if rank == last:
            if how == "error":
                return boards, None, f"rank {rank}: fetch-and-add on rank 0's window failed: (simulated)"
            return boards, seen + 2 * c.Get_size(), problem  # (a value no series of atomic additions gives)
        return boards, seen, problem

    monkeypatch.setattr(window, "allocate", broken)
    mine = list(Farm(300))
    err = capfd.readouterr().err
    note = "one-sided operations do not work here"
    said = err.count(note) == (1 if comm.rank == 0 else 0)
    if how == "error" and comm.rank == last:
        said = said and f"nlevel: rank {last}: fetch-and-add on rank 0's window failed: (simulated)" in err
    if how == "not atomic" and comm.rank == 0:
        said = said and "the window's self-test saw" in err and f"from {comm.size} atomic additions" in err
    assert everywhere(exactly_once(mine, set(range(300))) and said)
    monkeypatch.setattr(window, "allocate", real)
    again = list(Farm(50))  # (nothing left behind: the next farm is one-sided again)
    assert everywhere(exactly_once(again, set(range(50))) and note not in capfd.readouterr().err)


@pytest.mark.timeout(120)
def test_settings_that_differ_between_ranks_fail_on_every_rank_naming_one():
    if comm.size < 2:
        pytest.skip("needs two ranks")
    slots = 4096 if comm.rank != 1 else 2048
    with pytest.raises(ConfigError, match=r"the settings differ between ranks: board_slots 2048, grants one-sided on "
                                          r"rank 1; board_slots 4096, grants one-sided on rank 0"):
        Farm(10, config=Config(board_slots=slots))
    mine = list(Farm(9))  # (nothing left behind: the next farm works)
    assert everywhere(exactly_once(mine, set(range(9))))
