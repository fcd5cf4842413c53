"""Exceptions raised by nlevel: every one names the offending value and what was expected."""

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

    Args:
        problem: What is wrong, naming the file and the values.
        remedies: API (``"script"``, ``"run"``) -> what to do there; may be empty.
    """

    def __init__(self, problem: str, remedies: dict[str, str] | None = None) -> None:
        self.problem = problem
        self.remedies = dict(remedies or {})
        super().__init__(self.explain("script"))

    def explain(self, api: str = "script") -> str:
        """The problem and the remedy for ``api`` (``"script"`` or ``"run"``), in one line."""
        remedy = self.remedies.get(api)
        return f"{self.problem}; {remedy}" if remedy else self.problem


class AppError(NlevelError):
    """An application (``APP`` of ``python -m nlevel.run``) that breaks the app contract."""


class SimStalled(RuntimeError):
    """The simulated farm stopped with work left (a bug in the roles or in the engine)."""
