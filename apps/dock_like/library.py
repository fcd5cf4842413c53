"""The ligand library on disk: a byte-offset index, so a rank reads only the ligands it docks.

A library is a SMILES file (``.smi``, ``.smiles``, ``.txt``: one ligand a line, the SMILES
then an optional name; blank lines and lines starting with ``#`` are not ligands, nor is a
first line whose first word is ``smiles``) or an SDF file (``.sdf``, ``.sd``, ``.mol``:
records ending with ``$$$$``). Ligand ``i`` (task ``i``) is the ``i``-th entry in file order,
good or bad: an entry that does not parse is docked as a failure with its reason, so
the numbering never depends on parsing.

:func:`open_index` scans the file once (no chemistry: byte patterns only) and stores
``(start, stop)`` byte offsets of every entry, with the file's size, modification time
and SHA-256, in an HDF5 file beside the checkpoint. Later runs (other ranks, a resume)
reuse it after one ``stat``; a library whose size or time changed is hashed again and
the index rebuilt when its content changed. :class:`Library` then reads entry ``i``
with one ``pread`` of its bytes.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone

import h5py
import numpy as np

__all__ = ["SMILES_SUFFIXES", "SDF_SUFFIXES", "INDEX_FORMAT", "Entry", "Library", "IndexInfo", "library_kind",
           "scan", "build_index", "check_index", "open_index", "sha256"]

SMILES_SUFFIXES = (".smi", ".smiles", ".txt", ".ism", ".can")
SDF_SUFFIXES = (".sdf", ".sd", ".mol")
INDEX_FORMAT = "dock_like library index"
_CHUNK = 1 << 26  # bytes scanned at a time: memory stays ~8x this, whatever the file size
_SDF_END = re.compile(rb"^\$\$\$\$[ \t]*\r?$", re.M)


def sha256(path: str) -> str:
    """Return the hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def library_kind(path: str) -> str:
    """Return ``"smi"`` or ``"sdf"`` from the file name.

    Raises:
        ValueError: for another suffix, naming the suffixes expected.
    """
    low = path.lower()
    if low.endswith(SMILES_SUFFIXES):
        return "smi"
    if low.endswith(SDF_SUFFIXES):
        return "sdf"
    raise ValueError(f"--library {path!r}: unknown library format; expected a SMILES file "
                     f"({', '.join(SMILES_SUFFIXES)}: SMILES then an optional name per line) or an SDF file "
                     f"({', '.join(SDF_SUFFIXES)})")


def _scan_smiles(mm: mmap.mmap | bytes, size: int) -> np.ndarray:
    """``(start, stop)`` of each ligand line; stop excludes the line end."""
    spans = []
    pos = 0
    while pos < size:
        end = min(pos + _CHUNK, size)
        if end < size:  # cut the chunk at its last newline so no line is split
            nl = mm.rfind(b"\n", pos, end)
            end = nl + 1 if nl >= pos else size
        buf = np.frombuffer(mm[pos:end], dtype=np.uint8)
        newlines = np.flatnonzero(buf == 10)
        starts = np.concatenate(([0], newlines + 1))
        stops = np.concatenate((newlines, [buf.size]))
        keep = starts < stops  # not an empty line
        starts, stops = starts[keep], stops[keep]
        first = buf[starts]
        # A ligand line starts with a SMILES character; '#' comments and whitespace-first lines are not
        # ligands (a whitespace-first line with text is rare: checked one by one below).
        ok = (first != ord("#")) & (first != ord("\r"))
        blank_first = (first == ord(" ")) | (first == ord("\t"))
        for k in np.flatnonzero(blank_first):
            if not bytes(buf[starts[k]:stops[k]]).strip():
                ok[k] = False
        starts, stops = starts[ok], stops[ok]
        stops = stops - (buf[np.maximum(stops - 1, 0)] == ord("\r"))  # CRLF files
        spans.append(np.stack([starts + pos, stops + pos], axis=1))
        pos = end
    out = np.concatenate(spans) if spans else np.zeros((0, 2), np.int64)
    if len(out):
        head = bytes(mm[out[0, 0]:out[0, 1]]).split()
        if head and head[0].lower() == b"smiles":  # a header line, e.g. "smiles name"
            out = out[1:]
    return out.astype(np.int64)


