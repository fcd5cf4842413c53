"""``--levels auto`` starts from this machine's calibration (issue 14): nlevel.runtime.costs."""

from __future__ import annotations

import pytest

from nlevel.config import Config
from nlevel.errors import ConfigError
from nlevel.model.calibration import Calibration, save_calibration
from nlevel.runtime.costs import with_calibration


def _cal(path, **kw):
    values = {"service_time": 4e-5, "msg_time": 3e-6, "atomic_time": 2e-6, "atomic_service": 5e-7, **kw}
    save_calibration(Calibration(values["service_time"], values["msg_time"], {}, "now", {},
                                 values["atomic_time"], values["atomic_service"]), str(path))


def test_auto_takes_the_costs_it_was_not_given_from_the_calibration(tmp_path):
    _cal(tmp_path / "cal.json")
    cfg, source, _ = with_calibration(Config(levels=0, msg_time=9e-6), str(tmp_path / "cal.json"))
    assert (cfg.service_time, cfg.msg_time, cfg.atomic_time, cfg.atomic_service) == (4e-5, 9e-6, 2e-6, 5e-7)
    assert source.startswith(f"calibration {tmp_path / 'cal.json'}") and "msg_time" not in source


def test_no_file_or_a_fixed_plan_keeps_the_settings(tmp_path):
    cfg = Config(levels=0)
    assert with_calibration(cfg, str(tmp_path / "none.json"))[:2] == (cfg, "defaults")
    _cal(tmp_path / "cal.json")
    fixed = Config(levels=2)
    assert with_calibration(fixed, str(tmp_path / "cal.json"))[:2] == (fixed, "settings")


def test_a_file_that_is_not_a_calibration_is_one_error_naming_it(tmp_path):
    bad = tmp_path / "cal.json"
    bad.write_text("{}")
    with pytest.raises(ConfigError, match=str(bad)):
        with_calibration(Config(levels=0), str(bad))
