"""The checkpoint's journal: records appended beside the HDF5 file, each framed and checksummed.

A checkpoint is its HDF5 file (the base) and ``<name>.journal`` beside it: a write appends one
record to the journal (what is new since the previous write) and fsyncs it, so a write costs
what is new; now and then the writer folds the journal into a new base (see
:mod:`nlevel.runtime.checkpoint`). This module owns the journal's bytes only: framing, the
header that ties a journal to its base, and a scan that stops at a torn tail.

Layout: records back to back, each ::

    magic  4 bytes   b"NLJ1"
    meta   u32       length of the JSON part
    data   u64       length of the binary part
    crc    u32       zlib.crc32 of the JSON part
    crc    u32       zlib.crc32 of the binary part
    JSON             a UTF-8 object
    binary           raw little-endian arrays, described by the JSON part

The first record is the header: ``{"nlevel_journal": 1, "token": ..., "fingerprint": ...,
"total": ...}`` with no binary part; ``token`` is the base's ``journal`` attribute, so a journal
left from before the base was rewritten (a compaction, a full write) is known as stale and
ignored. A journal is made whole under a temporary name and renamed into place, so it always
has its header; a record is appended then fsynced, so a crash can only leave a partial last
record, which a scan ignores (and the next writer cuts off before it appends). Standard library
only.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Iterable

__all__ = ["FRAME", "HEADER_KEY", "MAGIC", "NotAJournal", "Record", "beside", "header", "is_journal", "record", "scan",
           "scan_file"]

MAGIC = b"NLJ1"
FRAME = struct.Struct("<4sIQII")  # magic, JSON length, binary length, JSON crc, binary crc
HEADER_KEY = "nlevel_journal"  # the header record's mark (its value: the journal's version)
_VERSION = 1

#: One record: its JSON part and its binary part (a view into what was read, or None when skipped).
Record = tuple[dict[str, Any], "memoryview | None"]


def beside(checkpoint: str | os.PathLike[str]) -> Path:
    """The journal of checkpoint ``checkpoint``: ``<checkpoint>.journal``."""
    return Path(f"{os.fspath(checkpoint)}.journal")


class NotAJournal(ValueError):
    """The file does not start with a journal's header: someone else's file, never to be overwritten."""


def record(meta: dict[str, Any], chunks: Iterable[bytes | memoryview] = ()) -> bytes:
    """One record, framed: ``meta`` as JSON, then ``chunks`` back to back as its binary part."""
    text = json.dumps(meta, separators=(",", ":")).encode()
    crc = 0
    size = 0
    parts: list[bytes | memoryview] = []
    for c in chunks:
        crc = zlib.crc32(c, crc)
        size += len(c)
        parts.append(c)
    return b"".join([FRAME.pack(MAGIC, len(text), size, zlib.crc32(text), crc), text, *parts])


def header(token: str, fingerprint: str, total: int) -> bytes:
    """The first record of a journal that belongs to the base whose ``journal`` attribute is ``token``."""
    return record({HEADER_KEY: _VERSION, "token": token, "fingerprint": fingerprint, "total": total})


def _next(buf: memoryview, pos: int, data: bool) -> tuple[Record, int] | None:
    """The record at ``pos`` and the offset after it, or None when it is not whole (a torn tail)."""
    if len(buf) - pos < FRAME.size:
        return None
    magic, n_meta, n_data, crc_meta, crc_data = FRAME.unpack_from(buf, pos)
    start = pos + FRAME.size
    end = start + n_meta + n_data
    if magic != MAGIC or end > len(buf):
        return None
    text = buf[start : start + n_meta]
    if zlib.crc32(text) != crc_meta:
        return None
    body = buf[start + n_meta : end]
    if data and zlib.crc32(body) != crc_data:
        return None
    try:
        meta = json.loads(bytes(text))
    except ValueError:
        return None
    if not isinstance(meta, dict):
        return None
    return (meta, body if data else None), end


def scan(buf: bytes | memoryview) -> tuple[dict[str, Any], list[Record], int]:
    """Read a journal held in memory: its header, its whole records, and the length they fill.

    Whatever follows the last whole record (a write cut short) is not part of it.

    Raises:
        NotAJournal: ``buf`` does not start with a whole journal header.
    """
    view = memoryview(buf)
    first = _next(view, 0, True) if view[: len(MAGIC)] == MAGIC else None
    if first is None or HEADER_KEY not in first[0][0]:
        raise NotAJournal("it does not start with an nlevel checkpoint journal's header")
    (head, _), pos = first
    records: list[Record] = []
    while True:
        got = _next(view, pos, True)
        if got is None or HEADER_KEY in got[0][0]:
            return head, records, pos
        records.append(got[0])
        pos = got[1]


def scan_file(f: BinaryIO) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The header and the records' JSON parts of an open journal, skipping the binary parts
    (for a look from outside, :mod:`nlevel.runtime.status`: it reads little of a long journal).
    A record whose binary part is not all in the file ends the journal; its checksum is not
    checked.

    Raises:
        NotAJournal: as :func:`scan`.
    """
    size = os.fstat(f.fileno()).st_size
    metas: list[dict[str, Any]] = []
    pos = 0
    head: dict[str, Any] | None = None
    while True:
        f.seek(pos)
        frame = f.read(FRAME.size)
        if len(frame) < FRAME.size:
            break
        magic, n_meta, n_data, crc_meta, _ = FRAME.unpack(frame)
        end = pos + FRAME.size + n_meta + n_data
        if magic != MAGIC or end > size:
            break
        text = f.read(n_meta)
        if len(text) < n_meta or zlib.crc32(text) != crc_meta:
            break
        try:
            meta = json.loads(text)
        except ValueError:
            break
        if not isinstance(meta, dict) or (HEADER_KEY in meta) != (head is None):
            break
        if head is None:
            head = meta
        else:
            metas.append(meta)
        pos = end
    if head is None:
        raise NotAJournal("it does not start with an nlevel checkpoint journal's header")
    return head, metas


def is_journal(path: str | os.PathLike[str]) -> bool | None:
    """Whether the file at ``path`` starts as a journal does (None: there is no file).

    Anything else there (a directory, another file, a file we cannot read) is not ours.
    """
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except FileNotFoundError:
        return None
    except OSError:
        return False
