"""apps.dock_like: library parsing and bad records, pocket errors, determinism, cost, hit list, SDF export."""

from __future__ import annotations

import argparse
import logging
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
from apps.dock_like.grids import build_grids  # noqa: E402
from apps.dock_like.ligands import PrepareError, ligand_seed, load_library, prepare  # noqa: E402
from apps.dock_like.pocket import read_pocket  # noqa: E402
from apps.dock_like.search import Pose, dock, place, score_pose  # noqa: E402

from ..conftest import BIN, ROOT  # noqa: E402

FAST = ["--maxiter", "4"]


def options(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    app.add_arguments(parser)
    return parser.parse_args(list(argv))


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
    lib = load_library(os.path.join(app.DATA, "library.sdf"))
    i = lib.names.index(name)
    return prepare(lib.mol(i), name, ligand_seed(name, lib.records[i]), 24)


# ---------------------------------------------------------------- library


def test_shipped_library_parses_with_no_bad_record():
    lib = load_library(os.path.join(app.DATA, "library.sdf"))
    assert len(lib) == lib.n_records >= 40 and not lib.skipped
    assert "imatinib" in lib.names and lib.records == list(range(1, len(lib) + 1))


def test_bad_records_are_skipped_with_a_warning_naming_them(mixed_library, tmp_path, caplog):
    lib = load_library(mixed_library)
    assert lib.names == ["aspirin", "phenol"] and lib.records == [1, 4]
    by_record = {s.record: s for s in lib.skipped}
    assert by_record[2].name == "broken_record" and "not a valid molfile" in by_record[2].reason
    assert by_record[3].name == "pentavalent_carbon" and "valence" in by_record[3].reason.lower()
    assert by_record[5].reason == "empty record"
    with caplog.at_level(logging.WARNING, logger="apps.dock_like"):
        app.setup(options("--library", mixed_library, "--out", str(tmp_path / "h.h5")))
    text = caplog.text
    assert "record 2 ('broken_record')" in text and "record 3 ('pentavalent_carbon')" in text
    assert app.total(None) == 2


def test_a_library_with_no_valid_record_is_an_error(tmp_path):
    path = tmp_path / "bad.sdf"
    path.write_text(MALFORMED + MALFORMED)
    with pytest.raises(ValueError, match=r"has no valid SDF record \(2 record\(s\) read\).*broken_record"):
        load_library(str(path))
    empty = tmp_path / "empty.sdf"
    empty.write_text("")
    with pytest.raises(ValueError, match="no valid SDF record"):
        load_library(str(empty))
    with pytest.raises(ValueError, match="no such file"):
        load_library(str(tmp_path / "missing.sdf"))


def test_a_ligand_without_3d_coordinates_gets_them_deterministically(tmp_path):
    path = tmp_path / "flat.sdf"
    path.write_text(molblock("CC(C)Cc1ccc(cc1)C(C)C(=O)O", "ibuprofen_2d", three_d=False))
    lib = load_library(str(path))
    a = prepare(lib.mol(0), "ibuprofen_2d", 42, 24)
    b = prepare(lib.mol(0), "ibuprofen_2d", 42, 24)
    assert a.generated_3d and np.ptp(a.ref[:, 2]) > 1.0
    assert np.array_equal(a.ref, b.ref)
    assert not shipped("aspirin").generated_3d


def test_a_ligand_that_cannot_get_3d_is_skipped_with_a_reason(tmp_path, monkeypatch, caplog):
    path = tmp_path / "flat.sdf"
    path.write_text(molblock("c1ccccc1CCN", "flat_one", three_d=False))
    app.setup(options("--library", str(path), "--out", str(tmp_path / "h.h5"), *FAST))
    monkeypatch.setattr(ligands.rdDistGeom, "EmbedMolecule", lambda *a, **k: -1)
    with caplog.at_level(logging.WARNING, logger="apps.dock_like"):
        row = app.do_job(0)
    assert "'flat_one' (record 1)" in caplog.text and "could not generate" in caplog.text
    values = dict(zip(app.result_fields, row))
    assert values["status"] == 1 and np.isnan(values["score"])
    app.finish(np.array([0]), np.array([row]), options("--library", str(path), "--out", str(tmp_path / "h.h5"), *FAST))
    hits = hitlist.read_hits(str(tmp_path / "h.h5"))
    assert hits["status"].tolist() == [1] and hits["n_heavy"].tolist() == [-1] and hits["name"] == ["flat_one"]
    assert "1 ligand(s) skipped" in hitlist.top_table(hits, 5)
    with pytest.raises(PrepareError):
        prepare(load_library(str(path)).mol(0), "flat_one", 1, 24)


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
        (["--starts", "0"], "--starts must be >= 1, got 0"),
        (["--max-torsions", "30"], r"--max-torsions must be in \[0, 24\], got 30"),
        (["--center", "1,2"], "--center must be three numbers X,Y,Z"),
        (["--spacing", "0"], "--spacing and --box must be > 0"),
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
    keep = [i for i, f in enumerate(app.result_fields) if f != "seconds"]
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


def test_the_hit_list_refuses_to_overwrite_a_foreign_file(tmp_path):
    text = tmp_path / "notes.h5"
    text.write_text("my notes")
    foreign = tmp_path / "other.h5"
    with h5py.File(foreign, "w") as f:
        f.create_dataset("x", data=[1, 2])
    row = np.zeros((1, len(hitlist.FIELDS)))
    for path in (text, foreign):
        with pytest.raises(ValueError, match="is not a dock_like hit list; it will not be overwritten"):
            hitlist.write_hits(str(path), np.array([0]), row, ["a"], [1], {})
    assert text.read_text() == "my notes"
    with pytest.raises(ValueError, match="is a directory"):
        hitlist.check_out_path(str(tmp_path))
    with pytest.raises(ValueError, match="--out .*notes.h5.* not a dock_like hit list"):
        app.setup(options("--out", str(text)))
    ours = tmp_path / "hits.h5"
    hitlist.write_hits(str(ours), np.array([0]), row, ["a"], [1], {})
    hitlist.write_hits(str(ours), np.array([0]), row, ["a"], [1], {})  # its own file: overwritten
    sdf = tmp_path / "mine.sdf"
    sdf.write_text(molblock("CCO", "ethanol"))
    with pytest.raises(ValueError, match="not a dock_like export"):
        hitlist.check_sdf_path(str(sdf))


def test_finish_writes_the_hit_list_and_the_sdf_export_round_trips(tmp_path, capsys, pocket_grids):
    out, sdf = tmp_path / "hits.h5", tmp_path / "top.sdf"
    o = options("--out", str(out), "--export-sdf", str(sdf), "--top", "3", *FAST)
    app.setup(o)
    ids = np.array([5, 0, 20, 53])
    values = np.array([app.do_job(int(i)) for i in ids])
    app.finish(ids, values, o)
    printed = capsys.readouterr().out
    assert "top 3 of 4 docked ligands" in printed and "hit list:" in printed
    hits = hitlist.read_hits(str(out))
    assert sorted(hits["ligand"].tolist()) == sorted(ids.tolist())
    assert list(hits["score"]) == sorted(values[:, 0])
    assert hits["attrs"]["library_sha256"] == hitlist.sha256(os.path.join(app.DATA, "library.sdf"))
    mols = [m for m in Chem.SDMolSupplier(str(sdf), removeHs=False)]
    assert len(mols) == 3 and all(m is not None for m in mols)
    lib = load_library(os.path.join(app.DATA, "library.sdf"))
    _, grids = pocket_grids
    for rank, mol in enumerate(mols):
        i = int(hits["ligand"][rank])
        assert mol.GetProp("_Name") == lib.names[i]
        assert mol.GetDoubleProp("dock_like_score") == pytest.approx(hits["score"][rank])
        original = Chem.MolToSmiles(Chem.RemoveHs(lib.mol(i)))
        assert Chem.MolToSmiles(Chem.RemoveHs(mol)) == original
        lig = prepare(lib.mol(i), lib.names[i], ligand_seed(lib.names[i], lib.records[i]), 24)
        xyz = mol.GetConformer().GetPositions()
        pose = Pose(hits["pose"][rank][:3], hits["pose"][rank][3:], hits["torsions"][rank][: len(lig.torsions)])
        assert np.allclose(xyz, place(lig, pose), atol=1e-4)  # SDF keeps 4 decimals
        assert score_pose(lig, grids, pose)[0] == pytest.approx(hits["score"][rank], abs=1e-9)
    # The stand-alone tool rebuilds the same export from the hit list alone.
    again = tmp_path / "again.sdf"
    assert hitlist.main([str(out), "--top", "3", "--export-sdf", str(again)]) == 0
    assert [m.GetProp("_Name") for m in Chem.SDMolSupplier(str(again))] == [m.GetProp("_Name") for m in mols]


# ---------------------------------------------------------------- generator and end to end


def test_the_generator_is_deterministic_and_long_tailed(tmp_path):
    a, b = tmp_path / "a.sdf", tmp_path / "b.sdf"
    generate.write_library(str(a), 6, seed=5, three_d=False)
    generate.write_library(str(b), 6, seed=5, three_d=False)
    assert a.read_bytes() == b.read_bytes()
    lib = load_library(str(a))
    assert len(lib) == 6 and not lib.skipped and lib.names[0] == "SYN5-0000000"
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
        assert "top 5 of 5 docked ligands" in proc.stdout
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
    assert changed.returncode == 2 and "fingerprint" in changed.stderr, changed.stderr
