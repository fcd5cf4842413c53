"""Receptor grids: the pocket's fields precomputed on a cubic lattice, read by trilinear interpolation.

Five grids (REP, ATT, ES, ACC, DON; see :mod:`score`) over a cube of edge ``box`` Å
centred on the pocket, with ``spacing`` Å between points. Building them costs a few
hundred ms (every rank builds its own in ``setup``); reading one pose costs one
:func:`scipy.ndimage.map_coordinates` call. A ligand atom outside the cube reads the
nearest face's value plus a penalty of ``OUTSIDE`` kcal/mol per Å outside, so the
search is pushed back in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage

from .pocket import Pocket
from .score import lj_params

__all__ = ["Grids", "build_grids", "CUTOFF", "OUTSIDE"]

CUTOFF = 8.0      # Å: pocket atoms farther than this from a grid point do not contribute
R_MIN = 1.0       # Å: distances are clipped here so the grids stay finite
REP_CAP = 1e4     # keeps REP finite near heavy halogens; a carbon 1 Å from a carbon is ~900
HB_R0, HB_WIDTH = 2.9, 0.35  # Å: centre and width of the H-bond well
OUTSIDE = 10.0    # kcal/mol per Å outside the grid, per atom
COULOMB = 332.06  # kcal Å / (mol e^2)
_CHANNEL = np.arange(5.0)


@dataclass(frozen=True)
class Grids:
    """The stacked grids ``values[k, i, j, l]`` at ``origin + spacing * (i, j, l)``."""

    values: np.ndarray   # (5, n, n, n), a cube: the same n on every axis
    origin: np.ndarray   # (3,)
    spacing: float
    centre: np.ndarray   # (3,) the pocket centre the grids are built around

    @property
    def shape(self) -> tuple[int, int, int]:
        """Points per axis."""
        n = self.values.shape[1]
        return n, n, n

    def lookup(self, xyz: np.ndarray) -> tuple[np.ndarray, float]:
        """Interpolate all five grids at the points ``xyz`` (n, 3).

        Returns:
            ``(values, outside)``: values (5, n), and the summed distance in Å of the
            points outside the grid.
        """
        g = (xyz - self.origin) / self.spacing
        hi = self.values.shape[1] - 1.0
        clipped = np.clip(g, 0.0, hi)
        outside = float(np.abs(g - clipped).sum()) * self.spacing
        n = xyz.shape[0]
        coords = np.empty((4, 5, n))
        coords[0] = _CHANNEL[:, None]
        coords[1:] = clipped.T[:, None, :]
        vals = ndimage.map_coordinates(self.values, coords.reshape(4, 5 * n), order=1, mode="nearest", prefilter=False)
        return vals.reshape(5, n), outside


def build_grids(pocket: Pocket, centre: np.ndarray, box: float, spacing: float) -> Grids:
    """Compute the five receptor grids around ``centre``.

    Args:
        pocket: the pocket atoms.
        centre: (3,) centre of the cube, Å.
        box: edge of the cube, Å.
        spacing: distance between grid points, Å.

    Raises:
        ValueError: for a non-positive box or spacing, or a box of more than 200 points a side.
    """
    if not (spacing > 0 and box > 0):
        raise ValueError(f"--spacing and --box must be > 0 Å, got {spacing} and {box}")
    n = int(round(box / spacing)) + 1
    if n > 200:
        raise ValueError(f"--box {box} / --spacing {spacing} gives {n} points a side; expected at most 200")
    origin = np.asarray(centre, dtype=float) - spacing * (n - 1) / 2
    axis = np.arange(n) * spacing
    values = np.zeros((5, n, n, n))
    reach = int(np.ceil(CUTOFF / spacing))
    coef = np.array([lj_params(e) for e in pocket.elements])
    for j in range(pocket.xyz.shape[0]):
        p = pocket.xyz[j] - origin
        c = np.round(p / spacing).astype(int)
        lo, hi = np.maximum(c - reach, 0), np.minimum(c + reach + 1, n)
        if (lo >= hi).any():
            continue
        dx, dy, dz = (axis[lo[k] : hi[k]] - p[k] for k in range(3))
        r2 = dx[:, None, None] ** 2 + dy[None, :, None] ** 2 + dz[None, None, :] ** 2
        within = r2 <= CUTOFF**2
        r2 = np.maximum(r2, R_MIN**2)
        sub = (slice(lo[0], hi[0]), slice(lo[1], hi[1]), slice(lo[2], hi[2]))
        inv6 = np.where(within, 1.0 / r2**3, 0.0)
        values[0][sub] += coef[j, 0] * inv6 * inv6
        values[1][sub] += coef[j, 1] * inv6
        if pocket.charges[j] != 0.0:
            values[2][sub] += np.where(within, COULOMB * pocket.charges[j] / (4.0 * r2), 0.0)
        if pocket.acceptor[j] or pocket.donor[j]:
            well = np.where(within, -np.exp(-(((np.sqrt(r2) - HB_R0) / HB_WIDTH) ** 2)), 0.0)
            if pocket.acceptor[j]:
                values[3][sub] += well
            if pocket.donor[j]:
                values[4][sub] += well
    np.minimum(values[0], REP_CAP, out=values[0])
    return Grids(values, origin, float(spacing), np.asarray(centre, dtype=float))
