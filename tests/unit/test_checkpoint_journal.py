"""The checkpoint's journal: a write appends what is new, readers see base + journal, a kill loses nothing.

Round trips and refusals of the base alone are tests/unit/test_checkpoint.py.
"""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import h5py  # type: ignore[import-untyped]
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nlevel.errors import CheckpointError
from nlevel.roles.ledger import Ledger
from nlevel.roles.messages import TaskFailure
from nlevel.runtime import checkpoint as ck
from nlevel.runtime import checkpoint_write
from nlevel.runtime import journal

from ..conftest import ROOT, examples
from .test_checkpoint import FP, FP_SRC, META, raw_write, sha, snap, temps

BIG = ck.RunMeta(10**7, FP, FP_SRC, "{}", "0.1.0")


def state(path: Path) -> tuple[list[tuple[int, int]], dict[int, float], dict[int, str], dict[int, int]]:
    """What ``read`` says the files hold, in plain Python."""
    _, s, extra = ck.read(path)
    assert extra["n_completed"] == s.n_completed
    ids = s.result_ids.tolist()
    assert len(ids) == len(set(ids)), "a result read twice"
    return (list(map(tuple, s.completed.tolist())), dict(zip(ids, s.result_values.tolist())),
            {f.id: f.error for f in s.failed}, dict(s.timeouts))


def ledger_state(led: Ledger) -> tuple[list[tuple[int, int]], dict[int, float], dict[int, str], dict[int, int]]:
    return (list(led.committed.ranges()), dict(zip(led.result_ids.tolist(), led.result_values.tolist())),
            {f.id: f.error for f in led.recorded_failed()}, dict(led.timeouts))


def journal_end(path: Path) -> tuple[str, int, int]:
    """(header token, bytes of whole records, file size) of the journal of ``path``."""
    data = journal.beside(path).read_bytes()
    head, _, end = journal.scan(data)
    return head["token"], end, len(data)


def token(path: Path) -> str:
    with h5py.File(path, "r") as f:
        return str(f.attrs["journal"])


def fresh_store(path: Path, meta: ck.RunMeta = BIG, **kw: float) -> tuple[ck.Store, Ledger]:
    """A run that starts with nothing: its store and its tracked ledger (as the farm sets them up)."""
    led = ck.load(path, meta).ledger(meta.total)
    led.track()
    return ck.Store(path, meta, **kw), led  # type: ignore[arg-type]


# ---------------------------------------------------------------- round trips

def test_appends_are_read_back_with_the_base(tmp_path: Path) -> None:
    path = tmp_path / "ck.h5"
    store, led = fresh_store(path)
    led.commit([(0, 10)], [(3, 1.5)])
    store.write(led.changes())  # (no file yet: this makes the base)
    assert store.appends == 0 and not journal.beside(path).exists() and state(path) == ledger_state(led)
    base = sha(path)
    led.commit([(20, 30), (10, 12)], [(25, -2.0), (11, 7.0)])
    led.fail(TaskFailure(40, "raised", "ValueError: x", 1, "n1", "tb", 3))
    led.timeouts[41] = 2
    store.write(led.changes())
    led.commit([(40, 41)])  # (the failed id succeeds after all: its record goes)
    store.write(led.changes())
    assert store.appends == 2 and sha(path) == base, "an append rewrote the base"
    assert state(path) == ledger_state(led) == ([(0, 12), (20, 30), (40, 41)], {3: 1.5, 25: -2.0, 11: 7.0}, {},
                                                {41: 2})
    meta, s, extra = ck.read(path)
    assert extra["journal_records"] == 2 and s.n_completed == 23 and meta == BIG
    store.write(led.changes())  # nothing new: nothing written
    assert store.appends == 2 and store.compactions == 0


def test_vector_results_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "ck.h5"
    led = Ledger(100, width=3)
    led.track()
    store = ck.Store(path, META)
    led.commit([(0, 2)], [(0, (1.0, 2.0, 3.0))])
    store.write(led.changes())
    led.commit([(2, 4)], [(3, (4.0, 5.0, 6.0))])
    store.write(led.changes())
    s = ck.read(path)[1]
    assert s.result_values.tolist() == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]] and s.result_ids.tolist() == [0, 3]
    assert ck.load(path, META).ledger(100, 3).result_rows() == [(1.0, 2.0, 3.0), (4.0, 5.0, 6.0)]


@settings(max_examples=examples(40), deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 999), st.integers(1, 30)), max_size=8), max_size=25),
       st.integers(1, 6))
