"""A survivor asked by a new master what it holds, before MPI has told it of the death."""

from __future__ import annotations

from nlevel.config import Config
from nlevel.model.hierarchy import build
from nlevel.model.plan import Plan
from nlevel.roles.events import Send
from nlevel.roles.messages import Holding
from nlevel.roles.station import Station
from nlevel.testing.network import LocalBoards


def _slave(rank: int = 3) -> Station:
    st = Station(build(8, Plan(2)), rank, Config(levels=2, fault_tolerance="on"), lambda: 1.0, LocalBoards(), 40)
    assert st.info.parent == 0
    return st


def test_a_question_naming_a_death_is_answered_at_once():
    """The question's dead ranks are certain (its asker heard of them from MPI): waiting for this
    rank's own notice held the master's recovery up to 196 ms (8 ranks on 2 cores, ULFM)."""
    st = _slave()
    outs = st.receive(1, Holding((), (0,), ask=True, token=7))
    assert st.failed == {0} and st.info.parent == 1  # (the death counts from the question)
    answers = [o for o in outs if isinstance(o, Send) and o.dest == 1 and isinstance(o.msg, Holding) and o.msg.token == 7]
    assert len(answers) == 1 and answers[0].msg.failed == (0,)
    assert st.fail((0,)) == []  # (MPI's notice, later, is old news)


def test_a_question_naming_this_rank_dead_is_not_answered():
    st = _slave()
    outs = st.receive(1, Holding((), (0, 3), ask=True, token=7))
    assert st.failed == {0}  # (the other death counts) ...
    assert not [o for o in outs if isinstance(o, Send) and isinstance(o.msg, Holding) and o.msg.token == 7]
    assert len(st.recovery.deferred) == 1  # ... but the asker buried this rank: the question waits, as before


def test_a_new_master_asks_the_survivors_before_it_reads_the_checkpoint_file():
    """The runtime carries effects out in order and reads the file on the spot: read before the
    questions went out, it delayed every answer by the read (25-45 ms with h5py's import)."""
    from nlevel.roles.events import LoadCheckpoint

    st = Station(build(8, Plan(2)), 1, Config(levels=2, fault_tolerance="on"), lambda: 1.0, LocalBoards(), 40)
    outs = st.fail((0,))
    asked = [i for i, o in enumerate(outs) if isinstance(o, Send) and isinstance(o.msg, Holding) and o.msg.ask]
    loads = [i for i, o in enumerate(outs) if isinstance(o, LoadCheckpoint)]
    assert st.info.parent is None and st.loading  # (it is the master, waiting for the file)
    assert sorted(outs[i].dest for i in asked) == [2, 3, 4, 5, 6, 7]
    assert loads == [len(outs) - 1]  # the file last, after every question
