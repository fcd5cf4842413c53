"""Reading a checkpoint: the base, checked, with its journal's whole records applied in order.

:func:`read` reads the files as they are (for tools and tests), :func:`stored_result_ids` every
result id they hold, repeats included (for audits); :func:`resume` and :func:`load` check them
against the run that wants to resume, and are the only readers that change anything on disk: they
remove temporaries left by a killed writer, and ``fresh`` moves the files aside. A partial last
journal record (a kill during an append) is left out. The format is
:mod:`~nlevel.runtime.checkpoint_format`; callers import from :mod:`nlevel.runtime.checkpoint`.
"""

from __future__ import annotations

import itertools
import os
import warnings
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from nlevel.errors import CheckpointError
from nlevel.runtime import journal
from nlevel.runtime.checkpoint_format import (_NOT_OURS, _ROOT_MARK, FORMAT_VERSION, RunMeta, Snapshot, _failure,
                                              _foreign_journal, _fsync, _inside, _problem, _read_failed,
                                              _remove_stale_temps, _temp_name, _union, h5)
from nlevel.runtime.identity import covers, identity_error, start_over


def _read_base(path: Path) -> tuple[RunMeta, Snapshot, dict[str, Any], str | None]:
    """The base alone, checked, and its journal's token (None: a file written before journals)."""
    corrupt = f"checkpoint {path} is corrupt or truncated"
    try:
        is_hdf5 = h5().is_hdf5(path)
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e}") from e
    if not is_hdf5:
        raise CheckpointError(f"checkpoint {path} is not an HDF5 file; {_NOT_OURS}")
    try:
        with h5().File(path, "r") as f:
            a = f.attrs
            if _ROOT_MARK not in a:
                raise CheckpointError(f"{path} is an HDF5 file but not an nlevel checkpoint "
                                      f"(no '{_ROOT_MARK}' attribute); {_NOT_OURS}")
            fmt = int(a[_ROOT_MARK])
            if fmt > FORMAT_VERSION:
                raise CheckpointError(f"checkpoint {path} has format {fmt}, newer than "
                                      f"{FORMAT_VERSION} which this nlevel reads; upgrade nlevel")
            meta = RunMeta(int(a["total"]), str(a["fingerprint"]), str(a["fingerprint_source"]),
                           str(a["plan"]), str(a["version"]))
            extra: dict[str, Any] = {"format": fmt, "created": str(a["created"]), "updated": str(a["updated"]),
                                     "n_completed": int(a["n_completed"]), "journal_records": 0}
            token = str(a["journal"]) if "journal" in a else None
            failed = _read_failed(f["failed"][()]) if "failed" in f else ()
            timeouts = tuple(map(tuple, f["timeouts"][()].tolist())) if "timeouts" in f else ()
            snap = Snapshot(f["completed"][()], f["result_ids"][()], f["result_values"][()], failed, timeouts)
    except CheckpointError:
        raise
    except Exception as e:  # h5py raises OSError, KeyError, ValueError, ... on damage
        raise CheckpointError(f"{corrupt} ({type(e).__name__}: {e})", start_over(path)) from e
    _check(path, snap, meta.total, extra["n_completed"])
    return meta, snap, extra, token


def _check(path: Path, snap: Snapshot, total: int, n_completed: int) -> None:
    problem = _problem(snap, total)
    if problem is None and snap.n_completed != n_completed:
        problem = f"n_completed is {n_completed} but the ranges hold {snap.n_completed}"
    if problem:
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated ({problem})", start_over(path))


def _journal_records(path: Path, token: str | None) -> list[journal.Record]:
    """The whole records of the journal of the base whose token is ``token`` ([] when there is none,
    or it is stale); a partial last record is left out.

    Raises:
        CheckpointError: something else than a journal is where the journal goes.
    """
    where = journal.beside(path)
    try:
        data = where.read_bytes()
    except FileNotFoundError:
        return []
    except OSError:
        raise _foreign_journal(path) from None  # (a directory, a file we may not read: not ours)
    try:
        head, records, _ = journal.scan(data)
    except journal.NotAJournal:
        raise _foreign_journal(path) from None
    return records if token is not None and head.get("token") == token else []


