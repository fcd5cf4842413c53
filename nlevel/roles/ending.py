"""How a job ends: one sub-machine of a :class:`~nlevel.roles.station.Station`. Pure Python.

Every rank's statistics travel up the tree, then the master releases everyone.

The end is part of the job, not a collective call after it, so a death while it runs is
handled like any other (MPI collectives hang when a process exited without MPI noticing,
and fail when one dies during them):

* A rank is *over* when its user loop is over and it serves nobody anymore (the master:
  its final checkpoint is on disk). It then waits for an :class:`~nlevel.roles.messages.Ending`
  from each live child, and sends its parent one Ending holding its own row and statistics
  merged with its children's. A rank whose parent changed (a death) sends it again to the
  new parent; a later Ending from the same rank replaces the earlier.
* A leaf sends its Ending *early*, while the last tasks still run elsewhere, once its
  parent's board said everything is out (``"all-out"``: the master's, or a region's whose
  own parent said so) and it holds and owes nothing: so the end does not wait for every
  leaf to learn of FINAL and answer. Without fault tolerance it rides on the leaf's last
  report (:attr:`~nlevel.roles.messages.Report.ending`): one message, not two. A parent drops a
  child's Ending when a report from it follows (it ran ids that came back after a
  failure): the child sends a new one when it is idle again.
* A child that stops beating is hung (see :mod:`nlevel.roles.watch`): killed, then handled like
  any death (the job does not wait for it). One that beats is waited for, whatever it does.
* The master, once every live child's Ending is in, has every surviving rank's row and
  statistics: it writes the last checkpoint and calls :meth:`Closing.release`, which tells
  the deputy first (with the report's facts) and then every rank, the deputy last. Some
  releases wait for the master's last work (its report), sent by :meth:`Closing.release_deputy`:
  the deputy's under fault tolerance (unless that work leaves nothing on disk: no checkpoint, no
  report file), everyone's when a rank was given up without it. A
  deputy told that the master was releasing, whose master then dies, releases the others itself.

A rank's loop runs until it is released (:attr:`Closing.released`).
"""

from __future__ import annotations

from typing import Any

from ..stats import RequestTimes, Summary
from .events import Effect, Send
from .failures import Recovery
from .host import Host
from .messages import Ending, Release
from .recovery import deputy
from .replan import Replanning
from .worker import State

__all__ = ["Closing", "merge_places", "merge_stats"]


def merge_places(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Combine two sets of ranks' placements, ``{host: {"ranks", "mask", "limit"}}`` (see
    :func:`nlevel.runtime.machine.here`): ranks add up, affinities unite, the lowest cap wins."""
    out = {h: dict(v) for h, v in a.items()}
    for h, v in b.items():
        if h not in out:
            out[h] = dict(v)
            continue
        w = out[h]
        w["ranks"] += v["ranks"]
        w["mask"] |= v["mask"]
        limits = [x for x in (w.get("limit"), v.get("limit")) if x is not None]
        w["limit"] = min(limits) if limits else None
    return out


def merge_stats(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Combine two ranks' (or subtrees') mergeable statistics (the reduction of the run report)."""
    tasks = Summary()
    for t in (a.get("tasks"), b.get("tasks")):
        if t is not None:
            tasks.merge(t)
    requests: dict[int, RequestTimes] = {}
    for side in (a.get("requests", {}), b.get("requests", {})):
        for level, rt in side.items():
            requests.setdefault(level, RequestTimes()).merge(rt)
    return {
        "tasks": tasks,
        "requests": requests,
        "unexpected": a.get("unexpected", 0) + b.get("unexpected", 0),
        "failures": a.get("failures", []) + b.get("failures", []),
        "timeline": {**a.get("timeline", {}), **b.get("timeline", {})},
        "hosts": merge_places(a.get("hosts", {}), b.get("hosts", {})),
    }


