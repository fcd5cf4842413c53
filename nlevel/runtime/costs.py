"""The model's costs a ``--levels auto`` job starts from: this machine's calibration when there is one.

``python -m nlevel.plan --calibrate`` stores the measured service, message and one-sided
operation times (:mod:`nlevel.model.calibration`). A job under ``--levels auto`` takes
each of them from that file unless its own setting differs from the documented default (a
flag or ``NLEVEL_*`` variable wins; a value given equal to the default is taken as not
given). The report says where the costs came from (``costs_from``).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from ..config import Config
from ..model.calibration import default_path, load_calibration

__all__ = ["COSTS", "with_calibration"]

#: The settings a calibration measures.
COSTS = ("service_time", "msg_time", "atomic_time", "atomic_service")


def with_calibration(config: Config, path: str | None = None) -> tuple[Config, str, list[str]]:
    """``config`` with its unset costs taken from the calibration file (only under ``--levels auto``).

    Returns:
        The config, where the costs came from (for the report: ``"defaults"``, ``"settings"`` or
        ``"calibration <path> (...)"``), and warnings to print (a calibration measured elsewhere).

    Raises:
        ConfigError: the file exists but is not a calibration (naming it).
    """
    if not config.auto:
        return config, "settings", []
    path = path or default_path()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cal = load_calibration(path)
    notes = [str(w.message) for w in caught]
    default = Config()
    unset = [k for k in COSTS if getattr(config, k) == getattr(default, k)]
    if cal is None:
        return config, "defaults" if len(unset) == len(COSTS) else "settings", notes
    taken: dict[str, Any] = {k: float(getattr(cal, k)) for k in unset if getattr(cal, k, 0.0) > 0}
    if not taken:
        return config, "settings", notes
    return dataclasses.replace(config, **taken), f"calibration {path} ({', '.join(sorted(taken))})", notes
