"""apps.dock_like: docking-style virtual screening on nlevel, one ligand per task.

``mpiexec -n N python -m nlevel.run apps.dock_like [--library F.sdf] [--pocket P.pdb]
[--out hits.h5] [--top 20] [--export-sdf top.sdf] [--checkpoint run.h5]``

Every rank reads the library (:mod:`ligands`) and the pocket (:mod:`pocket`) and builds
the receptor grids (:mod:`grids`) in ``setup``. Task ``i`` docks ligand ``i`` (the
``i``-th valid SDF record) by :mod:`search` and returns its score, pose and cost as the
numbers of :data:`result_fields`, which nlevel commits with the task's completion. When
every ligand is committed, ``finish`` (rank 0) writes the HDF5 hit list (:mod:`hitlist`),
prints the top-k table and optionally exports the top poses as SDF.

A ligand's result depends only on the library, the pocket, the options and its own seed,
so 1, 4 or 7 processes, and any kill and restart, give the same scores.
This is a showcase and a realistic workload, not a validated docking code: see README.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from . import hitlist
from .grids import Grids, build_grids
from .hitlist import FIELDS, MAX_TORSIONS
from .ligands import Library, PrepareError, ligand_seed, load_library, prepare
from .pocket import Pocket, read_pocket
from .search import Pose, dock, place

__all__ = ["add_arguments", "setup", "total", "do_job", "finish", "result_fields", "rebuild_from_hits", "DATA"]

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
result_fields: tuple[str, ...] = FIELDS
log = logging.getLogger("apps.dock_like")
_MAX_WARNINGS = 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the app's options (they also form the checkpoint's fingerprint)."""
    parser.add_argument("--library", default=os.path.join(DATA, "library.sdf"), metavar="F.sdf",
                        help="ligand library, SDF (default: the shipped 56 drugs and fragments)")
    parser.add_argument("--pocket", default=os.path.join(DATA, "pocket.pdb"), metavar="P.pdb",
                        help="receptor pocket atoms, PDB (default: the shipped synthetic pocket)")
    parser.add_argument("--center", metavar="X,Y,Z", help="grid centre in Å (default: the pocket atoms' centroid)")
    parser.add_argument("--box", type=float, default=28.0, help="grid edge in Å (default 28)")
    parser.add_argument("--spacing", type=float, default=0.4, help="grid spacing in Å (default 0.4)")
    parser.add_argument("--starts", type=int, default=1,
                        help="random starts per 3 rotatable bonds, plus one (default 1)")
    parser.add_argument("--maxiter", type=int, default=15, help="BFGS iterations per start (default 15)")
    parser.add_argument("--max-torsions", type=int, default=MAX_TORSIONS,
                        help=f"rotatable bonds searched per ligand, at most {MAX_TORSIONS} (default {MAX_TORSIONS})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the pose search, mixed with each ligand's (default 0)")
    parser.add_argument("--out", default="hits.h5", metavar="F.h5", help="HDF5 hit list (default hits.h5)")
    parser.add_argument("--top", type=int, default=20, help="rows of the final table and poses exported (default 20)")
    parser.add_argument("--export-sdf", metavar="F.sdf", help="write the top poses as SDF")


#: Options that only shape the output: a resumed run may change them.
OUTPUT_OPTIONS = ("out", "top", "export_sdf")


def fingerprint(options: argparse.Namespace) -> dict[str, object]:
    """What identifies a screening run: the search options and the inputs' content (after setup)."""
    run = _state()
    fp = {k: v for k, v in vars(options).items() if k in _SEARCH_OPTIONS}
    fp["library_sha256"] = run.library_digest
    fp["pocket_sha256"] = run.pocket_digest
    return fp


_SEARCH_OPTIONS = ("library", "pocket", "center", "box", "spacing", "starts", "maxiter", "max_torsions", "seed")


@dataclass
class _Run:
    options: argparse.Namespace
    library: Library
    pocket: Pocket
    grids: Grids
    library_digest: str = ""
    pocket_digest: str = ""