class Closing:
    """The end of the job on one rank (see the module docstring).

    Its statistics carry the station's ``facts`` (where it runs: ``hosts``), merged by
    :func:`merge_stats` like the rest.
    """

    def __init__(self, st: Host, recovery: Recovery, replanning: Replanning) -> None:
        self.st = st
        self.recovery = recovery
        self.replanning = replanning
        self.endings: dict[int, Ending] = {}  # child -> its Ending
        self.end_key: tuple[Any, ...] | None = None  # what this rank's last Ending was made of
        self.released: Release | None = None  # the master's Release (this rank's loop may stop)
        self.pending_release: Release | None = None  # the deputy: the master is releasing everyone
        self.finished_release = False  # this rank released the job for a master that died while releasing it
        self.held_release: list[Effect] = []  # the master: releases sent once its own end is done (see release)
        self.let_go: set[int] = set()  # the ranks this rank released: they exit now, which is no failure

    def forget(self, dead: frozenset[int]) -> None:
        """``dead`` died: their Endings no longer count."""
        for x in dead:
            self.endings.pop(x, None)

    @property
    def over(self) -> bool:
        """Whether this rank's part of the job is done: its loop is over and it serves nobody."""
        st = self.st
        return not st.abandoned and st.ended and st.done_serving and not st.loading

    def _live_children(self) -> list[int]:
        st = self.st
        return [c for c in st.info.children if c not in st.failed and c != st.rank]

    def _payload(self, children: list[int]) -> tuple[tuple[dict[str, Any], ...], dict[str, Any]]:
        row, stats = self.st.own_stats()
        rows = [row]
        for c in children:
            e = self.endings[c]
            rows.extend(e.rows)
            stats = merge_stats(stats, e.stats)
        return tuple(rows), stats

    def step(self) -> list[Effect]:
        """On each tick: send this rank's Ending up once its subtree is over; kill children that never end."""
        if self.released is not None:
            return []
        if not self.over:
            return self.early_ending()
        children = self._live_children()
        if any(c not in self.endings for c in children):
            return []  # (a child that is hung stops beating: its lease kills it)
        parent = self.st.info.parent
        if parent is None:
            return []  # the master: ready (see ready()); the runtime writes the report and releases
        return self._send_ending(parent, children)

    def _send_ending(self, parent: int, children: list[int]) -> list[Effect]:
        w = self.st.worker
        # (a report sent since the last Ending, its worker's or one sent again after a death, made the
        # parent drop that Ending: a new one goes)
        key = (parent, tuple((c, id(self.endings[c])) for c in children), len(self.recovery.failures),
               w.reports if w is not None else 0, self.recovery.delivery.reports)
        if key == self.end_key:
            return []
        self.end_key = key
        rows, stats = self._payload(children)
        return [Send(parent, Ending(rows, stats))]

    def early_ending(self) -> list[Effect]:
        """A leaf idle on a board whose ids are all out, holding and owing nothing: its Ending now (see the module docstring)."""
        st = self.st
        w = st.worker
        parent = st.info.parent
        if (w is None or not w.all_out or w.state is not State.WAIT or st.server is not None or parent is None
                or w.parent != parent or w.hand is not None or w.queue or w.done or w.failed or w.tasks
                or w.results or st.abandoned or self.replanning.unacked or st.drain_requested or st.loading):
            return []
        return self._send_ending(parent, [])

    def on_ending(self, src: int, msg: Ending) -> list[Effect]:
        """A child's subtree is over (kept even from a rank not yet known as a child: a failure may make it one)."""
        self.endings[src] = msg
        return self.step()

    @property
    def all_ended(self) -> bool:
        """The master: whether every live rank has ended, so the job can be released."""
        if self.st.info.parent is not None or self.released is not None or not self.over:
            return False
        return all(c in self.endings for c in self._live_children())

    @property
    def ready(self) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
        """The master, once every live rank has ended: (every rank's row, the merged statistics); else None."""
        return self.end_payload() if self.all_ended else None

    @property
    def payload(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Every rank's row and the merged statistics, from every live rank's Ending (the master's report)."""
        return self.end_payload()

    @property
    def partial_payload(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The same from the Endings this rank has (a deputy that finished a dead master's release)."""
        return self.end_payload(partial=True)

    def end_payload(self, partial: bool = False) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Every rank's row (by rank) and the merged statistics, from the Endings in (the master;
        also after the release, which need not wait for the merge).

        ``partial``: only the Endings this rank has (a deputy that finished the release of a
        master that died: the others' Endings went to the dead).
        """
        children = self._live_children()
        if partial:
            children = [c for c in children if c in self.endings]
        rows, stats = self._payload(children)
        return sorted(rows, key=lambda r: r["rank"]), stats

    def release(self, code: int, report: dict[str, Any] | None, error: BaseException | str | None = None,
                errno: int = 0, last_work: bool = True) -> list[Effect]:
        """The master: end the job for everyone; ``code`` is the status processes end with after failures;
        ``error``: the checkpoint's write error (its text, with ``errno``), for every rank to raise alike;
        ``last_work``: some of the master's work after the release outlives it (see :class:`ReleaseJob`)."""
        st = self.st
        if isinstance(error, BaseException):
            error, errno = getattr(error, "problem", None) or str(error), getattr(error, "errno", None) or 0
        error = error or ""
        failed = tuple(sorted(st.failed))
        dep = deputy(st.hierarchy)
        outs: list[Effect] = []
        if dep is not None:
            outs.append(Send(dep, Release(code, failed, report, pending=True, error=error, errno=errno)))
        others = sorted((r for r in range(st.size) if r not in st.failed and r not in (st.rank, dep)),
                        reverse=True)
        rest: list[Effect] = [Send(r, Release(code, failed, error=error, errno=errno)) for r in others]
        if not st.ft and failed:
            # Without fault tolerance, a rank given up (its task past --task-timeout) keeps its
            # process: no collective can end the job, every process ends on its own with the
            # job's status, and mpiexec ends the whole job at the first non-zero exit. A rank
            # released now exited before the master wrote its report (a resumed run then read
            # the last run's report: about one CI run in 20). Everyone waits for the master's
            # last work.
            self.held_release = rest
        else:
            outs += rest
            self.let_go.update(others)
        if dep is not None:
            # Under fault tolerance the deputy's own release waits for the master's last work
            # (report, lock): until then the deputy still watches it, so a master hung in that
            # window is killed and the deputy finishes the job, instead of a hang. Without a
            # checkpoint or a report file nothing of that work outlives the master: nothing to
            # take over, and the deputy returned last (4 ranks, ULFM: 1-8 ms after the others).
            # (Without fault tolerance, after a rank was given up, the deputy waits with everyone
            # else, see above.)
            last = Send(dep, Release(code, failed, error=error, errno=errno))
            if (st.ft and last_work) or failed:
                self.held_release.append(last)
            else:
                outs.append(last)
        self.released = Release(code, failed, report, error=error, errno=errno)
        return outs

    def release_deputy(self) -> list[Effect]:
        """The master, its own end done (report written, lock released): the releases it held back
        (see :meth:`release`: the deputy's under fault tolerance; everyone's after a rank was given
        up without it); once."""
        outs, self.held_release = self.held_release, []
        self.let_go.update(e.dest for e in outs if isinstance(e, Send))
        return outs

    def on_release(self, msg: Release) -> list[Effect]:
        """The master says the job is over (``pending``: this rank is the deputy, told first)."""
        if msg.pending:
            self.pending_release = msg
        else:
            self.released = msg
        return []

    @property
    def left_after_release(self) -> set[int]:
        """A rank that finished a dead master's release: the ranks the master had released (they
        exited, which ULFM tells it as deaths; they are not failures). Empty elsewhere."""
        if not self.finished_release:
            return set()
        assert self.pending_release is not None
        before = set(self.pending_release.failed)
        master = {f.rank for f in self.recovery.failures if f.role == "master" and f.rank not in before}
        return set(self.st.failed) - before - master

    def release_for_dead_master(self) -> list[Effect]:
        """A new master: if its predecessor died while releasing everyone, the job is over: release
        everyone still here (nothing otherwise)."""
        pending = self.pending_release
        if pending is None or self.released is not None:
            return []
        self.st.job_over = True
        self.finished_release = True
        return self.release(pending.code, pending.report, pending.error, pending.errno)
