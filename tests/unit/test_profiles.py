"""Named network profiles (:mod:`nlevel.model.profiles`) and ``--network`` in ``nlevel.sim`` and ``nlevel.plan``."""

from __future__ import annotations

import json
import os

import pytest

from nlevel.errors import ConfigError
from nlevel.model.profiles import PROFILES, get_profile, profile_names
from nlevel.runtime.plan_cli import main as plan_main
from nlevel.sim import main as sim_main
from nlevel.sim.cli import DEFAULT_ATOMIC_SERVICE, DEFAULT_ATOMIC_TIME, build_parser, run

from ..conftest import ROOT

SIM = ["--procs", "8", "--task-time", "0.002:0.005", "--tasks-per-proc", "3", "--engine", "python",
       "--service-time", "3e-5"]


@pytest.fixture(autouse=True)
def no_calibration(tmp_path, monkeypatch):
    """Tests do not read the machine's calibration file."""
    monkeypatch.setenv("NLEVEL_CALIBRATION", str(tmp_path / "no-calibration.json"))


def test_the_three_profiles_and_their_sources():
    assert profile_names() == ("shm", "ib-hdr", "slingshot-11")
    for p in PROFILES.values():
        assert p.msg_time > 0 and p.source
        assert p.atomic_time is None or p.atomic_time > 0
        assert p.atomic_service is None or p.atomic_service > 0
    # a fetch-and-op needs its answer back: at least a round trip
    assert get_profile("ib-hdr").atomic_time == pytest.approx(2 * get_profile("ib-hdr").msg_time)


def test_shm_is_the_stored_measurement():
    with open(os.path.join(ROOT, "bench", "results", "calibration-shm.json")) as f:
        stored = json.load(f)
    cal = stored["calibration"]
    shm = get_profile("shm")
    assert (shm.msg_time, shm.atomic_time, shm.atomic_service) == (
        cal["msg_time"], cal["atomic_time"], cal["atomic_service"])
    assert stored["provenance"]["command"].startswith("python -m nlevel.plan --calibrate")


def test_unknown_profile_names_the_choices():
    with pytest.raises(ConfigError) as e:
        get_profile("x")
    assert str(e.value) == "--network must be one of shm, ib-hdr, slingshot-11, got 'x'"


def test_sim_network_sets_message_and_one_sided_times_not_service():
    r = run(build_parser().parse_args([*SIM, "--network", "ib-hdr"]))
    assert (r.msg_time, r.atomic_time, r.service_time) == (1.2e-6, 2.4e-6, 3e-5)
    assert r.atomic_service == DEFAULT_ATOMIC_SERVICE  # (no published figure: the default, said so)
    assert "network ib-hdr (message, one-sided)" in r.times_source


def test_sim_explicit_times_override_the_network():
    r = run(build_parser().parse_args([*SIM, "--network", "slingshot-11", "--msg-time", "1e-5",
                                       "--atomic-service", "1e-7"]))
    assert (r.msg_time, r.atomic_time, r.atomic_service) == (1e-5, 5.52e-6, 1e-7)
    assert "network slingshot-11 (one-sided)" in r.times_source


def test_sim_without_network_keeps_its_defaults():
    r = run(build_parser().parse_args(SIM))
    assert (r.atomic_time, r.atomic_service) == (DEFAULT_ATOMIC_TIME, DEFAULT_ATOMIC_SERVICE)
    assert "network" not in r.times_source


def test_sim_unknown_network_is_one_line_exit_2(capsys):
    assert sim_main([*SIM, "--network", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "nlevel.sim: error: --network must be one of shm, ib-hdr, slingshot-11, got 'x'"


def test_plan_network_json_says_where_times_came_from(capsys):
    assert plan_main(["--procs", "1024", "--task-time", "2:5", "--service-time", "5e-4", "--network", "shm",
                      "--msg-time", "5e-5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "msg time 50 us (given)" in out["times_source"]
    assert "atomic time 0.791 us (network shm)" in out["times_source"]
    assert "service time 500 us (given)" in out["times_source"]


def test_plan_unknown_network_is_one_line_exit_2(capsys):
    assert plan_main(["--procs", "8", "--task-time", "1", "--network", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "nlevel.plan: error: --network must be one of shm, ib-hdr, slingshot-11, got 'x'"
