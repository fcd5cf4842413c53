"""Flexible-ligand pose search: random starts, each optimised locally with scipy's BFGS.

A pose is ``(t, q, theta)``: the position ``t`` (Å) of the ligand's reference centroid,
a unit quaternion ``q = (w, x, y, z)`` for its orientation, and one angle (radians) per
searched rotatable bond, each the rotation from the library conformer. The optimiser
works on ``(t, rotation vector, theta)`` and the pose keeps the quaternion it turns
that into, so :func:`place` rebuilds exactly the coordinates that were scored.

The effort grows like DOCK's: ``starts * (1 + n_torsions // 3)`` random starts, each a local
optimisation in ``6 + n_torsions`` dimensions by forward differences, over a score
whose cost grows with the atom count. Task time thus grows with size and flexibility,
and a library's times are long-tailed like DOCK's. Everything is deterministic in the
ligand's seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from scipy.optimize import minimize

from .grids import OUTSIDE, Grids
from .ligands import Ligand
from .score import combine, intramolecular

__all__ = ["Pose", "Docking", "place", "score_pose", "dock", "quat_to_matrix", "rotvec_to_quat", "n_starts"]

_FD_STEP = 1e-4     # forward-difference step (Å and rad)
_START_RADIUS = 3.0  # Å: random starts put the centroid within this of the pocket centre


@dataclass(frozen=True)
class Pose:
    """Where a ligand sits: centroid position, orientation quaternion (w, x, y, z), torsion angles."""

    t: np.ndarray       # (3,)
    q: np.ndarray       # (4,)
    theta: np.ndarray   # (n_torsions,)


@dataclass(frozen=True)
class Docking:
    """The outcome of docking one ligand."""

    score: float
    terms: dict[str, float]   # vdw, elec, hbond, intra, outside
    pose: Pose
    n_evals: int
    n_starts: int


def rotvec_to_quat(v: np.ndarray) -> np.ndarray:
    """Return the unit quaternion (w, x, y, z) of the rotation vector ``v``."""
    vx, vy, vz = float(v[0]), float(v[1]), float(v[2])
    angle = np.sqrt(vx * vx + vy * vy + vz * vz)
    if angle < 1e-12:
        return np.array([1.0, 0.5 * vx, 0.5 * vy, 0.5 * vz]) / np.sqrt(1.0 + 0.25 * angle * angle)
    s = np.sin(0.5 * angle) / angle
    return np.array([np.cos(0.5 * angle), s * vx, s * vy, s * vz])


def quat_to_matrix(q: np.ndarray) -> np.ndarray:
    """Return the rotation matrix of the quaternion ``q`` (w, x, y, z); ``q`` is normalised first."""
    w, x, y, z = (float(c) for c in q)
    n = 1.0 / np.sqrt(w * w + x * x + y * y + z * z)
    w, x, y, z = w * n, x * n, y * n, z * n
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
        [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
        [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
    ])


def _rotate(pts: np.ndarray, m: np.ndarray) -> np.ndarray:
    # Elementwise rather than a matmul, so a subset of atoms gets bit-identical coordinates.
    return pts[:, 0:1] * m[:, 0] + pts[:, 1:2] * m[:, 1] + pts[:, 2:3] * m[:, 2]


def _axis_matrix(k: np.ndarray, angle: float) -> np.ndarray:
    """Rotation matrix by ``angle`` about the unit vector ``k`` (Rodrigues), from Python floats."""
    x, y, z = float(k[0]), float(k[1]), float(k[2])
    n = 1.0 / math.sqrt(x * x + y * y + z * z)
    x, y, z = x * n, y * n, z * n
    c, s = math.cos(angle), math.sin(angle)
    t = 1.0 - c
    return np.array([
        [c + x * x * t, x * y * t - z * s, x * z * t + y * s],
        [y * x * t + z * s, c + y * y * t, y * z * t - x * s],
        [z * x * t - y * s, z * y * t + x * s, c + z * z * t],
    ])


def _twist(xyz: np.ndarray, torsions: list[tuple[int, int, np.ndarray]], theta: np.ndarray) -> np.ndarray:
    for (a, b, moving), angle in zip(torsions, theta.tolist()):
        pb = xyz[b]
        xyz[moving] = _rotate(xyz[moving] - pb, _axis_matrix(pb - xyz[a], angle)) + pb
    return xyz


class _Frame:
    """A ligand's atoms and torsions renumbered to a subset of its atoms (heavy atoms for scoring)."""

    def __init__(self, lig: Ligand, atoms: np.ndarray):
        where = -np.ones(lig.ref.shape[0], dtype=np.intp)
        where[atoms] = np.arange(atoms.size)
        self.ref = lig.ref[atoms]
        self.torsions = [(int(where[a]), int(where[b]), where[m][where[m] >= 0]) for a, b, m in lig.torsions]

    def place(self, pose: Pose) -> np.ndarray:
        xyz = _twist(self.ref.copy(), self.torsions, pose.theta)
        return _rotate(xyz, quat_to_matrix(pose.q)) + pose.t


