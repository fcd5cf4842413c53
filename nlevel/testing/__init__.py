"""Test tooling shipped with the library: an in-process farm, and fault injection from outside a running job.

:mod:`~nlevel.testing.network` runs every rank's loop in one process over a fake network
(the unit tests' property tests). :mod:`~nlevel.testing.faults`, :mod:`~nlevel.testing.inject`
and :mod:`~nlevel.testing.audit` kill a real job's ranks by role and check the run from
outside; used by the test suite and ``bench/soak.py``, and by hand (``python -m
nlevel.testing.inject``). :mod:`~nlevel.testing.cluster` makes an emulated cluster of
network namespaces on this machine (root) for the tests in tests/cluster. Nothing in
:mod:`nlevel` imports this package.

May import: the standard library, :mod:`nlevel.model`, :mod:`nlevel.roles`,
:mod:`nlevel.config`, :mod:`nlevel.ranges`, :mod:`nlevel.errors` and
:mod:`nlevel.runtime.checkpoint` (to read a run's checkpoint). Never mpi4py: the network
is simulated, and the injector and the cluster act on a job from outside, with signals,
``/proc`` and ``ip``.
"""
