"""The package's shape (issue 15): no import circle, a short top level, pure roles
and model, MPI confined to the runtime, and each subpackage importing only what its docstring allows.

The checks read the source with :mod:`ast` (nothing is imported), so every import counts:
at module level, inside functions, and under ``if TYPE_CHECKING:``. Each check is also run
on a small synthetic package built in ``tmp_path``, to show that it can fail.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ..conftest import ROOT

PACKAGE = Path(ROOT) / "nlevel"

MAX_TOP_LEVEL = 12  # .py files directly in nlevel/, __init__.py included
MAX_MPI_MODULES = 3
PURE = ("roles", "model")  # no MPI, no HDF5, no threads, no files
FORBIDDEN_IN_PURE = ("mpi4py", "h5py", "threading")
#: Modules of the pure subpackages allowed to open files, and why.
FILE_IO_ALLOWED = {
    # The calibration JSON (measured service and message times) is the model's input data:
    # the planner, the simulator and the job all read it, so reading and writing it lives here.
    "model/calibration.py",
}
#: What each subpackage may not import (their __init__ docstrings say the same).
MAY_NOT_IMPORT = {
    "model": ("nlevel.roles", "nlevel.runtime", "nlevel.sim", "nlevel.testing", "nlevel.api", "nlevel.config"),
    "roles": ("nlevel.runtime", "nlevel.sim", "nlevel.testing", "nlevel.api"),
    "sim": ("nlevel.runtime", "nlevel.testing", "nlevel.api"),
    "runtime": ("nlevel.sim", "nlevel.testing"),
    "": ("nlevel.testing",),  # the top-level modules
}


@dataclass
class Module:
    name: str  # dotted, e.g. nlevel.roles.station
    path: Path
    rel: str  # path under the package, e.g. roles/station.py
    is_package: bool
    tree: ast.Module = field(repr=False)
    lines: int = 0


def modules(package: Path) -> dict[str, Module]:
    """Every module of ``package`` (a directory), by dotted name."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(package)
        parts = [package.name, *rel.with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        text = path.read_text()
        name = ".".join(parts)
        out[name] = Module(name, path, rel.as_posix(), is_package, ast.parse(text, str(path)), len(text.splitlines()))
    return out


def imported(mod: Module, known: dict[str, Module]) -> list[tuple[str, int]]:
    """``(absolute module name, line)`` of every import in ``mod``, wherever it is written.

    ``from X import name`` counts as an import of ``X.name`` when that is a module, else of ``X``.
    """
    out = []
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod.name.split(".") if mod.is_package else mod.name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.append((sub if sub in known else target, node.lineno))
    return out


def graph(mods: dict[str, Module]) -> dict[str, set[str]]:
    """Imports between the package's own modules."""
    return {name: {t for t, _ in imported(m, mods) if t in mods and t != name} for name, m in mods.items()}


def circles(mods: dict[str, Module]) -> list[str]:
    """Every import circle, as ``a -> b -> a`` (one per strongly connected group)."""
    g = graph(mods)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(g):
        if v not in index:
            visit(v)
    out = []
    for group in groups:  # name one circle through the group's first module
        start = group[0]
        path, seen = [start], {start}
        while True:
            nxt = sorted(w for w in g[path[-1]] if w in group)
            back = [w for w in nxt if w == start]
            if back or not nxt:
                break
            step = next((w for w in nxt if w not in seen), nxt[0])
            if step in seen:
                path.append(step)
                break
            path.append(step)
            seen.add(step)
        out.append(" -> ".join(path + [start] if path[-1] != start else path))
    return out


def top_level(package: Path) -> list[str]:
    names = sorted(p.name for p in package.glob("*.py"))
    return [f"{len(names)} modules directly in {package.name}/ (at most {MAX_TOP_LEVEL}): {names}"] \
        if len(names) > MAX_TOP_LEVEL else []


def impure(mods: dict[str, Module]) -> list[str]:
    """Imports of mpi4py, h5py or threading, and file opens, in the pure subpackages."""
    out = []
    for m in mods.values():
        if m.rel.split("/")[0] not in PURE or len(m.rel.split("/")) < 2:
            continue
        for name, line in imported(m, mods):
            if name.split(".")[0] in FORBIDDEN_IN_PURE:
                out.append(f"{m.rel}:{line}: imports {name}")
        if m.rel in FILE_IO_ALLOWED:
            continue
        for node in ast.walk(m.tree):
            if isinstance(node, ast.Call):
                f = node.func
                if (isinstance(f, ast.Name) and f.id == "open") or (
                    isinstance(f, ast.Attribute) and f.attr in ("open", "fdopen")
                ):
                    out.append(f"{m.rel}:{node.lineno}: opens a file")
    return out


def mpi_outside_runtime(mods: dict[str, Module]) -> list[str]:
    users = sorted({m.rel for m in mods.values() for name, _ in imported(m, mods) if name.split(".")[0] == "mpi4py"})
    out = [f"{rel} imports mpi4py outside runtime/" for rel in users if not rel.startswith("runtime/")]
    if len(users) > MAX_MPI_MODULES:
        out.append(f"{len(users)} modules import mpi4py (at most {MAX_MPI_MODULES}): {users}")
    return out


def layering(mods: dict[str, Module]) -> list[str]:
    out = []
    for m in mods.values():
        parts = m.rel.split("/")
        area = parts[0] if len(parts) > 1 else ""
        if area == "testing":
            continue
        banned = MAY_NOT_IMPORT.get(area, ())
        for name, line in imported(m, mods):
            hit = next((b for b in banned if name == b or name.startswith(b + ".")), None)
            if hit is not None:
                out.append(f"{m.rel}:{line}: {area or 'the top level'} may not import {name}")
    return out


# ---------------------------------------------------------------- the package as it is

@pytest.fixture(scope="module")
def real() -> dict[str, Module]:
    return modules(PACKAGE)


def test_no_import_circle(real):
    assert circles(real) == []


def test_at_most_12_modules_at_the_top_level():
    assert top_level(PACKAGE) == []


def test_roles_and_model_are_pure(real):
    assert impure(real) == []


def test_mpi4py_only_in_the_runtime_and_in_at_most_3_modules(real):
    assert mpi_outside_runtime(real) == []
    users = {m.rel for m in real.values() for n, _ in imported(m, real) if n.split(".")[0] == "mpi4py"}
    assert users and all(u.startswith("runtime/") for u in users)  # the check sees the real ones


def test_subpackages_import_only_what_they_may(real):
    assert layering(real) == []


def test_the_checks_see_the_whole_package(real):
    assert {"nlevel.roles.station", "nlevel.runtime.transport", "nlevel.sim.engine", "nlevel.model.plan"} <= set(real)
    g = graph(real)
    assert "nlevel.roles.replan" in g["nlevel.roles.station"]
    assert "nlevel.runtime.transport" in g["nlevel.api"]  # imported inside a function: counted


# ---------------------------------------------------------------- each check can fail

def make(tmp_path: Path, files: dict[str, str]) -> Path:
    pkg = tmp_path / "nlevel"
    for rel, text in {"__init__.py": "", **files}.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return pkg


def test_a_circle_is_found_even_under_type_checking(tmp_path):
    pkg = make(tmp_path, {
        "roles/__init__.py": "",
        "roles/station.py": "from . import repair\n",
        "roles/repair.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .station import Station\n",
        "a.py": "def f():\n    from .b import x\n",
        "b.py": "from . import a\nx = 1\n",
        "c.py": "from .a import f\n",  # imports into a circle: not itself in one
    })
    assert sorted(circles(modules(pkg))) == ["nlevel.a -> nlevel.b -> nlevel.a",
                                             "nlevel.roles.repair -> nlevel.roles.station -> nlevel.roles.repair"]


def test_a_circle_through_the_package_init_is_found(tmp_path):
    pkg = make(tmp_path, {"__init__.py": "__version__ = '1'\nfrom .api import f\n",
                          "api.py": "from . import __version__\ndef f(): pass\n"})
    assert circles(modules(pkg)) == ["nlevel -> nlevel.api -> nlevel"]


def test_a_crowded_top_level_is_found(tmp_path):
    pkg = make(tmp_path, {f"m{i}.py": "" for i in range(MAX_TOP_LEVEL - 1)})  # + __init__.py = 12
    assert top_level(pkg) == []
    (pkg / "one_more.py").write_text("")
    assert len(top_level(pkg)) == 1


def test_impure_roles_and_model_are_found(tmp_path):
    pkg = make(tmp_path, {
        "roles/__init__.py": "",
        "roles/a.py": "import threading\nfrom mpi4py import MPI\n",
        "roles/b.py": "def f():\n    import h5py\n    with open('x') as fh:\n        pass\n",
        "model/__init__.py": "",
        "model/c.py": "import os\ndef f():\n    return os.fdopen(3)\n",
        "model/calibration.py": "def f():\n    return open('cal.json')\n",  # allowed: the calibration data
        "runtime/__init__.py": "",
        "runtime/d.py": "import threading\nopen('x')\n",  # the runtime may
    })
    assert sorted(impure(modules(pkg))) == ["model/c.py:3: opens a file", "roles/a.py:1: imports threading",
                                            "roles/a.py:2: imports mpi4py", "roles/b.py:2: imports h5py",
                                            "roles/b.py:3: opens a file"]


def test_mpi4py_outside_the_runtime_or_in_too_many_modules_is_found(tmp_path):
    files = {"runtime/__init__.py": ""}
    files.update({f"runtime/m{i}.py": "from mpi4py import MPI\n" for i in range(MAX_MPI_MODULES)})
    pkg = make(tmp_path, files)
    assert mpi_outside_runtime(modules(pkg)) == []
    (pkg / "api.py").write_text("def f():\n    import mpi4py.MPI\n")
    assert mpi_outside_runtime(modules(pkg)) == [
        "api.py imports mpi4py outside runtime/",
        f"{MAX_MPI_MODULES + 1} modules import mpi4py (at most {MAX_MPI_MODULES}): "
        f"{['api.py'] + [f'runtime/m{i}.py' for i in range(MAX_MPI_MODULES)]}",
    ]


def test_a_subpackage_importing_what_it_may_not_is_found(tmp_path):
    pkg = make(tmp_path, {
        "model/__init__.py": "",
        "model/plan.py": "from ..errors import E\n",
        "model/bad.py": "from ..roles import station\n",
        "roles/__init__.py": "",
        "roles/station.py": "from ..model.plan import P\n",
        "errors.py": "class E(Exception): pass\n",
        "sim/__init__.py": "",
        "sim/engine.py": "def f():\n    from nlevel.runtime.node import Node\n",
        "runtime/__init__.py": "",
        "runtime/node.py": "",
        "testing/__init__.py": "",
        "drain.py": "import nlevel.testing\n",
    })
    assert sorted(layering(modules(pkg))) == ["drain.py:1: the top level may not import nlevel.testing",
                                              "model/bad.py:1: model may not import nlevel.roles.station",
                                              "sim/engine.py:2: sim may not import nlevel.runtime.node"]


# ---------------------------------------------------------------- one way into a station (issue 35)

#: The drivers of stations: they translate I/O into events and perform effects, nothing else.
DRIVERS = ("runtime", "sim", "testing", "roles/loop.py", "api.py")
#: Attributes of a station that hold callables of the driver's own (calling them is not entering the station).
CLOCKS = {"clock", "wall"}
#: A station's parts that are state machines themselves (calling one of their methods enters the station).
PARTS = {"planner", "worker", "server", "delivery", "recovery", "watching", "closing", "replanning"}


def _station_expr(e: ast.expr, names: set[str]) -> bool:
    """Whether ``e`` denotes a station: ``self.station``, ``stations[...]``, ``Station(...)`` or a name bound to one."""
    if isinstance(e, ast.Name):
        return e.id in names
    if isinstance(e, ast.Attribute):
        return e.attr == "station"
    if isinstance(e, ast.Subscript):
        v = e.value
        return (isinstance(v, ast.Name) and v.id == "stations") or (isinstance(v, ast.Attribute) and v.attr == "stations")
    if isinstance(e, ast.Call):
        return isinstance(e.func, ast.Name) and e.func.id == "Station"
    return False


def station_calls(package: Path) -> list[str]:
    """Calls of a station's methods other than ``handle`` in the drivers (properties may be read)."""
    out = []
    for rel in DRIVERS:
        path = package / rel
        if not path.exists():
            continue
        for p in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            tree = ast.parse(p.read_text())
            for fn in ast.walk(tree):
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
                    continue
                names: set[str] = set()
                for n in ast.walk(fn):
                    if isinstance(n, ast.Assign) and _station_expr(n.value, names):
                        names |= {t.id for t in n.targets if isinstance(t, ast.Name)}
                    if isinstance(n, ast.Assign) and isinstance(n.value, ast.Tuple):  # st, loop = self.station, ...
                        for t, v in zip(n.targets[0].elts if isinstance(n.targets[0], ast.Tuple) else [],
                                        n.value.elts):
                            if isinstance(t, ast.Name) and _station_expr(v, names):
                                names.add(t.id)
                for n in ast.walk(fn):
                    if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)):
                        continue
                    if _station_expr(n.func.value, names) and n.func.attr in {"handle"} | CLOCKS:
                        continue
                    inner = n.func.value  # (a call on a station's part counts too: st.planner.tick())
                    if isinstance(inner, ast.Attribute) and inner.attr in PARTS:
                        inner = inner.value
                    if _station_expr(inner, names):
                        out.append(f"{p.relative_to(package.parent)}:{n.lineno}: {ast.unparse(n.func)}()")
    return sorted(set(out))


