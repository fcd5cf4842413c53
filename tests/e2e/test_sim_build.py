"""The compiled simulator (:mod:`nlevel.sim.build`): same results as the interpreted one, clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from nlevel.sim import build as sim_build
from nlevel.sim.cli import AUTO_COMPILE_TASKS

HAVE_BUILD = sim_build._mypy_version() is not None and sim_build._compiler() is not None


def sim(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nlevel.sim", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build cache for the module (the build takes about a minute)."""
    return tmp_path_factory.mktemp("nlevel-cache")


def env_with(cache: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, NLEVEL_CACHE=str(cache), NLEVEL_CALIBRATION=str(cache / "no-calibration.json"))
    env.update(extra)
    return env


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_BUILD, reason="needs mypy and a C compiler")
@pytest.mark.timeout(900)
@pytest.mark.parametrize("plan", ["classic", "levels=3,regions=8", "levels=4,regions=4x2"])
def test_compiled_engine_gives_the_interpreted_results(cache: Path, plan: str) -> None:
    args = ["--procs", "200", "--task-time", "0.002:0.005", "--tasks-per-proc", "20", "--plan", plan, "--json"]
    env = env_with(cache)
    runs = {}
    for engine in ("python", "compiled"):
        proc = sim(*args, "--engine", engine, env=env)
        assert proc.returncode == 0, proc.stderr
        runs[engine] = json.loads(proc.stdout)
    assert runs["python"]["engine"] == "python"
    assert runs["compiled"]["engine"] == "compiled (mypyc)"
    for r in runs.values():
        del r["sim_seconds"], r["engine"]
    assert runs["compiled"] == runs["python"]
    built = [p for p in cache.iterdir() if p.name.startswith("sim-")]
    assert len(built) == 1 and (built[0] / "BUILT").exists()
    assert not [p for p in cache.iterdir() if p.name.startswith("building-")]