def _scan_sdf(mm: mmap.mmap | bytes, size: int) -> np.ndarray:
    """``(start, stop)`` of each SDF record, its ``$$$$`` line included."""
    starts, stops = [], []
    prev = 0
    for m in _SDF_END.finditer(mm):
        starts.append(prev)
        stop = m.end()
        stops.append(stop)
        prev = stop + 1 if stop < size and mm[stop:stop + 1] == b"\n" else stop
    if prev < size and bytes(mm[prev:size]).strip():  # a last record without its $$$$ line
        starts.append(prev)
        stops.append(size)
    return np.stack([np.array(starts, np.int64), np.array(stops, np.int64)], axis=1) if starts else \
        np.zeros((0, 2), np.int64)


def scan(path: str, kind: str) -> np.ndarray:
    """Return the ``(n, 2)`` int64 byte spans of the entries of the library ``path``.

    Byte patterns only (newlines, ``$$$$`` lines): no entry is parsed as a molecule.
    """
    size = os.path.getsize(path)
    if size == 0:
        return np.zeros((0, 2), np.int64)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        return _scan_smiles(mm, size) if kind == "smi" else _scan_sdf(mm, size)


@dataclass(frozen=True)
class IndexInfo:
    """What an index says about the library it was built from."""

    library: str      # absolute path
    kind: str         # "smi" or "sdf"
    size: int         # bytes
    mtime_ns: int
    sha256: str
    count: int        # entries
    created: str      # ISO 8601 UTC

    def to_attrs(self) -> dict[str, object]:
        """The HDF5 root attributes of the index file."""
        return {"format": INDEX_FORMAT, "format_version": 1, **self.__dict__}


