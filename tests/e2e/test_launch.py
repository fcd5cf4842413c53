import sys

from nlevel.runtime import launch


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


def test_dry_run_prints_the_command(capsys):
    assert launch.main(["--dry-run", "-n", "2", "python", "-c", "pass"]) == 0
    assert "mpiexec" in capsys.readouterr().out
