"""Frozen records (:mod:`nlevel.roles.records`): the messages' and events' classes behave as frozen,
slotted dataclasses (equality, hashing, pickling, ``replace``, ``fields``), made for less at import."""

from __future__ import annotations

import dataclasses
import pickle
import sys
import types

import pytest

from nlevel.roles import records
from nlevel.roles.events import NeedIds, Ran, Send, Tick
from nlevel.roles.messages import Heartbeat, Report, TaskFailure


def test_a_record_is_a_frozen_slotted_dataclass():
    f = TaskFailure(7, "raised", "ValueError: bad", 3)
    assert dataclasses.is_dataclass(f) and not hasattr(f, "__dict__")
    assert [x.name for x in dataclasses.fields(f)][:4] == ["id", "kind", "error", "rank"]
    assert f == TaskFailure(7, "raised", "ValueError: bad", 3, "", "", 1) and f != TaskFailure(8, "raised", "x")
    assert hash(f) == hash(TaskFailure(7, "raised", "ValueError: bad", 3)) and len({f, dataclasses.replace(f)}) == 1
    assert dataclasses.replace(f, rank=5).rank == 5 and f.rank == 3
    assert repr(f) == ("TaskFailure(id=7, kind='raised', error='ValueError: bad', rank=3, host='', traceback='', "
                       "attempts=1)")
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.id = 8  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del f.kind  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(f)) == f  # (a report's failures travel pickled)
    assert dataclasses.asdict(Heartbeat(2, 0.5)) == {"epoch": 2, "running": 0.5}


def test_records_of_different_kinds_never_compare_equal():
    assert Tick() == Tick() and NeedIds() != Tick()
    assert Heartbeat() != (0, 0.0) and Send(1, Heartbeat()) == Send(1, Heartbeat())
    assert Report(((0, 3),)) != Report(((0, 4),)) and Ran(((0, 1),), tasks=1) == Ran(((0, 1),), tasks=1)


def test_a_module_compiles_its_records_inits_at_once_and_a_record_made_before_works_too():
    mod = types.ModuleType("nlevel_records_probe")
    sys.modules[mod.__name__] = mod
    try:
        code = ("from nlevel.roles.records import dataclass\n"
                "@dataclass(frozen=True, slots=True)\nclass A:\n    x: int\n    y: str = 'y'\n"
                "@dataclass(frozen=True, slots=True)\nclass B:\n    pass\n"
                "early = A(1)\n"  # (before build(): its class compiles its own __init__)
                "@dataclass(frozen=True, slots=True)\nclass C:\n    z: tuple = ()\n")
        exec(compile(code, "<probe>", "exec"), mod.__dict__)
        assert records._PENDING[mod.__name__] == [mod.B, mod.C]
        records.build(mod.__name__)
        assert mod.__name__ not in records._PENDING
        assert mod.early == mod.A(1, "y") and mod.B() == mod.B() and mod.C((1,)).z == (1,)
        assert mod.A.__init__.__qualname__ == "A.__init__" and mod.C.__init__.__qualname__ == "C.__init__"
        with pytest.raises(TypeError):
            mod.A()  # (x has no default)
    finally:
        del sys.modules[mod.__name__]


def test_other_options_are_dataclasses_own():
    @records.dataclass(slots=True, unsafe_hash=True)  # (the simulator's compiled build thaws the classes so)
    class Thawed:
        x: int = 0

    t = Thawed(1)
    t.x = 2
    assert t == Thawed(2) and hash(t) == hash(Thawed(2))
