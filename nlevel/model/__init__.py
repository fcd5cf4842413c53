"""The model: what to run, decided from numbers, with no MPI, no threads and no files.

Owns the :class:`~nlevel.model.plan.Plan` value (levels, regions, prefetch, chunk), its
layout over ranks (:mod:`~nlevel.model.hierarchy`), the queueing model that chooses a
plan (:mod:`~nlevel.model.queueing`: Poisson fit, dispersion, M/M/1), the measured
service and message times (:mod:`~nlevel.model.calibration`, the one module here that
reads and writes a file: the calibration JSON) and ``python -m nlevel.plan``
(:mod:`~nlevel.model.cli`).

May import: the standard library, numpy/scipy, :mod:`nlevel.errors`, :mod:`nlevel._version`
and its own modules. Never mpi4py, h5py, threading, nor anything from
:mod:`nlevel.roles`, :mod:`nlevel.runtime` or :mod:`nlevel.sim` (they build on it).
"""
