"""The runtime's Runner between two pieces of a hand, on a farm in one process (nlevel.testing.network)."""

from __future__ import annotations

import pytest

from nlevel.config import Config
from nlevel.model.plan import Plan
from nlevel.roles.events import Died
from nlevel.roles.messages import Heartbeat, encode
from nlevel.roles.recovery import successors
from nlevel.runtime.rank import Runner, RunnerThread
from nlevel.testing.network import Network


def _slave(ft: str, size: int = 3, rank: int = 1) -> tuple[Network, Runner]:
    config = Config(levels=2, fault_tolerance=ft)
    net = Network(size, Plan(2), 60, 0, config=config)
    net.loops[0].step()  # the master stocks its board
    runner = Runner(net.stations[rank], net.loops[rank], config)
    runner.look = 0.0  # (every call is a look: no waiting on the clock)
    return net, runner


class _Ob1Comm:
    """Stands for a communicator under Open MPI's ob1: a probe matches first and progresses the
    transfers after, so a message that arrived meanwhile is matched only by a later probe."""

    def __init__(self, arrived):
        self.arrived, self.matched, self.probes = list(arrived), [], 0

    def improbe(self, source, tag, status):
        self.probes += 1
        if self.matched:
            src, t, payload = self.matched.pop(0)
            status.Set_source(src)
            status.Set_tag(t)
            return _Message(payload)
        self.matched, self.arrived = self.matched + self.arrived, []
        return None


class _Message:
    def __init__(self, payload):
        self.payload = payload

    def recv(self):
        return self.payload


def _transport(comm):
    from mpi4py import MPI

    from nlevel.runtime.transport import Transport

    t = object.__new__(Transport)
    t.comm, t._status, t.ft, t.failed = comm, MPI.Status(), False, set()
    return t


def test_a_poll_finds_a_message_that_arrived_while_the_rank_slept():
    """Open MPI's probe that finds nothing progresses the transfers after it looked: what it pulled in
    is found by the next probe only. A survivor read a new master's question one look (10 ms) late."""
    tag, payload = encode(Heartbeat(3, 0.5))
    comm = _Ob1Comm([(2, tag, payload)])
    t = _transport(comm)
    assert t.poll() == (2, Heartbeat(3, 0.5))
    assert t.poll() is None and comm.probes == 4  # (an empty poll: two probes)


def test_the_ranks_next_in_line_prepare_a_takeover_once():
    """The deputy and the rank after it (which takes over from the file should both die) import
    h5py before a takeover needs it; the others only once a death puts them in line."""
    net, runner = _slave("on", size=5, rank=3)
    prepared = []
    runner.prepare_takeover = lambda: prepared.append(1)
    runner.next_range(None)
    assert successors(net.stations[3].hierarchy) == [1, 2] and prepared == []
    net.loops[3].handle(Died((1,)))
    runner.next_range(None)
    runner.next_range(None)
    assert successors(net.stations[3].hierarchy) == [2, 3] and prepared == [1]  # once


def test_a_runner_thread_is_started_without_waiting_for_it_to_run(monkeypatch):
    """threading.Thread.start waits until the new thread has run (0.3-2.9 ms of every rank's first
    call on an oversubscribed node); a RunnerThread's start returns at once, and the thread counts
    as alive from then on, so the runner never takes it for a server thread that has ended."""
    from nlevel.runtime import rank

    started = []
    monkeypatch.setattr(rank._thread, "start_new_thread", lambda body, args: started.append(body))
    ran = []
    th = RunnerThread(lambda: ran.append(th.is_current()), "nlevel-pulse")
    th.start()  # (the thread is not scheduled at all: a start that waited would never return)
    assert started and ran == [] and th.is_alive() and not th.is_current()
    started[0]()  # the thread runs now (here: in this one)
    assert ran == [True] and not th.is_alive() and th.name == "nlevel-pulse"
    th.join()  # (ended: returns at once)


def test_a_runner_thread_counts_as_ended_after_its_target_raised():
    def boom():
        raise RuntimeError("boom")

    th = RunnerThread(boom, "nlevel-server")
    with pytest.raises(RuntimeError, match="boom"):
        th.run()
    assert not th.is_alive()


def test_the_runner_starts_its_pulse_as_a_runner_thread_and_stops_it():
    net, runner = _slave("on")
    runner.look = 0.01
    runner.start()
    try:
        assert isinstance(runner._pulse, RunnerThread) and runner._pulsing()
    finally:
        runner.stop()
    assert not runner._pulsing()
