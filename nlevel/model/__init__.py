"""The model: what to run, decided from numbers, with no MPI, no threads and no files.

Owns the :class:`~nlevel.model.plan.Plan` value (levels, regions, prefetch, chunk), its
layout over ranks (:mod:`~nlevel.model.hierarchy`), the queueing pieces of the paper
(:mod:`~nlevel.model.queueing`: Poisson fit, dispersion, M/M/1 and Kingman waits), what a
plan costs (:mod:`~nlevel.model.cost`), the choice of a plan (:mod:`~nlevel.model.planner`)
and the measured costs of this machine (:mod:`~nlevel.model.calibration`, the one module
here that reads and writes a file: the calibration JSON). ``python -m nlevel.plan`` is
:mod:`nlevel.runtime.plan_cli`.

May import: the standard library, numpy/scipy, :mod:`nlevel.errors`, :mod:`nlevel._version`
and its own modules. Never mpi4py, h5py, threading, nor anything from
:mod:`nlevel.roles`, :mod:`nlevel.runtime` or :mod:`nlevel.sim` (they build on it).
"""