def _apply(path: Path, snap: Snapshot, extra: dict[str, Any],
           records: list[journal.Record]) -> tuple[Snapshot, dict[str, Any]]:
    """The base ``snap`` with the journal's ``records`` applied in order.

    An id is counted once however many records name it; of results for one id the first is kept
    (the base's, then the journal's in order), as the ledger does.
    """
    ranges = [snap.completed]
    ids: list[np.ndarray] = []
    values: list[np.ndarray] = []
    failed = {f.id: f for f in snap.failed}
    timeouts = dict(snap.timeouts)
    claimed, updated = extra["n_completed"], extra["updated"]
    try:
        for meta, body in records:
            k, r, w, ndim = int(meta["k"]), int(meta["r"]), int(meta["w"]), int(meta["ndim"])
            assert body is not None
            if min(k, r, w) < 0 or ndim not in (1, 2) or (ndim == 1 and w != 1) or len(body) != 8 * (2 * k + r + r * w):
                raise ValueError(f"a record describes {k} ranges and {r} results of {w} numbers, its binary part "
                                 f"holds {len(body)} bytes")
            ranges.append(np.frombuffer(body, "<i8", 2 * k).reshape(k, 2).astype(np.int64))
            ids.append(np.frombuffer(body, "<i8", r, 16 * k).astype(np.int64))
            v = np.frombuffer(body, "<f8", r * w, 8 * (2 * k + r)).astype(np.float64)
            values.append(v if ndim == 1 else v.reshape(r, w))
            for row in meta["failed"]:
                failed[int(row["id"])] = _failure(row)
            for tid in meta["unfailed"]:
                failed.pop(int(tid), None)
            for tid, n in meta["timeouts"]:
                timeouts[int(tid)] = int(n)
            for tid in meta["untimed"]:
                timeouts.pop(int(tid), None)
            claimed, updated = int(meta["n_completed"]), str(meta["updated"])
        base_values = snap.result_values
        shapes = {v.shape[1:] for v in values if len(v)} | ({base_values.shape[1:]} if len(base_values) else set())
        if len(shapes) > 1:
            raise ValueError(f"results of shapes {sorted(shapes)} in the base and its journal")
        shape = shapes.pop() if shapes else base_values.shape[1:]
        new_ids = np.concatenate(ids)
        new_values = np.concatenate([v.reshape((-1, *shape)) for v in values])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated (its journal {journal.beside(path)}: "
                              f"{type(e).__name__}: {e})", start_over(path)) from None
    keep = ~_inside(new_ids, snap.completed)  # (committed in the base: results of a second run of an id)
    if len(new_ids):
        once = np.zeros(len(new_ids), bool)
        once[np.unique(new_ids, return_index=True)[1]] = True
        keep &= once
    out = Snapshot(_union(np.concatenate(ranges)), np.concatenate([snap.result_ids, new_ids[keep]]),
                   np.concatenate([base_values.reshape((-1, *shape)), new_values[keep]]),
                   tuple(failed.values()), tuple(sorted(timeouts.items())))
    return out, {**extra, "updated": updated, "n_completed": claimed, "journal_records": len(records)}


def _read(path: Path) -> tuple[RunMeta, Snapshot, dict[str, Any]]:
    meta, snap, extra, token = _read_base(path)
    records = _journal_records(path, token)
    if records:
        snap, extra = _apply(path, snap, extra, records)
        _check(path, snap, meta.total, extra["n_completed"])
    return meta, snap, extra


def read(path: str | os.PathLike[str]) -> tuple[RunMeta, Snapshot, dict[str, Any]]:
    """Read a checkpoint without comparing it to a run (for tools and tests).

    Args:
        path: the checkpoint file.

    Returns:
        ``(meta, snapshot, extra)``: the base with its journal applied; extra holds ``format``,
        ``created`` and ``updated`` (ISO 8601 UTC strings), ``n_completed`` and
        ``journal_records`` (how many journal records were applied).

    Raises:
        CheckpointError: the file is unreadable, not HDF5, not ours, newer, or corrupt, or
            something else than a journal is where its journal goes.
    """
    return _read(Path(path))


def stored_result_ids(path: str | os.PathLike[str]) -> np.ndarray:
    """Every result id the checkpoint's files hold, repeats included: the base's, then its journal's in
    order (for audits: a repeat is a double commit, which :func:`read` would hide by keeping the first).

    Raises:
        CheckpointError, OSError, KeyError: the files are unreadable.
    """
    p = Path(path)
    with h5().File(p, "r", locking=False) as f:
        ids = [np.asarray(f["result_ids"][...], np.int64)] if "result_ids" in f else []
        token = str(f.attrs["journal"]) if "journal" in f.attrs else None
    for meta, body in _journal_records(p, token):
        assert body is not None
        ids.append(np.frombuffer(body, "<i8", int(meta["r"]), 16 * int(meta["k"])).astype(np.int64))
    return np.concatenate(ids) if ids else np.zeros(0, np.int64)


