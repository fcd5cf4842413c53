"""Turning one library entry into a molecule: SMILES line or SDF record, name, salts, the reason it failed.

:func:`parse_entry` never raises for bad chemistry: it returns the reason, so the ligand
is recorded as failed and the screen goes on. A multi-fragment entry (a salt, a
solvate) keeps its largest organic fragment, as a screening chemist expects.
"""

from __future__ import annotations

from dataclasses import dataclass

from rdkit import Chem, rdBase
from rdkit.Chem.MolStandardize import rdMolStandardize

from .library import Entry

__all__ = ["Parsed", "parse_entry"]


@dataclass
class Parsed:
    """A parsed library entry. ``mol`` is None when it does not parse; ``reason`` says why."""

    index: int
    name: str
    smiles: str            # canonical SMILES of what is docked ('' when unparsable: then the raw text)
    mol: Chem.Mol | None   # sanitized, largest fragment; 3D coordinates only from an SDF record
    reason: str = ""
    stripped: bool = False  # True when smaller fragments (counter-ions...) were removed


def _largest_fragment(mol: Chem.Mol) -> tuple[Chem.Mol, bool]:
    if len(Chem.GetMolFrags(mol)) < 2:
        return mol, False
    chooser = rdMolStandardize.LargestFragmentChooser(preferOrganic=True)
    return chooser.choose(mol), True


def _smiles_line(entry: Entry) -> Parsed:
    parts = entry.text.strip().split(None, 1)
    smiles = parts[0] if parts else ""
    name = parts[1].strip() if len(parts) > 1 else f"ligand{entry.index}"
    with rdBase.BlockLogs():
        mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        return Parsed(entry.index, name, smiles, None, f"unparsable SMILES {smiles[:80]!r} (RDKit could not read it)")
    if mol.GetNumAtoms() == 0:
        return Parsed(entry.index, name, smiles, None, "empty SMILES: no atoms")
    mol, stripped = _largest_fragment(mol)
    return Parsed(entry.index, name, Chem.MolToSmiles(mol), mol, "", stripped)


def _sdf_record(entry: Entry) -> Parsed:
    first = entry.text.split("\n", 1)[0].strip()
    name = first if first and first != "$$$$" else f"ligand{entry.index}"
    with rdBase.BlockLogs():
        try:
            mol = Chem.MolFromMolBlock(entry.text, sanitize=False, removeHs=False)
        except (RuntimeError, ValueError) as exc:
            return Parsed(entry.index, name, "", None, f"SDF record RDKit could not read ({exc})")
        if mol is None:
            if not entry.text.replace("$$$$", "").strip():
                return Parsed(entry.index, name, "", None, "empty SDF record")
            return Parsed(entry.index, name, "", None, "not a valid molfile (RDKit could not parse its atom or bond block)")
        if mol.GetNumAtoms() == 0:
            return Parsed(entry.index, name, "", None, "SDF record has no atoms")
        try:
            Chem.SanitizeMol(mol)
        except Exception as exc:  # RDKit raises several sanitization exception types
            return Parsed(entry.index, name, "", None, f"invalid chemistry: {exc}")
    mol, stripped = _largest_fragment(mol)
    return Parsed(entry.index, name, Chem.MolToSmiles(Chem.RemoveHs(mol)), mol, "", stripped)


def parse_entry(entry: Entry) -> Parsed:
    """Parse a library entry; a bad one comes back with ``mol=None`` and the reason."""
    return _smiles_line(entry) if entry.kind == "smi" else _sdf_record(entry)