_run: _Run | None = None


def _rank() -> int:
    # setup runs on every rank; only rank 0 should print the library's warnings.
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        return int(mpi.COMM_WORLD.Get_rank())
    return 0


def _parse_center(text: str | None, pocket: Pocket) -> np.ndarray:
    if text is None:
        return pocket.centroid
    try:
        xyz = np.array([float(v) for v in text.split(",")])
    except ValueError:
        xyz = np.array([])
    if xyz.shape != (3,) or not np.isfinite(xyz).all():
        raise ValueError(f"--center must be three numbers X,Y,Z in Å, got {text!r}")
    return xyz


def _check_numbers(o: argparse.Namespace) -> None:
    if o.starts < 1:
        raise ValueError(f"--starts must be >= 1, got {o.starts}")
    if o.maxiter < 1:
        raise ValueError(f"--maxiter must be >= 1, got {o.maxiter}")
    if not 0 <= o.max_torsions <= MAX_TORSIONS:
        raise ValueError(f"--max-torsions must be in [0, {MAX_TORSIONS}], got {o.max_torsions}")
    if o.top < 0:
        raise ValueError(f"--top must be >= 0, got {o.top}")


def setup(options: argparse.Namespace) -> None:
    """Read the library and the pocket, build the grids, check the output paths (every rank).

    Bad records are skipped with a warning naming them (printed by rank 0).

    Raises:
        ValueError: for a bad option, a missing or unparsable pocket, a library with no
            valid record, or an output path that would overwrite a foreign file.
    """
    global _run
    _check_numbers(options)
    library = load_library(options.library)
    pocket = read_pocket(options.pocket)
    grids = build_grids(pocket, _parse_center(options.center, pocket), options.box, options.spacing)
    hitlist.check_out_path(options.out)
    if options.export_sdf:
        hitlist.check_sdf_path(options.export_sdf, options.library)
    options.library, options.pocket = library.path, pocket.path
    if _rank() == 0:
        for s in library.skipped[:_MAX_WARNINGS]:
            log.warning("dock_like: warning: skipping %s %s", os.path.basename(library.path), s)
        if len(library.skipped) > _MAX_WARNINGS:
            log.warning("dock_like: warning: ... and %d more bad records skipped", len(library.skipped) - _MAX_WARNINGS)
    _run = _Run(options, library, pocket, grids, hitlist.sha256(library.path), hitlist.sha256(pocket.path))


def total(options: argparse.Namespace) -> int:
    """Return the number of ligands (valid records) in the library."""
    return len(_state().library)


def _state() -> _Run:
    if _run is None:
        raise RuntimeError("apps.dock_like: setup(options) must run before total() or do_job()")
    return _run


def _row(**values: Any) -> tuple[float, ...]:
    row = [math.nan] * len(FIELDS)
    for name, value in values.items():
        if name == "torsions":
            for k, angle in enumerate(value):
                row[FIELDS.index(f"torsion_{k + 1}")] = float(angle)
        else:
            row[FIELDS.index(name)] = float(value)
    return tuple(row)


def do_job(task_id: int) -> tuple[float, ...]:
    """Dock ligand ``task_id``; return its numbers in the order of :data:`result_fields`.

    A ligand that cannot be prepared (no 3D coordinates can be generated) is skipped: a
    warning names it and its row has status 1 and a NaN score.
    """
    run = _state()
    t0 = time.perf_counter()
    name, record = run.library.names[task_id], run.library.records[task_id]
    seed = ligand_seed(name, record, run.options.seed)
    try:
        lig = prepare(run.library.mol(task_id), name, seed, run.options.max_torsions)
    except PrepareError as exc:
        log.warning("dock_like: warning: skipping ligand %d %r (record %d): %s", task_id, name, record, exc)
        return _row(status=1, n_evals=0, seconds=time.perf_counter() - t0)
    d = dock(lig, run.grids, seed, starts=run.options.starts, maxiter=run.options.maxiter)
    t = d.pose.t
    return _row(score=d.score, **d.terms, n_evals=d.n_evals, seconds=time.perf_counter() - t0,
                n_heavy=lig.n_heavy, n_torsions=len(lig.torsions), n_starts=d.n_starts,
                generated_3d=lig.generated_3d, status=0, tx=t[0], ty=t[1], tz=t[2], qw=d.pose.q[0],
                qx=d.pose.q[1], qy=d.pose.q[2], qz=d.pose.q[3], torsions=d.pose.theta)


