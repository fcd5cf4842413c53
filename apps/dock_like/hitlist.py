"""The hit list: an HDF5 file of every ligand's best score and pose; the top-k table; SDF export.

``python -m apps.dock_like.hitlist HITS.h5 [--top K] [--export-sdf TOP.sdf]`` prints the
table of a finished run and writes its top poses, without running anything again.

The file (h5py) has one row per ligand, sorted by score (best first, skipped ligands
last). Datasets: ``ligand`` (task id), ``record`` (1-based SDF record), ``name``,
``score``, ``vdw``, ``elec``, ``hbond``, ``intra``, ``outside``, ``n_evals``,
``seconds``, ``n_heavy``, ``n_torsions``, ``status`` (0 docked, 1 skipped),
``pose`` (n, 7: centroid x, y, z in Å and orientation quaternion w, x, y, z) and
``torsions`` (n, 24, radians from the library conformer, NaN-padded). Root attributes:
``format`` (``FORMAT``), the library and pocket paths and SHA-256 digests, and the run's
options as JSON. A pose is rebuilt from the library record with :mod:`search`.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
from datetime import datetime, timezone
from typing import Any, Sequence

import h5py
import numpy as np
from rdkit import Chem
from rdkit.Geometry import Point3D

__all__ = ["FORMAT", "FIELDS", "SCALARS", "write_hits", "read_hits", "check_out_path", "check_sdf_path",
           "top_table", "export_sdf", "sha256", "main"]

FORMAT = "dock_like hit list"
SCALARS = ("score", "vdw", "elec", "hbond", "intra", "outside", "n_evals", "seconds", "n_heavy", "n_torsions",
           "n_starts", "generated_3d", "status")
MAX_TORSIONS = 24
FIELDS = SCALARS + ("tx", "ty", "tz", "qw", "qx", "qy", "qz") + tuple(f"torsion_{i}" for i in range(1, MAX_TORSIONS + 1))
_COUNTS = ("n_evals", "n_heavy", "n_torsions", "n_starts", "generated_3d", "status")
_SDF_TAG = "<dock_like_score>"


def sha256(path: str) -> str:
    """Return the hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _is_hit_list(path: str) -> bool:
    try:
        with h5py.File(path, "r") as f:
            return f.attrs.get("format") == FORMAT
    except OSError:
        return False


def check_out_path(path: str) -> None:
    """Refuse an output path that would overwrite something that is not a dock_like hit list.

    Raises:
        ValueError: naming the path and what was expected.
    """
    full = os.path.abspath(path)
    if os.path.isdir(full):
        raise ValueError(f"--out {path!r} is a directory; expected a file path such as hits.h5")
    if not os.path.isdir(os.path.dirname(full)):
        raise ValueError(f"--out {path!r}: directory {os.path.dirname(full)!r} does not exist")
    if os.path.exists(full) and not _is_hit_list(full):
        raise ValueError(f"--out {path!r} exists and is not a dock_like hit list; it will not be overwritten "
                         f"(choose another path)")


def check_sdf_path(path: str, library: str | None = None) -> None:
    """Refuse an SDF export path that is the library or an existing file this app did not write.

    Raises:
        ValueError: naming the path and what was expected.
    """
    full = os.path.abspath(path)
    if library is not None and full == os.path.abspath(library):
        raise ValueError(f"--export-sdf {path!r} is the ligand library; expected another path")
    if os.path.isdir(full) or not os.path.isdir(os.path.dirname(full)):
        raise ValueError(f"--export-sdf {path!r}: expected a file path in an existing directory")
    if os.path.exists(full) and os.path.getsize(full) > 0:
        with open(full, "rb") as f:
            ours = _SDF_TAG.encode() in f.read(1 << 16)
        if not ours:
            raise ValueError(f"--export-sdf {path!r} exists and is not a dock_like export; it will not be "
                             f"overwritten (choose another path)")


