import argparse
import os

import pytest

from nlevel.errors import AppError
from nlevel.errors import ConfigError
from nlevel.runtime.app import load_app
from nlevel.runtime.cli import check_report_path, find_app

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, which holds apps/


def test_builtin_and_module_and_file():
    assert load_app(None).name == "nlevel.micro"
    assert load_app("tests.apps.logging_app").module.total is not None
    app = load_app(os.path.join(HERE, "apps", "logging_app.py"))
    p = argparse.ArgumentParser()
    app.add_arguments(p)
    opts = p.parse_args(["--n", "7"])
    app.setup(opts)
    assert app.total(opts) == 7 and app.do_job(4) == 2.0


def test_bad_apps_say_what_is_expected():
    with pytest.raises(AppError, match=r"APP 'no.such.module' cannot be imported: ModuleNotFoundError"):
        load_app("no.such.module")
    with pytest.raises(AppError, match=r"no such file"):
        load_app("missing_app.py")
    with pytest.raises(AppError, match=r"lacks do_job; an app must define do_job\(task_id\)"):
        load_app("tests.apps.no_do_job")
    app = load_app("tests.apps.negative_total")
    with pytest.raises(AppError, match="total must be a non-negative integer, got -3"):
        app.total(argparse.Namespace())


@pytest.mark.parametrize("argv,app", [
    ([], None),
    (["myapp"], "myapp"),
    (["--levels", "3", "myapp", "--size", "4"], "myapp"),
    (["--tasks", "4000"], None),
    (["--checkpoint", "x.h5", "--quiet", "a.py"], "a.py"),
    (["--levels=3", "--", "app"], "app"),
])
def test_find_app(argv, app):
    assert find_app(argv) == app


def test_report_path_never_overwrites_other_files(tmp_path):
    data = tmp_path / "data.csv"
    data.write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match="exists and is not an nlevel report"):
        check_report_path(str(data), None)
    with pytest.raises(ConfigError, match="is the checkpoint file"):
        check_report_path(str(tmp_path / "run.h5"), str(tmp_path / "run.h5"))
    with pytest.raises(ConfigError, match="is a directory"):
        check_report_path(str(tmp_path), None)
    with pytest.raises(ConfigError, match="does not exist"):
        check_report_path(str(tmp_path / "nope" / "r.json"), None)
    old = tmp_path / "r.json"
    old.write_text('{"nlevel_version": "0.1.0"}')
    check_report_path(str(old), None)  # an earlier report may be replaced
    check_report_path(str(tmp_path / "new.json"), None)
    assert data.read_text() == "a,b\n1,2\n"


# ---------------------------------------------------------------- a run's identity (issue 16)

def test_an_app_without_the_hook_is_identified_by_its_name_and_total_only():
    app = load_app(os.path.join(HERE, "apps", "logging_app.py"))
    assert app.fingerprint(argparse.Namespace(n=7, sleep_ms=3.0)) == {}


def test_the_builtin_counts_what_defines_its_tasks_and_not_how_they_wait():
    app = load_app(None)
    p = argparse.ArgumentParser()
    app.add_arguments(p)
    a = app.fingerprint(p.parse_args(["--task-min", "0.1"]))
    assert a == {"task_min": 0.1, "task_spread": 3.0, "seed": 0}
    assert app.fingerprint(p.parse_args(["--task-min", "0.1", "--busy", "--tasks", "9"])) == a


def test_a_bad_hook_is_named(tmp_path):
    bad = tmp_path / "bad_fp.py"
    bad.write_text("total = 3\ndef do_job(i): pass\ndef fingerprint(options): return ['seed']\n")
    with pytest.raises(AppError, match=r"fingerprint\(options\) must return a dict, got list"):
        load_app(str(bad)).fingerprint(argparse.Namespace())
    bad.write_text("total = 3\ndef do_job(i): pass\ndef fingerprint(options): return {'app': 'x'}\n")
    with pytest.raises(AppError, match="may not use the key 'app'"):
        load_app(str(bad)).fingerprint(argparse.Namespace())


def test_what_a_script_passes_as_fingerprint(monkeypatch):
    from nlevel.runtime import identity

    monkeypatch.setattr(identity, "default_app", lambda: "screen.py")
    assert identity.identity(None) == ("screen.py", {})
    assert identity.identity("screen-v2") == ("screen-v2", {})
    assert identity.identity({"seed": 3}) == ("screen.py", {"seed": 3})
    assert identity.identity({"app": "x", "seed": 3}) == ("x", {"seed": 3})
    with pytest.raises(ConfigError, match=r"fingerprint must be None, a name or a dict .* got 3 \(int\)"):
        identity.identity(3)