def test_drivers_enter_a_station_only_through_handle(real):
    """The MPI runtime, the simulator, the in-process network, the loop and the user's API reach a
    station only with events (``handle``); they may read its properties, never call its other methods."""
    assert station_calls(PACKAGE) == []


def test_a_driver_calling_a_station_method_is_found(tmp_path):
    pkg = make(tmp_path, {"runtime/farm.py": "def f(self):\n    st = self.station\n    st.handle(1)\n"
                                             "    st.release(0)\n    self.station.serve()\n    st.clock()\n"
                                             "    st.planner.tick(1)\n"})
    assert station_calls(pkg) == ["nlevel/runtime/farm.py:4: st.release()", "nlevel/runtime/farm.py:5: self.station.serve()",
                                  "nlevel/runtime/farm.py:7: st.planner.tick()"]


#: Drivers outside the roles: they may read a station and its parts, never call into a part nor
#: change one (roles/loop.py is the roles' side of the loop: it answers their questions).
OUTSIDE = ("runtime", "sim", "testing", "api.py")
#: Drivers that reach a station only through its loop (:class:`~nlevel.roles.loop.Loop`), even for ``handle``.
THROUGH_THE_LOOP = ("sim", "testing/network.py")


def _part_expr(e: ast.expr, stations: set[str], parts: set[str]) -> bool:
    """Whether ``e`` denotes a station's part: ``st.worker``, or a name bound to one (``w = st.worker``)."""
    if isinstance(e, ast.Name):
        return e.id in parts
    return isinstance(e, ast.Attribute) and e.attr in PARTS and _station_expr(e.value, stations)


