"""Exceptions raised by nlevel: every one names the offending value and what was expected."""

from __future__ import annotations

__all__ = ["NlevelError", "ConfigError", "PlanError", "CheckpointError", "AppError"]


class NlevelError(Exception):
    """Base class of every error nlevel raises on purpose (bad input, foreign files)."""


class ConfigError(NlevelError, ValueError):
    """A setting (CLI flag, ``NLEVEL_*`` variable or argument) has a bad value."""


class PlanError(NlevelError, ValueError):
    """A hierarchy plan that cannot be laid out on the given number of processes."""


class CheckpointError(NlevelError):
    """A checkpoint file that cannot be used; the file on disk is left untouched.

    What a user can do about it depends on the API in use (``python -m nlevel.run`` has
    ``--fresh``, a script has ``Farm(..., fresh=True)`` or another path), so the error carries
    the problem and one remedy per API: ``str(error)`` gives the script's
    (``Farm``/``get_task_id``), :meth:`explain` any other's.

    A file that cannot be written (a full disk, a lost permission) is one too, raised on every
    rank alike at the farm's end: ``cannot write checkpoint /x/run.h5: No space left on device
    (errno 28); ...``, with the file in :attr:`path` and the OS error number in :attr:`errno`
    (the library's own exception is not chained: its text is in the message).

    Args:
        problem: What is wrong, naming the file and the values.
        remedies: API (``"script"``, ``"run"``) -> what to do there; may be empty.
        path: The file concerned, when there is one.
        errno: The OS error number behind it (``errno.ENOSPC`` for a full disk), when there is one.
    """

    def __init__(self, problem: str, remedies: dict[str, str] | None = None, *, path: str | None = None,
                 errno: int | None = None) -> None:
        self.problem = problem
        self.remedies = dict(remedies or {})
        self.path = path
        self.errno = errno
        super().__init__(self.explain("script"))

    def again(self) -> CheckpointError:
        """The same error, new (no traceback, no cause): to raise it anew where it is reported."""
        return CheckpointError(self.problem, self.remedies, path=self.path, errno=self.errno)

    def explain(self, api: str = "script") -> str:
        """The problem and the remedy for ``api`` (``"script"`` or ``"run"``), in one line."""
        remedy = self.remedies.get(api)
        return f"{self.problem}; {remedy}" if remedy else self.problem


class AppError(NlevelError):
    """An application (``APP`` of ``python -m nlevel.run``) that breaks the app contract."""


class SimStalled(RuntimeError):
    """The simulated farm stopped with work left (a bug in the roles or in the engine)."""
