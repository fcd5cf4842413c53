"""The built-in engine: the app's own grid score and pose search, in the rank, no extra dependency.

Fast (tens of milliseconds to seconds per ligand) and dependency-free, so the tests use it;
it is a sketch of a docking code, not a validated one (see README.md). Each ligand is
parsed from its library entry, prepared (:mod:`ligands`), docked (:mod:`search`) against
the receptor grids (:mod:`grids`), and its best pose goes to the pose store as an SDF
record with all its atoms.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from rdkit import Chem
from rdkit.Geometry import Point3D

from .grids import Grids
from .library import Entry
from .ligands import PrepareError, ligand_seed, prepare
from .parse import parse_entry
from .search import dock, place
from .store import record_block

__all__ = ["BuiltinSettings", "BuiltinEngine"]


@dataclass(frozen=True)
class BuiltinSettings:
    """The built-in search's effort and seed."""

    starts: int
    maxiter: int
    max_torsions: int
    seed: int


class BuiltinEngine:
    """Docks one entry at a time in this process with the built-in score."""

    def __init__(self, grids: Grids, settings: BuiltinSettings) -> None:
        self.grids = grids
        self.settings = settings

    def dock(self, entry: Entry) -> tuple[dict[str, Any], bytes]:
        """Parse, prepare and dock ``entry``; return its numbers and its pose-store record."""
        t0 = time.process_time()
        parsed = parse_entry(entry)
        props: dict[str, object] = {"dock_like_id": entry.index, "dock_like_name": parsed.name,
                                    "dock_like_smiles": parsed.smiles, "dock_like_engine": "builtin"}
        if parsed.mol is None:
            props.update(dock_like_status="failed", dock_like_reason=parsed.reason)
            return {"status": 1, "cpu_seconds": time.process_time() - t0}, record_block(None, props)
        s = self.settings
        try:
            lig = prepare(parsed.mol, parsed.name, ligand_seed(parsed.name, entry.index + 1, s.seed), s.max_torsions)
        except PrepareError as exc:
            props.update(dock_like_status="failed", dock_like_reason=str(exc))
            return {"status": 1, "cpu_seconds": time.process_time() - t0}, record_block(None, props)
        d = dock(lig, self.grids, ligand_seed(parsed.name, entry.index + 1, s.seed), starts=s.starts,
                 maxiter=s.maxiter)
        cpu = time.process_time() - t0
        pose = Chem.Mol(lig.mol)
        conf = pose.GetConformer()
        for a, (x, y, z) in enumerate(place(lig, d.pose).tolist()):
            conf.SetAtomPosition(a, Point3D(x, y, z))
        props.update(dock_like_status="docked", dock_like_score=d.score, dock_like_cpu_seconds=round(cpu, 3),
                     **{f"dock_like_{k}": v for k, v in d.terms.items()})
        numbers = {"status": 0, "score": d.score, **d.terms, "n_evals": d.n_evals, "n_starts": d.n_starts,
                   "n_heavy": lig.n_heavy, "n_rotatable": len(lig.torsions), "generated_3d": int(lig.generated_3d),
                   "cpu_seconds": cpu, "n_poses": 1, "pose_1": d.score, "stripped": int(parsed.stripped)}
        return numbers, record_block(pose, props)

    def close(self) -> None:
        """Nothing to release (same interface as the Vina engine)."""