def test_any_sequence_of_writes_reads_back_as_the_ledger(batches: list[list[tuple[int, int]]], every: int) -> None:
    import tempfile

    meta = ck.RunMeta(1100, FP, FP_SRC, "{}", "0.1.0")
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "ck.h5"
        store, led = fresh_store(path, meta, compact_min=600)  # (small: compactions happen)
        for i, batch in enumerate(batches):
            done = sorted((a, min(a + n, 1100)) for a, n in batch)
            led.commit(done, [(a, a * 0.25) for a, _ in done])
            if i % 7 == 3:
                led.fail(TaskFailure(1050 + i % 40, "died", f"killed {i}"))
            if i % every == 0:
                store.write(led.changes())
                assert state(path) == ledger_state(led)
        store.write(led.changes())
        assert state(path) == ledger_state(led)
        # A resumed run appends to what it loaded.
        store2, led2 = fresh_store(path, meta, compact_min=600)
        led2.commit([(1090, 1100)], [(1095, 9.0)])
        store2.write(led2.changes())
        assert state(path) == ledger_state(led2)


# ---------------------------------------------------------------- the cost of a write

def test_a_write_costs_what_is_new_not_what_the_file_holds(tmp_path: Path) -> None:
    """Bytes written per write stay those of its record whatever the base holds; compactions, amortised,
    add a bounded multiple of what was appended."""
    for n_base in (10_000, 300_000):
        path = tmp_path / f"ck{n_base}.h5"
        ids = np.arange(0, 2 * n_base, 2)
        ck.write(path, BIG, ck.Snapshot([[0, 2 * n_base]], ids, ids * 0.5))
        base_size = path.stat().st_size
        store, led = ck.Store(path, BIG), ck.load(path, BIG).ledger(BIG.total)
        led.track()
        costs = []
        for k in range(20):
            start = 2 * n_base + 100 * k
            led.commit([(start, start + 100)], [(i, 1.0) for i in range(start, start + 100, 4)])
            before = store.bytes_written
            store.write(led.changes())
            costs.append(store.bytes_written - before)
        # 25 results (16 bytes each) and a range per record, plus the framing: far below the base.
        assert max(costs[1:]) < 1000 < base_size / 100, (n_base, costs)
        assert store.compactions == 0 and state(path) == ledger_state(led)
    # Over many writes, compactions included, the bytes written stay a bounded multiple of what was new.
    path = tmp_path / "amortised.h5"
    store, led = fresh_store(path, compact_min=20_000)
    appended = 0
    for k in range(400):
        led.commit([(100 * k, 100 * k + 100)], [(i, 2.0) for i in range(100 * k, 100 * k + 100, 2)])
        ch = led.changes()
        appended += len(checkpoint_write._record(ch))
        store.write(ch)
    assert store.compactions >= 3, store.compactions
    assert store.bytes_written <= 4 * appended + 200_000, (store.bytes_written, appended)
    assert state(path) == ledger_state(led)


