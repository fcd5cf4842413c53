"""Loading an application for ``python -m nlevel.run`` and checking it keeps the app contract.

An APP is an importable module name (``apps.dock_like``) or a path to a ``.py`` file
that provides:

* ``do_job(task_id)`` (required): runs one task. May return a number, committed as the
  task's result together with its completion. ``do_job(task_id, comm)``, a second parameter:
  it gets the task's team communicator (``--ranks-per-task k``: every rank of a team calls it
  with the same id; the leader's result is committed; ``MPI.COMM_SELF`` with one rank per task).
* ``total`` (required): the number of tasks, an int or a function ``total(options)``.
* ``add_arguments(parser)`` (optional): declares the app's own command-line options.
* ``setup(options)`` (optional): called on every rank with the parsed options before
  the first task.
* ``result_fields`` (optional): names of the numbers ``do_job`` returns when it returns
  more than one; each task's tuple is committed with its completion.
* ``finish(ids, values, options)`` (optional): called on rank 0 once every task is
  committed, with all committed results (this run's and resumed ones), e.g. to write
  the app's own output.
* ``fingerprint(options) -> dict`` (optional, called after ``setup``): the parameters
  that change what a task computes (e.g. ``{"seed": options.seed}``, or a digest of an
  input file's content that the options do not show).

A run's identity in its checkpoint is the app's name and ``total``, plus what
``fingerprint(options)`` returns: a checkpoint is resumed only by a run of the same
identity. Options that do not define the tasks (output directories, log paths, job ids)
are left out by default, so they never block a resume; an app whose options change
what a task computes must name them in ``fingerprint``. Pure Python, no MPI.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ..errors import AppError

__all__ = ["App", "load_app"]

#: The built-in workload's app name: the shim nlevel/micro.py of nlevel.runtime.micro. The name is
#: hashed into checkpoints' fingerprints and written in reports, so it stays what it was.
BUILTIN = "nlevel.micro"


@dataclass
class App:
    """A loaded application."""

    name: str
    module: ModuleType

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Let the app declare its options (if it has any)."""
        add = getattr(self.module, "add_arguments", None)
        if add is not None:
            add(parser)

    def setup(self, options: argparse.Namespace) -> None:
        """Call the app's ``setup(options)`` if it has one."""
        fn = getattr(self.module, "setup", None)
        if fn is not None:
            fn(options)

    def total(self, options: argparse.Namespace) -> int:
        """Return the app's task count.

        Raises:
            AppError: when it is not a non-negative integer.
        """
        t = getattr(self.module, "total")
        value = t(options) if callable(t) else t
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise AppError(f"APP {self.name!r}: total must be a non-negative integer, got {value!r}")
        return value

    def do_job(self, task_id: int, comm: Any = None) -> Any:
        """Run one task (with the team's communicator when the app's ``do_job`` takes one)."""
        if self.takes_comm:
            return self.module.do_job(task_id, comm)
        return self.module.do_job(task_id)

    @property
    def takes_comm(self) -> bool:
        """Whether the app's ``do_job`` has a second parameter: the task's team communicator."""
        known = self.__dict__.get("_takes_comm")
        if known is None:
            known = self.__dict__["_takes_comm"] = _takes_comm(self.module.do_job)
        return bool(known)

    def fingerprint(self, options: argparse.Namespace) -> dict[str, Any]:
        """The app's ``fingerprint(options)``: what defines its tasks beyond its name and total ({} without the hook).

        Raises:
            AppError: when the hook does not return a dict, or uses the reserved key ``app``.
        """
        fn = getattr(self.module, "fingerprint", None)
        if fn is None:
            return {}
        value = fn(options)
        if not isinstance(value, dict):
            raise AppError(f"APP {self.name!r}: fingerprint(options) must return a dict, got {type(value).__name__}")
        if "app" in value:
            raise AppError(f"APP {self.name!r}: fingerprint(options) may not use the key 'app' (the app's name is "
                           f"part of the identity already), got {value!r}")
        return value

    @property
    def result_fields(self) -> tuple[str, ...] | None:
        """The app's result field names, or None for a single number."""
        fields = getattr(self.module, "result_fields", None)
        return tuple(fields) if fields is not None else None

    def finish(self, ids: Any, values: Any, options: argparse.Namespace) -> None:
        """Call the app's ``finish(ids, values, options)`` if it has one (rank 0)."""
        fn = getattr(self.module, "finish", None)
        if fn is not None:
            fn(ids, values, options)


def _takes_comm(fn: Any) -> bool:
    """Whether ``fn`` can be called with two positional arguments (a task id and a communicator)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params)


def load_app(spec: str | None) -> App:
    """Import the app named by ``spec`` (module name or .py path; None = the built-in workload).

    Raises:
        AppError: when it cannot be imported or lacks ``do_job`` / ``total``.
    """
    name = spec or BUILTIN
    try:
        if name.endswith(".py") or os.sep in name:
            if not os.path.isfile(name):
                raise AppError(f"APP {name!r}: no such file; expected a .py file or an importable module name")
            mod_name = "nlevel_app_" + os.path.splitext(os.path.basename(name))[0]
            file_spec = importlib.util.spec_from_file_location(mod_name, name)
            if file_spec is None or file_spec.loader is None:
                raise AppError(f"APP {name!r}: cannot be loaded as a Python file")
            module = importlib.util.module_from_spec(file_spec)
            sys.modules[mod_name] = module
            file_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(name)
    except AppError:
        raise
    except Exception as exc:
        raise AppError(
            f"APP {name!r} cannot be imported: {type(exc).__name__}: {exc}; "
            f"expected an importable module name (e.g. apps.dock_like) or a path to a .py file"
        ) from exc
    missing = [f for f in ("do_job", "total") if not hasattr(module, f)]
    if missing:
        raise AppError(
            f"APP {name!r} lacks {' and '.join(missing)}; an app must define do_job(task_id) "
            f"and total (an int or total(options) -> int)"
        )
    if not callable(module.do_job):
        raise AppError(f"APP {name!r}: do_job must be a function do_job(task_id) or do_job(task_id, comm), "
                       f"got {module.do_job!r}")
    fields = getattr(module, "result_fields", None)
    if fields is not None and (
        isinstance(fields, str) or not fields or not all(isinstance(f, str) and f for f in fields)
    ):
        raise AppError(f"APP {name!r}: result_fields must be a non-empty tuple of names, got {fields!r}")
    return App(name, module)
