"""The Vina engine: ligands prepared with meeko from RDKit, docked with AutoDock Vina in a helper process.

Each rank starts one helper process (``python -m apps.dock_like.vina_engine``) that holds
a ``vina.Vina`` object with the receptor's affinity maps (computed once, a few seconds)
and docks the ligands the rank hands it, one at a time, on one core. The helper exists
because Vina's Python binding keeps the GIL for the whole docking: in the rank itself, a
ligand of minutes would stall nlevel's server thread (the master and the region-masters
compute too) for minutes. The rank waits on a pipe instead, and the server runs. A
helper that dies (Vina calls ``exit()`` on some inputs) costs that ligand alone: it is
recorded failed with the reason and a new helper docks the next one.

Determinism: Vina re-creates its random generator from the seed at every docking, so a
ligand's poses depend only on the ligand, the receptor, the box, ``--exhaustiveness`` and
``--seed``, not on which rank docks it, in which order, or after which restart. The 3D
start conformer comes from RDKit's ETKDG seeded by the ligand (:func:`ligands.ligand_seed`).
Times are CPU seconds of the helper (``time.process_time``), so a busy machine
stretches the wall time of a ligand, not its recorded cost.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from .library import Entry
from .receptor import Receptor

__all__ = ["VinaSettings", "VinaEngine", "dock_entry", "MAX_POSES"]

MAX_POSES = 9
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass(frozen=True)
class VinaSettings:
    """What the helper needs to dock: the receptor, box, search effort and seed."""

    receptor: Receptor
    exhaustiveness: int
    n_poses: int
    seed: int        # Vina's seed, >= 1 (Vina's 0 means 'random')
    spacing: float = 0.375


# ---------------------------------------------------------------- helper side (no MPI here)


def _prepare_pdbqt(parsed: Any, seed: int) -> tuple[str, Any, int]:
    """meeko PDBQT of the parsed ligand, the prepared molecule, and its rotatable bonds."""
    import numpy as np
    from meeko import MoleculePreparation, PDBQTWriterLegacy
    from rdkit import Chem, rdBase
    from rdkit.Chem import rdDistGeom, rdForceFieldHelpers

    mol = parsed.mol
    # The coordinates decide, not the molfile's 2D/3D flag: a record with every z equal is flat.
    has_3d = mol.GetNumConformers() > 0 and float(np.ptp(mol.GetConformer().GetPositions()[:, 2])) > 1e-3
    with rdBase.BlockLogs():
        if has_3d:
            molh = Chem.AddHs(mol, addCoords=True)
        else:
            molh = Chem.AddHs(Chem.RemoveHs(mol))
            params = rdDistGeom.ETKDGv3()
            params.randomSeed = seed
            params.numThreads = 1
            if rdDistGeom.EmbedMolecule(molh, params) != 0:
                params.useRandomCoords = True
                if rdDistGeom.EmbedMolecule(molh, params) != 0:
                    raise ValueError("RDKit's ETKDG could not generate 3D coordinates")
            if rdForceFieldHelpers.MMFFHasAllMoleculeParams(molh):
                rdForceFieldHelpers.MMFFOptimizeMolecule(molh, maxIters=500)
            else:
                rdForceFieldHelpers.UFFOptimizeMolecule(molh, maxIters=500)
    try:
        setups = MoleculePreparation().prepare(molh)
    except Exception as exc:  # meeko raises plain Exceptions, RuntimeErrors, KeyErrors for what it cannot type
        raise ValueError(f"meeko could not prepare it: {_one_line(exc)}") from exc
    pdbqt, ok, error = PDBQTWriterLegacy.write_string(setups[0])
    if not ok:  # e.g. an element with no AutoDock type (Se, As, Hg): one message per atom, first one kept
        first = error.strip().splitlines()[0] if error.strip() else "no reason given"
        untyped = re.match(r"atom number (\d+) has None type", first)
        if untyped and int(untyped.group(1)) < molh.GetNumAtoms():
            element = molh.GetAtomWithIdx(int(untyped.group(1))).GetSymbol()
            raise ValueError(f"meeko has no AutoDock atom type for {element} (atom {untyped.group(1)}): {first}")
        raise ValueError(f"meeko could not write its PDBQT: {first}")
    rotatable = sum(1 for line in pdbqt.splitlines() if line.startswith("BRANCH"))
    return pdbqt, molh, rotatable


def _one_line(exc: BaseException) -> str:
    """An exception as one line; its type too when the message alone says nothing (a KeyError's ``92``)."""
    text = " ".join(str(exc).split())
    return text if any(c.isalpha() for c in text) else f"{type(exc).__name__}: {text}".rstrip(": ")


def dock_entry(vina: Any, settings: VinaSettings, entry: Entry) -> tuple[dict[str, Any], bytes]:
    """Parse, prepare and dock one library entry with the given ``vina.Vina`` object.

    Returns:
        ``(numbers, record)``: the ligand's numbers (``status`` 0 docked, 1 failed) and
        its SDF record for the pose store (the best pose with its scores, or the reason).
    """
    import numpy as np
    from meeko import PDBQTMolecule, RDKitMolCreate

    from .ligands import ligand_seed
    from .parse import parse_entry
    from .store import record_block

    t0 = time.process_time()
    parsed = parse_entry(entry)
    props: dict[str, object] = {"dock_like_id": entry.index, "dock_like_name": parsed.name,
                                "dock_like_smiles": parsed.smiles, "dock_like_engine": "vina"}
    if parsed.mol is None:
        props.update(dock_like_status="failed", dock_like_reason=parsed.reason)
        return {"status": 1, "cpu_seconds": time.process_time() - t0}, record_block(None, props)
    n_heavy = parsed.mol.GetNumHeavyAtoms()
    try:
        pdbqt, _, rotatable = _prepare_pdbqt(parsed, ligand_seed(parsed.name, entry.index + 1, settings.seed))
    except ValueError as exc:  # no 3D coordinates, or meeko cannot type or write it: the reason says which
        props.update(dock_like_status="failed", dock_like_reason=f"could not prepare: {exc}"[:500])
        return ({"status": 1, "cpu_seconds": time.process_time() - t0, "n_heavy": n_heavy},
                record_block(None, props))
    try:
        vina.set_ligand_from_string(pdbqt)
        vina.dock(exhaustiveness=settings.exhaustiveness, n_poses=max(settings.n_poses, 1))
        energies = np.asarray(vina.energies(n_poses=settings.n_poses, energy_range=1e9))
        pose = RDKitMolCreate.from_pdbqt_mol(PDBQTMolecule(vina.poses(n_poses=1), skip_typing=True))[0]
    except Exception as exc:  # Vina raises TypeError/RuntimeError with its own message, e.g. for boron
        props.update(dock_like_status="failed", dock_like_reason=f"could not dock: {_one_line(exc)}"[:500])
        return ({"status": 1, "cpu_seconds": time.process_time() - t0, "n_heavy": n_heavy},
                record_block(None, props))
    cpu = time.process_time() - t0
    scores = [float(e) for e in energies[:, 0]]
    props.update(dock_like_status="docked", dock_like_score=scores[0], dock_like_inter=float(energies[0, 1]),
                 dock_like_intra=float(energies[0, 2]), dock_like_pose_scores=" ".join(f"{s:.3f}" for s in scores),
                 dock_like_cpu_seconds=round(cpu, 3))
    numbers = {"status": 0, "score": scores[0], "inter": float(energies[0, 1]), "intra": float(energies[0, 2]),
               "n_poses": len(scores), "n_heavy": n_heavy, "n_rotatable": rotatable, "cpu_seconds": cpu,
               "stripped": int(parsed.stripped)}
    numbers.update({f"pose_{k + 1}": s for k, s in enumerate(scores[:MAX_POSES])})
    return numbers, record_block(pose, props)


def make_vina(settings: VinaSettings) -> Any:
    """Return a ``vina.Vina`` with the receptor and its maps (one core, quiet).

    Raises:
        ValueError: when Vina cannot read the receptor or compute the maps.
    """
    from vina import Vina

    r = settings.receptor
    vina = Vina(sf_name="vina", cpu=1, seed=settings.seed, verbosity=0)
    try:
        vina.set_receptor(r.path)
        vina.compute_vina_maps(center=list(r.center), box_size=list(r.box), spacing=settings.spacing)
    except Exception as exc:
        raise ValueError(f"Vina could not use receptor {r.path!r} with box centre {r.center} size {r.box}: "
                         f"{' '.join(str(exc).split())}") from exc
    return vina


def _die_with_parent(parent: int) -> None:
    try:  # Linux: SIGKILL this helper when its rank dies, so no orphan keeps docking
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(0)


def _serve(read_fd: int, write_fd: int, parent: int) -> None:
    _die_with_parent(parent)
    inbox, outbox = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    settings: VinaSettings = inbox.recv()
    try:
        vina = make_vina(settings)
    except ValueError as exc:
        outbox.send(("error", str(exc)))
        return
    outbox.send(("ready", ""))
    while True:
        try:
            entry = inbox.recv()
        except EOFError:
            return
        outbox.send(("done", dock_entry(vina, settings, entry)))


# ---------------------------------------------------------------- rank side


class VinaEngine:
    """A rank's helper process; :meth:`dock` hands it one entry and waits (without the GIL)."""

    def __init__(self, settings: VinaSettings) -> None:
        self.settings = settings
        self._proc: subprocess.Popen[bytes] | None = None
        self._inbox: Connection | None = None
        self._outbox: Connection | None = None
        self.restarts = 0

    def start(self) -> None:
        """Start the helper and wait until its maps are ready.

        Raises:
            ValueError: when the helper reports that Vina cannot use the receptor, or dies.
        """
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_", "PRTE_"))}
        env.update(PYTHONPATH=os.pathsep.join([_ROOT, env.get("PYTHONPATH", "")]), OMP_NUM_THREADS="1",
                   OPENBLAS_NUM_THREADS="1")
        code = (f"from apps.dock_like.vina_engine import _serve; "
                f"_serve({to_child_r}, {from_child_w}, {os.getpid()})")
        self._proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(to_child_r, from_child_w), env=env,
                                      stdin=subprocess.DEVNULL, close_fds=True)
        os.close(to_child_r)
        os.close(from_child_w)
        self._outbox = Connection(to_child_w, readable=False)
        self._inbox = Connection(from_child_r, writable=False)
        self._outbox.send(self.settings)
        kind, message = self._receive()
        if kind != "ready":
            self.close()
            raise ValueError(message)

    def _receive(self) -> tuple[str, Any]:
        assert self._inbox is not None and self._proc is not None
        try:
            return self._inbox.recv()
        except (EOFError, OSError):
            code = self._proc.wait()
            return "died", f"the Vina helper process died (exit status {code})"

    def dock(self, entry: Entry) -> tuple[dict[str, Any], bytes]:
        """Dock one entry in the helper; a helper that dies fails this ligand and is restarted."""
        if self._proc is None:
            self.start()
        assert self._outbox is not None
        try:
            self._outbox.send(entry)
        except (BrokenPipeError, OSError):
            pass  # it died between ligands: _receive reports it
        kind, value = self._receive()
        if kind == "done":
            return value
        self.close()
        self.restarts += 1
        from .parse import parse_entry
        from .store import record_block

        parsed = parse_entry(entry)
        props = {"dock_like_id": entry.index, "dock_like_name": parsed.name, "dock_like_smiles": parsed.smiles,
                 "dock_like_engine": "vina", "dock_like_status": "failed",
                 "dock_like_reason": f"{value} while docking this ligand"}
        return {"status": 1}, record_block(None, props)

    def close(self) -> None:
        """Stop the helper (it exits when its input closes)."""
        for conn in (self._outbox, self._inbox):
            if conn is not None:
                conn.close()
        self._outbox = self._inbox = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
