"""A hung rank is killed by pid only while the pid still names it (issue 34): a reused pid is a stranger's."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from nlevel.runtime import pids

from ..conftest import ROOT


@pytest.fixture
def stranger():
    """A process that is not the rank: it took the rank's pid after the rank's process exited."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_stranger_with_the_pid_is_never_signalled(stranger):
    born = pids.started(stranger.pid)
    assert born is not None
    assert not pids.kill(stranger.pid, born - 1)  # (the rank that had this pid started earlier)
    time.sleep(0.1)
    assert stranger.poll() is None, "the stranger was killed"
    assert not pids.same(stranger.pid, born - 1) and pids.same(stranger.pid, born)
    assert pids.kill(stranger.pid, born)  # (the process itself: killed)
    assert stranger.wait(timeout=10) == -9


def test_transport_kills_a_hung_rank_only_while_its_pid_is_its_own(stranger):
    """Transport.kill and Transport.gone with the places learnt at set-up (host, pid, start time), in
    a process of its own (no MPI is started: the transport is made without its constructor)."""
    born = pids.started(stranger.pid)
    script = textwrap.dedent(f"""
        import mpi4py
        mpi4py.rc.initialize = False
        import os, socket
        from nlevel.runtime.transport import Transport
        t = Transport.__new__(Transport)
        t.rank, t.failed, t.ft = 0, set(), True
        me = os.getpid()
        here = socket.gethostname()
        t.places = [(here, me, None), (here, {stranger.pid}, {born - 1})]
        print(t.gone([1]), t.kill(1))
        t.places[1] = (here, {stranger.pid}, {born})
        print(t.gone([1]), t.kill(1))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[1] gone", "[] killed"], out.stdout
    assert stranger.wait(timeout=10) == -9
