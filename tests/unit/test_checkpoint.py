"""Tests of nlevel.runtime.checkpoint: round trips, every refusal and the Writer thread.

The crash-safety tests that kill or limit a writer process are tests/e2e/test_checkpoint_kill.py; the
journal's (appends, compactions, torn tails, kills) are tests/unit/test_checkpoint_journal.py.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

import h5py  # type: ignore[import-untyped]
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nlevel.errors import CheckpointError
from nlevel.runtime import checkpoint as ck
from nlevel.runtime import checkpoint_read, checkpoint_write

from ..conftest import examples

FP, FP_SRC = ck.fingerprint("apps.demo", {"n": 3, "seed": 1})
META = ck.RunMeta(total=100, fingerprint=FP, fingerprint_source=FP_SRC, plan='{"levels": 2}',
                  version="0.1.0")


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def temps(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if ".tmp-" in p.name)


def snap(ranges: Sequence[Sequence[int]], ids: Sequence[int] = (),
         vals: Sequence[float] = ()) -> ck.Snapshot:
    return ck.Snapshot(np.array(ranges, np.int64).reshape(-1, 2), np.array(ids, np.int64),
                       np.array(vals, np.float64))


def assert_same(a: ck.Snapshot, b: ck.Snapshot) -> None:
    for x, y in ((a.completed, b.completed), (a.result_ids, b.result_ids),
                 (a.result_values, b.result_values)):
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def raw_write(path: Path, attrs: dict[str, Any] | None = None, drop: tuple[str, ...] = (),
              **data: Any) -> None:
    """Write our layout with h5py directly, bypassing validation, to fake damaged files."""
    a: dict[str, Any] = {"nlevel_format": 1, "total": 100, "fingerprint": FP,
                         "fingerprint_source": FP_SRC, "plan": "{}", "version": "0.1.0",
                         "created": "x", "updated": "x", "n_completed": 0}
    a.update(attrs or {})
    d: dict[str, Any] = {"completed": np.zeros((0, 2), np.int64),
                         "result_ids": np.zeros(0, np.int64), "result_values": np.zeros(0)}
    d.update(data)
    with h5py.File(path, "w") as f:
        f.attrs.update({k: v for k, v in a.items() if k not in drop})
        for k, v in d.items():
            if k not in drop:
                f.create_dataset(k, data=v)


# ---------------------------------------------------------------- fingerprint and Snapshot

def test_fingerprint_is_canonical() -> None:
    h1, s1 = ck.fingerprint("app", {"b": 1, "a": [1, 2], "p": Path("/x")})
    h2, s2 = ck.fingerprint("app", {"p": Path("/x"), "a": [1, 2], "b": 1})
    assert (h1, s1) == (h2, s2)
    assert s1 == '{"app": "app", "params": {"a": [1, 2], "b": 1, "p": "/x"}}'
    assert h1 == hashlib.sha256(s1.encode()).hexdigest()
    assert ck.fingerprint("app", {"b": 2, "a": [1, 2], "p": "/x"})[0] != h1


def test_snapshot_coerces_and_counts() -> None:
    s = ck.Snapshot([], [], [])  # type: ignore[arg-type]  # array-likes are accepted
    assert s.completed.shape == (0, 2) and s.completed.dtype == np.int64
    assert s.result_values.dtype == np.float64 and s.n_completed == 0
    assert snap([[0, 3], [5, 9]]).n_completed == 7
    assert ck.Snapshot.empty().n_completed == 0
    with pytest.raises(TypeError):
        ck.Snapshot(np.array([[0.5, 2.0]]), np.array([]), np.array([]))


# ---------------------------------------------------------------- round trips

@pytest.mark.parametrize("s", [ck.Snapshot.empty(), snap([[0, 3], [5, 9], [99, 100]]),
                               snap([[0, 10], [20, 30]], [9, 0, 25], [1.5, -0.0, np.nan])],
                         ids=["empty", "ranges", "results"])
def test_round_trip(tmp_path: Path, s: ck.Snapshot) -> None:
    path = tmp_path / "ck.h5"
    ck.write(path, META, s)
    meta, back, extra = ck.read(path)
    assert meta == META
    assert_same(back, s)
    assert extra["n_completed"] == s.n_completed and extra["format"] == ck.FORMAT_VERSION
    before = sha(path)
    assert_same(ck.load(path, META), s)
    assert sha(path) == before and temps(path) == []


def test_created_is_kept_across_rewrites(tmp_path: Path) -> None:
    path = tmp_path / "ck.h5"
    ck.write(path, META, ck.Snapshot.empty())
    created = ck.read(path)[2]["created"]
    datetime.fromisoformat(created)
    time.sleep(0.01)
    ck.write(path, META, snap([[0, 5]]))
    _, s, extra = ck.read(path)
    assert extra["created"] == created and extra["updated"] > created and s.n_completed == 5


def test_load_missing_file_is_empty(tmp_path: Path) -> None:
    s = ck.load(tmp_path / "ck.h5", META)
    assert s.n_completed == 0 and s.completed.shape == (0, 2)
    assert list(tmp_path.iterdir()) == []  # the writability probe leaves nothing behind


# ---------------------------------------------------------------- paths and directories

def test_directory_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="is a directory; expected an HDF5 file path") as e:
        ck.load(tmp_path, META)
    assert str(tmp_path) in str(e.value)


def test_missing_parent_directory(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist") as e:
        ck.load(tmp_path / "nope" / "ck.h5", META)
    assert str(tmp_path / "nope") in str(e.value)
    assert not (tmp_path / "nope").exists()


def test_parent_is_a_regular_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(CheckpointError, match="is not a directory") as e:
        ck.load(tmp_path / "f" / "ck.h5", META)
    assert str(tmp_path / "f") in str(e.value)


def test_unwritable_directory(tmp_path: Path) -> None:
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    try:
        try:
            (d / "probe").touch()
        except PermissionError:
            pass
        else:
            pytest.skip("chmod 0o500 does not stop this user (root) from writing; the "
                        "regular-file-parent and missing-directory tests cover the refusal")
        with pytest.raises(CheckpointError, match="cannot create files in directory") as e:
            ck.load(d / "ck.h5", META)
        assert str(d) in str(e.value)
    finally:
        d.chmod(0o700)


def test_stale_temps_of_killed_writers_are_removed(tmp_path: Path) -> None:
    path = tmp_path / "ck.h5"
    ck.write(path, META, snap([[0, 4]]))
    stale = [tmp_path / "ck.h5.tmp-999999-0", tmp_path / "ck.h5.tmp-1-17"]
    keep = [tmp_path / n for n in ("ck.h5.tmp-notes", "other.h5.tmp-1-1", "ck.h5.bak",
                                   f"ck.h5.tmp-{os.getpid()}-5")]
    for p in stale + keep:
        p.write_text("junk")
    assert ck.load(path, META).n_completed == 4
    assert [p.exists() for p in stale] == [False, False]
    assert all(p.exists() for p in keep)


# ---------------------------------------------------------------- --fresh

def test_fresh_moves_the_old_file_aside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Frozen(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Frozen:
            return cls(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)

    monkeypatch.setattr(checkpoint_read, "datetime", Frozen)  # (where resume moves the file aside)
    path = tmp_path / "ck.h5"
    bak = tmp_path / "ck.h5.20300102T030405.bak"
    bak1 = tmp_path / "ck.h5.20300102T030405-1.bak"
    ck.write(path, META, snap([[0, 7]]))
    first = sha(path)
    with pytest.warns(UserWarning, match=str(bak)):
        assert ck.load(path, META, fresh=True).n_completed == 0
    assert not path.exists() and sha(bak) == first
    path.write_text("not even HDF5")  # --fresh moves anything aside, never overwrites
    second = sha(path)
    with pytest.warns(UserWarning, match=str(bak1)):
        ck.load(path, META, fresh=True)
    assert sha(bak) == first and sha(bak1) == second and not path.exists()


def test_fresh_without_a_file_is_empty(tmp_path: Path) -> None:
    assert ck.load(tmp_path / "ck.h5", META, fresh=True).n_completed == 0
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- refusals, file untouched

def refused(path: Path, match: str, meta: ck.RunMeta = META) -> str:
    """Load is refused with ``match``, the file untouched; returns the message a script user sees."""
    before = sha(path)
    with pytest.raises(CheckpointError, match=match) as e:
        ck.load(path, meta)
    assert sha(path) == before and temps(path) == []
    assert str(path) in str(e.value)
    err = e.value
    if err.remedies:  # each API is told the remedy it has, and no other's
        assert "--fresh" in err.explain("run") and "fresh=True" not in err.explain("run")
        assert "--fresh" not in str(err) and "Farm(..., fresh=True)" in str(err)
    return str(err)


def test_text_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ck.h5"
    path.write_text("my precious notes\n")
    msg = refused(path, "is not an HDF5 file")
    assert "will not overwrite" in msg


def test_foreign_hdf5_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ck.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(3)
    refused(path, "is an HDF5 file but not an nlevel checkpoint")


def test_truncated_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ck.h5"
    ck.write(path, META, snap([[0, 100]], list(range(100)), list(range(100))))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    msg = refused(path, "corrupt or truncated")
    assert "to start over keeping the old file" in msg


@pytest.mark.parametrize("bad", [
    dict(completed=np.array([[5, 9], [0, 3]])),            # unsorted
    dict(completed=np.array([[0, 5], [3, 9]])),            # overlapping
    dict(completed=np.array([[0, 5], [5, 9]])),            # adjacent
    dict(completed=np.array([[4, 4]])),                    # empty range
    dict(completed=np.array([[-1, 3]])),                   # below 0
    dict(completed=np.array([[90, 101]])),                 # beyond total
    dict(completed=np.array([[0, 1, 2]])),                 # wrong shape
    dict(completed=np.array([[0, 3]]), result_ids=np.array([3]), result_values=np.ones(1)),
    dict(result_ids=np.array([1]), result_values=np.ones(1)),
    dict(completed=np.array([[0, 3]]), result_ids=np.array([1]), result_values=np.ones(2)),
    dict(completed=np.array([[0, 3]]), attrs={"n_completed": 0}),
    dict(drop=("result_values",)),
    dict(drop=("total",)),
], ids=["unsorted", "overlap", "adjacent", "empty", "negative", "beyond", "shape",
        "result-outside", "result-no-ranges", "values-length", "n_completed", "no-dataset",
        "no-attr"])
def test_inconsistent_contents_are_refused(tmp_path: Path, bad: dict[str, Any]) -> None:
    path = tmp_path / "ck.h5"
    bad = dict(bad)
    if "completed" in bad and "attrs" not in bad and bad["completed"].shape[1:] == (2,):
        n = int((bad["completed"][:, 1] - bad["completed"][:, 0]).sum())
        bad["attrs"] = {"n_completed": n}  # so the range check itself must catch it
    raw_write(path, **bad)
    refused(path, "corrupt or truncated.*to start over keeping the old file")
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        ck.read(path)


def test_newer_format_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ck.h5"
    raw_write(path, attrs={"nlevel_format": ck.FORMAT_VERSION + 1})
    refused(path, f"format {ck.FORMAT_VERSION + 1}, newer than {ck.FORMAT_VERSION}")


def meta_of(app: str, params: dict[str, Any], total: int = 100) -> ck.RunMeta:
    return ck.RunMeta(total, *ck.fingerprint(app, params), "{}", "0.1.0")


def test_other_fingerprint_is_refused_naming_both_sides_and_what_differs(tmp_path: Path) -> None:
    path = tmp_path / "ck.h5"
    ck.write(path, META, snap([[0, 4]]))
    other = meta_of("apps.demo", {"n": 4, "seed": 1, "mode": "fast"})
    msg = refused(path, "belongs to another run", other)
    for text in (FP_SRC, other.fingerprint_source, "n: 3 in the checkpoint, 4 in this run",
                 'mode only in this run ("fast")', "fingerprint= of Farm/get_task_id"):
        assert text in msg, text
    assert "seed" not in msg.split("differ in:")[1].split(")")[0]  # equal: not listed as a difference


def test_another_app_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ck.h5"
    ck.write(path, META, snap([[0, 4]]))
    msg = refused(path, "belongs to another run", meta_of("other.py", {"n": 3, "seed": 1}))
    assert "app 'apps.demo' in the checkpoint, 'other.py' in this run" in msg


def test_what_the_file_records_beyond_the_run_never_blocks_a_resume(tmp_path: Path) -> None:
    """A file written when the identity held the whole command line resumes under an identity of app + total."""
    path = tmp_path / "ck.h5"
    old = meta_of("run.py", {"argv": ["--out", "/scratch/job1", "--seed", "3"]})
    ck.write(path, old, snap([[0, 40]]))
    before = sha(path)
    meta, got = ck.resume(path, meta_of("run.py", {}))
    assert got.n_completed == 40 and sha(path) == before
    assert (meta.fingerprint, meta.fingerprint_source) == (old.fingerprint, old.fingerprint_source)
    ck.write(path, meta, snap([[0, 50]]))  # the file keeps its identity: the writer may replace it
    assert ck.load(path, meta_of("run.py", {})).n_completed == 50
    # a parameter this run counts must be recorded with the same value
    refused(path, r"seed only in this run \(3\)", meta_of("run.py", {"seed": 3}))
    # the same identity: the run's own meta comes back
    same = meta_of("run.py", {"argv": ["--out", "/scratch/job1", "--seed", "3"]})
    assert ck.resume(path, same)[0] == same


def test_the_results_shape_must_agree_both_ways(tmp_path: Path) -> None:
    path = tmp_path / "ck.h5"
    ck.write(path, meta_of("a.py", {"result_fields": ["x", "y"]}), snap([[0, 4]]))
    msg = refused(path, "belongs to another run", meta_of("a.py", {}))
    assert 'result_fields only in the checkpoint (["x", "y"])' in msg


def test_other_total_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ck.h5"
    ck.write(path, META, snap([[0, 4]]))
    other = ck.RunMeta(250, FP, FP_SRC, "{}", "0.1.0")
    msg = refused(path, "total 100 task ids, this run has 250", other)
    assert "to keep its progress, run with total 100" in msg


# ---------------------------------------------------------------- write() refusals and errors

@pytest.mark.parametrize("bad", [snap([[0, 5], [3, 9]]), snap([[0, 101]]),
                                 snap([[0, 5]], [7], [1.0])], ids=["overlap", "total", "result"])
def test_write_refuses_invalid_snapshot(tmp_path: Path, bad: ck.Snapshot) -> None:
    path = tmp_path / "ck.h5"
    ck.write(path, META, snap([[0, 2]]))
    before = sha(path)
    with pytest.raises(CheckpointError, match="refusing to write checkpoint"):
        ck.write(path, META, bad)
    assert sha(path) == before and temps(path) == []


def test_write_refuses_to_replace_other_files(tmp_path: Path) -> None:
    text, foreign, other = tmp_path / "a.h5", tmp_path / "b.h5", tmp_path / "c.h5"
    text.write_text("notes")
    with h5py.File(foreign, "w") as f:
        f["x"] = 1
    ck.write(other, ck.RunMeta(100, "0" * 64, "{}", "{}", "0"), ck.Snapshot.empty())
    for p in (text, foreign, other):
        before = sha(p)
        with pytest.raises(CheckpointError, match="refusing to replace") as e:
            ck.write(p, META, snap([[0, 1]]))
        assert str(p) in str(e.value) and sha(p) == before and temps(p) == []


def test_write_into_missing_directory(tmp_path: Path) -> None:
    path = tmp_path / "gone" / "ck.h5"
    with pytest.raises(CheckpointError, match="cannot write checkpoint") as e:
        ck.write(path, META, ck.Snapshot.empty())
    assert str(path) in str(e.value) and "No such file or directory" in str(e.value)


# ---------------------------------------------------------------- Writer

def test_writer_coalesces_and_writes_final(tmp_path: Path) -> None:
    path = tmp_path / "ck.h5"
    w = ck.Writer(path, META)
    for i in range(1, 200):
        w.submit(snap([[0, i % 100 + 1]]))
    final = snap([[0, 10], [50, 60]], [55], [3.25])
    w.close(final)
    assert_same(ck.read(path)[1], final)
    assert w.error is None and 1 <= w.writes < 100
    assert w.bytes_written >= path.stat().st_size and w.last_write_seconds > 0
    w.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        w.submit(final)


def test_writer_surfaces_errors_on_close(tmp_path: Path) -> None:
    d = tmp_path / "run"
    d.mkdir()
    path = d / "ck.h5"
    w = ck.Writer(path, META)
    d.rmdir()
    w.submit(snap([[0, 1]]))
    with pytest.raises(CheckpointError, match="cannot write checkpoint") as e:
        w.close(snap([[0, 2]]))
    assert str(path) in str(e.value) and w.error is e.value and w.writes == 0
    with pytest.raises(CheckpointError):
        w.close()


# ---------------------------------------------------------------- property

@st.composite
def snapshots(draw: st.DrawFn) -> tuple[int, ck.Snapshot]:
    done = draw(st.lists(st.booleans(), max_size=300))
    total = len(done) + draw(st.integers(0, 3))
    mask = np.array([False, *done, False])
    edges = np.flatnonzero(np.diff(mask.astype(np.int8)))
    ranges = edges.reshape(-1, 2)
    ids_done = [i for i, d in enumerate(done) if d]
    ids = draw(st.lists(st.sampled_from(ids_done), unique=True)) if ids_done else []
    vals = draw(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=len(ids),
                         max_size=len(ids)))
    return total, snap(ranges.tolist(), ids, vals)


@settings(max_examples=examples(60), deadline=None)
@given(snapshots())
def test_valid_snapshots_round_trip_exactly(case: tuple[int, ck.Snapshot]) -> None:
    total, s = case
    meta = ck.RunMeta(total, FP, FP_SRC, "{}", "0.1.0")
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "ck.h5"
        ck.write(path, meta, s)
        assert_same(ck.load(path, meta), s)
        assert ck.read(path)[2]["n_completed"] == s.n_completed


def test_writer_error_is_cleared_by_a_later_successful_write(tmp_path: Path) -> None:
    """A transient failure (the directory briefly gone) must not fail a run whose file is current."""
    import shutil

    d = tmp_path / "ck"
    d.mkdir()
    path = d / "run.h5"
    meta = ck.RunMeta(10, *ck.fingerprint("w", {}), "{}", "test")
    w = ck.Writer(path, meta)
    shutil.rmtree(d)
    w.submit(ck.Snapshot(np.array([[0, 2]]), np.zeros(0, np.int64), np.zeros(0)))
    deadline = time.monotonic() + 10
    while w.error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert w.error is not None and w.failures >= 1
    d.mkdir()
    w.close(ck.Snapshot(np.array([[0, 10]]), np.zeros(0, np.int64), np.zeros(0)))  # succeeds: no raise
    assert w.error is None and ck.read(path)[1].n_completed == 10


# ---------------------------------------------------------------- a full disk (issue 34)

class _FullDisk:
    """h5py as a full disk makes it fail: reading works; a new file, an OSError spanning lines, naming buffers."""

    @staticmethod
    def File(name: Any, mode: str = "r", **kwargs: Any) -> Any:
        if mode == "r":
            return h5py.File(name, mode, **kwargs)
        raise OSError(28, "Can't close file (file write failed: time = Sat Nov 28 03:20:19 2026\n, filename = "
                          "'x.tmp-1-2', file descriptor = 15, errno = 28, error message = 'No space left on "
                          "device', buf = 0x7f8914023ef0, total write size = 2048, offset = 4096)")


def test_a_full_disk_is_one_checkpoint_error_naming_the_file_and_the_cause(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "run.h5"
    ck.write(path, META, snap([[0, 2]]))
    before = sha(path)
    monkeypatch.setattr(checkpoint_write, "h5", lambda: _FullDisk)  # (where the writers look h5 up)
    for attempt in ("write", "writer"):
        with pytest.raises(CheckpointError) as e:
            if attempt == "write":
                ck.write(path, META, snap([[0, 5]]))
            else:
                w = ck.Writer(path, META)
                w.submit(snap([[0, 4]]))
                w.close(snap([[0, 5]]))
        err = e.value
        assert str(err) == (f"cannot write checkpoint {path}: No space left on device (errno 28); the previous "
                            f"checkpoint, if any, is intact"), attempt
        assert err.path == str(path) and err.errno == 28
        assert err.__cause__ is None and (err.__context__ is None or err.__suppress_context__), \
            "h5py's internals chained behind it"
        assert sha(path) == before and temps(path) == []


def test_any_write_error_is_a_checkpoint_error_naming_its_cause(tmp_path: Path) -> None:
    err = ck.write_error(tmp_path / "run.h5", PermissionError(13, "Permission denied"))
    assert str(err).startswith(f"cannot write checkpoint {tmp_path / 'run.h5'}: Permission denied (errno 13);")
    err = ck.write_error(tmp_path / "run.h5", RuntimeError("unexpected\n  on two lines"))
    assert "RuntimeError: unexpected on two lines" in str(err) and err.errno is None
    assert err.again() is not err and str(err.again()) == str(err)
