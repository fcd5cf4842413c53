"""The roles: pure state machines for master, region-master and slave, message in, sends out.

Owns the wire messages and their encoding (:mod:`~nlevel.roles.messages`), events and
effects (:mod:`~nlevel.roles.events`), the boards of one-sided grants
(:mod:`~nlevel.roles.board`), the slave's side (:mod:`~nlevel.roles.worker`), the servers'
side (:mod:`~nlevel.roles.server`, :mod:`~nlevel.roles.master`, :mod:`~nlevel.roles.region`),
one rank's roles composed into one state machine (:mod:`~nlevel.roles.station`) of
sub-machines: reports and their safety (:mod:`~nlevel.roles.delivery`), failure handling
(:mod:`~nlevel.roles.failures`, with the rules of :mod:`~nlevel.roles.recovery`), liveness
(:mod:`~nlevel.roles.watch`), the end (:mod:`~nlevel.roles.ending`), plan changes
(:mod:`~nlevel.roles.replan`); the completion record (:mod:`~nlevel.roles.ledger`), the in-job planner (:mod:`~nlevel.roles.autoplan`) and the
one loop around a station (:mod:`~nlevel.roles.loop`). The MPI runtime, the simulator and
the tests drive the same classes.

May import: the standard library, numpy, :mod:`nlevel.errors`, :mod:`nlevel.config`,
:mod:`nlevel.ranges`, :mod:`nlevel.stats`, :mod:`nlevel.model` and its own modules.
Never mpi4py, h5py, threading, a file, nor :mod:`nlevel.runtime` or :mod:`nlevel.sim`.
"""
