"""The part of a :class:`~nlevel.roles.station.Station` that repairs it after failures.

Functions of the station (its state lives there). :func:`fail` takes the ranks MPI reported dead and applies the rules of
:mod:`nlevel.roles.recovery` to this rank: requeue a dead slave's ids, start (or
extend) a reconciliation for a dead server, take over as region-master or master
when this rank is now the lowest survivor of a block, send a Holding when this
rank's parent died. Messages that arrive before this rank has heard of the failure
they follow are held back until it has. Pure Python, no MPI.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Protocol

from ..config import Config
from ..model.hierarchy import Hierarchy, Node, Role, build
from ..ranges import RangeSet
from .autoplan import AutoPlanner
from .dispatch import Dispatcher, Master, Region
from .ledger import Ledger
from .messages import Failed, Holding, Kill, Message, Mirror, Report
from .recovery import Reconciliation, close_record, deputy, expected, failure_record, reconciler
from .worker import Out, Worker


class StationState(Protocol):
    """What these functions read and change of a :class:`~nlevel.roles.station.Station`.

    A structural type, so that this module need not import :mod:`nlevel.roles.station`
    (which imports this one); ``Station`` satisfies it, and mypy checks that it does.
    """

    rank: int
    size: int
    config: Config
    ft: bool
    clock: Callable[[], float]
    wall: Callable[[], float]
    recover: Callable[[], Ledger] | None
    hierarchy: Hierarchy
    info: Node
    epoch: int
    dispatcher: Master | Region | None
    worker: Worker | None
    ledger: Ledger | None
    planner: AutoPlanner | None
    failed: frozenset[int]
    failures: list[dict[str, Any]]
    recon: Reconciliation | None
    mirror: Ledger | None
    mirror_failures: list[dict[str, Any]]
    sent_done: dict[int, RangeSet] | None
    job_over: bool
    draining: dict[int, set[int]]
    served_before: int
    _mirrored_failures: int
    _mirror_to: int | None
    _deferred: deque[tuple[int, Message]]
    _master_heard: float
    _mirror_sent: float
    _leases_checked: float

    def deliver(self, src: int, msg: Message) -> list[Out]: ...

    def route(self, outs: list[Out]) -> list[Out]: ...


#: The master copies its commits to the deputy at least this often (s) ...
MIRROR_AGE = 0.005
#: ... or once this many ids are waiting (a master that dies loses at most these commits).
MIRROR_BATCH = 256

__all__ = ["fail", "on_holding", "on_mirror", "watch_master", "lease_kills", "mirror_out", "holding"]



# -- events ---------------------------------------------------------------------------
def fail(st: StationState, ranks: tuple[int, ...], how: str = "ulfm") -> list[Out]:
    """``ranks`` are dead: repair this rank's roles; return what to send."""
    new = frozenset(ranks) - st.failed - {st.rank}
    if not new:
        return []
    old = st.hierarchy
    st.failed = failed = st.failed | new
    nh = build(st.size, old.plan, failed)
    if st.sent_done is None:
        st.sent_done = {}
    for x in new:
        st.sent_done.pop(x, None)
    wall = st.wall()
    outs: list[Out] = []
    for epoch in list(st.draining):  # the dead never acknowledge a regroup
        st.draining[epoch] -= new
        if not st.draining[epoch]:
            del st.draining[epoch]
    d = st.dispatcher
    ask: set[int] = set()
    if d is not None:
        for x in sorted(new & set(d.children)):
            gone = d.children[x]
            silent = d.clock() - gone.heard
            why = "lease expired (hung)" if gone.leased else "drained (left, then ended)" if gone.left else how
            held = d.drop_child(x)
            record = failure_record(x, old, len(held), why, st.rank, wall)
            record["silent_ms"] = round(silent * 1e3, 3)  # since its last message: bounds the detection latency
            if old[x].children and not (gone.finished and not held):
                # A server that was still working: its survivors will say what they hold. (One
                # that had its final grant held nothing, nor did anyone below it.)
                st.recon = st.recon or Reconciliation(now=st.clock())
                ask |= st.recon.add_dead(held, expected(x, old, failed), record)
            else:
                n, quarantined = d.requeue_lost(held)
                close_record(record, n, quarantined, st.wall())
                st.failures.append(record)
    if st.recon is not None:
        for x in sorted(new & (st.recon.expected | set(st.recon.got))):
            mine = reconciler(x, old, nh) == st.rank
            ask |= st.recon.member_died(x, expected(x, old, failed) if mine else set())
    became_master = nh.master == st.rank and old.master != st.rank
    if became_master:
        ask |= _take_over(st, old, nh, wall, how)
    outs += _relayout(st, nh)
    parent = old[st.rank].parent
    if parent is not None and parent in new and st.info.parent is not None:
        # Unasked, to the new parent: it records what this rank's subtree holds.
        outs.append(Out(st.info.parent, Holding(holding(st).ranges(), tuple(sorted(failed)))))
    asking = Holding((), tuple(sorted(failed)), True)
    outs += [Out(r, asking) for r in sorted(ask - {st.rank})]
    if isinstance(st.dispatcher, Master) and st.ft:
        dep = deputy(nh)
        if (dep if dep is not None else -1) != st._mirror_to:
            outs += _mirror_full(st, dep)
    if st.dispatcher is not None:
        st.dispatcher.reconciling = st.recon is not None
    deferred, st._deferred = st._deferred, deque()
    for src, msg in deferred:
        outs += st.deliver(src, msg)
    outs += _finish_recon(st)
    if st.dispatcher is not None:
        outs += st.route(st.dispatcher.tick())
    return outs