def _atomic_write(path: str, suffix: str, write: Any) -> None:
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=suffix, dir=os.path.dirname(os.path.abspath(path)))
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; the output should read like any file
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_hits(path: str, ids: np.ndarray, values: np.ndarray, names: Sequence[str], records: Sequence[int],
               attrs: dict[str, Any]) -> np.ndarray:
    """Write the hit list atomically; return the row order used (best score first).

    Args:
        path: the .h5 path (checked with :func:`check_out_path`).
        ids: (n,) ligand ids (task ids).
        values: (n, len(FIELDS)) committed results, row ``i`` for ``ids[i]``.
        names, records: per ligand id, its name and 1-based SDF record.
        attrs: root attributes (library, pocket, options...).

    Raises:
        ValueError: when ``path`` is not writable as a hit list, or ``values`` has the wrong width.
    """
    check_out_path(path)
    values = np.asarray(values, dtype=float).reshape(len(ids), -1)
    if values.shape[1] != len(FIELDS):
        raise ValueError(f"hit list rows must have {len(FIELDS)} numbers ({', '.join(FIELDS[:3])}, ...), got {values.shape[1]}")
    score = np.where(np.isnan(values[:, 0]), np.inf, values[:, 0])
    order = np.lexsort((np.asarray(ids), score))
    v, lig = values[order], np.asarray(ids, dtype=np.int64)[order]
    col = {name: v[:, i] for i, name in enumerate(FIELDS)}

    def write(tmp: str) -> None:
        with h5py.File(tmp, "w") as f:
            f.attrs["format"] = FORMAT
            f.attrs["format_version"] = 1
            f.attrs["created"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
            f.attrs["score_units"] = "kcal/mol-like, lower is better; not a binding free energy"
            for key, value in attrs.items():
                f.attrs[key] = value
            f.create_dataset("ligand", data=lig)
            f.create_dataset("record", data=np.asarray(records, dtype=np.int64)[lig])
            f.create_dataset("name", data=np.array([names[i] for i in lig], dtype=object), dtype=h5py.string_dtype())
            for name in SCALARS:
                data = col[name]
                if name in _COUNTS:  # skipped ligands have no counts: -1
                    data = np.nan_to_num(data, nan=-1.0).astype(np.int64)
                f.create_dataset(name, data=data)
            f.create_dataset("pose", data=v[:, len(SCALARS):len(SCALARS) + 7])
            f.create_dataset("torsions", data=v[:, len(SCALARS) + 7:])

    _atomic_write(path, ".tmp", write)
    return order


def read_hits(path: str) -> dict[str, Any]:
    """Read a hit list: every dataset as an array, and ``attrs``.

    Raises:
        ValueError: when ``path`` is missing or not a dock_like hit list.
    """
    if not os.path.isfile(path) or not _is_hit_list(path):
        raise ValueError(f"{path!r} is not a dock_like hit list (expected an .h5 written by apps.dock_like)")
    with h5py.File(path, "r") as f:
        out: dict[str, Any] = {k: f[k][()] for k in f}
        out["attrs"] = dict(f.attrs)
    out["name"] = [n.decode() if isinstance(n, bytes) else str(n) for n in out["name"]]
    return out


def top_table(hits: dict[str, Any], k: int) -> str:
    """Return the top-``k`` docked ligands as a text table."""
    ok = np.flatnonzero(hits["status"] == 0)[:k]
    head = f"{'rank':>4}  {'ligand':<22} {'score':>8} {'vdw':>7} {'elec':>7} {'hbond':>7} {'intra':>6} " \
           f"{'heavy':>5} {'tors':>4} {'evals':>7} {'time s':>7}"
    lines = [f"top {len(ok)} of {int((hits['status'] == 0).sum())} docked ligands (score: kcal/mol-like, lower is better)",
             head, "-" * len(head)]
    for r, i in enumerate(ok, start=1):
        lines.append(f"{r:>4}  {hits['name'][i][:22]:<22} {hits['score'][i]:8.2f} {hits['vdw'][i]:7.2f} "
                     f"{hits['elec'][i]:7.2f} {hits['hbond'][i]:7.2f} {hits['intra'][i]:6.2f} {hits['n_heavy'][i]:5d} "
                     f"{hits['n_torsions'][i]:4d} {hits['n_evals'][i]:7d} {hits['seconds'][i]:7.3f}")
    skipped = int((hits["status"] != 0).sum())
    if skipped:
        lines.append(f"{skipped} ligand(s) skipped (see the warnings above; status 1 in the hit list)")
    return "\n".join(lines)


def export_sdf(path: str, hits: dict[str, Any], k: int, rebuild: Any) -> int:
    """Write the top-``k`` docked poses as SDF; return how many.

    Args:
        path: the .sdf path (checked with :func:`check_sdf_path`).
        hits: a hit list (:func:`read_hits`).
        k: how many poses.
        rebuild: ``rebuild(row) -> (mol, coords)``: the prepared molecule of that row's
            ligand and its atoms' coordinates in the stored pose.
    """
    check_sdf_path(path)
    rows = np.flatnonzero(hits["status"] == 0)[:k]

    def write(tmp: str) -> None:
        writer = Chem.SDWriter(tmp)
        for rank, i in enumerate(rows, start=1):
            mol, xyz = rebuild(i)
            mol = Chem.Mol(mol)
            conf = mol.GetConformer()
            for a, (x, y, z) in enumerate(xyz.tolist()):
                conf.SetAtomPosition(a, Point3D(x, y, z))
            mol.SetProp("_Name", hits["name"][i])
            for key in ("score", "vdw", "elec", "hbond", "intra"):
                mol.SetDoubleProp(f"dock_like_{key}", float(hits[key][i]))
            mol.SetIntProp("dock_like_rank", rank)
            mol.SetIntProp("dock_like_record", int(hits["record"][i]))
            writer.write(mol)
        writer.close()

    _atomic_write(path, ".sdf.tmp", write)
    return len(rows)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry: print a hit list's top table, optionally export its top poses."""
    p = argparse.ArgumentParser(prog="python -m apps.dock_like.hitlist", description="Show a dock_like hit list.")
    p.add_argument("hits", help="hit list .h5 written by apps.dock_like")
    p.add_argument("--top", type=int, default=20, help="rows to show and poses to export (default 20)")
    p.add_argument("--export-sdf", metavar="F.sdf", help="write the top poses as SDF")
    a = p.parse_args(argv)
    try:
        hits = read_hits(a.hits)
        print(top_table(hits, a.top))
        if a.export_sdf:
            from . import rebuild_from_hits
            n = export_sdf(a.export_sdf, hits, a.top, rebuild_from_hits(hits))
            print(f"wrote {n} pose(s) to {a.export_sdf}")
    except ValueError as exc:
        print(f"dock_like: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

