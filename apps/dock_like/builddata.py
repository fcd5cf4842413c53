"""Rebuild the shipped data: ``data/library.sdf`` and ``data/pocket.pdb``.

``python -m apps.dock_like.builddata [--out DIR]``

* ``library.sdf``: well-known drugs and fragments from their SMILES, hydrogens added,
  3D coordinates from RDKit's ETKDG (seeded) and MMFF.
* ``pocket.pdb``: a **synthetic** pocket, generated deterministically: amino-acid-like
  residues whose alpha carbons sit on a sphere of radius 12 Å, open towards +z, with
  their side chains pointing into the cavity. It has PDB residue and atom names so that
  :mod:`pocket` can type it, but it is not a real protein and its geometry is only
  roughly protein-like.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
from rdkit import Chem
from rdkit.Chem import rdDistGeom, rdForceFieldHelpers

__all__ = ["DRUGS", "write_library", "write_pocket", "main"]

DRUGS: list[tuple[str, str]] = [
    ("aspirin", "CC(=O)Oc1ccccc1C(=O)O"),
    ("ibuprofen", "CC(C)Cc1ccc(cc1)C(C)C(=O)O"),
    ("paracetamol", "CC(=O)Nc1ccc(O)cc1"),
    ("caffeine", "Cn1cnc2c1c(=O)n(C)c(=O)n2C"),
    ("naproxen", "COc1ccc2cc(ccc2c1)[C@H](C)C(=O)O"),
    ("diclofenac", "OC(=O)Cc1ccccc1Nc1c(Cl)cccc1Cl"),
    ("celecoxib", "Cc1ccc(cc1)-c1cc(nn1-c1ccc(cc1)S(N)(=O)=O)C(F)(F)F"),
    ("imatinib", "Cc1ccc(NC(=O)c2ccc(CN3CCN(C)CC3)cc2)cc1Nc1nccc(n1)-c1cccnc1"),
    ("atorvastatin", "CC(C)c1c(C(=O)Nc2ccccc2)c(-c2ccccc2)c(-c2ccc(F)cc2)n1CC[C@@H](O)C[C@@H](O)CC(=O)O"),
    ("sildenafil", "CCCc1nn(C)c2c1nc([nH]c2=O)-c1cc(ccc1OCC)S(=O)(=O)N1CCN(C)CC1"),
    ("metformin", "CN(C)C(=N)NC(=N)N"),
    ("nicotine", "CN1CCC[C@H]1c1cccnc1"),
    ("morphine", "CN1CC[C@]23[C@@H]4[C@H]1CC5=C2C(=C(C=C5)O)O[C@H]3[C@H](C=C4)O"),
    ("diazepam", "CN1C(=O)CN=C(c2ccccc2)c2cc(Cl)ccc21"),
    ("fluoxetine", "CNCCC(Oc1ccc(cc1)C(F)(F)F)c1ccccc1"),
    ("warfarin", "CC(=O)CC(c1ccccc1)c1c(O)c2ccccc2oc1=O"),
    ("penicillin_g", "CC1(C)S[C@@H]2[C@H](NC(=O)Cc3ccccc3)C(=O)N2[C@H]1C(=O)O"),
    ("oseltamivir", "CCOC(=O)C1=C[C@@H](OC(CC)CC)[C@H](NC(C)=O)[C@@H](N)C1"),
    ("lisinopril", "NCCCC[C@H](N[C@@H](CCc1ccccc1)C(=O)O)C(=O)N1CCC[C@H]1C(=O)O"),
    ("captopril", "C[C@H](CS)C(=O)N1CCC[C@H]1C(=O)O"),
    ("propranolol", "CC(C)NCC(O)COc1cccc2ccccc12"),
    ("salbutamol", "CC(C)(C)NCC(O)c1ccc(O)c(CO)c1"),
    ("dopamine", "NCCc1ccc(O)c(O)c1"),
    ("serotonin", "NCCc1c[nH]c2ccc(O)cc12"),
    ("histamine", "NCCc1cnc[nH]1"),
    ("lidocaine", "CCN(CC)CC(=O)Nc1c(C)cccc1C"),
    ("omeprazole", "COc1ccc2[nH]c(nc2c1)S(=O)Cc1ncc(C)c(OC)c1C"),
    ("loratadine", "CCOC(=O)N1CCC(=C2c3ccc(Cl)cc3CCc3cccnc23)CC1"),
    ("tamoxifen", "CC/C(=C(\\c1ccccc1)c1ccc(OCCN(C)C)cc1)c1ccccc1"),
    ("methotrexate", "CN(Cc1cnc2nc(N)nc(N)c2n1)c1ccc(cc1)C(=O)N[C@@H](CCC(=O)O)C(=O)O"),
    ("gefitinib", "COc1cc2ncnc(Nc3ccc(F)c(Cl)c3)c2cc1OCCCN1CCOCC1"),
    ("erlotinib", "COCCOc1cc2ncnc(Nc3cccc(c3)C#C)c2cc1OCCOC"),
    ("haloperidol", "OC1(CCN(CCCC(=O)c2ccc(F)cc2)CC1)c1ccc(Cl)cc1"),
    ("ciprofloxacin", "OC(=O)c1cn(C2CC2)c2cc(N3CCNCC3)c(F)cc2c1=O"),
    ("acyclovir", "Nc1nc2n(COCCO)cnc2c(=O)[nH]1"),
    ("zidovudine", "Cc1cn([C@H]2C[C@H](N=[N+]=[N-])[C@@H](CO)O2)c(=O)[nH]c1=O"),
    ("theophylline", "Cn1c2nc[nH]c2c(=O)n(C)c1=O"),
    ("benzocaine", "CCOC(=O)c1ccc(N)cc1"),
    ("ketoprofen", "CC(C(=O)O)c1cccc(c1)C(=O)c1ccccc1"),
    ("indomethacin", "COc1ccc2n(C(=O)c3ccc(Cl)cc3)c(C)c(CC(=O)O)c2c1"),
    ("sulfamethoxazole", "Cc1cc(NS(=O)(=O)c2ccc(N)cc2)no1"),
    ("trimethoprim", "COc1cc(Cc2cnc(N)nc2N)cc(OC)c1OC"),
    ("chloroquine", "CCN(CC)CCCC(C)Nc1ccnc2cc(Cl)ccc12"),
    ("donepezil", "COc1cc2CC(CC3CCN(Cc4ccccc4)CC3)C(=O)c2cc1OC"),
    ("ranitidine", "CNC(=C[N+](=O)[O-])NCCSCc1ccc(CN(C)C)o1"),
    ("valsartan", "CCCCC(=O)N(Cc1ccc(cc1)-c1ccccc1-c1nn[nH]n1)[C@@H](C(C)C)C(=O)O"),
    ("ritonavir", "CC(C)[C@H](NC(=O)N(C)Cc1csc(n1)C(C)C)C(=O)N[C@@H](C[C@@H](O)[C@H](Cc1ccccc1)NC(=O)OCc1cncs1)Cc1ccccc1"),
    ("leu_enkephalin", "CC(C)C[C@H](NC(=O)[C@H](Cc1ccccc1)NC(=O)CNC(=O)CNC(=O)[C@@H](N)Cc1ccc(O)cc1)C(=O)O"),
    ("palmitic_acid", "CCCCCCCCCCCCCCCC(=O)O"),
    ("tryptophan", "N[C@@H](Cc1c[nH]c2ccccc12)C(=O)O"),
    ("glucose", "OC[C@H]1OC(O)[C@H](O)[C@@H](O)[C@@H]1O"),
    ("benzamidine", "NC(=N)c1ccccc1"),
    ("phenol", "Oc1ccccc1"),
    ("indole", "c1ccc2[nH]ccc2c1"),
    ("4_aminopyridine", "Nc1ccncc1"),
    ("benzoic_acid", "OC(=O)c1ccccc1"),
]


def write_library(path: str, seed: int = 7) -> int:
    """Write the drugs of :data:`DRUGS` with 3D coordinates to ``path``; return how many."""
    writer = Chem.SDWriter(path)
    for i, (name, smiles) in enumerate(DRUGS):
        mol = Chem.AddHs(Chem.MolFromSmiles(smiles))
        params = rdDistGeom.ETKDGv3()
        params.randomSeed = seed + i
        if rdDistGeom.EmbedMolecule(mol, params) != 0:
            raise RuntimeError(f"cannot embed {name} ({smiles})")
        rdForceFieldHelpers.MMFFOptimizeMolecule(mol, maxIters=1000)
        mol.SetProp("_Name", name)
        mol.SetProp("smiles", smiles)
        mol.SetProp("source", "RDKit ETKDGv3 + MMFF94 from SMILES (apps/dock_like/builddata.py)")
        writer.write(mol)
    writer.close()
    return len(DRUGS)


# Side chains in a local frame: (atom, element, steps inward, sideways, zigzag); one step ~ 1.25 Å.
def _chain(names: str) -> list[tuple[str, str, float, float, float]]:
    out = []
    for k, name in enumerate(names.split(), start=1):
        out.append((name, name[0], 1.25 * k, 0.0, 0.42 * (-1) ** k))
    return out


def _ring(base: int, names: str, radius: float) -> list[tuple[str, str, float, float, float]]:
    labels = names.split()
    out = []
    for i, name in enumerate(labels):
        ang = np.pi + 2 * np.pi * i / len(labels)
        out.append((name, name[0], 1.25 * base + radius + radius * np.cos(ang), radius * np.sin(ang), 0.0))
    return out


def _branch(name: str, parent_step: int) -> tuple[str, str, float, float, float]:
    return (name, name[0], 1.25 * parent_step + 0.5, 1.35, 0.42 * (-1) ** (parent_step + 1))


_SIDECHAINS = {
    "GLY": [], "ALA": _chain("CB"), "SER": _chain("CB OG"), "CYS": _chain("CB SG"),
    "THR": _chain("CB OG1") + [_branch("CG2", 1)], "VAL": _chain("CB CG1") + [_branch("CG2", 1)],
    "LEU": _chain("CB CG CD1") + [_branch("CD2", 2)], "ILE": _chain("CB CG1 CD1") + [_branch("CG2", 1)],
    "MET": _chain("CB CG SD CE"), "ASP": _chain("CB CG OD1") + [_branch("OD2", 2)],
    "GLU": _chain("CB CG CD OE1") + [_branch("OE2", 3)], "ASN": _chain("CB CG OD1") + [_branch("ND2", 2)],
    "GLN": _chain("CB CG CD OE1") + [_branch("NE2", 3)], "LYS": _chain("CB CG CD CE NZ"),
    "ARG": _chain("CB CG CD NE CZ NH1") + [_branch("NH2", 5)],
    "PHE": _chain("CB") + _ring(2, "CG CD1 CE1 CZ CE2 CD2", 1.39),
    "TYR": _chain("CB") + _ring(2, "CG CD1 CE1 CZ CE2 CD2", 1.39) + [("OH", "O", 2.5 + 2 * 1.39 + 1.36, 0.0, 0.0)],
    "HIS": _chain("CB") + _ring(2, "CG ND1 CE1 NE2 CD2", 1.15),
}
_SEQUENCE = ("LEU ASP SER PHE LYS THR VAL TYR GLU ASN ILE HIS ARG ALA GLN MET "
             "GLY SER ASP LEU PHE THR TYR ASN VAL LYS ILE GLU").split()


def _pocket_atoms(centre: np.ndarray, radius: float = 12.0) -> list[tuple[str, str, str, int, np.ndarray]]:
    rng = np.random.default_rng(2016)
    atoms: list[tuple[str, str, str, int, np.ndarray]] = []
    n = len(_SEQUENCE)
    golden = np.pi * (3 - np.sqrt(5))
    top = 0.35  # residues cover the sphere below z = top: a bowl open towards +z
    total = int(np.ceil(n * 2 / (1 + top)))
    k = 0
    for i in range(total):  # Fibonacci points on the sphere, keeping those below the opening
        z = 1 - 2 * (i + 0.5) / total
        if z > top or k >= n:
            continue
        r = np.sqrt(1 - z * z)
        u = np.array([r * np.cos(golden * i), r * np.sin(golden * i), z])
        resname = _SEQUENCE[k]
        k += 1
        ca = centre + radius * u
        backbone = [("N", "N", -0.8, 1.2, 0.0), ("CA", "C", 0.0, 0.0, 0.0), ("C", "C", -0.8, -1.2, 0.0),
                    ("O", "O", -1.3, -1.6, 1.0)]
        best: list[tuple[str, str, str, int, np.ndarray]] = []
        best_gap = -1.0
        for _ in range(24):  # orient and tilt the side chain to keep clear of the residues placed so far
            e1 = np.cross(-u, rng.normal(size=3))
            e1 /= np.linalg.norm(e1)
            w = -u + rng.uniform(-0.45, 0.45) * e1 + rng.uniform(-0.45, 0.45) * np.cross(-u, e1)
            w /= np.linalg.norm(w)
            e1 = np.cross(w, np.cross(e1, w))
            e1 /= np.linalg.norm(e1)
            e2 = np.cross(w, e1)
            trial = [(name, element, resname, k, ca + a * w + b * e1 + c * e2)
                     for name, element, a, b, c in backbone + _SIDECHAINS[resname]]
            if not atoms:
                best = trial
                break
            placed = np.array([a[4] for a in atoms])
            gap = min(float(np.linalg.norm(placed - t[4], axis=1).min()) for t in trial)
            if gap > best_gap:
                best, best_gap = trial, gap
        atoms.extend(best)
    return atoms


def write_pocket(path: str, centre: tuple[float, float, float] = (12.0, 8.0, 15.0)) -> int:
    """Write the synthetic pocket to ``path`` as PDB; return its atom count."""
    atoms = _pocket_atoms(np.array(centre))
    lines = [
        "REMARK   1 SYNTHETIC POCKET FOR apps.dock_like: NOT A REAL PROTEIN.",
        "REMARK   1 GENERATED DETERMINISTICALLY BY apps/dock_like/builddata.py.",
        f"REMARK   1 CAVITY CENTRE {centre[0]:.3f} {centre[1]:.3f} {centre[2]:.3f}, OPEN TOWARDS +Z.",
    ]
    for serial, (name, element, resname, resseq, xyz) in enumerate(atoms, start=1):
        atom_name = f" {name:<3}" if len(name) < 4 else name
        lines.append(
            f"ATOM  {serial:5d} {atom_name}{'':1}{resname:>3} A{resseq:4d}    "
            f"{xyz[0]:8.3f}{xyz[1]:8.3f}{xyz[2]:8.3f}{1.0:6.2f}{0.0:6.2f}          {element:>2}"
        )
    lines += ["TER", "END"]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return len(atoms)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: rebuild both files."""
    p = argparse.ArgumentParser(prog="python -m apps.dock_like.builddata", description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "data"), help="output directory")
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    n = write_library(os.path.join(a.out, "library.sdf"))
    m = write_pocket(os.path.join(a.out, "pocket.pdb"))
    print(f"wrote {n} ligands and a {m}-atom synthetic pocket to {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
