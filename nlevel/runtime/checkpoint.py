"""Crash-safe HDF5 checkpoint of completed task ids, written by rank 0 alone (POSIX I/O).

A restarted job calls :func:`load` and skips the ids it returns. Rank 0 hands a :class:`Writer`
what changed since its previous write (a ledger's :class:`~nlevel.roles.ledger.Changes`), which
its thread appends to the journal beside the file: a write costs what is new, not the whole
job. A :class:`Snapshot` (a new master's first write: its ledger is not the one the file was
written from) is written whole.

A checkpoint is two files: the base ``<name>`` (HDF5) and its journal ``<name>.journal``
(:mod:`nlevel.runtime.journal`: one checksummed record per write, each holding the ranges,
results, failure records and timeout counts that are new). Readers (:func:`read`, :func:`load`)
see the base with the journal's records applied. When the journal outgrows a fraction
(``COMPACT_FRACTION``, at least ``COMPACT_MIN`` bytes) of the base, the writer folds it in: a
new base (written whole) and an empty journal, so the bytes written per write stay
proportional, amortised, to what is new.

This module is the checkpoint's public face: callers import from here. The code is split by
concern: :mod:`~nlevel.runtime.checkpoint_format` (the files' layout, :class:`RunMeta`,
:class:`Snapshot` and the helpers readers and writers share), :mod:`~nlevel.runtime.checkpoint_read`
(:func:`read`, :func:`stored_result_ids`, :func:`load`, :func:`resume`) and
:mod:`~nlevel.runtime.checkpoint_write` (:func:`write`, :class:`Store`, :class:`Writer`, and how a
write stays crash-safe).
"""

from __future__ import annotations

from nlevel.errors import CheckpointError  # noqa: F401 (not in __all__: callers reach it as checkpoint.CheckpointError)
from nlevel.runtime.checkpoint_format import FORMAT_VERSION, RunMeta, Snapshot, h5
from nlevel.runtime.checkpoint_read import load, read, resume, stored_result_ids
from nlevel.runtime.checkpoint_write import COMPACT_FRACTION, COMPACT_MIN, Store, Writer, write, write_error
from nlevel.runtime.identity import covers, differences, fingerprint, start_over

__all__ = ["COMPACT_FRACTION", "COMPACT_MIN", "FORMAT_VERSION", "RunMeta", "Snapshot", "Store", "covers",
           "differences", "fingerprint", "h5", "load", "read", "resume", "start_over",
           "stored_result_ids", "write", "write_error", "Writer"]  # (covers .. start_over: nlevel.runtime.identity)