def defer(st: StationState, src: int, msg: Message) -> bool:
    """Whether ``msg`` must wait for this rank to learn of a failure (and keep order per sender)."""
    if st._deferred and any(s == src for s, _ in st._deferred):
        st._deferred.append((src, msg))
        return True
    waiting = False
    if isinstance(msg, Holding):
        waiting = not set(msg.failed) <= st.failed
    elif isinstance(msg, Report) and not msg.orphan and msg.epoch == st.epoch:
        d = st.dispatcher
        waiting = d is None or src not in d.children
    if waiting:
        st._deferred.append((src, msg))
    return waiting

def on_holding(st: StationState, src: int, msg: Holding) -> list[Out]:
    """A survivor whose parent died says what it holds (this rank reconciles, or is its new parent)."""
    if msg.ask:
        return [Out(src, Holding(holding(st).ranges(), tuple(sorted(st.failed))))]
    held = RangeSet(msg.held)
    d = st.dispatcher
    if d is None:
        return []
    path: int | None = src
    while path is not None and path not in d.children and path != st.rank:
        path = st.hierarchy[path].parent
    if path is not None and path != st.rank:
        d.attach(d.children[path], held)  # the child's subtree holds these now
    if st.recon is not None and (src in st.recon.expected or src in st.recon.got):
        st.recon.receive(src, held)
    return _finish_recon(st)

def on_mirror(st: StationState, msg: Mirror) -> list[Out]:
    """The deputy: copy the master's commits (a full copy replaces what it had)."""
    if isinstance(st.dispatcher, Master):  # a late copy from the master this rank replaced
        st.dispatcher.ledger.commit(msg.done, msg.results)
        return []
    if msg.full or st.mirror is None:
        st.mirror = Ledger(msg.total, width=msg.width)
        st.mirror_failures = []
    st.mirror.commit(msg.done, msg.results)
    st.mirror_failures.extend(msg.failures)
    st._master_heard = st.clock()
    return []

def watch_master(st: StationState) -> list[Out]:
    """The deputy: a master silent past its lease is hung (it heartbeats): have it killed."""
    if st.mirror is None or not st.ft or isinstance(st.dispatcher, Master):
        return []
    now = st.clock()
    longest = st.worker.task_times.hi if st.worker is not None and st.worker.task_times.n else 0.0
    if now - st._master_heard > st.config.lease_min + st.config.lease_factor * longest:
        st._master_heard = now  # once per lease
        return [Out(st.hierarchy.master, Kill(st.hierarchy.master))]
    return []

# -- the pieces -----------------------------------------------------------------------------
def _take_over(st: StationState, old: Hierarchy, nh: Hierarchy, wall: float, how: str) -> set[int]:
    """This rank is the new master: the ledger from the mirror (or the checkpoint); reconcile everything."""
    ledger = st.mirror
    source = "deputy's copy"
    if ledger is None:
        if st.recover is None:
            raise RuntimeError(f"rank {st.rank} must take over as master but has no ledger to start from")
        ledger = st.recover()
        source = "checkpoint"
    elif st.recover is not None and not ledger.complete():
        # The copy may lack the last commits (a message lost with the master); the checkpoint
        # file may have them (the master writes it before releasing anyone).
        ledger.merge(st.recover())
        source = "deputy's copy + checkpoint"
    st.ledger = ledger
    st.mirror = None
    st.failures = st.mirror_failures + st.failures  # recoveries the dead master had recorded
    record = failure_record(old.master, old, len(ledger.remaining()), how, st.rank, wall)
    record["ledger_from"] = source
    st.planner = None  # the new master keeps the plan it finds
    if ledger.complete() and st.recon is None:
        # The job was over (the old master copies its last commits here before releasing
        # anyone): nothing to reconcile; ranks already released will not ask again.
        st.job_over = True
        close_record(record, 0, [], wall)
        st.failures.append(record)
        return set()
    recon = st.recon or Reconciliation(now=st.clock())
    recon.everything = True
    st.recon = recon
    return recon.add_dead(RangeSet(), expected(old.master, old, st.failed) - {st.rank}, record)


