"""apps.dock_like, built-in engine: entries and bad records, pocket errors, determinism, cost, hit list, SDF export."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

pytest.importorskip("rdkit")

from rdkit import Chem  # noqa: E402
from rdkit.Chem import AllChem  # noqa: E402

import apps.dock_like as app  # noqa: E402
from apps.dock_like import generate, hitlist, ligands  # noqa: E402
from apps.dock_like.builddata import DRUGS  # noqa: E402
from apps.dock_like.grids import build_grids  # noqa: E402
from apps.dock_like.hitlist import FIELDS  # noqa: E402
from apps.dock_like.library import Entry, scan  # noqa: E402
from apps.dock_like.ligands import PrepareError, ligand_seed, prepare  # noqa: E402
from apps.dock_like.parse import parse_entry  # noqa: E402
from apps.dock_like.pocket import read_pocket  # noqa: E402
from apps.dock_like.search import dock, score_pose  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
while not os.path.isfile(os.path.join(ROOT, "setup.cfg")):  # this file may live in tests/ or tests/e2e/
    ROOT = os.path.dirname(ROOT)
BIN = os.path.dirname(sys.executable)
FAST = ["--maxiter", "4"]
SHIPPED = os.path.join(app.DATA, "library.sdf")


def options(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    app.add_arguments(parser)
    o = parser.parse_args(list(argv))
    o.checkpoint, o.fresh = None, False
    return o


def entries(path: str) -> list[Entry]:
    kind = "smi" if path.endswith(".smi") else "sdf"
    data = open(path, "rb").read()
    return [Entry(i, kind, data[a:b].decode()) for i, (a, b) in enumerate(scan(path, kind))]


def molblock(smiles: str, name: str, three_d: bool = True, seed: int = 1) -> str:
    mol = Chem.MolFromSmiles(smiles)
    if three_d:
        mol = Chem.AddHs(mol)
        AllChem.EmbedMolecule(mol, randomSeed=seed)
    else:
        AllChem.Compute2DCoords(mol)
    mol.SetProp("_Name", name)
    return Chem.MolToMolBlock(mol) + "$$$$\n"


MALFORMED = "broken_record\n  made by hand\n\n  2  1  0  0  0  0  0  0  0  0999 V2000\nthis is not an atom line\n$$$$\n"


def bad_valence_block() -> str:
    # A carbon with five bonds: parses as a molfile, fails RDKit's sanitization.
    mol = Chem.RWMol(Chem.MolFromSmiles("C(C)(C)(C)(C)", sanitize=False))
    mol.AddAtom(Chem.Atom(6))
    mol.AddBond(0, 5, Chem.BondType.SINGLE)
    m = mol.GetMol()
    m.UpdatePropertyCache(strict=False)
    AllChem.Compute2DCoords(m)
    m.SetProp("_Name", "pentavalent_carbon")
    return Chem.MolToMolBlock(m, kekulize=False) + "$$$$\n"


@pytest.fixture
def mixed_library(tmp_path):
    path = tmp_path / "mixed.sdf"
    path.write_text(molblock("CC(=O)Oc1ccccc1C(=O)O", "aspirin") + MALFORMED + bad_valence_block()
                    + molblock("c1ccccc1O", "phenol") + "\n$$$$\n")
    return str(path)


@pytest.fixture(scope="module")
def pocket_grids():
    pocket = read_pocket(os.path.join(app.DATA, "pocket.pdb"))
    return pocket, build_grids(pocket, pocket.centroid, 28.0, 0.4)


def shipped(name: str):
    i = [n for n, _ in DRUGS].index(name)
    parsed = parse_entry(entries(SHIPPED)[i])
    assert parsed.name == name
    return prepare(parsed.mol, name, ligand_seed(name, i + 1), 24)


# ---------------------------------------------------------------- library


def test_shipped_library_parses_with_no_bad_record():
    parsed = [parse_entry(e) for e in entries(SHIPPED)]
    assert len(parsed) == len(DRUGS) >= 40 and all(p.mol is not None for p in parsed)
    assert [p.name for p in parsed] == [n for n, _ in DRUGS]


def test_bad_records_are_failed_ligands_with_their_reason(mixed_library):
    parsed = [parse_entry(e) for e in entries(mixed_library)]
    assert [p.name for p in parsed] == ["aspirin", "broken_record", "pentavalent_carbon", "phenol", "ligand4"]
    assert [p.mol is not None for p in parsed] == [True, False, False, True, False]
    assert "not a valid molfile" in parsed[1].reason and "valence" in parsed[2].reason.lower()
    assert parsed[4].reason in ("empty SDF record", "SDF record has no atoms")


def test_bad_ligands_are_recorded_failed_and_the_screen_goes_on(mixed_library, tmp_path, capsys):
    o = options("--library", mixed_library, "--out", str(tmp_path / "h.h5"), *FAST)
    app.setup(o)
    assert app.total(o) == 5  # every record is a ligand: a bad one fails, it does not shift the numbering
    rows = [app.do_job(i) for i in range(5)]
    assert [dict(zip(FIELDS, r))["status"] for r in rows] == [0, 1, 1, 0, 1]
    app.finish(np.arange(5), np.array(rows), o)
    hits = hitlist.read_hits(str(tmp_path / "h.h5"))
    assert hits["name"][:2] in (["aspirin", "phenol"], ["phenol", "aspirin"]) and hits["status"].tolist() == [0, 0, 1, 1, 1]
    reasons = dict(zip(hits["name"], hits["reason"]))
    assert "valence" in reasons["pentavalent_carbon"].lower() and reasons["aspirin"] == ""
    assert hits["n_heavy"].tolist()[2:] == [-1, -1, -1]
    assert "3 ligand(s) failed" in capsys.readouterr().out


def test_a_library_with_no_entry_is_an_error(tmp_path):
    empty = tmp_path / "empty.sdf"
    empty.write_text("")
    with pytest.raises(ValueError, match="has no SDF record"):
        app.setup(options("--library", str(empty), "--out", str(tmp_path / "h.h5")))
    comments = tmp_path / "comments.smi"
    comments.write_text("# nothing here\n\n")
    with pytest.raises(ValueError, match="has no SMILES line"):
        app.setup(options("--library", str(comments), "--out", str(tmp_path / "h.h5")))
    with pytest.raises(ValueError, match="no such file"):
        app.setup(options("--library", str(tmp_path / "missing.sdf"), "--out", str(tmp_path / "h.h5")))


def test_a_ligand_without_3d_coordinates_gets_them_deterministically(tmp_path):
    path = tmp_path / "flat.sdf"
    path.write_text(molblock("CC(C)Cc1ccc(cc1)C(C)C(=O)O", "ibuprofen_2d", three_d=False))
    mol = parse_entry(entries(str(path))[0]).mol
    a = prepare(mol, "ibuprofen_2d", 42, 24)
    b = prepare(mol, "ibuprofen_2d", 42, 24)
    assert a.generated_3d and np.ptp(a.ref[:, 2]) > 1.0
    assert np.array_equal(a.ref, b.ref)
    assert not shipped("aspirin").generated_3d


def test_a_ligand_that_cannot_get_3d_is_failed_with_a_reason(tmp_path, monkeypatch):
    path = tmp_path / "flat.sdf"
    path.write_text(molblock("c1ccccc1CCN", "flat_one", three_d=False))
    o = options("--library", str(path), "--out", str(tmp_path / "h.h5"), *FAST)
    app.setup(o)
    monkeypatch.setattr(ligands.rdDistGeom, "EmbedMolecule", lambda *a, **k: -1)
    row = app.do_job(0)
    values = dict(zip(app.result_fields, row))
    assert values["status"] == 1 and np.isnan(values["score"])
    app.finish(np.array([0]), np.array([row]), o)
    hits = hitlist.read_hits(str(tmp_path / "h.h5"))
    assert hits["status"].tolist() == [1] and hits["n_heavy"].tolist() == [-1] and hits["name"] == ["flat_one"]
    assert "could not generate" in hits["reason"][0] and hits["pose"] == [""]
    with pytest.raises(PrepareError):
        prepare(parse_entry(entries(str(path))[0]).mol, "flat_one", 1, 24)


# ---------------------------------------------------------------- pocket and options


def test_bad_pocket_files_give_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        read_pocket(str(tmp_path / "nope.pdb"))
    text = tmp_path / "text.pdb"
    text.write_text("this is not a PDB file\n")
    with pytest.raises(ValueError, match="has no ATOM or HETATM record"):
        read_pocket(str(text))
    broken = tmp_path / "broken.pdb"
    broken.write_text("ATOM      1  CA  ALA A   1      xx.xxx  yy.yyy  zz.zzz  1.00  0.00           C\n" * 12)
    with pytest.raises(ValueError, match="does not parse as PDB|RDKit read"):
        read_pocket(str(broken))
    binary = tmp_path / "binary.pdb"
    binary.write_bytes(b"\x89HDF\r\n\x1a\n\xff\xfe")
    with pytest.raises(ValueError, match="not a text PDB file"):
        read_pocket(str(binary))
    few = tmp_path / "few.pdb"
    few.write_text("".join(open(os.path.join(app.DATA, "pocket.pdb")).readlines()[:6]))
    with pytest.raises(ValueError, match="expected at least 10 atoms"):
        read_pocket(str(few))


def test_setup_rejects_bad_options(tmp_path):
    out = ["--out", str(tmp_path / "h.h5")]
    for argv, message in [
        (["--starts", "0"], r"--starts must be in \[1, 1000\], got 0"),
        (["--max-torsions", "30"], r"--max-torsions must be in \[0, 24\], got 30"),
        (["--center", "1,2"], "--center must be three numbers X,Y,Z"),
        (["--spacing", "0"], "--spacing must be > 0"),
        (["--box", "10,12,14"], "--box for --engine builtin is one edge"),
        (["--limit", "0"], "--limit must be >= 1"),
        (["--pocket", str(tmp_path / "none.pdb")], "--pocket .* no such file"),
    ]:
        with pytest.raises(ValueError, match=message):
            app.setup(options(*argv, *out))


def test_the_shipped_pocket_is_typed():
    pocket = read_pocket(os.path.join(app.DATA, "pocket.pdb"))
    assert pocket.n_residues >= 20 and pocket.donor.any() and pocket.acceptor.any()
    assert abs(pocket.charges.sum()) < 5


# ---------------------------------------------------------------- docking


def test_a_ligands_score_is_deterministic(pocket_grids):
    _, grids = pocket_grids
    lig = shipped("propranolol")
    a = dock(lig, grids, seed=11, maxiter=5)
    b = dock(shipped("propranolol"), grids, seed=11, maxiter=5)
    assert a.score == b.score and a.n_evals == b.n_evals
    assert np.array_equal(a.pose.q, b.pose.q) and np.array_equal(a.pose.theta, b.pose.theta)
    assert a.score < 0
    assert score_pose(lig, grids, a.pose)[0] == pytest.approx(a.score, abs=1e-9)


def test_do_job_is_deterministic_across_setups(tmp_path):
    o = options("--out", str(tmp_path / "h.h5"), *FAST)
    app.setup(o)
    first = app.do_job(3)
    app.setup(options("--out", str(tmp_path / "h.h5"), *FAST))
    second = app.do_job(3)
    assert len(first) == len(app.result_fields)
    varies = ("seconds", "cpu_seconds", *hitlist.STORE_FIELDS)  # time, and where the record went
    keep = [i for i, f in enumerate(app.result_fields) if f not in varies]
    assert np.array_equal(np.array(first)[keep], np.array(second)[keep], equal_nan=True)


def test_cost_grows_with_size_and_flexibility(pocket_grids):
    _, grids = pocket_grids
    evals = {}
    for name in ("phenol", "propranolol", "leu_enkephalin"):
        lig = shipped(name)
        evals[name] = (lig.n_heavy, len(lig.torsions), dock(lig, grids, seed=3, maxiter=8).n_evals)
    (h0, t0, e0), (h1, t1, e1), (h2, t2, e2) = evals.values()
    assert h0 < h1 < h2 and t0 < t1 < t2
    assert e0 < e1 < e2 and e2 > 3 * e0, evals


# ---------------------------------------------------------------- hit list and export


def _texts(n: int) -> dict[str, list[str]]:
    return {"name": ["a"] * n, "smiles": ["C"] * n, "reason": [""] * n, "pose": [""] * n}


def test_the_hit_list_refuses_to_overwrite_a_foreign_file(tmp_path):
    text = tmp_path / "notes.h5"
    text.write_text("my notes")
    foreign = tmp_path / "other.h5"
    with h5py.File(foreign, "w") as f:
        f.create_dataset("x", data=[1, 2])
    row = np.zeros((1, len(hitlist.FIELDS)))
    for path in (text, foreign):
        with pytest.raises(ValueError, match="is not a dock_like hit list; it will not be overwritten"):
            hitlist.write_hits(str(path), np.array([0]), row, _texts(1), {})
    assert text.read_text() == "my notes"
    with pytest.raises(ValueError, match="is a directory"):
        hitlist.check_out_path(str(tmp_path))
    with pytest.raises(ValueError, match="--out .*notes.h5.* not a dock_like hit list"):
        app.setup(options("--out", str(text)))
    ours = tmp_path / "hits.h5"
    hitlist.write_hits(str(ours), np.array([0]), row, _texts(1), {})
    hitlist.write_hits(str(ours), np.array([0]), row, _texts(1), {})  # its own file: overwritten
    sdf = tmp_path / "mine.sdf"
    sdf.write_text(molblock("CCO", "ethanol"))
    with pytest.raises(ValueError, match="not a dock_like export"):
        hitlist.check_sdf_path(str(sdf))


def test_finish_writes_the_hit_list_and_the_sdf_export_round_trips(tmp_path, capsys):
    out, sdf = tmp_path / "hits.h5", tmp_path / "top.sdf"
    o = options("--out", str(out), "--export-sdf", str(sdf), "--top", "3", *FAST)
    app.setup(o)
    ids = np.array([5, 0, 20, 53])
    values = np.array([app.do_job(int(i)) for i in ids])
    app.finish(ids, values, o)
    printed = capsys.readouterr().out
    assert "top 3 of 4 docked ligands" in printed and "hit list:" in printed
    hits = hitlist.read_hits(str(out))
    assert sorted(hits["id"].tolist()) == sorted(ids.tolist())
    assert list(hits["score"]) == sorted(values[:, FIELDS.index("score")])
    assert hits["attrs"]["library_sha256"] == app.library.sha256(SHIPPED)
    assert hits["name"] == [DRUGS[i][0] for i in hits["id"]]
    mols = [m for m in Chem.SDMolSupplier(str(sdf), removeHs=False)]
    assert len(mols) == 3 and all(m is not None for m in mols)
    centre = np.array([float(v) for v in o.center.split(",")])
    for rank, mol in enumerate(mols):
        i = int(hits["id"][rank])
        assert mol.GetProp("_Name") == DRUGS[i][0] and mol.GetIntProp("dock_like_rank") == rank + 1
        assert float(mol.GetProp("dock_like_score")) == pytest.approx(hits["score"][rank], abs=1e-3)
        assert Chem.MolToSmiles(Chem.RemoveHs(mol)) == hits["smiles"][rank]
        assert Chem.MolToSmiles(Chem.RemoveHs(mol)) == Chem.MolToSmiles(Chem.MolFromSmiles(DRUGS[i][1]))
        assert np.abs(mol.GetConformer().GetPositions() - centre).max() < 14 + 3  # docked inside the 28 Å grid
    # The stand-alone tool writes the same export from the hit list alone.
    again = tmp_path / "again.sdf"
    assert hitlist.main([str(out), "--top", "3", "--export-sdf", str(again)]) == 0
    assert [m.GetProp("_Name") for m in Chem.SDMolSupplier(str(again))] == [m.GetProp("_Name") for m in mols]


# ---------------------------------------------------------------- generator and end to end


def test_the_generator_is_deterministic_and_long_tailed(tmp_path):
    a, b = tmp_path / "a.sdf", tmp_path / "b.sdf"
    generate.write_library(str(a), 6, seed=5, three_d=False)
    generate.write_library(str(b), 6, seed=5, three_d=False)
    assert a.read_bytes() == b.read_bytes()
    parsed = [parse_entry(e) for e in entries(str(a))]
    assert len(parsed) == 6 and all(p.mol is not None for p in parsed) and parsed[0].name == "SYN5-0000000"
    sizes = [Chem.MolFromSmiles(generate.smiles_for(5, i)) for i in range(300)]
    heavy = np.array([m.GetNumHeavyAtoms() for m in sizes if m is not None])
    assert heavy.max() > 2 * np.median(heavy)
    assert generate.main(["--count", "2", "--out", str(a)]) == 2  # exists: refused without --force


@pytest.mark.timeout(240)
def test_same_scores_on_1_and_3_processes(tmp_path):
    lib = tmp_path / "lib.sdf"
    lib.write_text("".join(molblock(s, n) for n, s in [("a", "CCO"), ("b", "c1ccccc1N"), ("c", "OCC(O)CO"),
                                                       ("d", "CC(=O)Nc1ccc(O)cc1"), ("e", "NCCc1ccccc1")]))
    env = {**os.environ, "PYTHONPATH": ROOT, "NLEVEL_TTY": "0"}
    scores = []
    for n in (1, 3):
        out = tmp_path / f"hits{n}.h5"
        cmd = [os.path.join(BIN, "nlevel-mpiexec"), "-n", str(n), sys.executable, "-m", "nlevel.run", "apps.dock_like",
               "--library", str(lib), "--out", str(out), "--checkpoint", str(tmp_path / f"run{n}.h5"),
               "--report", "", *FAST]
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=200)
        assert proc.returncode == 0, proc.stderr
        assert "top 5 of 5 docked ligands" in proc.stdout, proc.stdout
        hits = hitlist.read_hits(str(out))
        scores.append(dict(zip(hits["name"], hits["score"].tolist())))
    assert scores[0] == scores[1]


def test_the_shipped_pocket_is_rebuilt_exactly(tmp_path):
    from apps.dock_like import builddata

    builddata.write_pocket(str(tmp_path / "pocket.pdb"))
    assert (tmp_path / "pocket.pdb").read_bytes() == open(os.path.join(app.DATA, "pocket.pdb"), "rb").read()


@pytest.mark.timeout(240)
def test_resume_may_change_output_options_but_not_the_inputs(tmp_path):
    """The app's fingerprint() hook: --top/--out do not identify the run; the library's content does."""
    lib = tmp_path / "lib.sdf"
    lib.write_text("".join(molblock(s, n) for n, s in [("a", "CCO"), ("b", "c1ccccc1N"), ("c", "OCC(O)CO")]))
    env = {**os.environ, "PYTHONPATH": ROOT, "NLEVEL_TTY": "0"}

    def run(*extra):
        cmd = [os.path.join(BIN, "nlevel-mpiexec"), "-n", "2", sys.executable, "-m", "nlevel.run", "apps.dock_like",
               "--library", str(lib), "--checkpoint", str(tmp_path / "run.h5"), "--report", "", *FAST, *extra]
        return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=200)

    first = run("--out", "hits.h5", "--top", "3")
    assert first.returncode == 0, first.stderr
    again = run("--out", "hits2.h5", "--top", "1")  # only output options changed: resumes, nothing re-run
    assert again.returncode == 0, again.stderr
    assert "(0 this run, 3 from the checkpoint" in again.stdout
    h1, h2 = hitlist.read_hits(str(tmp_path / "hits.h5")), hitlist.read_hits(str(tmp_path / "hits2.h5"))
    assert dict(zip(h1["name"], h1["score"].tolist())) == dict(zip(h2["name"], h2["score"].tolist()))
    lib.write_text(lib.read_text() + "\n")  # same records, different bytes: another input
    changed = run("--out", "hits3.h5")
    assert changed.returncode == 2 and "changed since its index was built" in changed.stderr, changed.stderr
    assert "belongs to the library as it was" in changed.stderr and "Traceback" not in changed.stderr
    assert hitlist.read_hits(str(tmp_path / "hits2.h5"))["name"] == h2["name"]  # nothing lost