def test_the_journal_is_folded_into_the_base_past_its_fraction(tmp_path: Path) -> None:
    path = tmp_path / "ck.h5"
    store, led = fresh_store(path, compact_fraction=0.5, compact_min=4096)
    led.commit([(0, 1000)], [(i, float(i)) for i in range(1000)])
    store.write(led.changes())
    first = token(path)
    k = 1000
    while store.compactions == 0:
        led.commit([(k, k + 10)], [(k, 1.0)])
        store.write(led.changes())
        if not store.compactions:
            _, end, _ = journal_end(path)
            assert token(path) == first and end <= max(4096, path.stat().st_size // 2) + 2000
        k += 10
    assert token(path) != first and not journal.beside(path).exists(), "the journal outlived its compaction"
    assert ck.read(path)[2]["journal_records"] == 0 and state(path) == ledger_state(led)
    led.commit([(k, k + 1)])
    store.write(led.changes())
    assert journal_end(path)[0] == token(path) and state(path) == ledger_state(led)


# ---------------------------------------------------------------- torn tails, stale and foreign journals

def test_a_torn_last_record_is_ignored_then_cut_off_by_the_next_writer(tmp_path: Path) -> None:
    path = tmp_path / "ck.h5"
    store, led = fresh_store(path)
    led.commit([(0, 5)])
    store.write(led.changes())
    led.commit([(10, 20)], [(12, 3.0)])
    store.write(led.changes())
    kept = state(path)
    led.commit([(30, 40)], [(31, 4.0), (33, 5.0)])
    store.write(led.changes())
    store.close()
    whole = journal.beside(path).read_bytes()
    _, _, end_before_last = journal.scan(whole[: len(whole) - 1])
    for cut in range(end_before_last, len(whole)):  # every length a kill during the append could leave
        journal.beside(path).write_bytes(whole[:cut])
        assert state(path) == kept, cut
    for junk in (b"\0" * 40, whole[end_before_last:-3] + b"xyz"):  # zeros where the size grew; a bad checksum
        journal.beside(path).write_bytes(whole[:end_before_last] + junk)
        assert state(path) == kept
    # The resumed run's writer cuts the tail off before it appends: its record must be readable.
    store2, led2 = fresh_store(path)
    led2.commit([(50, 60)], [(55, 6.0)])
    store2.write(led2.changes())
    assert state(path) == ledger_state(led2) and 55 in state(path)[1]
    _, end, size = journal_end(path)
    assert end == size


def test_a_stale_journal_is_ignored_and_replaced(tmp_path: Path) -> None:
    path = tmp_path / "ck.h5"
    store, led = fresh_store(path)
    led.commit([(0, 5)])
    store.write(led.changes())
    led.commit([(5, 9)])
    store.write(led.changes())
    stale = journal.beside(path).read_bytes()
    ck.write(path, BIG, snap([[0, 3]]))  # a whole write: a new token
    journal.beside(path).write_bytes(stale)  # (as a crash after a compaction's new base leaves it)
    assert state(path)[0] == [(0, 3)]
    store2, led2 = fresh_store(path)
    led2.commit([(100, 101)])
    store2.write(led2.changes())
    assert state(path)[0] == [(0, 3), (100, 101)] and journal_end(path)[0] == token(path)


def test_a_file_of_a_writer_before_journals_loads_unchanged_then_gains_a_journal(tmp_path: Path) -> None:
    path = tmp_path / "ck.h5"
    raw_write(path, {"n_completed": 5}, completed=np.array([[0, 5]]), result_ids=np.array([2]),
              result_values=np.array([0.5]))  # (format 1, no journal token)
    journal.beside(path).write_bytes(journal.header("t", FP, 100) + b"junk")  # never read: the base has no token
    before = sha(path)
    assert state(path) == ([(0, 5)], {2: 0.5}, {}, {}) and sha(path) == before
    store, led = fresh_store(path, META)
    store.write(led.changes())  # nothing new: the old file stays as it is
    assert sha(path) == before
    led.commit([(7, 9)], [(8, 1.0)])
    store.write(led.changes())  # the first append rewrites it once, with a token
    assert state(path) == ([(0, 5), (7, 9)], {2: 0.5, 8: 1.0}, {}, {}) and ck.read(path)[2]["format"] == 1


def test_a_foreign_file_where_the_journal_goes_is_refused_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "ck.h5"
    where = journal.beside(path)
    where.write_text("my notes")
    with pytest.raises(CheckpointError, match="is not an nlevel checkpoint journal; nlevel will not overwrite it") as e:
        ck.load(path, META)  # (even with no checkpoint yet)
    assert str(where) in str(e.value)
    with pytest.raises(CheckpointError, match="refusing to write checkpoint"):
        ck.write(path, META, snap([[0, 1]]))
    assert not path.exists()
    where.unlink()
    ck.write(path, META, snap([[0, 1]]))
    where.mkdir()
    with pytest.raises(CheckpointError, match="not an nlevel checkpoint journal"):
        ck.read(path)
    where.rmdir()
    where.write_text("my notes")
    for call in (lambda: ck.read(path), lambda: ck.load(path, META, fresh=True)):
        with pytest.raises(CheckpointError, match="not an nlevel checkpoint journal"):
            call()
    led = ck.Snapshot.empty().ledger(100)
    led.track()
    led.commit([(5, 6)])
    store = ck.Store(path, META)
    with pytest.raises(CheckpointError, match="not an nlevel checkpoint journal"):
        store.write(led.changes())
    assert where.read_text() == "my notes" and temps(path) == []


def test_a_corrupt_record_is_a_corrupt_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "ck.h5"
    ck.write(path, META, snap([[0, 3]]))
    bad = journal.record({"k": 1, "r": 0, "w": 1, "ndim": 1, "n_completed": 999, "updated": "x", "failed": [],
                          "unfailed": [], "timeouts": [], "untimed": []}, [np.array([5, 6], "<i8").tobytes()])
    journal.beside(path).write_bytes(journal.header(token(path), FP, 100) + bad)
    with pytest.raises(CheckpointError, match="corrupt or truncated .*n_completed is 999 but the ranges hold 4"):
        ck.load(path, META)


# ---------------------------------------------------------------- Writer, fresh, status, audit

def test_the_writer_joins_pending_changes_and_keeps_what_a_failed_append_lost(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ck.h5"
    led = Ledger(10**6)
    led.track()
    w = ck.Writer(path, ck.RunMeta(10**6, FP, FP_SRC, "{}", "0"))
    for k in range(50):
        led.commit([(10 * k, 10 * k + 5)], [(10 * k, float(k))])
        w.submit(led.changes())
    deadline = time.monotonic() + 20
    while (not path.exists() or len(state(path)[0]) < 50) and time.monotonic() < deadline:
        time.sleep(0.01)  # (all written, before the disk fills)
    real = checkpoint_write._write_at
    monkeypatch.setattr(checkpoint_write, "_write_at",
                        lambda *a: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    led.commit([(7000, 7010)], [(7001, 1.0)])
    w.submit(led.changes())
    deadline = time.monotonic() + 20
    while w.error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert w.error is not None and "No space left on device (errno 28)" in str(w.error) and w.failures >= 1
    assert 7001 not in state(path)[1]
    monkeypatch.setattr(checkpoint_write, "_write_at", real)
    led.commit([(8000, 8001)])
    w.close(led.changes())  # the failed changes go with these
    assert w.error is None and state(path) == ledger_state(led) and w.appends >= 1


def test_a_new_master_writes_whole_then_appends_and_the_old_writer_stops(tmp_path: Path) -> None:
    path = tmp_path / "ck.h5"
    old, led = fresh_store(path)
    for k in range(5):
        led.commit([(10 * k, 10 * k + 3)])
        old.write(led.changes())
    # The new master's ledger: the file's, merged into its own copy (not tracked: written whole once).
    mine = ck.load(path, BIG).ledger(BIG.total)
    mine.commit([(1000, 1005)], [(1001, 2.0)])
    new = ck.Store(path, BIG)
    completed, ids, values = mine.arrays()
    new.write(ck.Snapshot(completed, ids, values))
    mine.track()
    mine.commit([(2000, 2001)])
    new.write(mine.changes())
    assert state(path) == ledger_state(mine)
    led.commit([(5000, 5001)])
    with pytest.raises(CheckpointError, match="was replaced since this job last wrote it"):
        old.write(led.changes())
    assert state(path) == ledger_state(mine)


def test_fresh_moves_the_journal_aside_with_its_base(tmp_path: Path) -> None:
    path = tmp_path / "ck.h5"
    store, led = fresh_store(path)
    led.commit([(0, 4)])
    store.write(led.changes())
    led.commit([(9, 12)])
    store.write(led.changes())
    with pytest.warns(UserWarning, match="moved the existing checkpoint"):
        assert ck.load(path, BIG, fresh=True).n_completed == 0
    [bak] = [p for p in tmp_path.iterdir() if p.name.endswith(".bak")]
    assert not journal.beside(path).exists() and journal.beside(bak).exists()
    assert state(bak)[0] == [(0, 4), (9, 12)]


def test_status_and_the_audit_see_the_journal(tmp_path: Path) -> None:
    from nlevel.runtime.status import read_checkpoint
    from nlevel.testing.audit import checkpoint_doubles

    path = tmp_path / "ck.h5"
    store, led = fresh_store(path)
    led.commit([(0, 4)], [(1, 1.0)])
    led.fail(TaskFailure(50, "raised", "boom", 2, "n3"))
    store.write(led.changes())
    led.commit([(4, 9)], [(6, 1.0)])
    led.fail(TaskFailure(51, "timeout", "late"))
    led.commit([(50, 51)])
    store.write(led.changes())
    seen = read_checkpoint(str(path))
    assert seen["n_completed"] == 10 and [f["id"] for f in seen["failed"]] == [51]
    assert seen["updated"] >= seen["created"]
    assert checkpoint_doubles(path) == 0
    twice = journal.record({"k": 0, "r": 1, "w": 1, "ndim": 1, "n_completed": 10, "updated": "x", "failed": [],
                            "unfailed": [], "timeouts": [], "untimed": []},
                           [np.array([6], "<i8").tobytes(), np.array([3.0]).tobytes()])
    with open(journal.beside(path), "ab") as f:
        f.write(twice)  # a second result for id 6: read keeps the first, the audit counts the double
    assert state(path)[1] == {1: 1.0, 6: 1.0} and checkpoint_doubles(path) == 1


# ---------------------------------------------------------------- SIGKILL at any instant

def check_after_kill(path: Path, recorded: int) -> None:
    """The files hold the ranges [3i, 3i + 2) for i < k, a multiple of the batch, k >= ``recorded``, with
    their results and timeouts, and nothing else."""
    if not path.exists():  # (killed before the first write made the file)
        assert recorded == 0
        return
    _, s, extra = ck.read(path)
    k = len(s.completed)
    assert k >= recorded and k % BATCH == 0, (k, recorded)
    starts = np.arange(k, dtype=np.int64) * 3
    assert np.array_equal(s.completed, np.stack([starts, starts + 2], 1))
    assert np.array_equal(s.result_ids, starts) and np.array_equal(s.result_values, starts / 6)
    assert s.n_completed == extra["n_completed"] == 2 * k
    assert dict(s.timeouts) == {3 * i + 2: i for i in range(0, k, 5 * BATCH)}


BATCH = 40


def write_batches(path: Path, batches: int, compact_min: int, report: Any) -> None:
    """The master's side: resume from the files, then commit and write ``batches`` batches, calling
    ``report(k)`` after each write (the ranges of every i < k are recorded then)."""
    meta = ck.RunMeta(10**8, "f" * 64, "{}", "{}", "0")
    led = ck.load(path, meta).ledger(meta.total)
    led.track()
    store = ck.Store(path, meta, compact_min=compact_min)
    k = len(led.committed.ranges())
    for _ in range(batches):
        led.commit([(3 * i, 3 * i + 2) for i in range(k, k + BATCH)], [(3 * i, i * 0.5) for i in range(k, k + BATCH)])
        if k % (5 * BATCH) == 0:
            led.timeouts[3 * k + 2] = k
        k += BATCH
        store.write(led.changes())
        report(k)


#: The file operations of a write (appends, a journal's start, a whole base, a compaction, a torn tail cut).
OPERATIONS = ("pwrite", "fsync", "replace", "ftruncate", "unlink")


def killed_at(path: Path, op: str, n: int) -> int:
    """Run :func:`write_batches` in a forked process that SIGKILLs itself at its ``n``-th call of ``os.<op>``
    (before the call; a pwrite writes half its bytes first); return the last ``k`` it reported."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(r)
            calls = [0]
            real = getattr(os, op)

            def call(*args: Any) -> Any:
                calls[0] += 1
                if calls[0] == n:
                    if op == "pwrite":
                        real(args[0], bytes(args[1])[: max(1, len(args[1]) // 2)], args[2])
                    os.kill(os.getpid(), signal.SIGKILL)
                return real(*args)

            setattr(os, op, call)
            write_batches(path, 40, 4096, lambda k: os.write(w, f"{k}\n".encode()))
        finally:
            os._exit(0)
    os.close(w)
    deadline = time.monotonic() + 60
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"the writer killed at os.{op} call {n} did not end within 60 s")
        time.sleep(0.005)
    with os.fdopen(r) as f:
        said = f.read().split()
    return int(said[-1]) if said else 0


@pytest.mark.timeout(200)
def test_sigkill_at_every_step_of_appends_and_compactions_loses_nothing_recorded(tmp_path: Path) -> None:
    path = tmp_path / "ck.h5"
    seen = {"torn tail": 0, "temporary": 0, "stale journal": 0}
    for op, n in [(op, n) for op in OPERATIONS for n in (1, 2, 3, 4, 6, 9)]:
        recorded = killed_at(path, op, n)
        if journal.beside(path).exists():
            tok, end, size = journal_end(path)
            seen["torn tail"] += end < size
            seen["stale journal"] += tok != token(path)
        seen["temporary"] += bool(temps(path))
        check_after_kill(path, recorded)
    assert all(seen.values()), f"some kind of kill never landed: {seen}"
    check_after_kill(path, killed_at(path, "fsync", 10**6))  # (no kill: writes on from what the kills left)


WRITER = """
    import sys
    from pathlib import Path
    from tests.unit.test_checkpoint_journal import write_batches
    print("ready", flush=True)
    write_batches(Path(sys.argv[1]), 10**6, 1 << 14, lambda k: print(k, flush=True))
"""


@pytest.mark.timeout(120)
def test_sigkill_at_a_random_instant_loses_nothing_recorded(tmp_path: Path) -> None:
    path = tmp_path / "ck.h5"
    rng = random.Random(20250107)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for trial in range(examples(6, least=2)):
        proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(WRITER), str(path)], env=env, cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        recorded = 0
        try:
            ready, _, _ = select.select([proc.stdout], [], [], 30)
            assert ready and proc.stdout.readline() == b"ready\n", proc.stderr.read()
            time.sleep(rng.uniform(0.05, 0.5))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            for line in proc.stdout.read().split():
                recorded = int(line)
        finally:
            proc.kill()
            proc.wait(timeout=30)
            proc.stdout.close()
            proc.stderr.close()
        check_after_kill(path, recorded)
