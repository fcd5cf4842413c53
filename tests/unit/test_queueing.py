"""The paper's model (nlevel.model.queueing) and python -m nlevel.plan."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nlevel.errors import ConfigError
from nlevel.model.calibration import Calibration, load_calibration, machine_identity, save_calibration
from nlevel.model.plan import Plan
from nlevel.model.queueing import choose_plan, fit_poisson, mm1_wait, predict, sampling_rule

service = st.floats(1e-6, 1e-3)
msg = st.floats(0.0, 1e-3)
task = st.floats(1e-3, 1000.0)


def test_mm1_wait():
    assert mm1_wait(5.0, 10.0) == pytest.approx(0.5 / 5.0)
    assert mm1_wait(10.0, 10.0) == math.inf and mm1_wait(11.0, 10.0) == math.inf


@given(st.integers(2, 20_000), st.integers(2, 20_000), task, service, msg)
@settings(max_examples=40, deadline=None)
def test_more_processes_never_fewer_levels(p1, p2, t, s, m):
    lo, hi = sorted((p1, p2))
    assert choose_plan(lo, t, s, m).plan.levels <= choose_plan(hi, t, s, m).plan.levels


@given(st.integers(8, 20_000), st.floats(1e-3, 100.0), st.floats(1.05, 6.0), msg)
@settings(max_examples=40, deadline=None)
def test_rho_above_one_always_adds_a_level(p, t, rho, m):
    # The service time at which the master gets rho times the requests it can serve:
    # lambda * s = p * s / (t + 2m + s) = rho.
    s = rho * (t + 2 * m) / (p - rho)
    classic = predict(Plan(), p, t, s, m)
    assert not classic.steady and classic.overhead > 1
    assert choose_plan(p, t, s, m).plan.levels >= 3


@given(st.integers(2, 160), st.floats(1e-3, 0.5), st.floats(1e-5, 2e-3), msg, st.floats(0.01, 0.5))
@settings(max_examples=80, deadline=None)
def test_chosen_plan_meets_c_whenever_any_plan_does(p, t, s, m, c):
    # Brute force every plan that fits up to 4 levels.
    options = [Plan()]
    options += [Plan(3, (r,)) for r in range(2, p // 2 + 1)]
    options += [Plan(4, (a, b)) for a in range(2, p // 4 + 1) for b in range(2, p // (2 * a) + 1)]
    any_meets = any(predict(o, p, t, s, m).overhead <= c for o in options)
    d = choose_plan(p, t, s, m, threshold=c)
    if any_meets:
        assert d.predicted_overhead <= c
    else:  # none up to 4 levels does: the planner says no plan does, or found a deeper one that does
        assert "no plan reaches" in d.reason or (d.plan.levels > 4 and d.predicted_overhead <= c)


@given(st.floats(0.5, 200.0), st.integers(30, 400), st.integers(0, 2**32 - 1))
@settings(max_examples=60, deadline=None)
def test_poisson_fit_recovers_lambda(lam, m, seed):
    counts = np.random.default_rng(seed).poisson(lam, size=m)
    fit = fit_poisson(counts.tolist(), interval=0.01)
    # Within 5 standard errors of the mean.
    assert abs(fit.lam - lam) <= 5 * math.sqrt(lam / m)
    assert fit.rate == pytest.approx(fit.lam / 0.01)


def test_dispersion_verdicts():
    rng = np.random.default_rng(7)
    assert fit_poisson(rng.poisson(20, 300).tolist(), 0.01).verdict == "poisson"
    bursty = rng.negative_binomial(2, 2 / 22, 300)  # mean 20, variance 220
    assert fit_poisson(bursty.tolist(), 0.01).verdict == "over-dispersed"
    assert fit_poisson([20] * 299 + [21], 0.01).verdict == "under-dispersed"


def test_paper_shape_with_the_paper_machines_service_time():
    # 32,768 processes, 2-5 s tasks (mean 3.4 s): a master that serves ~4,000 requests/s
    # cannot keep up with ~9,600/s, so classic has no steady state; the model adds a level.
    d = choose_plan(32768, 3.4, 2.5e-4, 2e-5, 0.10)
    assert not d.classic.steady and d.classic.overhead > 1
    assert d.plan.levels == 3 and d.predicted_overhead <= 0.10


@pytest.mark.parametrize("args,match", [
    ((0, 1.0, 1e-5, 1e-5, 0.1), "process count must be an integer >= 1, got 0"),
    ((8, 0.0, 1e-5, 1e-5, 0.1), "task time must be > 0 s, got 0.0"),
    ((8, -1.0, 1e-5, 1e-5, 0.1), "task time must be > 0 s"),
    ((8, 1.0, 1e-5, 1e-5, 1.0), r"threshold must be in \(0, 1\), got 1.0"),
    ((8, 1.0, 1e-5, 1e-5, 0.0), r"threshold must be in \(0, 1\)"),
])
def test_bad_model_input(args, match):
    with pytest.raises(ConfigError, match=match):
        choose_plan(*args)


def test_sampling_rule():
    interval, m = sampling_rule([3.5e-3] * 4, workers=4)
    assert 1e-3 <= interval <= 3.5e-3 and 30 <= m <= 300
    interval, m = sampling_rule([3.4] * 10, workers=32768)
    assert interval == pytest.approx(10 / (32768 / 3.4)) and m == 300
    with pytest.raises(ConfigError, match="at least one measured task time"):
        sampling_rule([], 4)


def test_calibration_round_trip_and_foreign_warning(tmp_path):
    path = str(tmp_path / "cal.json")
    ident = machine_identity("Open MPI v5")
    save_calibration(Calibration(3e-5, 2e-5, ident, "now", {}), path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cal = load_calibration(path, "Open MPI v5")
    assert cal is not None and cal.service_time == 3e-5
    other = dict(ident, host="elsewhere", nlevel="0.0.1")
    save_calibration(Calibration(3e-5, 2e-5, other, "now", {}), path)
    with pytest.warns(UserWarning, match=r"host: 'elsewhere' there.*nlevel: '0.0.1' there"):
        load_calibration(path)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot be read"):
        load_calibration(str(tmp_path / "bad.json"))
    assert load_calibration(str(tmp_path / "none.json")) is None


def plan_cli(*args):
    return subprocess.run([sys.executable, "-m", "nlevel.plan", *args], capture_output=True, text=True, timeout=120)


def test_plan_cli_json_keys():
    proc = plan_cli("--procs", "32768", "--task-time", "3.4", "--service-time", "2.5e-4", "--msg-time", "2e-5", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["levels"] == 3 and isinstance(out["regions_per_level"], list)
    assert 0 <= out["predicted_overhead"] <= 0.1 and out["classic_overhead"] > 1
    assert "RuntimeWarning" not in proc.stderr


@pytest.mark.parametrize("args,message", [
    (["--procs", "0", "--task-time", "1"], "--procs must be >= 1, got 0"),
    (["--procs", "8", "--task-time", "-2"], "--task-time must be > 0, got '-2'"),
    (["--procs", "8", "--task-time", "1", "--threshold", "1.5"], "--threshold must be in (0, 1)"),
    (["--procs", "8"], "--procs and --task-time are required"),
])
def test_plan_cli_bad_input(args, message):
    proc = plan_cli(*args)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("k", [1, 2, 3, 9, 29, 99, 499])
def test_the_hand_written_chi_square_matches_scipy(k):
    from scipy import stats

    from nlevel.model.queueing import chi2_cdf

    for x in [0.0, 1e-6, 0.1, 0.5 * k, k - 1, k, k + 1, 2.0 * k, 5.0 * k + 30]:
        assert chi2_cdf(x, k) == pytest.approx(float(stats.chi2.cdf(x, k)), abs=1e-12, rel=1e-10)
