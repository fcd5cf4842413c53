"""The hit list: an HDF5 file with one row per ligand (best first), the top-k table, SDF export.

``python -m apps.dock_like.hitlist HITS.h5 [--top K] [--export-sdf TOP.sdf]`` prints the
table of a finished screen and writes its top poses, without docking anything again.

The file (h5py, ``format`` = :data:`FORMAT`, ``format_version`` 2) has one row per
committed ligand, sorted by score (best first; failed ligands last). Datasets: ``id``
(the ligand's 0-based position in the library, the task id), ``name``, ``smiles``,
``score`` (kcal/mol for Vina; lower is better), ``status`` (0 docked, 1 failed, 2 the
pose record was lost), ``reason`` (why it failed, '' when docked), ``pose_scores`` (n, 9:
the scores of the poses Vina kept, NaN-padded), ``pose`` (the best pose as an SDF record
with all hydrogens, '' when failed) and every other number of :data:`FIELDS`. Root
attributes: the engine, the receptor or pocket, the box, the library and its SHA-256,
and the run's options as JSON.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from datetime import datetime, timezone
from typing import Any, Mapping, Sequence

import h5py
import numpy as np

__all__ = ["FORMAT", "FIELDS", "STORE_FIELDS", "write_hits", "read_hits", "check_out_path", "check_sdf_path",
           "top_table", "export_sdf", "record_props", "main"]

FORMAT = "dock_like hit list"
_POSES = 9
#: The numbers each task returns (nlevel commits them with its completion). The last four
#: are the address of the ligand's record in the pose store (:mod:`store`).
STORE_FIELDS = ("store_file", "store_offset", "store_length", "store_crc")
FIELDS: tuple[str, ...] = (
    "status", "score", "cpu_seconds", "seconds", "n_heavy", "n_rotatable", "stripped", "n_poses",
    *(f"pose_{k}" for k in range(1, _POSES + 1)),
    "inter", "intra", "vdw", "elec", "hbond", "outside", "n_evals", "n_starts", "generated_3d",
    *STORE_FIELDS,
)
_COUNTS = ("status", "n_heavy", "n_rotatable", "stripped", "n_poses", "n_evals", "n_starts", "generated_3d")
_SDF_TAG = "<dock_like_score>"
_PROP = re.compile(r"^>\s*<([^>]+)>.*\n(.*)$", re.M)


def record_props(record: str) -> dict[str, str]:
    """Return the SD properties of one SDF record (the first line of each value)."""
    return {m.group(1): m.group(2).strip() for m in _PROP.finditer(record)}


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


def write_hits(path: str, ids: np.ndarray, values: np.ndarray, texts: Mapping[str, Sequence[str]],
               attrs: dict[str, Any]) -> np.ndarray:
    """Write the hit list atomically; return the row order used (best score first, failed last).

    Args:
        path: the .h5 path (checked with :func:`check_out_path`).
        ids: (n,) ligand ids, each once.
        values: (n, len(FIELDS)) committed numbers, row ``i`` for ``ids[i]``.
        texts: per row (in the order of ``ids``): ``name``, ``smiles``, ``reason``, ``pose``.
        attrs: root attributes (engine, receptor, library...).

    Raises:
        ValueError: when ``path`` is not writable as a hit list, ``values`` has the wrong
            width, or an id appears twice.
    """
    check_out_path(path)
    ids = np.asarray(ids, dtype=np.int64)
    values = np.asarray(values, dtype=float).reshape(len(ids), -1)
    if values.shape[1] != len(FIELDS):
        raise ValueError(f"hit list rows must have {len(FIELDS)} numbers ({', '.join(FIELDS[:3])}, ...), got {values.shape[1]}")
    if np.unique(ids).size != ids.size:
        raise ValueError("a ligand id appears twice in the committed results; the hit list lists each ligand once")
    col = {name: values[:, i] for i, name in enumerate(FIELDS)}
    status = np.nan_to_num(col["status"], nan=1.0).astype(np.int64)
    score = np.where((status == 0) & ~np.isnan(col["score"]), col["score"], np.inf)
    order = np.lexsort((ids, score))

    def strings(name: str) -> np.ndarray:
        return np.array([texts[name][i] for i in order], dtype=object)

    def write(tmp: str) -> None:
        with h5py.File(tmp, "w") as f:
            f.attrs["format"] = FORMAT
            f.attrs["format_version"] = 2
            f.attrs["created"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
            for key, value in attrs.items():
                f.attrs[key] = value
            f.create_dataset("id", data=ids[order])
            text = h5py.string_dtype()
            for name in ("name", "smiles", "reason"):
                f.create_dataset(name, data=strings(name), dtype=text)
            f.create_dataset("pose", data=strings("pose"), dtype=text, compression="gzip", compression_opts=4)
            f.create_dataset("status", data=status[order])
            f.create_dataset("pose_scores", data=values[order][:, [FIELDS.index(f"pose_{k}") for k in range(1, _POSES + 1)]])
            for name in FIELDS:
                if name == "status" or name.startswith("pose_") or name in STORE_FIELDS:
                    continue
                data = col[name][order]
                if name in _COUNTS:  # failed ligands have no counts: -1
                    data = np.nan_to_num(data, nan=-1.0).astype(np.int64)
                f.create_dataset(name, data=data)

    _atomic_write(path, ".tmp", write)
    return order


def read_hits(path: str) -> dict[str, Any]:
    """Read a hit list: every dataset as an array (text as lists of str), and ``attrs``.

    Raises:
        ValueError: when ``path`` is missing or not a dock_like hit list of this format.
    """
    if not os.path.isfile(path) or not _is_hit_list(path):
        raise ValueError(f"{path!r} is not a dock_like hit list (expected an .h5 written by apps.dock_like)")
    with h5py.File(path, "r") as f:
        if int(f.attrs.get("format_version", 1)) != 2:
            raise ValueError(f"{path!r} is a dock_like hit list of format {f.attrs.get('format_version', 1)}; "
                             f"this version reads format 2 (re-run the screen to rewrite it)")
        out: dict[str, Any] = {k: f[k][()] for k in f}
        out["attrs"] = dict(f.attrs)
    for name in ("name", "smiles", "reason", "pose"):
        out[name] = [v.decode() if isinstance(v, bytes) else str(v) for v in out[name]]
    return out


def top_table(hits: dict[str, Any], k: int) -> str:
    """Return the top-``k`` docked ligands as a text table, and a count of the failed ones."""
    ok = np.flatnonzero(hits["status"] == 0)
    units = "kcal/mol" if hits["attrs"].get("engine") == "vina" else "kcal/mol-like"
    head = f"{'rank':>4}  {'id':>7}  {'ligand':<20} {'score':>8} {'heavy':>5} {'rot':>3} {'cpu s':>7}  smiles"
    lines = [f"top {min(k, ok.size)} of {ok.size} docked ligands (score: {units}, lower is better)", head,
             "-" * (len(head) + 30)]
    for r, i in enumerate(ok[:k], start=1):
        smiles = hits["smiles"][i]
        lines.append(f"{r:>4}  {hits['id'][i]:>7}  {hits['name'][i][:20]:<20} {hits['score'][i]:8.3f} "
                     f"{hits['n_heavy'][i]:5d} {hits['n_rotatable'][i]:3d} {hits['cpu_seconds'][i]:7.2f}  "
                     f"{smiles if len(smiles) <= 60 else smiles[:57] + '...'}")
    failed = np.flatnonzero(hits["status"] != 0)
    if failed.size:
        lines.append(f"{failed.size} ligand(s) failed (status and reason in the hit list), e.g. "
                     f"{hits['id'][failed[0]]} {hits['name'][failed[0]]!r}: {hits['reason'][failed[0]]}")
    return "\n".join(lines)


def _with_rank(record: str, rank: int) -> str:
    body = record.rstrip()
    if body.endswith("$$$$"):
        body = body[:-4].rstrip("\n")
    sep = "\n" if body.endswith("M  END") else "\n\n"  # a property value ends with a blank line
    return f"{body}{sep}>  <dock_like_rank>\n{rank}\n\n$$$$\n"


def export_sdf(path: str, hits: dict[str, Any], k: int) -> int:
    """Write the top-``k`` docked ligands' best poses as SDF (their scores as SD properties); return how many.

    Raises:
        ValueError: when ``path`` is not a place this app may write (:func:`check_sdf_path`).
    """
    check_sdf_path(path)
    rows = [i for i in np.flatnonzero(hits["status"] == 0) if hits["pose"][i]][:k]

    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            for rank, i in enumerate(rows, start=1):
                f.write(_with_rank(hits["pose"][i], rank))

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
            n = export_sdf(a.export_sdf, hits, a.top)
            print(f"wrote {n} pose(s) to {a.export_sdf}")
    except ValueError as exc:
        print(f"dock_like: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
