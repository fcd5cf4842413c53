import pytest

from nlevel.config import Config, parse_setting
from nlevel.errors import ConfigError, PlanError


def test_precedence_argument_then_env_then_default():
    env = {"NLEVEL_LEVELS": "3", "NLEVEL_POLL_MAX": "0.001", "NLEVEL_REGIONS": "2"}
    c = Config.from_env(env)
    assert (c.levels, c.poll_max, c.regions) == (3, 0.001, (2,))
    c = Config.from_env(env, levels=4, regions=(2, 2))
    assert (c.levels, c.regions, c.poll_max) == (4, (2, 2), 0.001)
    assert Config.from_env({}).auto  # levels default: auto


@pytest.mark.parametrize("var,value,match", [
    ("NLEVEL_LEVELS", "three", r"NLEVEL_LEVELS must be an integer, got 'three'"),
    ("NLEVEL_LEVELS", "1", r"levels must be an integer >= 2, got 1"),
    ("NLEVEL_REGIONS", "4,a", r"NLEVEL_REGIONS must be a list of integers like 4,2, got '4,a'"),
    ("NLEVEL_CHECKPOINT_INTERVAL", "0", r"checkpoint_interval must be a number > 0 \(seconds\), got 0.0"),
    ("NLEVEL_SERVE_ONLY", "slaves", r"serve_only must be one of none, master, all, got 'slaves'"),
    ("NLEVEL_POLL_MAX", "0", r"poll_max must be a number > 0 \(seconds\), got 0.0"),
    ("NLEVEL_PROGRESS", "maybe", r"NLEVEL_PROGRESS must be true or false, got 'maybe'"),
])
def test_bad_environment_names_variable_and_value(var, value, match):
    with pytest.raises(ConfigError, match=match):
        Config.from_env({var: value})


def test_unknown_override():
    with pytest.raises(ConfigError, match="unknown setting"):
        Config.from_env({}, levls=3)


def test_plan_from_config():
    p = Config(levels=3).plan(7)
    assert p.levels == 3 and p.regions == (3,)
    assert "from the world size" in p.reason
    with pytest.raises(PlanError, match="needs at least 8 processes"):
        Config(levels=3, regions=(4,)).plan(7)


def test_parse_setting_types():
    assert parse_setting("regions", "4x2") == (4, 2)
    assert parse_setting("progress", "on") is True
    assert parse_setting("poll_max", "1e-5") == 1e-5
