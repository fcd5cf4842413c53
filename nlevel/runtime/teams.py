"""Tasks that need several processes: teams of ranks, each running one task at a time on its own communicator.

Teams are formed below the farm, so the hierarchy sees one worker per team:

* :func:`form` (collective over the user's communicator) groups the ranks by node
  (``Split_type(COMM_TYPE_SHARED)``, else by processor name), cuts them into teams
  (:func:`nlevel.model.teams.layout`), gives each team its GPUs, and builds three communicators:
  the team leaders' (the farm runs on it: master, region-masters and slaves are leaders), each
  team's own for nlevel's two collectives per task, and a duplicate of it for the user
  (``farm.team``).
* A leader runs the farm as any rank does. When it hands its loop an id it broadcasts it to its
  team (:meth:`Teams.announce`); when its loop comes back for the next one, the team's closing
  collective (:meth:`Teams.close_task`, a gather of every member's outcome) ends the task. The
  leader's task therefore lasts until its slowest member is done: its task time, the model's
  and the planner's, and ``--task-timeout`` are the team's.
* A member runs the same user loop: its ``next`` takes part in the closing gather, then waits
  for the next id (:meth:`Teams.next_id`); -1 after the job's end. Ranks in no team (left over)
  wait for the end only. Waits are nonblocking collectives polled with a backoff: no spinning.
* Followers (members and ranks left over, each attached to a leader) learn the farm's set-up
  outcome and the job's end from their leader (two messages on a private duplicate of the
  user's communicator), so an error at set-up is raised on every rank alike, and every rank
  ends with the job's status.

Failures under ULFM: a team is the unit of failure. A death in a team fails the current
attempt of its task as a death (``TaskFailure`` kind ``"team"``: the leader's parent counts it
toward quarantine and queues the id again, :meth:`~nlevel.roles.server.Server.take_report`).
The team's communicators are revoked (nobody waits in a collective for the dead), the
surviving members on the leader's node are stopped (a team of fewer than ``k`` cannot run a
task of ``k``), and the leader leaves the loop: it gives back what it had not started and
serves the hierarchy until the job's end if it is a server. A member whose leader died
leaves the job. Without ULFM a death ends the job; the same command resumes it from the checkpoint.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import Config
from ..errors import ConfigError, NlevelError
from ..model.teams import DeviceShortage, TeamLayout, assign_devices, layout, left_over_line
from . import devices as gpus
from .backoff import Backoff
from .output import check_dir, console
from .transport import (MpiError, allreduce_max, broken, dup, host, kill_self, last_words, node_comm, revoke,
                        self_comm, split, user_ranks, world)

__all__ = ["Teams", "TeamBroken", "Follower", "form", "wanted", "portable", "record_loss", "register_last_words", "OK", "FAILED", "LEFT", "ERROR"]

# What a member says of the task in hand at the team's closing collective.
OK, FAILED, LEFT, ERROR = 0, 1, 2, 3
_TAG_SETUP, _TAG_END = 1, 2  # on the private duplicate of the user's communicator
_TAG_TEXT = 1  # on the team's own: a member's failure text, sent before the closing gather
_END_LOOK = 0.005  # seconds: the longest sleep of a follower waiting for the set-up's outcome or the job's end


class TeamBroken(Exception):
    """A process of this team died (ULFM): its task fails as a death."""


def wanted(cfg: Config) -> bool:
    """Whether the farm's set-up forms teams (several ranks per task, GPUs, or per-task output)."""
    return cfg.ranks_per_task > 1 or cfg.gpus_per_task > 0 or bool(cfg.task_output)


