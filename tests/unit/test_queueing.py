"""The paper's queueing pieces (:mod:`nlevel.model.queueing`) and the calibration file."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nlevel.errors import ConfigError
from nlevel.model.calibration import Calibration, load_calibration, machine_identity, save_calibration
from nlevel.model.queueing import fit_poisson, kingman_wait, mm1_wait, sampling_rule



def test_mm1_wait():
    assert mm1_wait(5.0, 10.0) == pytest.approx(0.5 / 5.0)
    assert mm1_wait(10.0, 10.0) == math.inf and mm1_wait(11.0, 10.0) == math.inf
    # Kingman: Poisson arrivals and exponential service give M/M/1; regular arrivals wait less.
    assert kingman_wait(5.0, 10.0, 1.0) == pytest.approx(mm1_wait(5.0, 10.0))
    assert kingman_wait(5.0, 10.0, 0.0) < mm1_wait(5.0, 10.0) < kingman_wait(5.0, 10.0, 3.0)


@given(st.floats(0.5, 200.0), st.integers(30, 400), st.integers(0, 2**32 - 1))
@settings(max_examples=60, deadline=None, derandomize=True, database=None)  # (a statistical bound: fixed draws)
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


@pytest.mark.parametrize("k", [1, 2, 3, 9, 29, 99, 499])
def test_the_hand_written_chi_square_matches_scipy(k):
    from scipy import stats

    from nlevel.model.queueing import chi2_cdf

    for x in [0.0, 1e-6, 0.1, 0.5 * k, k - 1, k, k + 1, 2.0 * k, 5.0 * k + 30]:
        assert chi2_cdf(x, k) == pytest.approx(float(stats.chi2.cdf(x, k)), abs=1e-12, rel=1e-10)
