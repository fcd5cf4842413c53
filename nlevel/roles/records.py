"""Frozen records: the :func:`dataclass` of the wire messages and the events, cheap to make at import.

``dataclasses.dataclass(frozen=True, slots=True)`` compiles six methods per class with
``exec`` (``__init__``, ``__repr__``, ``__eq__``, ``__hash__``, ``__setattr__``,
``__delattr__``): about a millisecond a class, and :mod:`~nlevel.roles.messages` and
:mod:`~nlevel.roles.events` hold 40 of them, a third of ``import nlevel`` (measured with
``python -X importtime``). Here the same classes are made with one ``exec`` per module:

* ``dataclasses.dataclass`` still makes each class (its fields, ``__slots__``,
  ``__match_args__``), with no generated method: :func:`dataclasses.replace`, :func:`~dataclasses.fields`
  and :func:`~dataclasses.asdict` work as on any dataclass, and type checkers see a frozen
  dataclass (:func:`typing.dataclass_transform`);
* every class's ``__init__`` is written out and compiled at once by :func:`build` at the end of
  its module (until then, or without it, a class compiles its own at its first instance), the
  code ``dataclasses`` writes for a frozen class;
* ``__eq__``, ``__hash__`` and ``__repr__`` are shared and read the fields through one
  :func:`operator.attrgetter` per class; ``__setattr__`` and ``__delattr__`` raise
  :class:`dataclasses.FrozenInstanceError`; pickling goes through ``__getstate__`` and
  ``__setstate__``, as for a frozen slotted dataclass.

Any other use (``frozen`` or ``slots`` off, other options: the simulator's compiled build
thaws the classes) is ``dataclasses.dataclass`` itself. Pure Python.
"""

from __future__ import annotations

import dataclasses
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Callable, TypeVar, overload

if TYPE_CHECKING:  # (typing has it from Python 3.11; only type checkers read it)
    from typing_extensions import dataclass_transform
else:
    def dataclass_transform(**_: Any) -> Callable[[Any], Any]:
        return lambda f: f

__all__ = ["dataclass", "build"]

_T = TypeVar("_T")

#: Classes of each module whose ``__init__`` is still to be compiled (module name -> classes).
_PENDING: dict[str, list[type]] = {}
_MISSING = dataclasses.MISSING


@overload
def dataclass(cls: type[_T], /) -> type[_T]: ...


@overload
def dataclass(*, frozen: bool = False, slots: bool = False, unsafe_hash: bool = False) -> Callable[[type[_T]], type[_T]]:
    ...


@dataclass_transform()
def dataclass(cls: Any = None, /, *, frozen: bool = False, slots: bool = False, unsafe_hash: bool = False) -> Any:
    """``dataclasses.dataclass``, made cheaply for ``frozen=True, slots=True`` (see the module)."""
    def make(c: Any) -> Any:
        if frozen and slots and not unsafe_hash:
            return _record(c)
        return dataclasses.dataclass(c, frozen=frozen, slots=slots, unsafe_hash=unsafe_hash)

    return make if cls is None else make(cls)


def _record(cls: Any) -> Any:
    c = dataclasses.dataclass(cls, init=False, repr=False, eq=False, slots=True)
    names = tuple(f.name for f in dataclasses.fields(c))
    c._record_key = staticmethod(attrgetter(*names) if len(names) > 1 else (
        (lambda obj: (getattr(obj, names[0]),)) if names else (lambda obj: ())))
    c.__init__ = _first_init
    c.__eq__ = _eq
    c.__hash__ = _hash
    c.__repr__ = _repr
    c.__setattr__ = _frozen_set
    c.__delattr__ = _frozen_del
    c.__getstate__ = _getstate
    c.__setstate__ = _setstate
    _PENDING.setdefault(c.__module__, []).append(c)
    return c


def build(module: str) -> None:
    """Compile the ``__init__`` of every record made so far in ``module``, with one ``exec`` (at its end)."""
    classes = _PENDING.pop(module, [])
    if classes:
        _compile(classes)


def _compile(classes: list[Any]) -> None:
    """Write and compile the ``__init__`` of ``classes``: what ``dataclasses`` writes for a frozen class."""
    ns: dict[str, Any] = {"__dataclass_builtins_object__": object}
    lines: list[str] = []
    for k, c in enumerate(classes):
        params, body = [], []
        for f in dataclasses.fields(c):
            if f.default is not _MISSING:
                ns[f"_d{k}_{f.name}"] = f.default
                params.append(f"{f.name}=_d{k}_{f.name}")
            elif f.default_factory is not _MISSING:
                raise TypeError(f"{c.__qualname__}.{f.name}: a record field takes no default_factory")
            else:
                params.append(f.name)
            body.append(f"    __dataclass_builtins_object__.__setattr__(self, {f.name!r}, {f.name})")
        lines.append(f"def _init{k}(self, {', '.join(params)}):" if params else f"def _init{k}(self):")
        lines += body or ["    pass"]
    exec("\n".join(lines), ns)  # noqa: S102 (code written here from field names, as dataclasses does)
    for k, c in enumerate(classes):
        fn = ns[f"_init{k}"]
        fn.__qualname__ = f"{c.__qualname__}.__init__"
        fn.__module__ = c.__module__
        c.__init__ = fn


def _first_init(self: Any, *args: Any, **kwargs: Any) -> None:
    """A record made before its module's :func:`build`: compile its class's ``__init__`` now."""
    cls = type(self)
    pending = _PENDING.get(cls.__module__, [])
    if cls in pending:
        pending.remove(cls)
    _compile([cls])
    cls.__init__(self, *args, **kwargs)


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is self.__class__:
        key = self._record_key
        return key(self) == key(other)
    return NotImplemented


def _hash(self: Any) -> int:
    return hash(self._record_key(self))


def _repr(self: Any) -> str:
    fields = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self) if f.repr)
    return f"{type(self).__qualname__}({fields})"


def _frozen_set(self: Any, name: str, value: Any) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_del(self: Any, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


def _getstate(self: Any) -> list[Any]:
    return [getattr(self, f.name) for f in dataclasses.fields(self)]


def _setstate(self: Any, state: list[Any]) -> None:
    for f, value in zip(dataclasses.fields(self), state):
        object.__setattr__(self, f.name, value)