@dataclass
class Teams:
    """This rank's part in the teams of one farm (made by :func:`form`).

    Attributes:
        job: nlevel's duplicate of the user's communicator (set-up, the end, the final status).
        lay: The layout (ranks of the user's communicator).
        rank: This rank in the user's communicator.
        index: This rank's team (None: left over).
        farm_comm: The leaders' communicator (leaders only): the farm runs on it.
        wire: The team's communicator for nlevel's collectives (teams of 2 or more).
        team: The team's communicator for the user (``farm.team``): a duplicate of ``wire``;
            ``MPI.COMM_SELF`` for teams of one; None for a rank left over.
        leader: The user rank of this rank's leader (itself for a leader; -1: none).
        followers: A leader's members and the ranks left over attached to it.
        places: (host, pid) of every rank.
        devices: This rank's GPUs (empty: none given).
        variable: The variable the GPUs are set in.
        output: The ``task_output`` directory ("" none).
    """

    job: Any
    lay: TeamLayout
    rank: int
    index: int | None
    farm_comm: Any
    wire: Any
    team: Any
    leader: int
    followers: tuple[int, ...]
    places: list[tuple[str, int]]
    devices: tuple[str, ...] = ()
    variable: str = ""
    output: str = ""
    ft: bool = False
    poll_max: float = 1e-4
    is_broken: bool = False
    names: tuple[str, ...] = ()
    #: The user's team communicator was revoked in the task in hand (a rank's task failed, under ULFM:
    #: the others may wait in its collectives): the team makes a new one before the next task.
    spoilt: bool = False
    _bcast: Any = None
    _buf: Any = field(default_factory=lambda: np.zeros(2, np.int64))
    _watch: threading.Thread | None = None
    _watch_stop: threading.Event = field(default_factory=threading.Event)

    # -- who -----------------------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        """Whether this rank takes part in the farm (a team's first rank)."""
        return self.farm_comm is not None

    @property
    def size(self) -> int:
        """Ranks in this rank's team (0: left over)."""
        return len(self.lay.teams[self.index]) if self.index is not None else 0

    @property
    def member(self) -> int:
        """This rank's rank in its team (-1: left over)."""
        return self.lay.teams[self.index].index(self.rank) if self.index is not None else -1

    def describe(self) -> dict[str, Any]:
        """The layout for the run report (ranks of the user's communicator; farm rank ``i`` leads team ``i``)."""
        return {"ranks_per_task": self.lay.k, "teams": [list(t) for t in self.lay.teams], "left": list(self.lay.left),
                "nodes": [list(n) for n in self.lay.nodes], "node_names": list(self.names)}

    # -- the leader's side ----------------------------------------------------------------------
    def tell(self, outcome: tuple[str, Any]) -> None:
        """The farm's set-up outcome, to every follower: ``("ok", facts)`` or ``("error", exception)``."""
        self._send_all(outcome, _TAG_SETUP)

    def announce(self, tid: int, renew: bool = False) -> None:
        """Broadcast the next id to the team (-1: the job is over). Nonblocking: completed at the next collective.

        ``renew``: the user's team communicator was revoked in the last task; every rank of the team
        makes a new one now (:meth:`renew`)."""
        self._complete_bcast()
        self._buf[0], self._buf[1] = tid, int(renew)
        self._bcast = self.wire.Ibcast(self._buf, root=0)
        if renew:
            self.renew()

    def spoil(self) -> None:
        """A task failed on this rank (ULFM): revoke the user's team communicator, so that no rank of the team
        waits for ever in one of the task's collectives; the team makes a new one before its next task."""
        if self.ft and self.wire is not None and not self.spoilt:
            self.spoilt = True
            revoke(self.team)

    def renew(self) -> None:
        """A new user's team communicator (collective over the team), the revoked one given up."""
        self.team = dup(self.wire)
        self.spoilt = False

    def close_task(self) -> list[tuple[int, int, str]]:
        """The team's closing collective for the task in hand: every member's outcome, once all are done.

        Returns:
            (member, outcome, text) of each member that did not say OK.

        Raises:
            TeamBroken: a process of the team died (ULFM), or the team was revoked.
        """
        got = np.zeros(self.size, np.int64)
        try:
            self._complete_bcast()
            self._wait([self.wire.Igather(np.zeros(1, np.int64), got, root=0)])
            out = []
            for j in range(1, self.size):
                code = int(got[j])
                if code != OK:
                    out.append((j, code, self._text(j) if code in (FAILED, ERROR) else ""))
            return out
        except MpiError as exc:
            raise TeamBroken(self._who_died(exc)) from None

    def finish(self, facts: dict[str, Any]) -> None:
        """The job is over: -1 to the team, and the job's end (status, dead ranks) to every follower."""
        if self.wire is not None and not self.is_broken:
            try:
                self.announce(-1)
                self._complete_bcast()
            except MpiError:
                pass  # (a member died after the last task: it has nothing to be told)
        self._send_all(("end", facts), _TAG_END)
        self.stop_watch()
        if self.stop_members in last_words:  # (this farm is over: a later death of this process is not its team's)
            last_words.remove(self.stop_members)

    def broke(self, why: str) -> None:
        """This leader's team lost a process: revoke its communicators, stop the members on this node."""
        if self.is_broken:
            return
        self.stop_watch()
        stopped = self._stop_members_here()
        said = f"; members {', '.join(map(str, stopped))} on this node stopped" if stopped else ""
        console(2).write(f"nlevel: rank {self.rank} (leader of team {self.index}): {why}: the team cannot run "
                         f"its tasks any more{said}; its task goes back (counted as a death) and this rank leaves "
                         f"the loop\n")
        console(2).flush()

    def stop_members(self) -> None:
        """Last words of a leader that kills itself (a task past --task-timeout, a drain, an error under ULFM):
        its members on this node go with it (one may be the hung one), the others are released by the revoke."""
        if self.wire is not None and not self.is_broken:
            self._stop_members_here()

    def _stop_members_here(self) -> list[int]:
        """Revoke the team's communicators (no rank waits in them any more) and SIGKILL the members on this
        node (a team short of a rank cannot run a task; one of them may be hung); return those signalled."""
        self.is_broken = True
        revoke(self.wire)
        revoke(self.team)
        here = self.places[self.rank][0]
        stopped = []
        for r in self.lay.teams[self.index][1:] if self.index is not None else ():
            h, pid = self.places[r]
            if h == here:
                try:
                    os.kill(pid, signal.SIGKILL)
                    stopped.append(r)
                except OSError:
                    pass  # (it is the one that died)
        return stopped

    def check(self) -> None:
        """Under ULFM, from a thread: a process of the team known dead revokes the team's communicators, so no
        rank of it waits for ever in a collective of the task (the user's, on ``farm.team``) or of nlevel's."""
        if self.wire is not None and not self.is_broken and (broken(self.wire) or broken(self.team, revoked=False)):
            revoke(self.wire)
            revoke(self.team)

    def start_watch(self) -> None:
        """Under ULFM, a member's thread that runs :meth:`check` every 10 ms (a leader's pulse does it)."""
        if not self.ft or self.wire is None or self._watch is not None:
            return

        def run() -> None:
            while not self._watch_stop.wait(0.01):
                self.check()

        self._watch = threading.Thread(target=run, name="nlevel-team-watch", daemon=True)
        self._watch.start()

    def stop_watch(self) -> None:
        self._watch_stop.set()

    # -- a follower's side ----------------------------------------------------------------------
    def outcome(self) -> tuple[str, Any]:
        """The leader's set-up outcome (waits for it)."""
        return self._receive(_TAG_SETUP)

    def next_id(self, code: int | None, text: Any = None) -> int:
        """A member: say how the task in hand ended (``code`` None: none in hand), then wait for the next id.

        Raises:
            TeamBroken: the leader or another member died (ULFM), or the team was revoked.
        """
        try:
            reqs = []
            if code is not None:
                if text is not None:
                    reqs.append(self.wire.isend(text, 0, _TAG_TEXT))
                reqs.append(self.wire.Igather(np.array([code], np.int64), None, root=0))
            reqs.append(self.wire.Ibcast(self._buf, root=0))
            self._wait(reqs)
            tid = int(self._buf[0])
            if self._buf[1]:
                self.renew()
        except MpiError as exc:
            raise TeamBroken(self._who_died(exc)) from None
        return tid

    def end(self) -> dict[str, Any]:
        """A follower, after -1 (or left over): the job's end as the leader saw it (waits for it)."""
        kind, facts = self._receive(_TAG_END)
        self.stop_watch()
        return dict(facts)

    def leave(self, why: str) -> None:
        """A member whose team broke (ULFM): it cannot run a task of its team's size; it leaves the job."""
        console(2).write(f"nlevel: rank {self.rank} (team {self.index}): {why}; this process leaves the job "
                         f"(its team's task runs again elsewhere)\n")
        console(2).flush()
        sys.stdout.flush()
        kill_self()

    def agree(self, status: int, local: bool) -> int:
        """The worst ``status`` of every rank (collective over the user's communicator unless ``local``)."""
        return status if local else allreduce_max(self.job, status)

    # -- plumbing --------------------------------------------------------------------------------
    def _wait(self, reqs: list[Any]) -> None:
        backoff = Backoff(self.poll_max)
        pending = list(reqs)
        while pending:
            pending = [r for r in pending if not r.Test()]
            if pending:
                backoff.wait()

    def _complete_bcast(self) -> None:
        req, self._bcast = self._bcast, None
        if req is not None:
            self._wait([req])

    def _text(self, member: int) -> Any:
        backoff = Backoff(self.poll_max)
        while (m := self.wire.improbe(member, _TAG_TEXT)) is None:
            backoff.wait()
        return m.recv()

    def _receive(self, tag: int) -> Any:
        # (the set-up's outcome, or the job's end: a rank left over waits for it the whole job, and
        # nobody waits for it; a few milliseconds between looks leave the cores to the others)
        backoff = Backoff(max(self.poll_max, _END_LOOK))
        try:
            while (m := self.job.improbe(self.leader, tag)) is None:
                backoff.wait()
            return m.recv()
        except MpiError as exc:
            raise TeamBroken(f"its leader, rank {self.leader}, died ({exc})") from None

    def _send_all(self, value: Any, tag: int) -> None:
        for r in self.followers:
            try:
                self.job.send(value, r, tag)
            except MpiError:
                pass  # (a follower that died: nothing to tell; under ULFM the others go on)

    def _who_died(self, exc: BaseException) -> str:
        return f"a process of team {self.index} died ({type(exc).__name__}: {exc})"