def _stat(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def build_index(library: str, index_path: str) -> IndexInfo:
    """Scan ``library`` and write its index to ``index_path`` (atomically); return what it holds.

    Raises:
        ValueError: when the library has an unknown suffix, is missing, or has no entry.
    """
    kind = library_kind(library)
    size, mtime = _stat(library)
    digest = sha256(library)
    spans = scan(library, kind)
    if size != _stat(library)[0]:
        raise ValueError(f"--library {library!r} changed while it was being indexed; try again")
    if len(spans) == 0:
        what = "no SMILES line" if kind == "smi" else "no SDF record"
        raise ValueError(f"--library {library!r} has {what}; expected "
                         + ("one ligand a line: SMILES then an optional name" if kind == "smi"
                            else "SDF records, each ending with a $$$$ line"))
    info = IndexInfo(os.path.abspath(library), kind, size, mtime, digest, int(len(spans)),
                     datetime.now(timezone.utc).isoformat(timespec="seconds"))
    directory = os.path.dirname(os.path.abspath(index_path))
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(index_path) + ".", suffix=".tmp", dir=directory)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; other users of the run directory read it too
        with h5py.File(tmp, "w") as f:
            f.attrs.update(info.to_attrs())
            f.create_dataset("spans", data=spans)
        os.replace(tmp, index_path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return info


def _read_info(index_path: str) -> IndexInfo | None:
    try:
        with h5py.File(index_path, "r") as f:
            a = dict(f.attrs)
    except OSError:
        return None
    if a.get("format") != INDEX_FORMAT:
        return None
    return IndexInfo(str(a["library"]), str(a["kind"]), int(a["size"]), int(a["mtime_ns"]), str(a["sha256"]),
                     int(a["count"]), str(a["created"]))


def check_index(library: str, index_path: str) -> tuple[IndexInfo | None, str]:
    """Compare an existing index with the library as it is now.

    Returns:
        ``(info, "")`` when the index is current (the library's size and time match, or
        its content hashes the same); ``(None, why)`` when there is no usable index or the
        library changed; ``why`` says what differs.
    """
    if not os.path.exists(index_path):
        return None, "no index yet"
    info = _read_info(index_path)
    if info is None:
        return None, f"{index_path!r} is not a dock_like library index"
    if info.library != os.path.abspath(library):
        return None, f"the index is of {info.library!r}, not of {os.path.abspath(library)!r}"
    size, mtime = _stat(library)
    if (size, mtime) == (info.size, info.mtime_ns):
        return info, ""
    digest = sha256(library)
    if digest == info.sha256:  # touched or copied, same bytes
        return info, ""
    return None, (f"the library changed since its index was built on {info.created} "
                  f"(sha256 {info.sha256[:12]}... then, {digest[:12]}... now; {info.size} then, {size} bytes now)")


def open_index(library: str, index_path: str, rebuild: bool = True) -> tuple[IndexInfo, str]:
    """Return the index of ``library`` at ``index_path``, building it when missing or stale.

    Args:
        library: the library file.
        index_path: where the index lives (beside the checkpoint or the output).
        rebuild: when False, a stale index is an error instead of being rebuilt.

    Returns:
        ``(info, note)``: ``note`` is "" when an existing index was reused, else why it was built.

    Raises:
        ValueError: when the library is missing or empty, the index path holds a foreign
            file, or (``rebuild=False``) the library changed since the index was built.
    """
    if not os.path.isfile(library):
        raise ValueError(f"--library {library!r}: no such file; expected a SMILES (.smi) or SDF (.sdf) file of ligands")
    library_kind(library)
    info, why = check_index(library, index_path)
    if info is not None:
        return info, ""
    if os.path.exists(index_path) and _read_info(index_path) is None:
        raise ValueError(f"library index path {index_path!r} exists and is not a dock_like library index; "
                         f"it will not be overwritten (move it away)")
    if not rebuild and why != "no index yet":
        raise ValueError(why)
    return build_index(library, index_path), why


@dataclass(frozen=True)
class Entry:
    """One ligand as stored in the library: its bytes, not yet parsed."""

    index: int   # 0-based ligand (task) id
    kind: str    # "smi" or "sdf"
    text: str    # the SMILES line or the whole SDF record


@dataclass
class Library:
    """A library read through its index: ``len()`` entries, ``entry(i)`` reads one with one pread.

    ``bytes_read`` and ``entries_read`` count what this process read from the library file.
    """

    path: str
    info: IndexInfo
    index_path: str
    bytes_read: int = 0
    entries_read: int = 0
    _spans: h5py.Dataset | None = field(default=None, repr=False)
    _file: h5py.File | None = field(default=None, repr=False)
    _fd: int | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return self.info.count

    def span(self, i: int) -> tuple[int, int]:
        """Byte span ``(start, stop)`` of entry ``i`` (reads one row of the index)."""
        if not 0 <= i < self.info.count:
            raise IndexError(f"ligand {i} is outside the library's {self.info.count} entries")
        if self._spans is None:
            self._file = h5py.File(self.index_path, "r")
            self._spans = self._file["spans"]
        start, stop = self._spans[i]
        return int(start), int(stop)

    def entry(self, i: int) -> Entry:
        """Read entry ``i`` (0-based) from the library file."""
        start, stop = self.span(i)
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        data = os.pread(self._fd, stop - start, start)
        self.bytes_read += len(data)
        self.entries_read += 1
        return Entry(i, self.info.kind, data.decode("utf-8", errors="replace"))

    def close(self) -> None:
        """Close the library and index files (reopened on the next read)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._file is not None:
            self._file.close()
            self._file, self._spans = None, None

    def describe(self) -> str:
        """One line for logs: the file, its format and size."""
        return json.dumps({"library": self.path, "kind": self.info.kind, "entries": self.info.count})