def place(lig: Ligand, pose: Pose) -> np.ndarray:
    """Return all atoms' coordinates (hydrogens included) of ``lig`` in ``pose``."""
    return _Frame(lig, np.arange(lig.ref.shape[0])).place(pose)


def _evaluate(frame: _Frame, lig: Ligand, grids: Grids, pose: Pose) -> dict[str, float]:
    xyz = frame.place(pose)
    values, outside = grids.lookup(xyz)
    vdw, elec, hbond = combine(values, lig.weights)
    intra = intramolecular(xyz, lig.pairs, lig.pair_a, lig.pair_ref) if lig.torsions else 0.0
    return {"vdw": vdw, "elec": elec, "hbond": hbond, "intra": intra, "outside": OUTSIDE * outside}


def score_pose(lig: Ligand, grids: Grids, pose: Pose) -> tuple[float, dict[str, float]]:
    """Score ``lig`` in ``pose``: return (total, terms)."""
    terms = _evaluate(_Frame(lig, lig.heavy), lig, grids, pose)
    return sum(terms.values()), terms


def n_starts(lig: Ligand, starts: int) -> int:
    """Return how many random starts a ligand gets: ``starts * (1 + n_torsions // 3)``."""
    return starts * (1 + len(lig.torsions) // 3)


def _random_start(rng: np.random.Generator, centre: np.ndarray, k: int, keep_conformer: bool) -> np.ndarray:
    u = rng.normal(size=3)
    t = centre + _START_RADIUS * rng.random() ** (1 / 3) * u / np.linalg.norm(u)
    q = rng.normal(size=4)
    q = q / np.linalg.norm(q) * (1 if q[0] >= 0 else -1)
    angle = 2 * np.arccos(min(1.0, q[0]))
    axis = q[1:] / max(np.linalg.norm(q[1:]), 1e-12)
    theta = rng.uniform(-np.pi, np.pi, size=k)
    return np.concatenate([t, axis * angle, np.zeros(k) if keep_conformer else theta])


def _local(objective: Callable[[np.ndarray], float], x0: np.ndarray, maxiter: int) -> Any:
    # BFGS by forward differences. scipy's L-BFGS-B was measured at ~2 ms per iteration here,
    # more than the evaluations it drives; the grid's outside penalty stands in for bounds.
    return minimize(objective, x0, method="BFGS", options={"maxiter": maxiter, "eps": _FD_STEP})


def dock(lig: Ligand, grids: Grids, seed: int, starts: int = 1, maxiter: int = 15) -> Docking:
    """Dock ``lig`` into the pocket of ``grids``: deterministic in ``seed``.

    Args:
        lig: the prepared ligand.
        grids: the receptor grids.
        seed: the ligand's seed (random starts).
        starts: random starts per three rotatable bonds, plus one (see :func:`n_starts`).
        maxiter: BFGS iterations per start (the best start is then polished with twice as many).
    """
    frame = _Frame(lig, lig.heavy)
    k = len(lig.torsions)
    evals = 0

    def objective(x: np.ndarray) -> float:
        nonlocal evals
        evals += 1
        pose = Pose(x[:3], rotvec_to_quat(x[3:6]), x[6:])
        return sum(_evaluate(frame, lig, grids, pose).values())

    rng = np.random.default_rng(seed)
    n = n_starts(lig, starts)
    best_x, best_f = None, np.inf
    for i in range(n):  # the first start keeps the library conformer, the others also draw torsions
        res = _local(objective, _random_start(rng, grids.centre, k, keep_conformer=i == 0), maxiter)
        if res.fun < best_f:
            best_x, best_f = res.x, float(res.fun)
    assert best_x is not None
    res = _local(objective, best_x, 2 * maxiter)
    x = res.x if res.fun < best_f else best_x
    pose = Pose(np.array(x[:3]), rotvec_to_quat(x[3:6]), np.array(x[6:]))
    terms = _evaluate(frame, lig, grids, pose)
    return Docking(sum(terms.values()), terms, pose, evals, n)