def portable(exc: BaseException) -> BaseException:
    """``exc`` as it can travel to the followers (raised there as it was here)."""
    if isinstance(exc, NlevelError):
        return exc
    return NlevelError(f"the team's leader failed while setting up the farm: {exc!r}")


class Follower:
    """The farm as a follower sees it (a team's member, or a rank left over): no runtime of its own; what
    it knows comes from its leader (the set-up's outcome, then the job's end).

    Raises:
        NlevelError: the leader's set-up failed (the same error as the leader's).
    """

    def __init__(self, teams: Teams) -> None:
        try:
            kind, facts = teams.outcome()
        except TeamBroken as exc:
            raise NlevelError(f"the farm could not be set up: {exc}") from None
        if kind != "ok":
            raise facts
        self.total: int = facts["total"]
        self.config: Config = facts["config"]
        self.job: str = facts["job"]
        self.started: float = facts["started"]
        self.ft: bool = facts["ft"]
        teams.ft, teams.poll_max = self.ft, self.config.poll_max
        self.rank = -1  # (no rank of the farm's: its leader's stands for its team)
        self.size = teams.job.Get_size()
        self.failed: tuple[int, ...] = ()
        self.exit_code: int | None = None
        self.released_code = 0
        self.report: dict[str, Any] | None = None
        self.ledger: Any = None
        self.progress: Any = None
        self.hold_deputy = False
        self.on_forced_end: Any = None
        self.error = ""  # an error in the program here (complete() refused): its leader stops the job

    def ended(self, facts: dict[str, Any]) -> None:
        """The job's end as the leader saw it: its status, the dead ranks."""
        self.exit_code, self.released_code, self.failed = facts["code"], facts["released"], tuple(facts["failed"])

    def results(self) -> None:
        """A follower holds no results (the master does)."""
        return None

    def release_deputy(self) -> None:
        """Nothing to release: a follower is nobody's deputy."""