def _files(package: Path, rels: tuple[str, ...]) -> list[Path]:
    out: list[Path] = []
    for rel in rels:
        path = package / rel
        if path.exists():
            out += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return out


def part_reaches(package: Path) -> list[str]:
    """In the drivers outside the roles: calls into a station's part through a name bound to it
    (``d = st.server; d.stock()``), and writes into a part (``st.worker.claims = None``, ``w.x += 1``);
    in the simulator and the in-process network, also a station's own ``handle`` (their loop calls it)."""
    out = []
    loop_driven = set(_files(package, THROUGH_THE_LOOP))
    for p in _files(package, OUTSIDE):
        through_loop = p in loop_driven
        rel = p.relative_to(package.parent)
        tree = ast.parse(p.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
                continue
            stations: set[str] = set()
            parts: set[str] = set()
            for n in ast.walk(fn):
                if isinstance(n, ast.Assign):
                    pairs = [(t, n.value) for t in n.targets]
                    if isinstance(n.targets[0], ast.Tuple) and isinstance(n.value, ast.Tuple):
                        pairs = list(zip(n.targets[0].elts, n.value.elts))
                    for t, v in pairs:
                        if isinstance(t, ast.Name) and _station_expr(v, stations):
                            stations.add(t.id)
                        elif isinstance(t, ast.Name) and _part_expr(v, stations, parts):
                            parts.add(t.id)
            for n in ast.walk(fn):
                where = f"{rel}:{getattr(n, 'lineno', 0)}"
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
                    v = n.func.value
                    if isinstance(v, ast.Name) and v.id in parts:
                        out.append(f"{where}: {ast.unparse(n.func)}()")
                    elif through_loop and n.func.attr == "handle" and _station_expr(v, stations):
                        out.append(f"{where}: {ast.unparse(n.func)}() (not through its loop)")
                targets = n.targets if isinstance(n, ast.Assign) else [n.target] \
                    if isinstance(n, (ast.AugAssign, ast.AnnAssign)) else []
                for t in targets:
                    base = t
                    while isinstance(base, (ast.Attribute, ast.Subscript)):
                        base = base.value
                        if _part_expr(base, stations, parts):
                            out.append(f"{where}: {ast.unparse(t)} = ...")
                            break
    return sorted(set(out))


def test_drivers_outside_the_roles_neither_call_into_nor_change_a_stations_parts(real):
    """Issue 35: the simulator once timed claims by overwriting ``worker.claims`` and woke claimers by
    reading ``claimer.ticket``; what a driver needs is an argument, an event, or what the loop says."""
    assert part_reaches(PACKAGE) == []


def test_a_driver_reaching_into_a_stations_part_is_found(tmp_path):
    pkg = make(tmp_path, {
        "sim/engine.py": "def f(stations, loops):\n    st = stations[0]\n    st.worker.claims = None\n"
                         "    w = st.worker\n    w.task_times = 1\n    w.n += 1\n    d = st.server\n"
                         "    d.stock()\n    st.handle(1)\n    loops[0].handle(1)\n    x = d.queue\n",
        "runtime/farm.py": "def f(self):\n    self.station.handle(1)\n    self.station.server.owners[0] = 1\n",
        "roles/loop.py": "def f(self):\n    self.station.worker.claims = None\n",
    })
    assert part_reaches(pkg) == [
        "nlevel/runtime/farm.py:3: self.station.server.owners[0] = ...",
        "nlevel/sim/engine.py:3: st.worker.claims = ...",
        "nlevel/sim/engine.py:5: w.task_times = ...",
        "nlevel/sim/engine.py:6: w.n = ...",
        "nlevel/sim/engine.py:8: d.stock()",
        "nlevel/sim/engine.py:9: st.handle() (not through its loop)",
    ]


def positional_costs(roots: list[Path]) -> list[str]:
    """Constructions of ``Costs`` or ``SimCosts`` with positional arguments (both hold several
    seconds in a row: an order mistaken is a plan computed from the wrong costs)."""
    out = []
    for root in roots:
        for p in sorted(root.rglob("*.py")):
            text = p.read_text()
            if "Costs" not in text:
                continue  # (no such call can be in it: parsing every file of three trees took 2.5 s)
            for n in ast.walk(ast.parse(text)):
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("Costs", "SimCosts") \
                        and n.args:
                    out.append(f"{p.relative_to(root.parent)}:{n.lineno}")
    return out


def test_costs_are_built_with_their_names():
    root = Path(ROOT)
    assert positional_costs([root / "nlevel", root / "tests", root / "bench"]) == []
