"""The GPUs of this node, and the variable that hands a process its share (``--gpus-per-task``).

The node's list comes from, in order:

1. ``NLEVEL_GPUS`` (e.g. ``0,1,2,3``): the list to split, whatever the node has (it overrides
   what is found; tests use it as a fake list);
2. the allocation's variable, the first of :data:`VARIABLES` that is set (Slurm, PBS and Flux
   set ``CUDA_VISIBLE_DEVICES`` for a job given whole GPUs per node; AMD's ROCm reads
   ``ROCR_VISIBLE_DEVICES``, Intel's Level Zero ``ZE_AFFINITY_MASK``);
3. the NVIDIA devices found on the node: ``/dev/nvidia0``, ``/dev/nvidia1``, ...

A process's share is set in that variable (``CUDA_VISIBLE_DEVICES`` for 1 and 3) in
``os.environ`` at the farm's set-up, before the first task: a CUDA, ROCm or oneAPI library
imported after it sees only the process's own devices. One imported before (at the top of a
script, before the Farm) has already read the variable: import it in the task, or after the
Farm is made.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Mapping

__all__ = ["VARIABLES", "FAKE", "node_devices", "apply"]

#: The variables that name a job's devices, in the order they are read.
VARIABLES = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ZE_AFFINITY_MASK")
#: The variable that gives the node's list by hand (tests: a fake list).
FAKE = "NLEVEL_GPUS"


def _split(text: str) -> list[str]:
    return [d.strip() for d in text.split(",") if d.strip()]


def node_devices(environ: Mapping[str, str] | None = None, dev: str = "/dev") -> tuple[str, list[str]]:
    """The variable to set and this node's devices (``("", [])``: none found).

    Args:
        environ: The environment (default ``os.environ``).
        dev: Where device files are (for tests).
    """
    env = os.environ if environ is None else environ
    allocated = next((v for v in VARIABLES if v in env), "")
    if env.get(FAKE, "").strip():
        return allocated or VARIABLES[0], _split(env[FAKE])
    if allocated:
        return allocated, _split(env[allocated])
    found = sorted((int(m.group(1)) for p in glob.glob(os.path.join(dev, "nvidia[0-9]*"))
                    if (m := re.fullmatch(r"nvidia(\d+)", os.path.basename(p)))))
    return (VARIABLES[0], [str(n) for n in found]) if found else ("", [])


def apply(variable: str, devices: tuple[str, ...], environ: dict[str, str] | None = None) -> None:
    """Set this process's devices: ``variable`` names exactly ``devices`` (empty: none visible)."""
    env = os.environ if environ is None else environ
    env[variable or VARIABLES[0]] = ",".join(devices)
