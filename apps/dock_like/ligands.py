"""Preparing a parsed ligand for the built-in engine, and every ligand's seed.

:func:`prepare` turns one ligand into what the built-in pose search needs: hydrogens,
Gasteiger charges, 3D coordinates (generated with ETKDG + MMFF when the entry has
none, seeded by the ligand, so every rank gets the same conformer), force-field atom
parameters, rotatable bonds and the intramolecular pairs. :func:`ligand_seed` is also
the seed of the Vina engine's 3D embedding. Reading the library is :mod:`library`'s
and :mod:`parse`'s concern.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
from rdkit import Chem, rdBase
from rdkit.Chem import rdDistGeom, rdForceFieldHelpers, rdPartialCharges

from .score import atom_weights, pair_repulsion

__all__ = ["Ligand", "prepare", "ligand_seed", "PrepareError"]


class PrepareError(ValueError):
    """A ligand that parsed but cannot be docked (e.g. no 3D coordinates can be generated)."""


def ligand_seed(name: str, record: int, seed: int = 0) -> int:
    """Return the 31-bit seed of a ligand: fixed by its name, record number and the run's seed.

    Every rank and every restart derives the same seed, so a ligand's 3D embedding and pose
    search (and hence its score) do not depend on which process docks it or when.
    """
    digest = hashlib.blake2b(f"{seed}|{record}|{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


@dataclass
class Ligand:
    """A ligand ready to dock.

    Coordinates are of the prepared molecule (hydrogens included), centred on the heavy
    atoms' centroid; a pose moves these. Scoring uses the heavy atoms only (united atom:
    each hydrogen's charge is added to its heavy atom).
    """

    name: str
    mol: Chem.Mol             # prepared: explicit H, one 3D conformer (the reference)
    ref: np.ndarray           # (n_atoms, 3) reference coordinates, centred
    centre: np.ndarray        # (3,) the centroid removed from the conformer
    heavy: np.ndarray         # (n_heavy,) indices of heavy atoms in mol
    weights: np.ndarray       # (5, n_heavy) per-atom grid weights, see score.atom_weights
    torsions: list[tuple[int, int, np.ndarray]]  # (a, b, moving atoms) in mol indices
    n_rotatable: int          # rotatable bonds found (torsions may hold fewer: see max_torsions)
    pairs: np.ndarray         # (P, 2) heavy-atom pairs (heavy indices) > 3 bonds apart
    pair_a: np.ndarray        # (P,) repulsion coefficient of each pair
    pair_ref: np.ndarray      # (P,) each pair's repulsion in the library conformer (strain is counted above it)
    generated_3d: bool        # True when the record had no 3D coordinates

    @property
    def n_heavy(self) -> int:
        """Number of heavy atoms."""
        return int(self.heavy.size)


def _has_3d(mol: Chem.Mol) -> bool:
    # The coordinates decide, not the molfile's 2D/3D flag: a "3D" record with every z equal is flat.
    if mol.GetNumConformers() == 0:
        return False
    return bool(np.ptp(mol.GetConformer().GetPositions()[:, 2]) > 1e-3)


def _embed(mol: Chem.Mol, seed: int) -> Chem.Mol:
    molh = Chem.AddHs(Chem.RemoveHs(mol))
    params = rdDistGeom.ETKDGv3()
    params.randomSeed = seed
    params.numThreads = 1
    with rdBase.BlockLogs():
        if rdDistGeom.EmbedMolecule(molh, params) != 0:
            params.useRandomCoords = True
            if rdDistGeom.EmbedMolecule(molh, params) != 0:
                raise PrepareError("no 3D coordinates in the record and RDKit's ETKDG could not generate them")
        if rdForceFieldHelpers.MMFFHasAllMoleculeParams(molh):
            rdForceFieldHelpers.MMFFOptimizeMolecule(molh, maxIters=500)
        else:
            rdForceFieldHelpers.UFFOptimizeMolecule(molh, maxIters=500)
    return molh


def _rotatable(mol: Chem.Mol) -> list[tuple[int, int]]:
    """Single, acyclic bonds between atoms with >= 2 heavy neighbours; not amide C-N, not next to a triple bond."""
    out = []
    for bond in mol.GetBonds():
        if bond.GetBondType() != Chem.BondType.SINGLE or bond.IsInRing():
            continue
        a, b = bond.GetBeginAtom(), bond.GetEndAtom()
        if a.GetAtomicNum() == 1 or b.GetAtomicNum() == 1:
            continue
        if a.GetDegree() - a.GetTotalNumHs(includeNeighbors=True) < 2 or b.GetDegree() - b.GetTotalNumHs(includeNeighbors=True) < 2:
            continue
        if any(x.GetBondType() == Chem.BondType.TRIPLE for at in (a, b) for x in at.GetBonds()):
            continue
        if _is_amide(a, b) or _is_amide(b, a):
            continue
        out.append((a.GetIdx(), b.GetIdx()))
    return out


def _is_amide(c: Chem.Atom, n: Chem.Atom) -> bool:
    if c.GetSymbol() != "C" or n.GetSymbol() != "N":
        return False
    return any(
        x.GetBondType() == Chem.BondType.DOUBLE and x.GetOtherAtom(c).GetSymbol() in ("O", "S") for x in c.GetBonds()
    )


def _side(mol: Chem.Mol, a: int, b: int) -> np.ndarray:
    """Atoms reached from ``b`` without crossing the bond a-b (the side that rotates)."""
    seen, stack = {b}, [b]
    while stack:
        for nb in mol.GetAtomWithIdx(stack.pop()).GetNeighbors():
            j = nb.GetIdx()
            if j != a and j not in seen:
                seen.add(j)
                stack.append(j)
    return np.array(sorted(seen), dtype=np.intp)


def prepare(mol: Chem.Mol, name: str, seed: int, max_torsions: int) -> Ligand:
    """Prepare a parsed ligand for docking (deterministic in ``mol`` and ``seed``).

    Args:
        mol: the sanitized molecule from the library.
        name: its name (for messages).
        seed: the ligand's seed (:func:`ligand_seed`), used for 3D embedding.
        max_torsions: at most this many rotatable bonds are searched; the rest keep the
            input conformation.

    Raises:
        PrepareError: when no 3D coordinates can be had, or charges cannot be computed.
    """
    generated = not _has_3d(mol)
    if generated:
        molh = _embed(mol, seed)
    else:
        with rdBase.BlockLogs():
            molh = Chem.AddHs(Chem.RemoveHs(mol), addCoords=True)
    with rdBase.BlockLogs():
        rdPartialCharges.ComputeGasteigerCharges(molh)
    charges = np.array([a.GetDoubleProp("_GasteigerCharge") for a in molh.GetAtoms()])
    charges = np.nan_to_num(charges, nan=0.0, posinf=0.0, neginf=0.0)
    heavy = np.array([a.GetIdx() for a in molh.GetAtoms() if a.GetAtomicNum() > 1], dtype=np.intp)
    if heavy.size == 0:
        raise PrepareError(f"ligand {name!r} has no heavy atom")
    united = charges.copy()
    for atom in molh.GetAtoms():
        if atom.GetAtomicNum() == 1 and atom.GetDegree() == 1:
            united[atom.GetNeighbors()[0].GetIdx()] += charges[atom.GetIdx()]
    pos = molh.GetConformer().GetPositions()
    centre = pos[heavy].mean(axis=0)
    ref = pos - centre
    heavy_atoms = [molh.GetAtomWithIdx(int(i)) for i in heavy]
    weights = atom_weights(heavy_atoms, united[heavy])
    rot = _rotatable(molh)
    torsions = []
    for a, b in rot[:max_torsions]:
        side_b, side_a = _side(molh, a, b), _side(molh, b, a)
        torsions.append((a, b, side_b) if side_b.size <= side_a.size else (b, a, side_a))
    topo = Chem.GetDistanceMatrix(molh)[np.ix_(heavy, heavy)]
    i, j = np.nonzero(np.triu(topo > 3))
    pairs = np.stack([i, j], axis=1).astype(np.intp)
    pair_a = weights[0, i] * weights[0, j]
    pair_ref = pair_repulsion(ref[heavy], pairs, pair_a)
    return Ligand(name, molh, ref, centre, heavy, weights, torsions, len(rot), pairs, pair_a, pair_ref, generated)