def _relayout(st: StationState, nh: Hierarchy) -> list[Out]:
    """Give this rank the roles ``nh`` says, keeping every id it holds; return what to send."""
    outs: list[Out] = []
    old_d = st.dispatcher
    st.hierarchy = nh
    st.info = info = nh[st.rank]
    w = st.worker
    weights = {c: nh[c].weight for c in info.children}
    if w is not None and (info.children or info.role is Role.MASTER):
        weights[st.rank] = 1
    c = st.config
    d: Master | Region | None = old_d
    if info.role is Role.MASTER and not isinstance(old_d, Master):
        assert st.ledger is not None
        d = Master(info, {}, st.clock, st.ledger, c.task_retries if c.on_task_error == "retry" else 0, st.ft)
        d.queue = RangeSet()  # nothing is granted before the reconciliation says what is free
        _absorb(st, old_d, d)
    elif info.role is Role.REGION and old_d is None:
        d = Region(info, {}, st.clock, nh.plan.prefetch, c.batch, c.batch_age)
    elif isinstance(d, Region) and info.role is Role.REGION and d.parent != info.parent:
        assert info.parent is not None
        d.parent = info.parent
        d.asked = False  # the want went to a dead parent: ask the new one
    elif isinstance(d, Region) and info.role is Role.SLAVE:
        # Every child died: no region left to serve. Its ids go back up; its own loop goes on.
        assert info.parent is not None
        returned = d.queue.copy()
        returned.add_ranges(d.up_returned.ranges())
        own = d.children.get(st.rank)
        if own is not None:
            returned.remove_ranges(own.held.ranges())  # still this rank's own worker's
        outs.append(Out(info.parent, Report(d.up_done.ranges(), tuple(d.up_results), 0, returned.ranges(),
                                            failed=tuple(d.up_failed), task_max=d.task_max)))
        st.served_before += d.served
        d = None
    if d is not None:
        d.quarantine = c.quarantine
        d.track_settled = True
        for r in [r for r in d.children if r not in weights]:
            d.requeue_lost(d.drop_child(r))  # (not expected: children only change by dying)
        for r, wt in weights.items():
            if r in d.children:
                d.set_weight(r, wt)
            else:
                child = d.adopt_child(r, wt)
                if r == st.rank and w is not None:
                    d.attach(child, w.holding())  # this rank's own loop is now served here
    st.dispatcher = d
    if d is not None and st.job_over:
        for child in d.children.values():
            child.finished = True  # released by the old master; a late want still gets its final grant
    if w is None:
        return outs
    parent = st.rank if d is not None else info.parent
    assert parent is not None
    if w.parent != parent:
        w.parent = parent
        w.asked = False  # an unanswered want to a dead parent: ask again
    return outs

def _absorb(st: StationState, old: Dispatcher | None, new: Master) -> None:
    """A region-master becoming master: its queue, children and buffered completions come along."""
    if not isinstance(old, Region):
        return
    new.queue = old.queue
    new.children = {r: ch for r, ch in old.children.items()}
    new.pending = deque(ch for ch in new.children.values() if ch.want)
    new.pending_want = sum(ch.want for ch in new.children.values())
    new.want_sum = sum(ch.last_want for ch in new.children.values() if not ch.left)
    new.held_total = sum(len(ch.held) for ch in new.children.values())
    new.total_weight = sum(ch.weight for ch in new.children.values()) or 1
    # (Not its `settled`: what it passed up went to the master that died; the ledger decides now.)
    new.task_max, new.deaths = old.task_max, old.deaths
    if old.up_done:
        new.ledger.commit(old.up_done.ranges(), old.up_results)
    for tid, info in old.up_failed:
        new._task_failed(tid, info)
    st.served_before += old.served

