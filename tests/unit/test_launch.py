"""``nlevel-mpiexec``: the options and variables it adds, decided without starting anything."""

import os
import signal
import sys
import time

import pytest

from nlevel.runtime import launch

from ..conftest import ROOT


@pytest.fixture(autouse=True)
def chosen_one_sided_component(monkeypatch):
    """The tests below compare whole environments: the one-node OMPI_MCA_osc default has its own test."""
    monkeypatch.setenv("OMPI_MCA_osc", "sm")


def test_root_and_oversubscription_are_handled(monkeypatch):
    monkeypatch.setattr(launch, "find_mpiexec", lambda: "/x/mpiexec")
    cmd, env = launch.build_command(["-n", "8", "python", "-m", "nlevel.run"], cores=2, root=True, open_mpi=True)
    assert cmd[0] == "/x/mpiexec" and "--oversubscribe" in cmd
    assert cmd[cmd.index("-n") + 1] == "8"
    assert cmd[-3:] == [sys.executable, "-m", "nlevel.run"]
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "1" and env["OMPI_MCA_mpi_yield_when_idle"] == "1"


def test_nothing_added_when_not_needed(monkeypatch):
    monkeypatch.setattr(launch, "find_mpiexec", lambda: "/x/mpiexec")
    cmd, env = launch.build_command(["-n", "2", "./app"], cores=4, root=False, open_mpi=True)
    assert cmd == ["/x/mpiexec", "-n", "2", "./app"] and env == {}
    cmd, env = launch.build_command(["-n", "8", "./app"], cores=2, root=True, open_mpi=False)
    assert cmd == ["/x/mpiexec", "-n", "8", "./app"] and env == {}


def test_mpiexec_options_pass_through(monkeypatch):
    monkeypatch.setattr(launch, "find_mpiexec", lambda: "/x/mpiexec")
    cmd, _ = launch.build_command(
        ["-n", "3", "--with-ft", "ulfm", "--mca", "btl", "self,sm", "python", "app.py", "-n", "5"],
        cores=8, root=False, open_mpi=True,
    )
    assert cmd == ["/x/mpiexec", "-n", "3", "--with-ft", "ulfm", "--mca", "btl", "self,sm", sys.executable, "app.py", "-n", "5"]


def test_options_with_two_values_are_kept_whole(monkeypatch):
    """``--prtemca NAME VALUE`` (and ``--pmixmca``) take two words: the second is not the program."""
    monkeypatch.setattr(launch, "find_mpiexec", lambda: "/x/mpiexec")
    args = ["--host", "a:2,b:2", "--prtemca", "plm_ssh_agent", "/x/agent", "--pmixmca", "ptl_base_verbose", "0",
            "python", "app.py"]
    cmd, _ = launch.build_command(args, cores=8, root=False, open_mpi=True)
    assert cmd[-len(args):] == [*args[:-2], sys.executable, "app.py"]


def test_a_job_across_hosts_gets_the_markers_and_a_keepalive_that_notices_a_cut_link(monkeypatch):
    """Several hosts, with or without ULFM: the ranks there are told the marker directories (ssh passes
    no environment on), and PRRTE's out-of-band keepalive notices a cut link in 20 s, not 8 minutes."""
    monkeypatch.setattr(launch, "find_mpiexec", lambda: "/x/mpiexec")
    monkeypatch.delenv("PRTE_MCA_oob_tcp_keepalive_time", raising=False)
    cmd, _ = launch.build_command(["--host", "a:2,b:2", "./app"], cores=8, root=False, open_mpi=True)
    extra = cmd[1:cmd.index("--host")]
    assert extra[:4] == ["-x", launch.EXIT_DIR, "-x", launch.START_DIR]
    assert extra[4:] == ["--prtemca", "oob_tcp_keepalive_time", "10", "--prtemca", "oob_tcp_keepalive_intvl", "2",
                         "--prtemca", "oob_tcp_keepalive_probes", "5"]
    # The user's own setting stands (an option, or the environment).
    cmd, _ = launch.build_command(["--host", "a,b", "--prtemca", "oob_tcp_keepalive_time", "60", "./app"], cores=8,
                                  root=False, open_mpi=True)
    assert cmd.count("oob_tcp_keepalive_time") == 1 and "oob_tcp_keepalive_probes" in cmd
    monkeypatch.setenv("PRTE_MCA_oob_tcp_keepalive_time", "60")
    cmd, _ = launch.build_command(["--host", "a,b", "./app"], cores=8, root=False, open_mpi=True)
    assert "oob_tcp_keepalive_time" not in cmd
    cmd, _ = launch.build_command(["-n", "2", "./app"], cores=8, root=False, open_mpi=True)  # (one node: nothing)
    assert cmd == ["/x/mpiexec", "-n", "2", "./app"]


