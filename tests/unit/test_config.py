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
    ("NLEVEL_LEVELS", "1", r"NLEVEL_LEVELS must be an integer >= 2, got '1'"),
    ("NLEVEL_REGIONS", "4,a", r"NLEVEL_REGIONS must be a list of integers like 4,2, got '4,a'"),
    ("NLEVEL_CHECKPOINT_INTERVAL", "0", r"NLEVEL_CHECKPOINT_INTERVAL must be a number > 0 \(seconds\), got '0'"),
    ("NLEVEL_SERVE_ONLY", "slaves", r"NLEVEL_SERVE_ONLY must be one of none, master, all, got 'slaves'"),
    ("NLEVEL_POLL_MAX", "0", r"NLEVEL_POLL_MAX must be a number > 0 \(seconds\), got '0'"),
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


# ---------------------------------------------------------------- the one settings table

from dataclasses import fields  # noqa: E402

from nlevel.config import GROUPS, SETTINGS, Config as _Config  # noqa: E402
from nlevel.runtime.cli import build_parser  # noqa: E402


def test_every_field_is_a_row_of_the_table():
    assert list(SETTINGS) == [f.name for f in fields(_Config)]
    for s in SETTINGS.values():
        assert s.help and s.group in GROUPS, s.name
        assert s.default == getattr(_Config(), s.name)
        s.check(s.name, s.default)  # the default passes its own check


def test_the_table_drives_flags_variables_and_validation():
    s = SETTINGS["poll_max"]
    assert (s.flag, s.env, s.unit, s.kind) == ("--poll-max", "NLEVEL_POLL_MAX", "s", "a number")
    assert Config.from_env({s.env: "0.002"}).poll_max == 0.002
    with pytest.raises(ConfigError, match=r"^poll_max must be a number > 0 \(seconds\), got -1$"):
        s.check("poll_max", -1)
    assert SETTINGS["on_task_error"].kind == "one of retry, skip, abort"
    assert SETTINGS["serve_only"].kind == "one of none, master, all"


@pytest.mark.parametrize("name,text,value", [
    ("levels", "auto", 0), ("levels", "AUTO", 0), ("chunk", "auto", 0), ("regions", "auto", ()),
    ("force_replan", "none", ""), ("switch_interval", "keep", 0.0), ("chunk", "8", 8),
])
def test_words_stand_for_values(name, text, value):
    assert parse_setting(name, text) == value
    assert SETTINGS[name].show(value) == (text.lower() if not text.isdigit() else f"{text} ids")


def test_help_shows_auto_not_zero_and_names_the_variable():
    text = build_parser().format_help()
    flat = " ".join(text.split())
    assert "[default auto; NLEVEL_LEVELS]" in flat and "[default 0;" not in flat and "[default ;" not in flat
    assert "[default auto; NLEVEL_CHUNK]" in flat and "[default auto; NLEVEL_REGIONS]" in flat
    assert "[default 2.0 s; NLEVEL_CHECKPOINT_INTERVAL]" in flat
    for s in SETTINGS.values():
        assert (f"{s.flag} {s.name.upper()}" in flat) == s.cli, s.name  # progress has --quiet instead
    for title in GROUPS.values():
        assert title + ":" in text


def test_a_flag_given_as_a_word_reaches_the_config():
    options = build_parser().parse_args(["--levels", "auto", "--chunk", "auto", "--levels", "3"])
    assert options.levels == "3" and parse_setting("chunk", options.chunk, source="--chunk") == 0


# ---------------------------------------------------------------- durations (issue 34: bad input)

@pytest.mark.parametrize("name", ["task_timeout", "lease"])
@pytest.mark.parametrize("text", ["0", "-1", "-0.5", "abc", "", "nan", "inf", "-inf", "1e400"])
def test_a_duration_that_is_zero_negative_or_not_a_number_is_one_line_naming_the_flag(name, text):
    flag = "--" + name.replace("_", "-")
    with pytest.raises(ConfigError) as e:
        parse_setting(name, text, source=flag)
    said = str(e.value)
    assert said.startswith(f"{flag} must be a number") and said.endswith(f"got {text.strip()!r}") and "\n" not in said


@pytest.mark.parametrize("kwargs", [{"task_timeout": 0}, {"task_timeout": -3.0}, {"task_timeout": float("nan")},
                                    {"task_timeout": float("inf")}, {"task_timeout": True}, {"task_timeout": "5"},
                                    {"lease": 0.0}, {"lease": float("inf")}, {"lease": True}, {"lease": -2.0},
                                    {"poll_max": float("inf")}])
def test_a_bad_duration_from_python_is_refused_naming_the_setting(kwargs):
    [(name, value)] = kwargs.items()
    with pytest.raises(ConfigError, match=rf"^{name} must be a number.*, got {value!r}$".replace("(", r"\(")):
        Config(**kwargs)


def test_the_seconds_check_is_shared_by_the_duration_settings():
    from nlevel.config import seconds

    check = seconds()
    check("lease", 2.5)
    with pytest.raises(ConfigError, match=r"^--lease must be a number of seconds > 0, got 0$"):
        check("--lease", 0)
    seconds(none=True)("task_timeout", None)
    assert parse_setting("task_timeout", "none") is None and parse_setting("task_timeout", "2.5") == 2.5
    assert parse_setting("lease", "3") == 3.0
