"""A compiled build of the simulator's hot modules (mypyc), made on first use and cached.

``python -m nlevel.sim`` spends almost all its time in the role state machines
(:mod:`nlevel.roles`), the id ranges and the statistics: the same code the MPI runtime
runs, called millions of times. Compiled with `mypyc <https://mypyc.readthedocs.io>`_
(part of mypy; it turns type-annotated Python into a C extension) the same source
runs several times as fast (on 2026-11-22 a 32,768-process, 100-tasks-per-process classic
run took 74 s of one core instead of 245 s; what such runs take now, and what made them
slower since, is in ``bench/results/sim_speed.txt``).

The build is not a second implementation: it is the package's own files, copied into a
cache directory and compiled there, with changes to how their dataclasses are made, not to
what they do: the messages and events are made by :func:`dataclasses.dataclass` itself (see
:func:`_plain_records`), frozen dataclasses are compiled as plain ones (:func:`_thaw`), and
their ``__init__`` is written out (:func:`_add_inits`). Compiled code also holds to its declared
types: an ``int`` given for a ``float`` becomes a float, a ``bool`` for an ``int`` an int,
and a numpy integer is refused with a TypeError. Only the command line's child process
runs the build, with the values its parser made; ``model/plan.py`` stays interpreted all
the same, so that a :class:`~nlevel.model.plan.Plan` refuses what it refuses in a real
job, with the same message. The directory's name carries a
digest of every source file, the Python version and mypy's version, so an edited
source is never run from a stale build. The installed package itself stays
interpreted (the MPI runtime, the tests, a developer's edits).

* :func:`build` returns the directory (building it once, under a lock, if needed) or
  raises :class:`BuildUnavailable` naming what is missing: mypy, or a C compiler.
* :func:`compiled` says whether the running interpreter loaded the compiled roles.

The cache lives in ``$NLEVEL_CACHE``, else ``$XDG_CACHE_HOME/nlevel``, else
``~/.cache/nlevel``; deleting it is always safe.
"""

from __future__ import annotations

import ast
import fcntl
import hashlib
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from ..errors import NlevelError

__all__ = ["COMPILED", "BuildUnavailable", "cache_root", "digest", "build", "compiled"]

#: Modules compiled (paths under the package): where the simulator spends its time.
COMPILED = (
    "roles/messages.py",
    "roles/events.py",
    "ranges.py",
    "stats.py",
    "model/hierarchy.py",
    "model/cost.py",
    "roles/board.py",
    "roles/worker.py",
    "roles/child.py",
    "roles/server.py",
    "roles/master.py",
    "roles/region.py",
    "roles/ledger.py",
    "roles/delivery.py",
    "roles/failures.py",
    "roles/watch.py",
    "roles/ending.py",
    "roles/replan.py",
    "roles/suspects.py",
    "roles/station.py",
    "roles/recovery.py",
    "roles/autoplan.py",
    "roles/loop.py",
    "sim/heap.py",
    "sim/engine.py",
    "sim/port.py",
    "sim/waiters.py",
)

_PACKAGE = Path(__file__).resolve().parent.parent  # the nlevel package (this file is nlevel/sim/build.py)
_BUILD_TIMEOUT = 1800  # seconds; about 60 s on one core of the development machine


class BuildUnavailable(NlevelError):
    """The compiled build cannot be made here (no mypy, no C compiler, or mypyc failed)."""


