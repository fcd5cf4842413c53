"""``bench/soak.py``'s draw of a trial: ``--any-roles`` asks for deaths of different roles in one job."""

from __future__ import annotations

import importlib.util
import os
import random

from ..conftest import ROOT


def _soak():
    spec = importlib.util.spec_from_file_location("soak", os.path.join(ROOT, "bench", "soak.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_any_roles_draws_two_or_three_victims_of_any_role_from_outside():
    soak = _soak()
    rng = random.Random(0)
    trials = [soak.draw(rng, 3000, any_roles=True) for _ in range(300)]
    for t in trials:
        assert t["role"] == "any" and t["task"] is None and t["then_new_leader"] is None
        assert t["kind"] in ("KILL", "STOP", "SEGV") and t["signal"] == t["kind"]
        assert 2 <= t["count"] <= (2 if t["kind"] == "STOP" else 3) and t["count"] <= t["size"] - 3
    assert {t["count"] for t in trials} == {2, 3} and {t["kind"] for t in trials} == {"KILL", "STOP", "SEGV"}


def test_any_roles_leaves_the_rest_of_a_trial_as_the_same_seed_draws_it():
    """The plan, the instant and the workload are drawn as before (the victims are drawn after them)."""
    soak = _soak()
    plain, mixed = soak.draw(random.Random(5), 3000), soak.draw(random.Random(5), 3000, any_roles=True)
    for key in ("size", "levels", "regions", "phase", "workload", "long", "after_committed"):
        assert plain[key] == mixed[key], key