def holding(st: StationState) -> RangeSet:
    """Every id this rank and its subtree hold, for a Holding."""
    held = RangeSet()
    w, d = st.worker, st.dispatcher
    if w is not None:
        held.add_ranges(w.holding().ranges())
    if d is not None:
        held.add_ranges(d.queue.ranges())
        for ch in d.children.values():
            held.add_ranges(ch.held.ranges())
        if isinstance(d, Region):
            held.add_ranges(d.up_done.ranges())
            held.add_ranges(d.up_returned.ranges())
            for tid, _ in d.up_failed:
                held.add(tid, tid + 1)
    if st.recon is not None:
        held.add_ranges(st.recon.held.ranges())
    for sent in (st.sent_done or {}).values():
        held.add_ranges(sent.ranges())
    return held

def _finish_recon(st: StationState) -> list[Out]:
    """Every expected Holding is in: requeue what nobody holds."""
    recon, d = st.recon, st.dispatcher
    if recon is None or not recon.complete or d is None:
        return []
    if recon.everything:
        assert isinstance(d, Master)
        question = d.ledger.remaining()
        question.remove_ranges(d.queue.ranges())
        question.remove_ranges(d.carried.ranges())
        for ch in d.children.values():
            question.remove_ranges(ch.held.ranges())
    else:
        question = recon.held
    lost = recon.lost(question, d.settled)
    n, quarantined = d.requeue_lost(lost)
    wall = st.wall()
    for record in recon.records:
        close_record(record, n, quarantined, wall)
        n, quarantined = 0, []  # counted once, on the first record
    st.failures += recon.records
    st.recon = None
    d.reconciling = False
    return st.route(d.tick())

def _mirror_full(st: StationState, dep: int | None) -> list[Out]:
    """The master: (re)start the deputy's copy with the whole ledger."""
    st._mirror_to = dep if dep is not None else -1
    d = st.dispatcher
    assert isinstance(d, Master)
    d.mirror_done, d.mirror_results = RangeSet(), []
    if dep is None:
        return []
    led = d.ledger
    results = tuple(zip(led.result_ids.tolist(), _rows(led)))
    st._mirrored_failures = len(st.failures)
    return [Out(dep, Mirror(led.committed.ranges(), results, led.total, led.width, True, tuple(st.failures)))]


def mirror_out(st: StationState, force: bool = False) -> list[Out]:
    """The master: send the deputy what was committed since the last copy (batched: every
    ``MIRROR_AGE`` seconds or ``MIRROR_BATCH`` ids), or a heartbeat when there is nothing."""
    d = st.dispatcher
    if not isinstance(d, Master) or not d.mirror:
        return []
    now = st.clock()
    if st._mirror_to is None:
        st._mirror_sent = now
        return _mirror_full(st, deputy(st.hierarchy))
    if st._mirror_to < 0:  # one process: nobody to copy to
        d.mirror_done, d.mirror_results = RangeSet(), []
        return []
    waiting = len(d.mirror_done) + len(st.failures) - st._mirrored_failures
    if not waiting:
        if now - st._mirror_sent < st.config.lease_min / 4:
            return []
        st._mirror_sent = now  # a heartbeat: the deputy watches for the master's silence
        return [Out(st._mirror_to, Mirror((), (), d.ledger.total, d.ledger.width))]
    if waiting < MIRROR_BATCH and now - st._mirror_sent < MIRROR_AGE and not force:
        return []
    st._mirror_sent = now
    news = tuple(st.failures[st._mirrored_failures :])
    st._mirrored_failures = len(st.failures)
    msg = Mirror(d.mirror_done.ranges(), tuple(d.mirror_results), d.ledger.total, d.ledger.width, False, news)
    d.mirror_done, d.mirror_results = RangeSet(), []
    return [Out(st._mirror_to, msg)]


def lease_kills(st: StationState) -> list[Out]:
    """Children silent past their lease, and survivors that do not answer a reconciler within
    one: ask for them to be killed (MPI then reports them dead; without ULFM the job stops,
    and the checkpoint resumes it: never a hang)."""
    d = st.dispatcher
    if d is None:
        return []
    c = st.config
    now = st.clock()
    # Every lease is at least lease_min: looking ten times per lease_min finds a silent
    # child at most 10 % late, instead of scanning every child on every tick.
    if now - st._leases_checked < c.lease_min / 10:
        return []
    st._leases_checked = now
    late = d.overdue(now, c.lease_min, c.lease_factor)
    recon = st.recon
    if recon is not None and recon.expected and now - recon.started > c.lease_min + c.lease_factor * d.task_max:
        late += sorted(recon.expected - recon.killed)
        recon.killed |= recon.expected
    return [Out(r, Kill(r)) for r in late]


def _rows(led: Ledger) -> list[Any]:
    values = led.result_values.tolist()
    if led.width == 1:
        return values
    return [tuple(values[i : i + led.width]) for i in range(0, len(values), led.width)]


