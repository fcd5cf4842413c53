"""The ligand library: reading SDF with RDKit, skipping bad records, preparing a ligand to dock.

A library is an SDF file. :func:`load_library` scans it once: every record that RDKit
parses and sanitizes becomes a ligand; a malformed or empty record is skipped with a
reason that names it (record number and name), and a file with no valid record is an
error. :func:`prepare` turns one ligand into what the pose search needs: hydrogens,
Gasteiger charges, 3D coordinates (generated with ETKDG + MMFF when the record has
none, seeded by the ligand, so every rank gets the same conformer), force-field atom
parameters, rotatable bonds and the intramolecular pairs.

Task ``i`` of the app is ligand ``i``: the ``i``-th valid record, in file order.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field

import numpy as np
from rdkit import Chem, rdBase
from rdkit.Chem import rdDistGeom, rdForceFieldHelpers, rdPartialCharges

from .score import atom_weights, pair_repulsion

__all__ = ["Library", "Skipped", "Ligand", "load_library", "prepare", "ligand_seed", "PrepareError"]


class PrepareError(ValueError):
    """A ligand that parsed but cannot be docked (e.g. no 3D coordinates can be generated)."""


@dataclass(frozen=True)
class Skipped:
    """A record of the library that is not docked, and why."""

    record: int  # 1-based position in the file
    name: str
    reason: str

    def __str__(self) -> str:
        return f"record {self.record} ({self.name!r}): {self.reason}"


@dataclass
class Library:
    """The valid records of an SDF file; ``records[i]`` is the 1-based record of ligand ``i``."""

    path: str
    records: list[int]
    names: list[str]
    skipped: list[Skipped]
    n_records: int
    _supplier: Chem.SDMolSupplier | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.records)

    def mol(self, ligand: int) -> Chem.Mol:
        """Return ligand ``ligand``'s molecule as read from the file (sanitized)."""
        if self._supplier is None:
            self._supplier = _supplier(self.path)
        mol, _reason = _read(self._supplier, self.records[ligand] - 1)
        if mol is None:  # the file changed under us
            raise PrepareError(f"{self.path!r} record {self.records[ligand]} no longer parses; was the library modified?")
        return mol


def _supplier(path: str) -> Chem.SDMolSupplier:
    return Chem.SDMolSupplier(path, sanitize=False, removeHs=False)


def _record_name(supplier: Chem.SDMolSupplier, index: int) -> str:
    try:
        text = supplier.GetItemText(index)
    except (RuntimeError, IndexError):
        return ""
    first = text.split("\n", 1)[0].strip()
    return "" if first == "$$$$" else first


def _read(supplier: Chem.SDMolSupplier, index: int) -> tuple[Chem.Mol | None, str]:
    """Parse and sanitize record ``index`` (0-based); return (mol, "") or (None, reason)."""
    with rdBase.BlockLogs():
        try:
            mol = supplier[index]
        except (RuntimeError, ValueError) as exc:  # RDKit raises on some truncated records
            return None, f"RDKit could not read it ({exc})"
        if mol is None:
            text = supplier.GetItemText(index)
            if not text.replace("$$$$", "").strip():
                return None, "empty record"
            return None, "not a valid molfile (RDKit could not parse its atom or bond block)"
        if mol.GetNumAtoms() == 0:
            return None, "record has no atoms"
        try:
            Chem.SanitizeMol(mol)
        except Exception as exc:  # RDKit raises several sanitization exception types
            return None, f"invalid chemistry: {exc}"
    return mol, ""


def load_library(path: str) -> Library:
    """Scan the SDF file ``path``: keep the records RDKit can parse, note the others.

    Returns:
        The library; ``skipped`` lists each bad record with its number, name and reason.

    Raises:
        ValueError: when the file is missing, unreadable, or has no valid record.
    """
    if not os.path.isfile(path):
        raise ValueError(f"--library {path!r}: no such file; expected an SDF file of ligands")
    if os.path.getsize(path) == 0:
        raise ValueError(f"--library {path!r} is empty: no valid SDF record; expected an SDF file of ligands")
    try:
        supplier = _supplier(path)
        n = len(supplier)
    except OSError as exc:
        raise ValueError(f"--library {path!r} cannot be read: {exc}") from exc
    records: list[int] = []
    names: list[str] = []
    skipped: list[Skipped] = []
    for index in range(n):
        mol, reason = _read(supplier, index)
        name = _record_name(supplier, index) or f"record{index + 1}"
        if mol is None:
            skipped.append(Skipped(index + 1, name, reason))
        else:
            records.append(index + 1)
            names.append(mol.GetProp("_Name").strip() or name)
    if not records:
        detail = f"; first problem: {skipped[0]}" if skipped else ""
        raise ValueError(
            f"--library {path!r} has no valid SDF record ({n} record(s) read){detail}; "
            f"expected an SDF file (records ending with $$$$) that RDKit can parse"
        )
    return Library(os.path.abspath(path), records, names, skipped, n)


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
