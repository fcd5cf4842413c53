"""The scoring function: a DOCK-style grid score (van der Waals + electrostatics + H-bonds).

Each ligand heavy atom ``i`` at position ``x`` contributes

    vdW    a_i * REP(x) - b_i * ATT(x)          (Lennard-Jones 12-6, geometric-mean mixing)
    elec   q_i * ES(x)                          (Coulomb, distance-dependent dielectric 4r)
    hbond  w_hb * (donor_i * ACC(x) + acceptor_i * DON(x))

where REP, ATT, ES, ACC and DON are receptor grids (:mod:`grids`) summed over pocket
atoms ``j``: ``REP = sum a_j / r^12``, ``ATT = sum b_j / r^6``,
``ES = sum 332 q_j / (4 r^2)``, and ``ACC``/``DON`` a Gaussian well at 2.9 Å around each
receptor acceptor/donor. With ``a_i = sqrt(eps_i) (2 R_i)^6`` and
``b_i = sqrt(2 eps_i) (2 R_i)^3``, ``a_i a_j / r^12 - b_i b_j / r^6`` is the 12-6
potential with well depth ``sqrt(eps_i eps_j)`` at ``r = 2 sqrt(R_i R_j)``, as in DOCK's
energy grid. A ligand atom's vdW above ``SOFT_CAP`` grows only logarithmically, so a
clashing start can still be optimised. An intramolecular repulsion between heavy atoms
more than three bonds apart, counted only where a pair is pushed closer than in the
library conformer ("intra", the strain), keeps flexible ligands from folding onto
themselves.

Units are kcal/mol-like; lower is better. This is a toy force field, not a validated one.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from rdkit import Chem

__all__ = ["LJ", "lj_params", "atom_weights", "combine", "pair_repulsion", "intramolecular", "W_HB", "SOFT_CAP", "TERMS"]

# (R*, eps): half the LJ minimum distance in Å and well depth in kcal/mol, AMBER-like.
LJ: dict[str, tuple[float, float]] = {
    "C": (1.908, 0.086), "N": (1.824, 0.170), "O": (1.661, 0.210), "S": (2.000, 0.250),
    "P": (2.100, 0.200), "F": (1.750, 0.061), "Cl": (1.948, 0.265), "Br": (2.220, 0.320),
    "I": (2.350, 0.400), "H": (0.600, 0.016),
}
_DEFAULT_LJ = (2.000, 0.100)
W_HB = 2.0       # kcal/mol per ideal hydrogen bond
SOFT_CAP = 5.0   # kcal/mol: per-atom vdW above this grows as log
TERMS = ("vdw", "elec", "hbond", "intra")


def lj_params(element: str) -> tuple[float, float]:
    """Return the (a, b) grid coefficients of an element (see the module docstring)."""
    r, eps = LJ.get(element, _DEFAULT_LJ)
    return float(np.sqrt(eps) * (2 * r) ** 6), float(np.sqrt(2 * eps) * (2 * r) ** 3)


def _is_donor(atom: Chem.Atom) -> bool:
    return atom.GetSymbol() in ("N", "O") and atom.GetTotalNumHs(includeNeighbors=True) > 0


def _is_acceptor(atom: Chem.Atom) -> bool:
    sym = atom.GetSymbol()
    if sym == "O":
        return True
    if sym != "N" or atom.GetFormalCharge() > 0 or atom.GetTotalNumHs(includeNeighbors=True) > 0:
        return False
    heavy = sum(1 for nb in atom.GetNeighbors() if nb.GetAtomicNum() > 1)
    return heavy < 3  # pyridine-like, imine or nitrile N; not an amine with three substituents


def atom_weights(atoms: Sequence[Chem.Atom], charges: np.ndarray) -> np.ndarray:
    """Return the (5, n) weights of ligand heavy atoms on the grids REP, ATT, ES, ACC, DON.

    Args:
        atoms: the heavy atoms, in scoring order.
        charges: their (united-atom) partial charges.
    """
    w = np.zeros((5, len(atoms)))
    for k, atom in enumerate(atoms):
        w[0, k], w[1, k] = lj_params(atom.GetSymbol())
        w[3, k] = W_HB * _is_donor(atom)
        w[4, k] = W_HB * _is_acceptor(atom)
    w[2] = charges
    return w


def _soft(e: np.ndarray) -> np.ndarray:
    over = e > SOFT_CAP
    if over.any():
        e = e.copy()
        e[over] = SOFT_CAP + np.log1p(e[over] - SOFT_CAP)
    return e


def combine(values: np.ndarray, weights: np.ndarray) -> tuple[float, float, float]:
    """Return (vdw, elec, hbond) from interpolated grid values and atom weights, both (5, n)."""
    vdw = _soft(weights[0] * values[0] - weights[1] * values[1]).sum()
    elec = float(weights[2] @ values[2])
    hbond = float(weights[3] @ values[3] + weights[4] @ values[4])
    return float(vdw), elec, hbond


def pair_repulsion(xyz: np.ndarray, pairs: np.ndarray, pair_a: np.ndarray) -> np.ndarray:
    """Return the soft-capped repulsion ``a_i a_j / r^12`` of each pair of ``pairs``."""
    d = xyz[pairs[:, 0]] - xyz[pairs[:, 1]]
    r2 = np.maximum(np.einsum("ij,ij->i", d, d), 1.0)
    return _soft(pair_a / r2**6)


def intramolecular(xyz: np.ndarray, pairs: np.ndarray, pair_a: np.ndarray, pair_ref: np.ndarray) -> float:
    """Return the ligand's strain: the repulsion each pair has above its value ``pair_ref`` in the library conformer."""
    if pairs.shape[0] == 0:
        return 0.0
    return float(np.maximum(pair_repulsion(xyz, pairs, pair_a) - pair_ref, 0.0).sum())