@pytest.fixture
def restore_signals():
    """main() installs its forwarding handlers in this process: put the test runner's back."""
    saved = {s: signal.getsignal(s) for s in launch._FORWARDED}
    yield
    for s, h in saved.items():
        signal.signal(s, h)
    launch._early.clear()


def dry_run(monkeypatch, capsys, argv, cores, root):
    """``nlevel-mpiexec --dry-run ARGV`` on a machine with ``cores`` cores, as root or not (Open MPI)."""
    monkeypatch.setattr(launch, "find_mpiexec", lambda: "/x/mpiexec")
    monkeypatch.setattr(launch, "is_open_mpi", lambda mpiexec: True)
    monkeypatch.setattr(launch.os, "sched_getaffinity", lambda pid: set(range(cores)))
    monkeypatch.setattr(launch.os, "geteuid", lambda: 0 if root else 1000)
    assert launch.main(["--dry-run", *argv]) == 0
    words = capsys.readouterr().out.split()
    at = words.index("/x/mpiexec")
    return dict(w.split("=", 1) for w in words[:at]), words[at:]


def test_dry_run_prints_the_effective_command(monkeypatch, capsys, restore_signals):
    env, cmd = dry_run(monkeypatch, capsys, ["-n", "8", "python", "-c", "pass"], cores=2, root=True)
    assert cmd == ["/x/mpiexec", "--oversubscribe", "--bind-to", "none", "-n", "8", sys.executable, "-c", "pass"]
    assert env == {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                   "OMPI_MCA_mpi_yield_when_idle": "1"}
    # Within the cores and not root: nothing added; python3 still becomes this interpreter.
    env, cmd = dry_run(monkeypatch, capsys, ["-n", "2", "python3", "app.py"], cores=4, root=False)
    assert cmd == ["/x/mpiexec", "-n", "2", sys.executable, "app.py"] and env == {}
    # The user's own --oversubscribe / --bind-to are kept and not doubled; idle ranks still yield.
    env, cmd = dry_run(monkeypatch, capsys, ["-n", "4", "--oversubscribe", "--bind-to", "core", "./app"],
                       cores=2, root=False)
    assert cmd == ["/x/mpiexec", "-n", "4", "--oversubscribe", "--bind-to", "core", "./app"]
    assert env == {"OMPI_MCA_mpi_yield_when_idle": "1"}


def test_without_n_one_process_per_core(monkeypatch):
    monkeypatch.setattr(launch, "find_mpiexec", lambda: "/x/mpiexec")
    for var in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES", "PBS_NODEFILE", "LSB_HOSTS", "SLURM_JOB_ID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    cmd, env = launch.build_command(["python", "-m", "nlevel.run"], cores=3, root=False, open_mpi=True)
    assert cmd == ["/x/mpiexec", "-n", "3", sys.executable, "-m", "nlevel.run"] and env == {}
    cmd, _ = launch.build_command(["-c", "2", "./app"], cores=3, root=False, open_mpi=True)
    assert cmd == ["/x/mpiexec", "-c", "2", "./app"]  # -c is Open MPI's -n: never two counts
    cmd, _ = launch.build_command(["--hostfile", "hosts", "./app"], cores=3, root=False, open_mpi=True)
    assert "-n" not in cmd and cmd[-3:] == ["--hostfile", "hosts", "./app"]  # several hosts: mpiexec counts their slots
    monkeypatch.setenv("SLURM_JOB_ID", "7")  # (a Slurm job of 4 tasks on 2 cores: its tasks, not this node's cores)
    monkeypatch.setenv("SLURM_NTASKS", "4")
    cmd, _ = launch.build_command(["./app"], cores=2, root=False, open_mpi=True)
    assert cmd == ["/x/mpiexec", "./app"]
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "3")  # (and of 3 nodes)
    cmd, _ = launch.build_command(["./app"], cores=3, root=False, open_mpi=True)
    assert "-n" not in cmd and cmd[-1] == "./app"


