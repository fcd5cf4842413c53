"""apps.dock_like: virtual screening on nlevel, one ligand per task, with AutoDock Vina or a built-in score.

``mpiexec -n N python -m nlevel.run apps.dock_like --engine vina --target ABL1 --library F.smi
[--exhaustiveness 8] [--out hits.h5] [--top 20] [--export-sdf top.sdf] [--checkpoint run.h5]``

In ``setup`` rank 0 indexes the library once (:mod:`library`: byte offsets, stored beside
the checkpoint, reused by every rank and every resume), every rank starts its engine
(:mod:`vina_engine`: a helper process holding Vina's maps; or :mod:`builtin_engine`).
Task ``i`` reads ligand ``i``'s bytes alone, docks it, appends its best pose (or why it
failed) to this process's file in the pose store (:mod:`store`) and returns its numbers
(:data:`result_fields`) with the record's address; nlevel commits both with the task's
completion. ``finish`` (rank 0) builds the HDF5 hit list from the committed numbers and
the records they address (:mod:`hitlist`), so a ligand docked twice across a kill and a
resume is listed once.
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .receptor import require

try:  # both engines read molecules with RDKit: say which extra brings it, in one line
    require("rdkit", why="apps.dock_like")
except ValueError as _missing:
    raise ImportError(str(_missing)) from None

from . import hitlist  # noqa: E402
from .hitlist import FIELDS, STORE_FIELDS  # noqa: E402
from .library import Library, open_index, sha256  # noqa: E402
from .receptor import Receptor, check_pdbqt, load_target, parse_triple  # noqa: E402
from .store import Address, PoseStore, read_record  # noqa: E402

__all__ = ["add_arguments", "setup", "total", "do_job", "finish", "fingerprint", "result_fields", "DATA",
           "work_dir", "ENGINES"]

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
ENGINES = ("builtin", "vina")
result_fields: tuple[str, ...] = FIELDS
log = logging.getLogger("apps.dock_like")
_MAX_POSES = 9


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the app's options (the search ones also form the checkpoint's fingerprint)."""
    a = parser.add_argument
    a("--engine", choices=ENGINES, default="builtin",
      help="vina: AutoDock Vina (needs the 'dock' extra); builtin: the app's own fast score (default)")
    a("--library", default=os.path.join(DATA, "library.sdf"), metavar="FILE",
      help="ligands: .smi (SMILES then an optional name per line) or .sdf (default: the shipped 56 drugs)")
    a("--limit", type=int, metavar="N", help="dock only the first N ligands of the library (a trial run)")
    a("--target", metavar="NAME", help="vina: one of dockstring's 58 receptors with its box, e.g. ABL1")
    a("--receptor", metavar="R.pdbqt", help="vina: your own receptor, PDBQT (with --center and --box)")
    a("--pocket", metavar="P.pdb", help="builtin: receptor pocket atoms, PDB (default: the shipped synthetic pocket)")
    a("--center", metavar="X,Y,Z", help="centre of the search box in Å (default: the target's, or the pocket's centroid)")
    a("--box", metavar="X,Y,Z", help="size of the search box in Å, or one size for a cube (default: the target's; "
                                     "builtin 28)")
    a("--exhaustiveness", type=int, default=8, help="vina: Monte Carlo runs per ligand (default 8, Vina's own)")
    a("--poses", type=int, default=_MAX_POSES, help=f"vina: poses kept per ligand, 1-{_MAX_POSES} (default {_MAX_POSES})")
    a("--seed", type=int, help="search seed (default: 1 for vina, which needs >= 1; 0 for builtin)")
    a("--spacing", type=float, default=0.4, help="builtin: grid spacing in Å (default 0.4)")
    a("--starts", type=int, default=1, help="builtin: random starts per 3 rotatable bonds, plus one (default 1)")
    a("--maxiter", type=int, default=15, help="builtin: BFGS iterations per start (default 15)")
    a("--max-torsions", type=int, default=24, help="builtin: rotatable bonds searched per ligand, 0-24 (default 24)")
    a("--out", default="hits.h5", metavar="F.h5", help="HDF5 hit list (default hits.h5)")
    a("--top", type=int, default=20, help="rows of the final table and poses exported (default 20)")
    a("--export-sdf", metavar="F.sdf", help="write the top poses with their scores as SDF")