def cache_root() -> Path:
    """Return the directory that holds compiled builds (not created here)."""
    if os.environ.get("NLEVEL_CACHE"):
        return Path(os.environ["NLEVEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nlevel"


def _mypy_version() -> str | None:
    if importlib.util.find_spec("mypyc") is None:
        return None
    from mypy.version import __version__

    return str(__version__)


def digest() -> str:
    """Return a digest of every source file of the package, the Python version and mypy's version."""
    h = hashlib.sha256()
    h.update(sys.version.encode())
    h.update((_mypy_version() or "none").encode())
    for path in sorted(_PACKAGE.rglob("*.py")):
        h.update(str(path.relative_to(_PACKAGE)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _compiler_command() -> str:
    """Return the C compiler command that building extensions would use."""
    return os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"


def _compiler() -> str | None:
    """Return the C compiler's path, or None when there is none."""
    return shutil.which(shlex.split(_compiler_command())[0])


def build() -> Path:
    """Return a directory whose ``nlevel`` package has the :data:`COMPILED` modules compiled.

    Builds it on the first call for these sources (about a minute), under a file lock
    so concurrent runs build once.

    Raises:
        BuildUnavailable: naming what is missing (mypy, a C compiler) or mypyc's last words.
    """
    if _mypy_version() is None:
        raise BuildUnavailable("mypy (which provides mypyc) is not installed: pip install 'nlevel[sim]'")
    if _compiler() is None:
        raise BuildUnavailable(f"no C compiler: {_compiler_command()!r} is not on PATH (install gcc, or set CC)")
    root = cache_root()
    target = root / f"sim-py{sys.version_info[0]}{sys.version_info[1]}-{digest()}"
    if (target / "BUILT").exists():
        return target
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = open(root / ".lock", "w")
    except OSError as exc:
        raise BuildUnavailable(f"cannot write the build cache {root}: {exc.strerror} (set NLEVEL_CACHE)") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "BUILT").exists():  # another run built it while we waited
            return target
        work = Path(tempfile.mkdtemp(prefix="building-", dir=root))
        try:
            shutil.copytree(_PACKAGE, work / "nlevel", ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd"))
            for m in COMPILED:
                _plain_records(work / "nlevel" / m)
                _thaw(work / "nlevel" / m)
                _add_inits(work / "nlevel" / m)
            # mypyc type-checks what the compiled modules import, down to the runtime's h5py and
            # tqdm, which ship no stubs; the repository's setup.cfg says to skip them, but the
            # build directory has no setup.cfg (an installed package has none either).
            (work / "mypy.ini").write_text("[mypy]\nignore_missing_imports = True\n")
            cmd = [sys.executable, "-m", "mypyc", *(f"nlevel/{m}" for m in COMPILED)]
            try:
                proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=_BUILD_TIMEOUT)
            except subprocess.TimeoutExpired:
                raise BuildUnavailable(f"mypyc took longer than {_BUILD_TIMEOUT} s") from None
            if proc.returncode != 0:
                tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
                raise BuildUnavailable(f"mypyc failed (exit {proc.returncode}):\n{tail}")
            shutil.rmtree(work / "build", ignore_errors=True)
            (work / "BUILT").write_text(" ".join(cmd) + "\n")
            os.replace(work, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target


_RECORDS_IMPORT = "from .records import build, dataclass\n"
_RECORDS_BUILD = re.compile(r"^build\(__name__\).*\n", re.MULTILINE)


def _plain_records(path: Path) -> None:
    """Make ``path``'s records with :func:`dataclasses.dataclass` itself, not :mod:`~nlevel.roles.records`.

    mypyc compiles a class as a native one (its fields in C slots, its methods called
    directly) only when it knows its decorator; a class made by any other function is
    compiled as a plain Python class, every attribute read a dictionary lookup. The messages
    and the events, made by ``records.dataclass`` for a cheap ``import nlevel`` (ea8107c),
    were so compiled: 32,768 processes x 20 tasks took 62 s instead of 56
    (``bench/results/sim_speed.txt``). The import's cost does not matter to a simulation.
    """
    text = path.read_text()
    if _RECORDS_IMPORT not in text:
        return
    path.write_text(_RECORDS_BUILD.sub("", text.replace(_RECORDS_IMPORT, "from dataclasses import dataclass\n")))


_FROZEN = re.compile(r"@dataclass\(frozen=True(, slots=True)?\)")


def _thaw(path: Path) -> None:
    """Compile ``path``'s frozen dataclasses as plain ones (hashable alike).

    A frozen dataclass's ``__init__`` sets every field through ``object.__setattr__``, in
    Python even when compiled: the events and claims made between two simulated tasks spent
    6.5 % of a 32,768-rank simulation there. The interpreted package (the runtime, the tests)
    keeps them frozen, so a change that mutates one still fails there.
    """
    text = path.read_text()
    thawed = _FROZEN.sub(lambda m: "@dataclass(slots=True, unsafe_hash=True)" if m.group(1)
                         else "@dataclass(unsafe_hash=True)", text)
    if thawed != text:
        path.write_text(thawed)


def _add_inits(path: Path) -> None:
    """Write out the ``__init__`` of ``path``'s plain dataclasses (see :func:`_with_inits`)."""
    text = path.read_text()
    with_inits = _with_inits(text)
    if with_inits != text:
        path.write_text(with_inits)


def _with_inits(text: str) -> str:
    """``text`` with an ``__init__`` written out in each dataclass that has plain fields only.

    The ``__init__`` that :func:`dataclasses.dataclass` makes is Python code it generates at run
    time, interpreted even in a compiled class (every event and message the simulator makes
    went through one: 2 % of a 32,768-process run); one written in the class is compiled, and
    ``dataclass`` keeps it. Classes with ``field(...)``, ``__post_init__``, ``InitVar``,
    ``ClassVar``, base classes or their own ``__init__`` are left as they are.
    """
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    inserts: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef) or not any(
                (isinstance(d, ast.Call) and getattr(d.func, "id", "") == "dataclass") or getattr(d, "id", "") == "dataclass"
                for d in node.decorator_list):
            continue
        if node.bases:
            continue  # (inherited fields would be missing)
        body_src = ast.get_source_segment(text, node) or ""
        if any(w in body_src for w in ("field(", "__post_init__", "InitVar", "ClassVar", "def __init__")):
            continue
        fields = [n for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
        if not fields:
            continue
        params, sets = [], []
        for f in fields:
            name = f.target.id  # type: ignore[union-attr]
            ann = ast.get_source_segment(text, f.annotation)
            default = f" = {ast.get_source_segment(text, f.value)}" if f.value is not None else ""
            params.append(f"{name}: {ann}{default}")
            sets.append(f"        self.{name} = {name}\n")
        code = f"\n    def __init__(self, {', '.join(params)}) -> None:\n" + "".join(sets)
        inserts.append((node.end_lineno or len(lines), code))
    for end, code in sorted(inserts, reverse=True):
        lines.insert(end, code)
    return "".join(lines)


def compiled() -> bool:
    """Whether this interpreter runs the compiled roles (it was started on a :func:`build` directory)."""
    from ..roles import station

    return not str(station.__file__).endswith(".py")
