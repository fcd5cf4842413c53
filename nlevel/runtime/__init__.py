"""The runtime: the only place with MPI, threads, signals and files.

Owns the transport over MPI (:mod:`~nlevel.runtime.transport`), the boards in an MPI
window (:mod:`~nlevel.runtime.window`), the port and runner through which the shared loop
drives one rank's :class:`~nlevel.roles.station.Station` (:mod:`~nlevel.runtime.rank`), the
checkpoint (:mod:`~nlevel.runtime.checkpoint`, over its format, readers and writers, its journal
:mod:`~nlevel.runtime.journal`), the run report, the control directory,
signal handling, progress display, polling back-off, app loading, the calibration run,
the built-in workload, ``nlevel-mpiexec`` (:mod:`~nlevel.runtime.launch`) and
``python -m nlevel.run`` (:mod:`~nlevel.runtime.cli`).

May import: anything in :mod:`nlevel` except :mod:`nlevel.sim` and :mod:`nlevel.testing`.
mpi4py is imported here only, in at most three modules (transport, window, calibrate).
"""
