"""Measure per-ligand AutoDock Vina times on real drug-like ligands: the input of bench/dock_sim.py.

``python bench/dock_times.py [--target ABL1] [--exhaustiveness 8] [--procs 2]
[--out bench/results/dock_times_abl1] [--work DIR]``

Docks the app's drug list (:data:`apps.dock_like.builddata.DRUGS`: 56 approved drugs and
fragments) plus the ABL1 inhibitors of ``apps/dock_like/data/abl1_actives_decoys.smi``
that are not already in it, with the real app (``nlevel-mpiexec -n PROCS python -m
nlevel.run apps.dock_like --engine vina ...``), then reads each ligand's CPU seconds
(``time.process_time`` of the Vina helper: preparation and docking, not the maps) from
the hit list. Writes ``OUT.json`` (per ligand: name, SMILES, heavy atoms, rotatable
bonds, score, CPU seconds; the command, commit, versions and load average) and
``OUT.txt`` (one CPU time a line, the format of ``python -m nlevel.sim --task-times-file``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from apps.dock_like.builddata import DRUGS  # noqa: E402

ACTIVES = os.path.join(ROOT, "apps", "dock_like", "data", "abl1_actives_decoys.smi")


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "apps", "nlevel"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def library_lines() -> list[str]:
    """The ligands timed: the app's drug list, then the enrichment file's ligands not in it (the inhibitors)."""
    lines = [f"{smiles} {name}" for name, smiles in DRUGS]
    names = {name for name, _ in DRUGS}
    with open(ACTIVES) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 2 and not line.startswith("#") and parts[1] not in names:
                names.add(parts[1])
                lines.append(line.strip())
    return lines


def build_parser() -> argparse.ArgumentParser:
    """The command line (also what ``docs/render.py --check`` parses a saved result's command with)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default="ABL1")
    p.add_argument("--exhaustiveness", type=int, default=8)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "dock_times_abl1"))
    p.add_argument("--work", help="directory of the screen (checkpoint, library); the same --work resumes a "
                                  "stopped measurement without docking its finished ligands again (default: a new "
                                  "temporary directory)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the timing screen and write the results; return the app's exit status."""
    p = build_parser()
    a = p.parse_args(argv)
    work = os.path.abspath(a.work) if a.work else tempfile.mkdtemp(prefix="dock_times.")
    os.makedirs(work, exist_ok=True)
    lib = os.path.join(work, "timing.smi")
    text = "\n".join(library_lines()) + "\n"
    if not os.path.exists(lib):
        with open(lib, "w") as f:
            f.write(text)
    elif open(lib).read() != text:
        print(f"dock_times: error: --work {work!r} holds another ligand list ({lib}); choose a new --work",
              file=sys.stderr)
        return 2
    # --bind-to none: on this shared 2-core machine a rank pinned to a core (and its Vina helper
    # with it) left other sessions' new processes on that core unscheduled for minutes.
    cmd = [os.path.join(os.path.dirname(sys.executable), "nlevel-mpiexec"), "-n", str(a.procs), "--bind-to", "none",
           sys.executable, "-m",
           "nlevel.run", "apps.dock_like", "--engine", "vina", "--target", a.target, "--library", lib,
           "--exhaustiveness", str(a.exhaustiveness), "--out", os.path.join(work, "hits.h5"),
           "--checkpoint", os.path.join(work, "run.h5"), "--report", os.path.join(work, "report.json"), "--quiet"]
    env = dict(os.environ, PYTHONPATH=ROOT, NLEVEL_TTY="0")
    load_before = os.getloadavg()
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=work, env=env)
    wall = time.time() - t0
    if proc.returncode != 0:
        print(f"dock_times: the screen failed (exit {proc.returncode}); work dir {work}", file=sys.stderr)
        return proc.returncode
    from apps.dock_like import hitlist  # (here: a parse of the command line needs no h5py)

    hits = hitlist.read_hits(os.path.join(work, "hits.h5"))
    rows = []
    for i in sorted(range(len(hits["id"])), key=lambda i: int(hits["id"][i])):
        rows.append({"id": int(hits["id"][i]), "name": hits["name"][i], "smiles": hits["smiles"][i],
                     "status": int(hits["status"][i]), "score": float(hits["score"][i]),
                     "n_heavy": int(hits["n_heavy"][i]), "n_rotatable": int(hits["n_rotatable"][i]),
                     "cpu_seconds": round(float(hits["cpu_seconds"][i]), 3), "wall_seconds": round(float(hits["seconds"][i]), 3)})
    docked = [r["cpu_seconds"] for r in rows if r["status"] == 0]
    result = {
        "what": "per-ligand CPU seconds of AutoDock Vina (meeko preparation + docking, one core, maps excluded)",
        "command": "python bench/dock_times.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "app_command": " ".join(cmd).replace(work, "WORK"), "commit": _commit(),
        "target": a.target, "exhaustiveness": a.exhaustiveness, "procs": a.procs,
        "versions": {k: version(k) for k in ("vina", "meeko", "rdkit", "dockstring")},
        "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
        "loadavg_before": load_before, "loadavg_after": os.getloadavg(), "wall_seconds": round(wall, 1),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "ligands": rows,
        "summary": {"docked": len(docked), "failed": len(rows) - len(docked), "min": min(docked), "max": max(docked),
                    "mean": round(sum(docked) / len(docked), 3), "sum": round(sum(docked), 1)},
    }
    with open(a.out + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(a.out + ".txt", "w") as f:
        f.write("".join(f"{t}\n" for t in docked))
    print(json.dumps(result["summary"]), f"wall {wall:.0f} s -> {a.out}.json, {a.out}.txt")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
