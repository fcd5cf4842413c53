"""Test tooling shipped with the library: fault injection from outside a running job.

Used by the test suite and ``bench/soak.py``, and by hand (``python -m
nlevel.testing.inject``). Nothing in :mod:`nlevel` imports this package.

May import: :mod:`nlevel.model`, :mod:`nlevel.errors` and :mod:`nlevel.runtime.checkpoint`
(to read a run's checkpoint), the standard library. Never mpi4py: it acts on a job
from outside, with signals and ``/proc``.
"""
