"""Exceptions raised by nlevel: every one names the offending value and what was expected."""

__all__ = ["NlevelError", "ConfigError", "PlanError", "CheckpointError", "AppError"]


class NlevelError(Exception):
    """Base class of every error nlevel raises on purpose (bad input, foreign files)."""


class ConfigError(NlevelError, ValueError):
    """A setting (CLI flag, ``NLEVEL_*`` variable or argument) has a bad value."""


class PlanError(NlevelError, ValueError):
    """A hierarchy plan that cannot be laid out on the given number of processes."""


class CheckpointError(NlevelError):
    """A checkpoint file that cannot be used; the file on disk is left untouched."""


class AppError(NlevelError):
    """An application (``APP`` of ``python -m nlevel.run``) that breaks the app contract."""


class SimStalled(RuntimeError):
    """The simulated farm stopped with work left (a bug in the roles or in the engine)."""