def form(comm: Any, cfg: Config) -> Teams:
    """Form the teams of ``cfg.ranks_per_task`` over ``comm`` (collective); set this rank's GPUs.

    Raises:
        ConfigError: on every rank alike: ``ranks_per_task`` differs between ranks or exceeds the
            world, a node has too few GPUs, ``task_output`` cannot be written.
    """
    user = comm if comm is not None else world()
    if not hasattr(user, "Dup"):
        raise TypeError(f"comm must be an mpi4py communicator, got {user!r}")
    job = dup(user)
    rank, size = job.Get_rank(), job.Get_size()
    k, g, out = cfg.ranks_per_task, cfg.gpus_per_task, cfg.task_output
    try:
        node = node_comm(job)
        first = user_ranks(node, job)[0] if node is not None else -1
        if node is not None:
            node.Free()
        variable, found = gpus.node_devices() if g else ("", [])
        problem = check_dir(out) if out else ""
        rows = job.allgather((k, g, first, host(), os.getpid(), variable, found, problem))
    except MpiError as exc:
        revoke(job)
        raise NlevelError(f"a process died while the teams were being formed ({exc}); the same command resumes") \
            from None
    ks = sorted({r[0] for r in rows})
    if len(ks) > 1 or len({r[1] for r in rows}) > 1:
        which = [(i, r[0], r[1]) for i, r in enumerate(rows)]
        a = which[0]
        b = next(w for w in which if w[1:] != a[1:])
        raise ConfigError(f"ranks_per_task/gpus_per_task differ between ranks ({a[1]}/{a[2]} on rank {a[0]}, "
                          f"{b[1]}/{b[2]} on rank {b[0]}); pass the same values on every rank")
    if k > size:
        raise ConfigError(f"ranks_per_task {k} is larger than the job's {size} process(es); expected 1 to {size}")
    bad = next((r[7] for r in rows if r[7]), "")
    if bad:
        raise ConfigError(bad)
    places = [(r[3], r[4]) for r in rows]
    if all(r[2] >= 0 for r in rows):
        groups: dict[Any, list[int]] = {}
        for i, r in enumerate(rows):
            groups.setdefault(r[2], []).append(i)
    else:  # (no Split_type: the processor's name says which node)
        groups = {}
        for i, r in enumerate(rows):
            groups.setdefault(r[3], []).append(i)
    lay = layout(list(groups.values()), k)
    names = tuple(rows[n[0]][3] for n in lay.nodes)
    mine: tuple[str, ...] = ()
    variable = ""
    if g:
        lists = []
        for i, n in enumerate(lay.nodes):
            seen = {(rows[r][5], tuple(rows[r][6])) for r in n}
            if len(seen) > 1:
                (va, la), (vb, lb) = sorted(seen)[:2]
                raise ConfigError(
                    f"gpus_per_task {g}: the ranks on node {names[i]} see different GPUs ({va or 'none'}={','.join(la)}"
                    f" and {vb or 'none'}={','.join(lb)}): the launcher binds GPUs per rank already (e.g. srun "
                    f"--gpus-per-task); expected every rank of a node to see the node's GPUs (ask for them per "
                    f"node: --gpus-per-node), or gpus_per_task 0")
            lists.append(list(rows[n[0]][6]))
        variable = rows[rank][5]
        try:
            given = assign_devices(lay, lists, g, names, variable)
        except DeviceShortage as exc:
            raise ConfigError(str(exc)) from None
        mine = given[rank]
        gpus.apply(variable, mine)
    index = lay.team_of(rank)
    leaders = lay.leaders
    is_leader = index is not None and lay.teams[index][0] == rank
    farm_comm = split(job, 0 if is_leader else None, rank)
    wire = split(job, index, rank) if k > 1 else None
    team = dup(wire) if wire is not None else (self_comm() if index is not None else None)
    if not leaders:  # (cannot happen with k <= size: some node, or run of nodes, holds a team)
        raise ConfigError(f"ranks_per_task {k}: no team fits the nodes of this job ({[len(n) for n in lay.nodes]} ranks)")
    # Ranks left over are attached to a leader on their node (else team 0's): it tells them the end.
    attach: dict[int, int] = {}
    for r in lay.left:
        node = lay.nodes[lay.node_of(r)]
        attach[r] = next((t[0] for t in lay.teams if t[0] in node), leaders[0] if leaders else -1)
    if index is not None:
        leader = lay.teams[index][0]
    else:
        leader = attach.get(rank, -1)
    followers: tuple[int, ...] = ()
    if is_leader:
        followers = tuple(lay.teams[index][1:]) + tuple(r for r, a in attach.items() if a == rank)  # type: ignore[index]
    if rank == 0 and lay.left:
        sys.stderr.write(f"nlevel: warning: {left_over_line(lay, names)}\n")
        sys.stderr.flush()
    return Teams(job, lay, rank, index, farm_comm, wire, team, leader, followers, places, mine, variable,
                 os.path.abspath(out) if out else "", cfg.ft, cfg.poll_max, names=names)


def record_loss(rt: Any, teams: Teams, tid: int, why: str) -> None:
    """A leader's team lost a process: a failure record for the run report (``role`` "team", the
    leader's farm rank; the task it ran went back to the leader's parent, counted as a death)."""
    from ..roles.events import TeamLost

    members = tuple(teams.lay.teams[teams.index]) if teams.index is not None else ()
    with rt.runner.lock:
        rt.loop.handle(TeamLost(teams.index if teams.index is not None else -1, members, why, 1 if tid >= 0 else 0))


def register_last_words(teams: Teams) -> None:
    """A leader: when this process kills itself, its members on this node go with it (see :meth:`Teams.stop_members`)."""
    if teams.wire is not None and teams.is_leader:
        last_words.append(teams.stop_members)