def test_one_node_leaves_one_sided_operations_to_shared_memory(monkeypatch):
    monkeypatch.setattr(launch, "find_mpiexec", lambda: "/x/mpiexec")
    monkeypatch.delenv("OMPI_MCA_osc", raising=False)
    for var in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES", "PBS_NODEFILE", "LSB_HOSTS", "SLURM_JOB_ID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    _, env = launch.build_command(["-n", "2", "./app"], cores=4, root=False, open_mpi=True)
    assert env == {"OMPI_MCA_osc": "^ucx"}
    _, env = launch.build_command(["-n", "2", "--host", "a,b", "./app"], cores=4, root=False, open_mpi=True)
    assert env == {}  # several nodes: UCX may be what reaches the others
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "4")
    _, env = launch.build_command(["-n", "2", "./app"], cores=4, root=False, open_mpi=True)
    assert env == {}


def test_under_ulfm_a_non_zero_exit_does_not_end_the_job_and_statuses_come_back_by_file(monkeypatch, tmp_path):
    """PRRTE would end the whole job when one process exits non-zero (issue 14: a task's os._exit)."""
    monkeypatch.setattr(launch, "find_mpiexec", lambda: "/x/mpiexec")
    monkeypatch.delenv("PRTE_MCA_state_base_error_non_zero_exit", raising=False)
    _, env = launch.build_command(["--with-ft", "ulfm", "-n", "2", "./app"], cores=4, root=False, open_mpi=True)
    assert env["PRTE_MCA_state_base_error_non_zero_exit"] == "0"
    _, env = launch.build_command(["-n", "2", "./app"], cores=4, root=False, open_mpi=True)
    assert "PRTE_MCA_state_base_error_non_zero_exit" not in env
    monkeypatch.setenv(launch.EXIT_DIR, str(tmp_path))
    launch.record_exit(0)
    assert launch._worst_recorded(str(tmp_path)) == 0 and os.listdir(tmp_path)  # (0 too: it ended, it did not die)
    launch.record_exit(75)
    (tmp_path / "1").write_text("1\n")
    assert launch._worst_recorded(str(tmp_path)) == 75


def test_a_job_whose_every_process_died_before_its_release_is_not_a_success(tmp_path):
    """Under --with-ft mpiexec returns 0 whatever its processes did (issue 14: no silent loss)."""
    start, exits = tmp_path / "start", tmp_path / "exits"
    start.mkdir()
    exits.mkdir()
    assert not launch.never_released(str(start), str(exits))  # another program: no marker, mpiexec's status stands
    (start / "start-0").touch()
    assert not launch.never_released(str(start), str(exits))  # (not past MPI_Init)
    (start / "up-0").touch()
    (start / "up-1").touch()
    assert launch.never_released(str(start), str(exits))
    (exits / "4242").write_text("0\n")
    assert not launch.never_released(str(start), str(exits))  # a process ended (e.g. --help): not all died
    (exits / "4242").unlink()
    (start / "done-1").touch()
    assert not launch.never_released(str(start), str(exits))  # a rank was released: the job ended


