"""The pose store: each docked ligand's text (name, SMILES, best pose, or why it failed) beside the checkpoint.

nlevel commits a fixed tuple of numbers with each completion. A pose, a name and a reason
are text, so a process appends them as one SDF record to its own file in the store
directory, ``fsync``-s it, and returns the record's *address* among its numbers:
``(file id, byte offset, length, CRC-32)``. The checkpoint therefore commits, with the
completion, a reference to exactly the bytes written for that completion. A ligand docked
twice (its first completion was lost with a killed process) leaves an unreferenced record
behind, never a second row: the hit list is built from the committed addresses alone.

Files are ``poses-<8 hex>.sdf``, the hex part being the file id (random, created with
``O_EXCL``). Every record is a valid SDF molecule (no atoms for a failed ligand), so the
files also read as SDF.
"""

from __future__ import annotations

import io
import os
import zlib
from dataclasses import dataclass

from rdkit import Chem

__all__ = ["Address", "PoseStore", "read_record", "record_block", "NO_ADDRESS"]


@dataclass(frozen=True)
class Address:
    """Where one record is: file id, byte offset, length and CRC-32 of its bytes (all exact in float64)."""

    file: int
    offset: int
    length: int
    crc: int

    def numbers(self) -> tuple[float, float, float, float]:
        """The address as the four result numbers committed by nlevel."""
        return float(self.file), float(self.offset), float(self.length), float(self.crc)

    @classmethod
    def from_numbers(cls, values: tuple[float, ...] | list[float]) -> "Address | None":
        """Rebuild an address from committed numbers; None when they hold no address (NaN)."""
        if any(v != v for v in values):
            return None
        f, o, n, c = (int(v) for v in values)
        return cls(f, o, n, c)


NO_ADDRESS = (float("nan"),) * 4


def _file_name(file_id: int) -> str:
    return f"poses-{file_id:08x}.sdf"


def record_block(mol: Chem.Mol | None, props: dict[str, object]) -> bytes:
    """Return one SDF record: ``mol`` (or an empty molecule) with ``props`` as SD properties (floats to 3 decimals)."""
    m = Chem.Mol(mol) if mol is not None else Chem.Mol()
    for key, value in props.items():
        if isinstance(value, float):
            m.SetProp(key, f"{value:.3f}")  # scores are meaningful to 3 decimals (Vina's own precision)
        elif isinstance(value, int) and not isinstance(value, bool):
            m.SetIntProp(key, value)
        else:
            m.SetProp(key, str(value).replace("\n", " "))
    m.SetProp("_Name", str(props.get("dock_like_name", "")).replace("\n", " "))
    text = io.StringIO()
    writer = Chem.SDWriter(text)
    writer.SetKekulize(False)
    writer.write(m)
    writer.close()
    return text.getvalue().encode()


class PoseStore:
    """This process's file in the store directory; :meth:`append` returns the record's address.

    Args:
        directory: the store directory (created if missing).
        durable: fsync each record before returning its address (the default; a record
            must be on disk before the checkpoint can commit its address).
    """

    def __init__(self, directory: str, durable: bool = True) -> None:
        os.makedirs(directory, exist_ok=True)
        self.directory = directory
        self.durable = durable
        self._fd: int | None = None
        self.file_id = 0
        self._size = 0

    def _open(self) -> int:
        while self._fd is None:
            file_id = int.from_bytes(os.urandom(4), "little")
            try:
                self._fd = os.open(os.path.join(self.directory, _file_name(file_id)),
                                   os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o666)
            except FileExistsError:
                continue
            self.file_id, self._size = file_id, 0
        return self._fd

    def append(self, block: bytes) -> Address:
        """Append one record; return its address once it is on disk."""
        fd = self._open()
        offset = self._size
        written = os.write(fd, block)
        while written < len(block):
            written += os.write(fd, block[written:])
        if self.durable:
            os.fsync(fd)
        self._size += len(block)
        return Address(self.file_id, offset, len(block), zlib.crc32(block))

    def close(self) -> None:
        """Close the file (a later append opens a new one)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_record(directory: str, address: Address) -> bytes:
    """Return the bytes at ``address``.

    Raises:
        ValueError: when the file is missing, short, or the bytes' CRC differs (naming which).
    """
    path = os.path.join(directory, _file_name(address.file))
    try:
        with open(path, "rb") as f:
            f.seek(address.offset)
            data = f.read(address.length)
    except OSError as exc:
        raise ValueError(f"pose record file {path!r} cannot be read ({exc})") from exc
    if len(data) != address.length or zlib.crc32(data) != address.crc:
        raise ValueError(f"pose record at {path!r} offset {address.offset} is truncated or changed (CRC mismatch)")
    return data