_NATIVE_CHECK = """
import bisect, random, sys
sys.path.insert(0, sys.argv[1])
from nlevel import ranges
from nlevel.sim import heap as events
assert ranges._NATIVE and ranges.__file__.endswith('.so'), ranges.__file__
import dataclasses
from nlevel.roles import events as roles_events, messages
# (a class mypyc compiles as native has its fields in C slots; any other is a dict per read)
plain = [c.__name__ for m in (messages, roles_events) for c in vars(m).values()
         if dataclasses.is_dataclass(c) and c.__module__ == m.__name__ and "__mypyc_attrs__" not in vars(c)]
assert not plain, plain
rng = random.Random(7)
for _ in range(20000):
    xs = sorted(rng.sample(range(400), rng.choice([0, 1, 5, 16, 17, 18, 40, 300])))
    x, lo = rng.randrange(-3, 403), rng.randrange(0, len(xs) + 1)
    assert ranges._after(xs, x, lo) == bisect.bisect_right(xs, x, lo), (xs, x, lo)
    assert ranges._before(xs, x) == bisect.bisect_left(xs, x), (xs, x)
for _ in range(200):
    heap, want, seq = [], [], 0
    for _ in range(rng.randrange(1, 300)):
        if want and rng.random() < 0.4:
            e = events.pop(heap)
            assert (e.t, e.seq) == min(want), ((e.t, e.seq), min(want))
            want.remove((e.t, e.seq))
        else:
            seq += 1
            t = float(rng.randrange(20))  # (ties: seq decides)
            events.push(heap, events.Event(t, seq, 0, 0, None))
            want.append((t, seq))
    while want:
        e = events.pop(heap)
        assert (e.t, e.seq) == min(want)
        want.remove((e.t, e.seq))
print("ok")
"""


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_BUILD, reason="needs mypy and a C compiler")
@pytest.mark.timeout(900)
def test_the_compiled_searches_and_event_heap_match_bisect_and_sorting(cache: Path) -> None:
    # Compiled, ranges.py searches with its own loop (interpreted, it calls bisect) and the engine
    # keeps its own heap: both checked here against bisect and a sort, on the build itself.
    env = env_with(cache)
    where = subprocess.run([sys.executable, "-c", "from nlevel.sim.build import build; print(build())"],
                           capture_output=True, text=True, env=env, timeout=900)
    assert where.returncode == 0, where.stderr
    proc = subprocess.run([sys.executable, "-c", _NATIVE_CHECK, where.stdout.strip()], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_an_edited_source_gets_a_new_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    before = sim_build.digest()
    monkeypatch.setattr(sim_build, "_PACKAGE", tmp_path / "nlevel")
    (tmp_path / "nlevel").mkdir()
    (tmp_path / "nlevel" / "ranges.py").write_text("x = 1\n")
    assert sim_build.digest() != before


def test_compiled_engine_without_a_compiler_is_a_clear_error(tmp_path: Path) -> None:
    env = env_with(tmp_path, CC="/nonexistent/cc")
    proc = sim("--procs", "4", "--task-time", "0.002", "--tasks-per-proc", "2", "--engine", "compiled", env=env)
    assert proc.returncode == 2
    assert "--engine compiled: no C compiler: '/nonexistent/cc' is not on PATH" in proc.stderr
    assert not list(tmp_path.glob("sim-*"))


def test_auto_engine_falls_back_with_a_note(tmp_path: Path) -> None:
    env = env_with(tmp_path, CC="/nonexistent/cc")
    tasks = str(AUTO_COMPILE_TASKS)
    proc = sim("--procs", "2", "--task-time", "0.002", "--tasks", tasks, "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "note: simulating with the interpreted engine, about 3x slower (no C compiler" in proc.stderr
    out = json.loads(proc.stdout)
    assert out["engine"] == "python" and out["committed"] == AUTO_COMPILE_TASKS


def test_small_runs_do_not_build(tmp_path: Path) -> None:
    proc = sim("--procs", "4", "--task-time", "0.002", "--tasks-per-proc", "2", "--json", env=env_with(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["engine"] == "python"
    assert not list(tmp_path.glob("sim-*"))


def rewritten(tmp_path: Path, rewrite: Callable[[Path], None], text: str) -> str:
    """``text`` after one of the build's rewrites of a module's source."""
    src = tmp_path / "m.py"
    src.write_text(text)
    rewrite(src)
    return src.read_text()


def package_source(module: str) -> str:
    return (Path(sim_build.__file__).parent.parent / "roles" / f"{module}.py").read_text()


def test_the_build_compiles_frozen_dataclasses_as_plain_hashable_ones(tmp_path: Path) -> None:
    # (a frozen dataclass's __init__ goes through object.__setattr__, interpreted even when compiled)
    out = rewritten(tmp_path, sim_build._thaw, "@dataclass(frozen=True, slots=True)\nclass A:\n    x: int\n\n\n"
                    "@dataclass(frozen=True)\nclass B:\n    y: int\n\n\n@dataclass(slots=True)\nclass C:\n    z: int\n")
    assert out == ("@dataclass(slots=True, unsafe_hash=True)\nclass A:\n    x: int\n\n\n"
                   "@dataclass(unsafe_hash=True)\nclass B:\n    y: int\n\n\n@dataclass(slots=True)\nclass C:\n    z: int\n")
    assert "@dataclass(frozen=True" in package_source("events")


def test_the_build_makes_the_records_with_dataclass_itself(tmp_path: Path) -> None:
    # (mypyc compiles a class as a native one only under a decorator it knows)
    out = rewritten(tmp_path, sim_build._plain_records, "from .records import build, dataclass\n\n\n"
                    "@dataclass(frozen=True, slots=True)\nclass A:\n    x: int\n\n\nbuild(__name__)  # (a comment)\n")
    assert out == "from dataclasses import dataclass\n\n\n@dataclass(frozen=True, slots=True)\nclass A:\n    x: int\n\n\n"
    for module in ("messages", "events"):  # (what the build rewrites is what the package has)
        text = package_source(module)
        assert sim_build._RECORDS_IMPORT in text and sim_build._RECORDS_BUILD.search(text)


def test_the_build_writes_out_the_init_of_plain_dataclasses(tmp_path: Path) -> None:
    # (dataclass's generated __init__ is interpreted even in a compiled class; one in the class is compiled)
    src = ("from dataclasses import dataclass, field\n\n\n"
           "@dataclass(slots=True, unsafe_hash=True)\nclass A:\n    \"\"\"Doc.\"\"\"\n\n    x: int\n    y: tuple[int, ...] = ()\n"
           "    z: float = 0.5\n\n    def twice(self) -> int:\n        return 2 * self.x\n\n\n"
           "@dataclass\nclass B:\n    y: list[int] = field(default_factory=list)\n\n\n"
           "@dataclass\nclass C(A):\n    w: int = 0\n")
    out = sim_build._with_inits(src)
    assert out.count("def __init__") == 1  # A only: B has a field(), C a base
    space: dict[str, object] = {}
    exec(compile(out, "m.py", "exec"), space)
    plain: dict[str, object] = {}
    exec(compile(src, "m.py", "exec"), plain)
    A, A0 = space["A"], plain["A"]
    a, a0 = A(3, (1,)), A0(3, (1,))  # type: ignore[operator]
    assert (a.x, a.y, a.z, a.twice()) == (a0.x, a0.y, a0.z, a0.twice()) == (3, (1,), 0.5, 6)
    assert repr(a) == repr(a0) and a == A(x=3, y=(1,), z=0.5) and hash(a) == hash(A(3, (1,)))  # type: ignore[operator]
    assert "def __init__(self, x: int, y: tuple[int, ...] = (), z: float = 0.5) -> None:" in out
