"""The receptor for the Vina engine: a dockstring target by name, or the user's PDBQT file and search box.

``--target ABL1`` takes the receptor and its search box from dockstring's 58 curated
DUD-E targets (shipped inside the ``dockstring`` package, nothing downloaded).
``--receptor R.pdbqt --center X,Y,Z --box X,Y,Z`` docks into the user's own receptor.
Every check here gives one line naming the value and what was expected.
"""

from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import dataclass

__all__ = ["Receptor", "parse_triple", "target_names", "load_target", "check_pdbqt", "require", "DOCK_EXTRA"]

#: How a user gets the real engine's dependencies.
DOCK_EXTRA = "pip install 'nlevel[dock]' (vina, meeko, gemmi, rdkit, dockstring)"


@dataclass(frozen=True)
class Receptor:
    """A receptor PDBQT file and the search box (Å) Vina docks into."""

    path: str
    center: tuple[float, float, float]
    box: tuple[float, float, float]
    target: str = ""  # the dockstring name, '' for the user's own file


def require(*modules: str, why: str = "--engine vina") -> None:
    """Check optional modules are importable without importing them.

    Raises:
        ValueError: one line naming the missing module and the extra to install.
    """
    missing = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a module set to None in sys.modules, or a broken package
            found = False
        if not found:
            missing.append(name)
    if missing:
        raise ValueError(f"{why} needs the Python package(s) {', '.join(missing)}, not installed; "
                         f"install the 'dock' extra: {DOCK_EXTRA}")


def parse_triple(flag: str, text: str, positive: bool) -> tuple[float, float, float]:
    """Parse ``X,Y,Z`` (or one number ``S`` for a cube when ``positive``) as three finite floats.

    Raises:
        ValueError: naming the flag, the text and what was expected.
    """
    try:
        values = [float(v) for v in str(text).split(",")]
    except ValueError:
        values = []
    if positive and len(values) == 1:
        values = values * 3
    what = "three sizes X,Y,Z in Å (or one size for a cube), each > 0" if positive else "three numbers X,Y,Z in Å"
    if len(values) != 3 or not all(math.isfinite(v) for v in values):
        raise ValueError(f"{flag} must be {what}, got {text!r}")
    if positive and min(values) <= 0:
        raise ValueError(f"{flag} must be {what}, got {text!r} (a box needs a positive size on every axis)")
    return values[0], values[1], values[2]


def target_names() -> list[str]:
    """Return dockstring's target names, sorted.

    Raises:
        ValueError: when dockstring is not installed.
    """
    require("dockstring", why="--target")
    from dockstring.target import list_all_target_names

    return sorted(list_all_target_names())


def load_target(name: str) -> Receptor:
    """Return dockstring target ``name`` (case-insensitive) with its search box.

    Raises:
        ValueError: for an unknown name, listing the valid ones.
    """
    names = target_names()
    match = {n.upper(): n for n in names}.get(name.strip().upper())
    if match is None:
        raise ValueError(f"--target {name!r} is not one of dockstring's {len(names)} targets; expected one of: "
                         f"{', '.join(names)} (or --receptor R.pdbqt --center X,Y,Z --box X,Y,Z)")
    from dockstring.utils import get_targets_dir, parse_search_box_conf

    directory = str(get_targets_dir())
    box = parse_search_box_conf(os.path.join(directory, f"{match}_conf.txt"))
    return Receptor(os.path.join(directory, f"{match}_target.pdbqt"),
                    (box["center_x"], box["center_y"], box["center_z"]),
                    (box["size_x"], box["size_y"], box["size_z"]), match)


def check_pdbqt(path: str) -> None:
    """Check ``path`` is a receptor PDBQT: ATOM/HETATM lines with a charge and an AutoDock atom type.

    A PDB file has no partial charge (columns 71-76) and no AutoDock type (columns
    78-79); Vina would stop at the first such line, so the check reads every atom line.

    Raises:
        ValueError: naming the file, the first bad line and what was expected.
    """
    expected = ("expected a receptor in PDBQT format (ATOM/HETATM lines with a partial charge in columns 71-76 "
                "and an AutoDock atom type from column 78), e.g. from meeko's mk_prepare_receptor.py")
    if not os.path.isfile(path):
        raise ValueError(f"--receptor {path!r}: no such file; {expected}")
    atoms = 0
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if not line.startswith(("ATOM", "HETATM")):
                    continue
                atoms += 1
                fields = line[70:].split()
                try:
                    float(line[30:38]), float(line[38:46]), float(line[46:54])
                    ok = len(fields) >= 2 and float(fields[0]) == float(fields[0]) and fields[1][0].isalpha()
                except (ValueError, IndexError):
                    ok = False
                if not ok:
                    raise ValueError(f"--receptor {path!r} is not PDBQT: line {number} has no partial charge and "
                                     f"AutoDock atom type after column 70 ({line.rstrip()[:80]!r}); {expected}")
    except UnicodeDecodeError as exc:
        raise ValueError(f"--receptor {path!r} is not a text file ({exc.reason}); {expected}") from exc
    if atoms == 0:
        raise ValueError(f"--receptor {path!r} has no ATOM or HETATM line; {expected}")
