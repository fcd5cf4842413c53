"""Random in-process trials of the hardest recovery: the master (or the master and its deputy) dying
while a plan switch is under way, on plans of 3, 4 and 5 levels.

    .venv/bin/python bench/replan_fuzz.py [--seeds 100] [--deaths 3000] [--json bench/results/replan_fuzz.json]

Each trial is an in-process network (:class:`nlevel.testing.network.Network`: the roles' own
state machines, messages delivered in random order) of 400 ids under ``--levels auto`` with a
forced switch at 30 % committed. The master is killed (``master``), or the master and its
deputy together (``master+deputy``), at the first step after its switch at which either its
Regroups are still on their way (``regroups``: some ranks switch before they hear of its death,
some after) or a report from the old plan is being relayed to it (``relayed``). Every trial
is checked as the unit tests check theirs (``tests/unit/test_farm_inprocess.check``): every id
committed once, re-runs only of ids at risk, every rank released, every report row right; a
trial that does not finish within 60,000 steps is a hang. The scenarios come from
``tests/unit/test_replan_state.py``, whose fixed seeds hold the cases this found.

With ``--deaths N``, also N trials of deaths around a switch (``deaths``): 300 ids on 9, 13 or 16
ranks (3 and 4 levels), two to four ranks of any role killed at random steps, a forced switch in
30 % of the trials (the rest keep their plan), user loops that look at their messages in the
middle of a hand or not. Same checks; a trial that does not finish within 80,000 steps is a hang.

It is a search, not a benchmark: no timing, any machine. Its result lists the failing trials
(plan, victims, moment, seed, what went wrong) so each can be replayed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import provenance  # noqa: E402
from nlevel.config import Config  # noqa: E402
from nlevel.model.plan import Plan  # noqa: E402
from nlevel.testing.network import Network  # noqa: E402
from tests.unit.test_farm_inprocess import check  # noqa: E402
from tests.unit.test_replan_state import _kill_master_when, _regroups_on_their_way, _relayed_to_the_master  # noqa: E402

#: name -> (ranks, first plan, forced switch)
PLANS: dict[str, tuple[int, Plan, str]] = {
    "3 levels": (13, Plan(3, (3,)), "0.3@3x2"),
    "4 levels": (17, Plan(4, (2, 2)), "0.3@3x3"),
    "5 levels": (33, Plan(5, (2, 2, 2)), "0.3@3x2"),
}
VICTIMS = {"master": (0,), "master+deputy": (0, 1)}
TOTAL = 400


MOMENTS: dict[str, Callable[[Network], bool]] = {"regroups": _regroups_on_their_way, "relayed": _relayed_to_the_master}


def trial(plan: str, victims: str, moment: str, seed: int) -> str | None:
    """One trial; None if it passed, "not killed" if the moment never came, else what went wrong."""
    size, first, force = PLANS[plan]
    net = Network(size, first, TOTAL, seed, config=Config(levels=0, force_replan=force, fault_tolerance="on",
                                                          report_every=4))
    state = _kill_master_when(net, MOMENTS[moment], VICTIMS[victims])
    try:
        out = net.run(max_steps=60_000)
        if not state["killed"]:
            return "not killed"
        check(out, TOTAL)
    except AssertionError as exc:
        return str(exc).splitlines()[0][:200]
    return None


DEATH_PLANS = [(9, Plan(3, (2,))), (16, Plan(4, (2, 2))), (13, Plan(3, (3,)))]


def death_trial(seed: int) -> tuple[dict[str, object], str | None]:
    """One trial of deaths around a switch (all of it drawn from ``seed``); its set-up, and None if it passed."""
    rng = random.Random(seed)
    size, plan = rng.choice(DEATH_PLANS)
    kills = sorted((rng.randint(0, 900), rng.randrange(size)) for _ in range(rng.choice([2, 3, 4])))
    pieces = rng.choice([0.0, 0.3])
    switch = rng.random() < 0.3
    config = Config(levels=0 if switch else plan.levels, regions=() if switch else plan.regions,
                    force_replan="0.3@3x2" if switch else "", chunk=16 if pieces else plan.chunk,
                    fault_tolerance="on", report_every=rng.choice([1, 4]))
    setup: dict[str, object] = {"seed": seed, "size": size, "levels": plan.levels, "regions": list(plan.regions),
                                "kills": kills, "pieces": pieces, "switch": switch,
                                "report_every": config.report_every}
    try:
        out = Network(size, plan, DEATH_TOTAL, seed, config=config, pieces=pieces).run(kills=kills, max_steps=80_000)
        check(out, DEATH_TOTAL)
        assert not out.kills, f"a live rank was killed as hung: {out.kills}"
    except AssertionError as exc:
        return setup, str(exc).splitlines()[0][:200]
    return setup, None


DEATH_TOTAL = 300


def build_parser() -> argparse.ArgumentParser:
    """The command line (docs/render.py --check parses recorded commands with it)."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=100, help="seeds per plan, victims and moment (default 100)")
    ap.add_argument("--deaths", type=int, default=0, help="also this many trials of deaths around a switch (default 0)")
    ap.add_argument("--json", help="write the result here")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    t0 = time.perf_counter()
    rows, failures = [], []
    for plan in PLANS:
        for victims in VICTIMS:
            for moment in MOMENTS:
                bad = missed = 0
                for seed in range(args.seeds):
                    why = trial(plan, victims, moment, seed)
                    if why == "not killed":
                        missed += 1
                    elif why is not None:
                        bad += 1
                        failures.append({"plan": plan, "victims": victims, "moment": moment, "seed": seed, "why": why})
                rows.append({"plan": plan, "victims": victims, "moment": moment, "trials": args.seeds, "failed": bad,
                             "not_killed": missed})
                print(f"{plan}, {victims} killed, {moment}: {bad} of {args.seeds} failed"
                      + (f" ({missed} never reached the moment)" if missed else ""), flush=True)
    total = sum(r["trials"] for r in rows)
    print(f"{len(failures)} of {total} trials failed ({time.perf_counter() - t0:.0f} s)")
    for f in failures:
        print(f"  {f['plan']}, {f['victims']}, {f['moment']}, seed {f['seed']}: {f['why']}")
    deaths = []
    for seed in range(args.deaths):
        setup, why = death_trial(seed)
        if why is not None:
            deaths.append({**setup, "why": why})
    if args.deaths:
        hangs = sum("a hang" in d["why"] for d in deaths)
        print(f"deaths around a switch: {len(deaths)} of {args.deaths} trials failed ({hangs} hangs)")
        for d in deaths:
            print(f"  seed {d['seed']}, {d['size']} ranks, {d['levels']} levels, kills {d['kills']}, "
                  f"switch {d['switch']}: {d['why']}")
    if args.json:
        prov = provenance.record()  # (before the file is opened: truncating a tracked result makes the tree "dirty")
        with open(args.json, "w") as fh:
            json.dump({"provenance": prov, "rows": rows, "failures": failures, "trials": total,
                       "deaths": {"trials": args.deaths, "failures": deaths},
                       "seconds": round(time.perf_counter() - t0, 1)}, fh, indent=1)
            fh.write("\n")
    return 1 if failures or deaths else 0


if __name__ == "__main__":
    sys.exit(main())