def _rebuild(library: Library, seed: int, max_torsions: int, ligand: int, pose_row: np.ndarray,
             torsions: np.ndarray) -> tuple[Any, np.ndarray]:
    name, record = library.names[ligand], library.records[ligand]
    lig = prepare(library.mol(ligand), name, ligand_seed(name, record, seed), max_torsions)
    theta = torsions[: len(lig.torsions)]
    return lig.mol, place(lig, Pose(pose_row[:3], pose_row[3:7], theta))


def rebuild_from_hits(hits: dict[str, Any]) -> Callable[[int], tuple[Any, np.ndarray]]:
    """Return ``rebuild(row) -> (mol, coords)`` for a hit list read by :func:`hitlist.read_hits`.

    Raises:
        ValueError: when the library the hit list was made from is missing or changed.
    """
    attrs = hits["attrs"]
    path = str(attrs["library"])
    if not os.path.isfile(path) or hitlist.sha256(path) != attrs["library_sha256"]:
        raise ValueError(f"the hit list's library {path!r} is missing or changed since the run; "
                         f"poses can only be rebuilt from the same library")
    library = load_library(path)
    opts = json.loads(attrs["options"])
    return lambda i: _rebuild(library, int(opts["seed"]), int(opts["max_torsions"]), int(hits["ligand"][i]),
                              hits["pose"][i], hits["torsions"][i])


def finish(ids: np.ndarray, values: np.ndarray, options: argparse.Namespace) -> None:
    """Rank 0, after every ligand is committed: write the hit list, print the top table, export SDF."""
    run = _state()
    ids = np.asarray(ids, dtype=np.int64)
    values = np.asarray(values, dtype=float).reshape(ids.size, len(FIELDS))
    opts = {k: v for k, v in vars(options).items() if k in _option_names()}
    attrs = {
        "app": "apps.dock_like",
        "library": run.library.path, "library_sha256": hitlist.sha256(run.library.path),
        "pocket": run.pocket.path, "pocket_sha256": hitlist.sha256(run.pocket.path),
        "n_records": run.library.n_records, "n_skipped_records": len(run.library.skipped),
        "grid_centre": run.grids.centre, "options": json.dumps(opts, sort_keys=True, default=str),
    }
    hitlist.write_hits(options.out, ids, values, run.library.names, run.library.records, attrs)
    hits = hitlist.read_hits(options.out)
    print(hitlist.top_table(hits, options.top), flush=True)
    generated = int((hits["generated_3d"] == 1).sum())
    if generated:
        print(f"{generated} ligand(s) had no 3D coordinates in the library; generated with RDKit ETKDG + MMFF", flush=True)
    print(f"hit list: {os.path.abspath(options.out)} ({ids.size} ligands)", flush=True)
    if options.export_sdf:
        rebuild = lambda i: _rebuild(run.library, options.seed, options.max_torsions, int(hits["ligand"][i]),  # noqa: E731
                                     hits["pose"][i], hits["torsions"][i])
        n = hitlist.export_sdf(options.export_sdf, hits, options.top, rebuild)
        print(f"top {n} pose(s): {os.path.abspath(options.export_sdf)}", flush=True)


def _option_names() -> set[str]:
    probe = argparse.ArgumentParser(add_help=False)
    add_arguments(probe)
    return {a.dest for a in probe._actions}