def test_on_several_nodes_a_job_the_runtime_tore_down_is_not_a_success(monkeypatch, tmp_path, restore_signals):
    """Issue 33: PRRTE ended a ULFM job when a node's daemon was lost, and mpiexec returned 0.
    On several nodes the markers and statuses still tell an end from a teardown: the ranks get
    the directories' names through ``-x`` (ssh-launched daemons pass no environment on)."""
    monkeypatch.setattr(launch, "find_mpiexec", lambda: "/x/mpiexec")
    cmd, _ = launch.build_command(["--with-ft", "ulfm", "--host", "a:2,b:2", "./app"], cores=4, root=False,
                                  open_mpi=True)
    assert cmd[1:5] == ["-x", launch.EXIT_DIR, "-x", "NLEVEL_START_DIR"]
    one, _ = launch.build_command(["--with-ft", "ulfm", "-n", "2", "./app"], cores=4, root=False, open_mpi=True)
    assert "-x" not in one

    def torn_down(cmd, env, start_dir=None, exit_dir=None, end_dir=None):
        """mpiexec after a lost daemon: its ranks were up, none was released, none left a status; it returns 0."""
        assert start_dir is None  # (several nodes: the start is not watched)
        open(os.path.join(env["NLEVEL_START_DIR"], "up-0"), "w").close()
        return 0, None

    monkeypatch.setattr(launch, "is_open_mpi", lambda mpiexec: True)
    monkeypatch.setattr(launch, "_run_forwarding_signals", torn_down)
    assert launch.main(["--with-ft", "ulfm", "--host", "a:2,b:2", "./app"]) == 1
    assert launch.main(["--host", "a:2,b:2", "./app"]) == 1  # (without ULFM mpiexec returned 0 all the same)

    def ended(cmd, env, start_dir=None, exit_dir=None, end_dir=None):
        open(os.path.join(env["NLEVEL_START_DIR"], "up-0"), "w").close()
        open(os.path.join(env["NLEVEL_START_DIR"], "done-0"), "w").close()
        return 0, None

    monkeypatch.setattr(launch, "_run_forwarding_signals", ended)
    assert launch.main(["--with-ft", "ulfm", "--host", "a:2,b:2", "./app"]) == 0


def test_after_the_masters_end_record_a_launcher_waiting_for_lost_ranks_is_stopped(monkeypatch, tmp_path,
                                                                                   restore_signals):
    """A node stopped or cut off: its ranks were given up, the job ended, and mpiexec waits for them
    for ever. From the master's end record nlevel-mpiexec stops it, END_GRACE later, with the job's status."""
    from nlevel.runtime import startwatch

    fake = tmp_path / "mpiexec"
    fake.write_text("#!/bin/sh\n"
                    "touch \"$NLEVEL_START_DIR/up-0\" \"$NLEVEL_START_DIR/done-0\"\n"
                    f"{sys.executable} -c 'from nlevel.runtime import startwatch; "
                    "startwatch.mark_end(75, {4: \"node3\", 5: \"node3\"})'\n"
                    "exec sleep 120\n")
    fake.chmod(0o755)
    monkeypatch.setattr(launch, "find_mpiexec", lambda: str(fake))
    monkeypatch.setattr(launch, "is_open_mpi", lambda mpiexec: True)
    monkeypatch.setattr(launch, "END_GRACE", 0.5)
    monkeypatch.setenv("PYTHONPATH", ROOT)
    started = time.monotonic()
    assert launch.main(["--host", "a:2,b:2", "./app"]) == 75
    assert time.monotonic() - started < 30
    assert startwatch.job_end(str(tmp_path)) is None  # (no record here: None, not an error)


def test_a_one_task_allocation_gets_one_process_per_core(monkeypatch):
    """``srun --pty -c 8 bash`` or ``sbatch -n 1 -c 8``: SLURM_NTASKS is 1, the cores are the user's."""
    monkeypatch.setattr(launch, "find_mpiexec", lambda: "/x/mpiexec")
    for var in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES", "PBS_NODEFILE", "LSB_HOSTS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    for tasks, expected in (("1", ["-n", "8"]), ("", ["-n", "8"]), ("x", ["-n", "8"]), ("4", [])):
        monkeypatch.setenv("SLURM_NTASKS", tasks)
        cmd, _ = launch.build_command(["./app"], cores=8, root=False, open_mpi=True)
        assert cmd == ["/x/mpiexec", *expected, "./app"], (tasks, cmd)
