"""The runtime's Runner between two pieces of a hand, on a farm in one process (nlevel.testing.network)."""

from __future__ import annotations

import pytest

from nlevel.config import Config
from nlevel.model.plan import Plan
from nlevel.roles.events import Died, Ran
from nlevel.roles.recovery import successors
from nlevel.runtime.rank import Runner
from nlevel.testing.network import Network


def _slave(ft: str, size: int = 3, rank: int = 1) -> tuple[Network, Runner]:
    config = Config(levels=2, fault_tolerance=ft)
    net = Network(size, Plan(2), 60, 0, config=config)
    net.loops[0].step()  # the master stocks its board
    runner = Runner(net.stations[rank], net.loops[rank], config)
    runner.look = 0.0  # (every call is a look: no waiting on the clock)
    return net, runner


@pytest.mark.parametrize("ft", ["on", "off"])
def test_a_look_probes_again_under_fault_tolerance(ft):
    """Open MPI's probe that finds nothing progresses the transfers after it looked: what it pulled in
    is found by the next probe only. A survivor read a new master's question one look (10 ms) late."""
    net, runner = _slave(ft)
    calls = []
    receive = net.loops[1].receive
    net.loops[1].receive = lambda most=256: calls.append(most) or receive(most)
    hand = runner.next_range(None)
    assert hand is not None
    calls.clear()
    a, b = hand
    runner.next_range(Ran(((a, a + 1),), tasks=1, busy=1e-3, longest=1e-3))
    assert len(calls) == (2 if ft == "on" else 1)


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
