"""The roles: pure state machines for master, region-master and slave, message in, sends out.

Owns the wire messages and their encoding (:mod:`~nlevel.roles.messages`), the slave's
side (:mod:`~nlevel.roles.worker`), the servers' side (:mod:`~nlevel.roles.dispatch`),
one rank's roles wired together (:mod:`~nlevel.roles.station`), the completion record
(:mod:`~nlevel.roles.ledger`), failure handling (:mod:`~nlevel.roles.recovery`,
:mod:`~nlevel.roles.repair`) and the in-job planner (:mod:`~nlevel.roles.autoplan`).
The MPI runtime, the simulator and the tests drive the same classes.

May import: the standard library, numpy, :mod:`nlevel.errors`, :mod:`nlevel.config`,
:mod:`nlevel.ranges`, :mod:`nlevel.stats`, :mod:`nlevel.model` and its own modules.
Never mpi4py, h5py, threading, a file, nor :mod:`nlevel.runtime` or :mod:`nlevel.sim`.
"""
