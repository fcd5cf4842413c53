"""Synthetic ligand libraries for scale runs, deterministic from a seed.

``python -m apps.dock_like.generate --count N --seed S --out lib.sdf [--2d] [--force]``

Molecule ``i`` is assembled from drug-like building blocks (rings, linkers, end caps)
by a random walk seeded by ``(S, i)`` alone, so any slice of a library is reproducible
and two runs with the same seed write the same file. The number of building blocks is
geometric, so sizes and rotatable-bond counts are long-tailed, like a real screening
library's and like DOCK's task times. Each SMILES is sanitized by RDKit (a rare invalid
one is redrawn), then given 3D coordinates with ETKDG (seeded) and MMFF, or, with
``--2d``, 2D coordinates only, in which case the app generates 3D per ligand.

These are not real compounds: use them to measure the farm, not to find hits.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from typing import Sequence

from rdkit import Chem, rdBase
from rdkit.Chem import rdDepictor, rdDistGeom, rdForceFieldHelpers

__all__ = ["RINGS", "LINKERS", "CAPS", "smiles_for", "molecule", "write_library", "main"]

# Divalent rings: the previous block bonds to the first atom, the next to the last written one.
RINGS = ["c1ccc(cc1)", "c1cccc(c1)", "c1ccc(nc1)", "c1ccc(s1)", "c1ccc(o1)", "C1CCN(CC1)", "N1CCN(CC1)",
         "C1CCC(CC1)", "c1cc(F)c(cc1)", "c1cc(Cl)c(cc1)", "c1cc(OC)c(cc1)", "c1cc2ccccc2c(c1)", "n1cnc(c1)",
         "C1CCOC1", "c1ccc2[nH]c(cc2c1)"]
LINKERS = ["C", "CC", "CCC", "O", "N", "C(=O)N", "NC(=O)", "C(=O)O", "S(=O)(=O)N", "OC", "CO", "C(O)", "C(C)",
           "CN", "NC(=O)N", "CCO", "C=C"]
CAPS = ["C", "CC", "F", "Cl", "Br", "O", "N", "OC", "C(F)(F)F", "C#N", "C(=O)O", "C(N)=O", "c1ccccc1", "C1CC1",
        "N(C)C", "S(N)(=O)=O", "C(C)C", "[H]"]
_MAX_HEAVY = 60


def smiles_for(seed: int, index: int, attempt: int = 0) -> str:
    """Return the SMILES drawn for molecule ``index`` of library ``seed`` (before validation)."""
    rng = random.Random(f"dock_like:{seed}:{index}:{attempt}")
    n_rings = 1
    while n_rings < 8 and rng.random() < 0.55:  # geometric: most have 1-3 rings, a few many more
        n_rings += 1
    parts = [rng.choice(CAPS)]
    for k in range(n_rings):
        if k > 0 or rng.random() < 0.5:
            for _ in range(1 + (rng.random() < 0.3)):
                parts.append(rng.choice(LINKERS))
        parts.append(rng.choice(RINGS))
    if rng.random() < 0.6:
        parts.append(rng.choice(LINKERS))
    parts.append(rng.choice(CAPS))
    return "".join(p for p in parts if p != "[H]")


def molecule(seed: int, index: int, three_d: bool = True) -> Chem.Mol:
    """Return molecule ``index`` of library ``seed``: sanitized, named, with 3D (or 2D) coordinates."""
    for attempt in range(50):
        smiles = smiles_for(seed, index, attempt)
        with rdBase.BlockLogs():
            mol = Chem.MolFromSmiles(smiles)
        if mol is None or mol.GetNumHeavyAtoms() > _MAX_HEAVY:
            continue
        if three_d:
            molh = Chem.AddHs(mol)
            params = rdDistGeom.ETKDGv3()
            params.randomSeed = (seed * 1_000_003 + index) & 0x7FFFFFFF
            params.numThreads = 1
            with rdBase.BlockLogs():
                if rdDistGeom.EmbedMolecule(molh, params) != 0:
                    continue
                rdForceFieldHelpers.MMFFOptimizeMolecule(molh, maxIters=200)
            mol = molh
        else:
            rdDepictor.Compute2DCoords(mol)
        mol.SetProp("_Name", f"SYN{seed}-{index:07d}")
        mol.SetProp("smiles", Chem.MolToSmiles(Chem.RemoveHs(mol)))
        return mol
    raise RuntimeError(f"no valid molecule for seed {seed} index {index} after 50 draws")


def write_library(path: str, count: int, seed: int, three_d: bool = True) -> None:
    """Write ``count`` synthetic molecules to ``path`` (SDF)."""
    writer = Chem.SDWriter(path)
    for i in range(count):
        writer.write(molecule(seed, i, three_d))
    writer.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry."""
    p = argparse.ArgumentParser(prog="python -m apps.dock_like.generate",
                                description="Write a synthetic, deterministic ligand library (SDF) for scale runs.")
    p.add_argument("--count", type=int, required=True, help="number of molecules")
    p.add_argument("--seed", type=int, default=0, help="library seed (default 0)")
    p.add_argument("--out", required=True, metavar="F.sdf", help="output SDF")
    p.add_argument("--2d", dest="two_d", action="store_true", help="2D coordinates only (the app embeds per ligand)")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    a = p.parse_args(argv)
    if a.count < 1:
        p.error(f"--count must be >= 1, got {a.count}")
    if os.path.exists(a.out) and not a.force:
        print(f"generate: error: --out {a.out!r} exists; pass --force to overwrite it", file=sys.stderr)
        return 2
    write_library(a.out, a.count, a.seed, three_d=not a.two_d)
    print(f"wrote {a.count} synthetic ligands (seed {a.seed}) to {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