def load(path: str | os.PathLike[str], meta: RunMeta, *, fresh: bool = False) -> Snapshot:
    """Validate and read the checkpoint for the run described by `meta` (see :func:`resume`).

    Returns:
        The stored snapshot, or an empty one if there is no file (or ``fresh``).

    Raises:
        CheckpointError: as :func:`resume`.
    """
    return resume(path, meta, fresh=fresh)[1]


def resume(path: str | os.PathLike[str], meta: RunMeta, *, fresh: bool = False) -> tuple[RunMeta, Snapshot]:
    """Validate and read the checkpoint for the run described by `meta`.

    The run may resume the file when the totals agree and the file's identity covers the
    run's: the same app, and every parameter the run counts (its fingerprint's params)
    stored with the same value. The file may record more parameters than the run counts
    (a checkpoint written when the default identity held the whole command line, or an
    app that has since left an option out of its identity): those never block a resume,
    and the file keeps its identity (the returned meta carries it, so writes replace it).

    Only ``fresh=True`` changes anything on disk besides removing stale temporaries: it
    renames an existing file to ``<path>.<UTC yyyymmddTHHMMSS>[-n].bak`` (with a warning), and
    its journal to that name with ``.journal`` added.

    Args:
        path: the checkpoint file; it need not exist, but its directory must be writable.
        meta: the run that wants to resume.
        fresh: start over, keeping any existing file aside.

    Returns:
        ``(meta to write with, snapshot)``: ``meta`` itself, or it with the file's fingerprint
        when the file records more parameters; the stored snapshot, or an empty one if there
        is no file (or ``fresh``).

    Raises:
        CheckpointError: path is a directory; its directory is missing or unwritable; the
            file is not HDF5, not an nlevel checkpoint, corrupt, of a newer format, or belongs
            to a run with another identity (app, parameters) or total; something else than a
            journal is where its journal goes. The message names both
            sides and what differs; its remedies say how to keep the progress or start over.
    """
    p = Path(path)
    if p.is_dir():
        raise CheckpointError(f"checkpoint path {p} is a directory; expected an HDF5 file path")
    _check_directory(p)
    _remove_stale_temps(p)
    if journal.is_journal(journal.beside(p)) is False:  # (refused now: the writer would not replace it)
        raise _foreign_journal(p)
    if not p.exists():
        return meta, Snapshot.empty()
    if fresh:
        bak = _move_aside(p)
        warnings.warn(f"fresh start: moved the existing checkpoint {p} to {bak}", stacklevel=2)
        return meta, Snapshot.empty()
    stored, snap, _ = _read(p)
    if stored.fingerprint != meta.fingerprint:
        if not covers(stored.fingerprint_source, meta.fingerprint_source):
            raise identity_error(p, stored.fingerprint_source, meta.fingerprint_source)
        meta = RunMeta(meta.total, stored.fingerprint, stored.fingerprint_source, meta.plan, meta.version)
    if stored.total != meta.total:
        raise CheckpointError(
            f"checkpoint {p} has total {stored.total} task ids, this run has {meta.total}",
            {api: f"to keep its progress, run with total {stored.total}; {text}"
             for api, text in start_over(p).items()})
    return meta, snap


def _check_directory(path: Path) -> None:
    d = path.parent
    if not d.exists():
        raise CheckpointError(f"directory {d} of checkpoint {path} does not exist")
    if not d.is_dir():
        raise CheckpointError(f"{d} (where checkpoint {path} would go) is not a directory")
    probe = _temp_name(path)
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        os.unlink(probe)
    except OSError as e:
        raise CheckpointError(f"cannot create files in directory {d} for checkpoint {path}: "
                              f"{e}") from e


def _move_aside(path: Path) -> Path:
    """Rename the checkpoint to a free ``.bak`` name, its journal with it (``<bak>.journal``: it
    stays a checkpoint that :func:`read` reads whole)."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    for n in itertools.count():
        bak = Path(f"{path}.{stamp}{f'-{n}' if n else ''}.bak")
        # (single writer, rank 0: no race with another mover)
        if not os.path.lexists(bak) and not os.path.lexists(journal.beside(bak)):
            if journal.is_journal(journal.beside(path)):
                os.rename(journal.beside(path), journal.beside(bak))
            os.rename(path, bak)
            _fsync(path.parent)
            return bak
    raise AssertionError("unreachable")
