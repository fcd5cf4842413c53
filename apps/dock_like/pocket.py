"""The receptor pocket: a PDB file of the atoms lining the binding site, read with RDKit.

Hydrogens are dropped (united atom). Partial charges come from a small table of
united-atom charges for the standard amino acids (:data:`CHARGES`); other atoms get 0.
H-bond donors and acceptors come from the same table, and from the element for atoms
it does not know (N donor, O acceptor). The pocket's centre defaults to the centroid of
its atoms, which is where a file of pocket-lining atoms puts it; for a whole protein,
give ``--center``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
from rdkit import Chem, rdBase

__all__ = ["Pocket", "read_pocket", "CHARGES"]

# United-atom partial charges (e), simplified from AMBER; backbone N/CA/C/O sum to 0.
_BACKBONE = {"N": -0.30, "CA": 0.20, "C": 0.55, "O": -0.45, "OXT": -0.45}
CHARGES: dict[str, dict[str, float]] = {
    "ASP": {"CG": 0.60, "OD1": -0.80, "OD2": -0.80},
    "GLU": {"CD": 0.60, "OE1": -0.80, "OE2": -0.80},
    "LYS": {"CE": 0.20, "NZ": 0.80},
    "ARG": {"CD": 0.10, "NE": -0.30, "CZ": 0.60, "NH1": 0.30, "NH2": 0.30},
    "SER": {"CB": 0.20, "OG": -0.20},
    "THR": {"CB": 0.20, "OG1": -0.20},
    "TYR": {"CZ": 0.15, "OH": -0.15},
    "ASN": {"CG": 0.50, "OD1": -0.50},
    "GLN": {"CD": 0.50, "OE1": -0.50},
    "HIS": {"CG": 0.05, "ND1": -0.10, "CD2": 0.20, "CE1": 0.35, "NE2": -0.50},
    "CYS": {"CB": 0.10, "SG": -0.10},
    "MET": {"CG": 0.125, "SD": -0.25, "CE": 0.125},
    "TRP": {"NE1": -0.05, "CD1": 0.05},
}
_DONORS = {
    "SER": {"OG"}, "THR": {"OG1"}, "TYR": {"OH"}, "ASN": {"ND2"}, "GLN": {"NE2"}, "LYS": {"NZ"},
    "ARG": {"NE", "NH1", "NH2"}, "HIS": {"ND1"}, "TRP": {"NE1"},
}
_ACCEPTORS = {
    "ASP": {"OD1", "OD2"}, "GLU": {"OE1", "OE2"}, "ASN": {"OD1"}, "GLN": {"OE1"}, "SER": {"OG"},
    "THR": {"OG1"}, "TYR": {"OH"}, "HIS": {"NE2"},
}
_AMINO = set(CHARGES) | {"GLY", "ALA", "VAL", "LEU", "ILE", "PHE", "PRO", "TRP"}


@dataclass(frozen=True)
class Pocket:
    """Pocket atoms (heavy atoms only) and what the grids need of them."""

    path: str
    xyz: np.ndarray        # (n, 3) Å
    elements: list[str]
    charges: np.ndarray    # (n,) e, united atom
    donor: np.ndarray      # (n,) bool
    acceptor: np.ndarray   # (n,) bool
    n_residues: int

    @property
    def centroid(self) -> np.ndarray:
        """The centroid of the pocket atoms."""
        return self.xyz.mean(axis=0)


def _typing(resname: str, name: str, element: str) -> tuple[float, bool, bool]:
    if resname in _AMINO:
        if name in _BACKBONE:
            return _BACKBONE[name], name == "N" and resname != "PRO", name in ("O", "OXT")
        return (
            CHARGES.get(resname, {}).get(name, 0.0),
            name in _DONORS.get(resname, ()),
            name in _ACCEPTORS.get(resname, ()),
        )
    return 0.0, element == "N", element == "O"


def read_pocket(path: str, min_atoms: int = 10) -> Pocket:
    """Read a pocket PDB file.

    Raises:
        ValueError: when the file is missing, does not parse as PDB, or has fewer than
            ``min_atoms`` heavy atoms; the message names the file and what was expected.
    """
    if not os.path.isfile(path):
        raise ValueError(f"--pocket {path!r}: no such file; expected a PDB file of the pocket atoms")
    try:
        with open(path, "rb") as f:
            raw = f.read()
        text = raw.decode("ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--pocket {path!r} is not a text PDB file ({exc}); expected ATOM/HETATM records") from exc
    n_records = sum(1 for line in text.splitlines() if line.startswith(("ATOM  ", "HETATM")))
    if n_records == 0:
        raise ValueError(f"--pocket {path!r} has no ATOM or HETATM record; expected a PDB file of the pocket atoms")
    with rdBase.BlockLogs():
        mol = Chem.MolFromPDBBlock(text, sanitize=False, removeHs=False, proximityBonding=False)
    if mol is None or mol.GetNumAtoms() == 0:
        raise ValueError(
            f"--pocket {path!r} does not parse as PDB ({n_records} ATOM/HETATM lines, RDKit read none); "
            f"expected fixed-column PDB records (coordinates in columns 31-54)"
        )
    if mol.GetNumAtoms() != n_records:
        raise ValueError(
            f"--pocket {path!r}: RDKit read {mol.GetNumAtoms()} of {n_records} ATOM/HETATM records; "
            f"expected every record to parse (check the fixed columns)"
        )
    pos = mol.GetConformer().GetPositions()
    if not np.isfinite(pos).all():
        raise ValueError(f"--pocket {path!r} has non-finite coordinates")
    keep, elements, charges, donor, acceptor, residues = [], [], [], [], [], set()
    for atom in mol.GetAtoms():
        if atom.GetAtomicNum() <= 1:
            continue
        info = atom.GetPDBResidueInfo()
        resname = info.GetResidueName().strip().upper() if info else ""
        name = info.GetName().strip().upper() if info else atom.GetSymbol().upper()
        if info:
            residues.add((info.GetChainId(), info.GetResidueNumber(), info.GetInsertionCode(), resname))
        q, d, a = _typing(resname, name, atom.GetSymbol())
        keep.append(atom.GetIdx())
        elements.append(atom.GetSymbol())
        charges.append(q)
        donor.append(d)
        acceptor.append(a)
    if len(keep) < min_atoms:
        raise ValueError(
            f"--pocket {path!r} has {len(keep)} heavy atom(s); expected at least {min_atoms} atoms lining a pocket"
        )
    return Pocket(
        os.path.abspath(path), pos[keep], elements, np.array(charges), np.array(donor), np.array(acceptor), len(residues)
    )
