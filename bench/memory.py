"""Memory of the master's records as ``total`` grows to 10^9 ids (no MPI needed).

The master keeps the ids not yet granted, what each child holds, and the completion
record, all as id ranges (:class:`nlevel.ranges.RangeSet`), never as Python sets of
ints. This drives the real :class:`~nlevel.roles.dispatch.Master` with 64 children:
it hands out ``--steps`` grants of up to 256 ids, and completions come back in a
shuffled order within a window, as they do on a real machine. It reports
tracemalloc's peak, and the number of ranges in the completion record.

    python bench/memory.py [--steps 20000]
"""

from __future__ import annotations

import argparse
import random
import tracemalloc

from nlevel.config import Config
from nlevel.hierarchy import build
from nlevel.plan import Plan
from nlevel.protocol import Report
from nlevel.roles.ledger import Ledger
from nlevel.roles.station import Station


def run(total: int, steps: int, children: int = 64, seed: int = 1) -> tuple[float, int, int]:
    rng = random.Random(seed)
    tracemalloc.start()
    h = build(children + 1, Plan(serve_only="master"))
    ledger = Ledger(total)
    master = Station(h, 0, Config(levels=2), lambda: 0.0, ledger).dispatcher
    assert master is not None
    held: dict[int, list[tuple[int, int]]] = {c: [] for c in range(1, children + 1)}
    for _ in range(steps):
        c = rng.randrange(1, children + 1)
        done = tuple(held[c])
        rng.shuffle(held[c])
        # Report most of what this child holds (out of order), keep the rest a while.
        keep = held[c][: rng.randrange(0, 2)]
        report_done = tuple(r for r in done if r not in keep)
        held[c] = list(keep)
        for out in master.on_report(c, Report(done=report_done, want=256)):
            held[out.dest].extend(out.msg.ids)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 2**20, ledger.committed.n_ranges, ledger.n_committed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20_000)
    args = p.parse_args()
    print(f"{'total ids':>14} {'peak MiB':>9} {'ranges in record':>17} {'committed':>11}")
    for total in (10**6, 10**7, 10**8, 10**9):
        peak, ranges, committed = run(total, args.steps)
        print(f"{total:14,} {peak:9.2f} {ranges:17,} {committed:11,}")


if __name__ == "__main__":
    main()
