"""A worker's range claimed ahead (the runtime's Prefetch, while the user's loop runs its hand)."""

from __future__ import annotations

import pytest

from nlevel.config import Config
from nlevel.model.plan import Plan
from nlevel.roles.board import Claim
from nlevel.roles.worker import PREFETCH_SPAN, Worker
from nlevel.testing.network import Network


class Board:
    """What the parent's board gives: one claim per call, counted."""

    def __init__(self, *claims: Claim) -> None:
        self.claims = list(claims)
        self.made = 0

    def claim(self, mem: object) -> Claim:
        self.made += 1
        return self.claims.pop(0)


def _worker(*claims: Claim) -> tuple[Worker, Board]:
    w = Worker(1, 0, 64, report_every=256, report_age=10.0)
    board = Board(*claims)
    w.claimer = board  # type: ignore[assignment]
    return w, board


def test_the_next_range_is_claimed_ahead_and_taken_without_a_claim():
    w, board = _worker(Claim(0, 4, "ids"), Claim(4, 8, "ids"))
    w.refill(object(), 0.0)
    w.ran(((0, 1),), (), (), 1, 0.003, 0.003, 0.01)  # (a task time is known)
    assert w.prefetch_due()
    w.prefetch(object(), 0.01)
    assert w.hand == (1, 4) and list(w.queue) == [4, 5, 6, 7] and not w.prefetch_due()  # (one ahead at most)
    assert list(w.holding()) == list(range(8))  # (id 0 ran, not yet reported)
    w.ran(((1, 4),), (), (), 3, 0.009, 0.003, 0.02)
    assert w.refill(object(), 0.02) is None and board.made == 2  # (from the queue: no claim)
    assert w.hand == (4, 8) and not w.queue


def test_nothing_is_claimed_ahead_before_a_task_time_is_known_nor_for_a_long_hand():
    w, _ = _worker(Claim(0, 4, "ids"))
    w.refill(object(), 0.0)
    assert not w.prefetch_due()  # (the first ids may be tasks of hours)
    long = PREFETCH_SPAN / 2  # (four of these in hand: twice the span)
    w.ran(((0, 1),), (), (), 1, long, long, 0.01)
    assert w.hand == (1, 4) and not w.prefetch_due()


def test_nothing_is_claimed_ahead_once_ranges_narrow():
    """The servers cut ranges as their stock runs low: the end, where a range held ahead idles another rank."""
    w, _ = _worker(Claim(0, 8, "ids"), Claim(8, 10, "ids"))
    w.refill(object(), 0.0)
    w.ran(((0, 8),), (), (), 8, 0.024, 0.003, 0.01)
    w.refill(object(), 0.01)
    assert w.hand == (8, 10) and not w.prefetch_due()


def test_a_suspect_claimed_ahead_is_reported_as_soon_as_it_has_run():
    w, _ = _worker(Claim(0, 4, "ids"), Claim(17, 18, "ids", suspect=True))
    w.refill(object(), 0.0)
    w.ran(((0, 1),), (), (), 1, 0.003, 0.003, 0.01)
    w.prefetch(object(), 0.01)
    assert w.suspect_until == 0  # (not in hand yet)
    w.ran(((1, 4),), (), (), 3, 0.009, 0.003, 0.02)
    w.refill(object(), 0.02)
    assert w.hand == (17, 18) and not w.report_due(0.02)
    w.ran(((17, 18),), (), (), 1, 0.003, 0.003, 0.03)
    assert w.report_due(0.03)


def test_a_claim_ahead_that_finds_nothing_changes_nothing_but_keeps_its_ticket_state():
    w, board = _worker(Claim(0, 4, "ids"), Claim(0, 0, "wait"), Claim(0, 0, "all-out"))
    w.refill(object(), 0.0)
    w.ran(((0, 1),), (), (), 1, 0.003, 0.003, 0.01)
    w.prefetch(object(), 0.01)
    assert w.hand == (1, 4) and not w.queue and w.state.value == "run" and w.prefetch_due()
    w.prefetch(object(), 0.02)
    assert w.all_out and not w.prefetch_due() and w.hand == (1, 4)


def test_leaving_gives_back_the_range_claimed_ahead():
    w, _ = _worker(Claim(0, 4, "ids"), Claim(4, 8, "ids", suspect=True))
    w.refill(object(), 0.0)
    w.ran(((0, 1),), (), (), 1, 0.003, 0.003, 0.01)
    w.prefetch(object(), 0.01)
    report = w.leave((), 0.02)
    assert report.returned == ((1, 8),) and not w.queue and w.queued_suspect == 0


def test_a_worker_gives_back_the_range_claimed_ahead():
    w, _ = _worker(Claim(0, 4, "ids"), Claim(4, 8, "ids", suspect=True))
    w.refill(object(), 0.0)
    w.ran(((0, 1),), (), (), 1, 0.003, 0.003, 0.01)
    w.prefetch(object(), 0.01)
    report = w.give_back(0.5)
    assert report.returned == ((4, 8),) and report.done == ((0, 1),) and not report.leaving
    assert w.hand == (1, 4) and not w.queue and w.queued_suspect == 0 and list(w.holding()) == [1, 2, 3]


@pytest.mark.parametrize("seed", range(4))
def test_a_range_claimed_ahead_goes_back_when_the_task_before_it_runs_long(seed, monkeypatch):
    """A range claimed ahead waits behind the task in hand; once that task has run past PREFETCH_SPAN
    (a heavy tail: its whole hand was expected to take less) the range goes back to the parent, for
    another rank, instead of waiting for a task of unknown length (the job's end, a task time limit)."""
    given: list[tuple[int, tuple[tuple[int, int], ...]]] = []
    give_back = Worker.give_back

    def recorded(self, now):
        given.append((self.rank, self.queue.ranges()))
        return give_back(self, now)

    monkeypatch.setattr(Worker, "give_back", recorded)
    total = 200
    config = Config(levels=2, chunk=4, fault_tolerance="on")
    out = Network(6, Plan(2), total, seed, config=config, ahead=1.0, long={50: 2.0}).run()
    assert given, "no range claimed ahead went back while task 50 ran for 2 s"
    assert all(n == 1 for n in out.executed.values()) and sorted(out.executed) == list(range(total))
    assert out.ledger.n_committed == total and not out.kills