#: Options that only shape the output: a resumed run may change them.
OUTPUT_OPTIONS = ("out", "top", "export_sdf")
_VINA_OPTIONS = ("engine", "library", "limit", "target", "receptor", "center", "box", "exhaustiveness", "poses", "seed")
_BUILTIN_OPTIONS = ("engine", "library", "limit", "pocket", "center", "box", "spacing", "starts", "maxiter",
                    "max_torsions", "seed")


@dataclass
class _Run:
    options: argparse.Namespace
    library: Library
    engine: Any                # VinaEngine or BuiltinEngine
    store: PoseStore
    work: str                  # the run's directory: index and pose store
    receptor_path: str
    receptor_digest: str
    attrs: dict[str, Any]      # what the hit list records about the run


_run: _Run | None = None


def work_dir(options: argparse.Namespace) -> str:
    """The run's directory beside the checkpoint (or the output): ``<checkpoint>.dock/``."""
    anchor = getattr(options, "checkpoint", None) or options.out
    return os.path.abspath(anchor) + ".dock"


def _comm() -> Any:
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        return mpi.COMM_WORLD
    return None


def _on_rank0(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on rank 0 only and give every rank its result or its ValueError (no rank hangs)."""
    comm = _comm()
    if comm is None or comm.Get_size() == 1:
        return fn()
    outcome: tuple[Any, str | None] = (None, None)
    if comm.Get_rank() == 0:
        try:
            outcome = (fn(), None)
        except ValueError as exc:
            outcome = (None, str(exc))
    value, error = comm.bcast(outcome, root=0)
    if error is not None:
        raise ValueError(error)
    return value


def _check_numbers(o: argparse.Namespace) -> None:
    for flag, value, low, high in (("--exhaustiveness", o.exhaustiveness, 1, 1024), ("--poses", o.poses, 1, _MAX_POSES),
                                   ("--starts", o.starts, 1, 1000), ("--maxiter", o.maxiter, 1, 100000),
                                   ("--max-torsions", o.max_torsions, 0, 24), ("--top", o.top, 0, 10**9)):
        if not low <= value <= high:
            raise ValueError(f"{flag} must be in [{low}, {high}], got {value}")
    if o.limit is not None and o.limit < 1:
        raise ValueError(f"--limit must be >= 1 ligands, got {o.limit}")
    if not (math.isfinite(o.spacing) and o.spacing > 0):
        raise ValueError(f"--spacing must be > 0 Å, got {o.spacing}")


def _vina_receptor(o: argparse.Namespace) -> Receptor:
    if o.pocket is not None:
        raise ValueError("--pocket is for --engine builtin; with --engine vina give --target NAME or --receptor R.pdbqt")
    if o.target and o.receptor:
        raise ValueError(f"give --target or --receptor, not both (got --target {o.target!r} and --receptor {o.receptor!r})")
    if o.target:
        r = load_target(o.target)
        center = parse_triple("--center", o.center, positive=False) if o.center else r.center
        box = parse_triple("--box", o.box, positive=True) if o.box else r.box
        return Receptor(r.path, center, box, r.target)
    if not o.receptor:
        raise ValueError("--engine vina needs a receptor: --target NAME (one of dockstring's, e.g. ABL1) or "
                         "--receptor R.pdbqt --center X,Y,Z --box X,Y,Z")
    if not o.center or not o.box:
        raise ValueError(f"--receptor {o.receptor!r} needs the search box: --center X,Y,Z and --box X,Y,Z in Å")
    center = parse_triple("--center", o.center, positive=False)
    box = parse_triple("--box", o.box, positive=True)
    check_pdbqt(o.receptor)
    return Receptor(os.path.abspath(o.receptor), center, box)


def _vina_engine(o: argparse.Namespace) -> tuple[Any, str, dict[str, Any]]:
    require("vina", "meeko", "gemmi", "rdkit")
    receptor = _vina_receptor(o)
    if o.seed is None:
        o.seed = 1
    if o.seed < 1:
        raise ValueError(f"--seed must be >= 1 with --engine vina (Vina's 0 means 'random'), got {o.seed}")
    o.center = ",".join(f"{v:g}" for v in receptor.center)
    o.box = ",".join(f"{v:g}" for v in receptor.box)
    from .vina_engine import VinaEngine, VinaSettings

    engine = VinaEngine(VinaSettings(receptor, o.exhaustiveness, o.poses, o.seed))  # started after the index
    attrs = {"target": receptor.target, "receptor": receptor.path, "center": receptor.center, "box": receptor.box,
             "exhaustiveness": o.exhaustiveness, "score_units": "kcal/mol (AutoDock Vina), lower is better"}
    return engine, receptor.path, attrs


def _builtin_engine(o: argparse.Namespace) -> tuple[Any, str, dict[str, Any]]:
    for flag in ("target", "receptor"):
        if getattr(o, flag):
            raise ValueError(f"--{flag} is for --engine vina; --engine builtin docks into --pocket P.pdb")
    from .builtin_engine import BuiltinEngine, BuiltinSettings
    from .grids import build_grids
    from .pocket import read_pocket

    o.pocket = o.pocket or os.path.join(DATA, "pocket.pdb")
    pocket = read_pocket(o.pocket)
    o.pocket = pocket.path
    center = np.array(parse_triple("--center", o.center, positive=False)) if o.center else pocket.centroid
    box = parse_triple("--box", o.box, positive=True) if o.box else (28.0,) * 3
    if len(set(box)) != 1:
        raise ValueError(f"--box for --engine builtin is one edge (its grid is a cube), got {o.box!r}")
    o.center, o.box = ",".join(f"{v:g}" for v in center), f"{box[0]:g}"
    o.seed = 0 if o.seed is None else o.seed
    grids = build_grids(pocket, center, box[0], o.spacing)
    engine = BuiltinEngine(grids, BuiltinSettings(o.starts, o.maxiter, o.max_torsions, o.seed))
    attrs = {"pocket": pocket.path, "center": tuple(center), "box": box,
             "score_units": "kcal/mol-like (built-in sketch score), lower is better"}
    return engine, pocket.path, attrs


def _index(o: argparse.Namespace, work: str) -> Any:
    os.makedirs(work, exist_ok=True)
    checkpoint = getattr(o, "checkpoint", None)
    resuming = checkpoint is not None and os.path.exists(checkpoint) and not getattr(o, "fresh", False)
    try:
        info, note = open_index(o.library, os.path.join(work, "library-index.h5"), rebuild=not resuming)
    except ValueError as exc:
        if resuming and "changed since" in str(exc):
            raise ValueError(f"--library {o.library!r}: {exc}; the checkpoint {checkpoint!r} belongs to the library "
                             f"as it was: restore it, or start over with --fresh or another --checkpoint") from exc
        raise
    if note and note != "no index yet":
        log.warning("dock_like: note: library index rebuilt: %s", note)
    return info


def setup(options: argparse.Namespace) -> None:
    """Check the options, index the library (rank 0, once), start the engine (every rank).

    Raises:
        ValueError: one line naming the bad value and what was expected: an unknown
            target, a receptor that is not PDBQT, a box of non-positive size, a missing
            optional dependency, a missing library, an output path that would overwrite
            a foreign file.
    """
    global _run
    o = options
    _check_numbers(o)
    hitlist.check_out_path(o.out)
    if o.export_sdf:
        hitlist.check_sdf_path(o.export_sdf, o.library)
    if not os.path.isfile(o.library):
        raise ValueError(f"--library {o.library!r}: no such file; expected a SMILES (.smi) or SDF (.sdf) file of ligands")
    o.library = os.path.abspath(o.library)
    # Everything up to the index is the same on every rank, so a bad value stops every rank
    # before the collective step below, and none waits for rank 0 in vain.
    engine, receptor_path, attrs = _vina_engine(o) if o.engine == "vina" else _builtin_engine(o)
    work = work_dir(o)
    info = _on_rank0(lambda: _index(o, work))
    if hasattr(engine, "start"):
        engine.start()  # the Vina helper computes its maps: a receptor Vina rejects stops here
    library = Library(o.library, info, os.path.join(work, "library-index.h5"))
    if _run is not None:
        _run.engine.close()
        _run.store.close()
    _run = _Run(o, library, engine, PoseStore(work), work, receptor_path, sha256(receptor_path), attrs)
    atexit.register(_close)


def _close() -> None:
    if _run is not None:
        _run.engine.close()
        _run.store.close()
        _run.library.close()


def fingerprint(options: argparse.Namespace) -> dict[str, object]:
    """What identifies a screen: the engine, its search options and the inputs' content (after setup)."""
    run = _state()
    keys = _VINA_OPTIONS if options.engine == "vina" else _BUILTIN_OPTIONS
    fp: dict[str, object] = {k: getattr(options, k) for k in keys}
    fp["library_sha256"] = run.library.info.sha256
    fp["receptor_sha256"] = run.receptor_digest
    return fp


def total(options: argparse.Namespace) -> int:
    """Return the number of ligands to dock: the library's entries, or ``--limit``."""
    n = len(_state().library)
    return min(n, options.limit) if options.limit else n


def _state() -> _Run:
    if _run is None:
        raise RuntimeError("apps.dock_like: setup(options) must run before total() or do_job()")
    return _run


def do_job(task_id: int) -> tuple[float, ...]:
    """Dock ligand ``task_id``; store its record; return its numbers in the order of :data:`result_fields`.

    A ligand that does not parse or cannot be prepared or docked is not an error: its row
    has status 1 and its record says why.
    """
    run = _state()
    t0 = time.perf_counter()
    numbers, record = run.engine.dock(run.library.entry(task_id))
    address = run.store.append(record)
    numbers["seconds"] = time.perf_counter() - t0
    row = [math.nan] * len(FIELDS)
    for name, value in numbers.items():
        row[FIELDS.index(name)] = float(value)
    for name, value in zip(STORE_FIELDS, address.numbers()):
        row[FIELDS.index(name)] = value
    return tuple(row)


def _texts(work: str, ids: np.ndarray, values: np.ndarray) -> tuple[dict[str, list[str]], int]:
    """Name, SMILES, reason and pose of each committed row, read from the records their numbers address."""
    cols = [FIELDS.index(f) for f in STORE_FIELDS]
    texts: dict[str, list[str]] = {"name": [], "smiles": [], "reason": [], "pose": []}
    lost = 0
    order = np.lexsort((values[:, cols[1]], values[:, cols[0]]))  # read each file front to back
    found: dict[int, tuple[str, str, str, str]] = {}
    for row in order:
        address = Address.from_numbers(list(values[row, cols]))
        try:
            if address is None:
                raise ValueError("no pose record address was committed")
            record = read_record(os.path.join(work), address).decode()
            props = hitlist.record_props(record)
            if props.get("dock_like_id") != str(int(ids[row])):
                raise ValueError(f"the record holds ligand {props.get('dock_like_id')}, not {int(ids[row])}")
        except ValueError as exc:
            lost += 1
            found[row] = (f"ligand{int(ids[row])}", "", f"pose record lost: {exc}", "")
            continue
        docked = props.get("dock_like_status") == "docked"
        found[row] = (props.get("dock_like_name", ""), props.get("dock_like_smiles", ""),
                      props.get("dock_like_reason", ""), record if docked else "")
    for row in range(ids.size):
        for key, value in zip(("name", "smiles", "reason", "pose"), found[row]):
            texts[key].append(value)
    return texts, lost


def finish(ids: np.ndarray, values: np.ndarray, options: argparse.Namespace) -> None:
    """Rank 0, once every ligand is committed: write the hit list, print the top table, export SDF."""
    run = _state()
    ids = np.asarray(ids, dtype=np.int64)
    values = np.asarray(values, dtype=float).reshape(ids.size, len(FIELDS))
    texts, lost = _texts(run.work, ids, values)
    if lost:
        values = values.copy()
        bad = [i for i, r in enumerate(texts["reason"]) if r.startswith("pose record lost")]
        values[bad, FIELDS.index("status")] = 2
        log.warning("dock_like: warning: %d ligand(s) have no readable pose record in %s; their scores are kept, "
                    "their poses are not (status 2)", lost, run.work)
    opts = {k: getattr(options, k) for k in (*_VINA_OPTIONS, *_BUILTIN_OPTIONS, *OUTPUT_OPTIONS)}
    attrs = {"app": "apps.dock_like", "engine": options.engine, "library": run.library.path,
             "library_sha256": run.library.info.sha256, "library_entries": len(run.library),
             "options": json.dumps(opts, sort_keys=True, default=str), "store": run.work}
    for key, value in run.attrs.items():
        attrs[key] = np.asarray(value, dtype=float) if isinstance(value, tuple) else value
    hitlist.write_hits(options.out, ids, values, texts, attrs)
    hits = hitlist.read_hits(options.out)
    print(hitlist.top_table(hits, options.top), flush=True)
    print(f"hit list: {os.path.abspath(options.out)} ({ids.size} ligands)", flush=True)
    if options.export_sdf:
        n = hitlist.export_sdf(options.export_sdf, hits, options.top)
        print(f"top {n} pose(s): {os.path.abspath(options.export_sdf)}", flush=True)
