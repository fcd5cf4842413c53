"""Memory of the master's and region-masters' records as ``total`` grows to 10^9 ids (no MPI).

The master keeps the ids not yet granted, what each child holds, and the completion
record; a region-master keeps its queue, what each child holds and the completions it
has not yet forwarded: all as id ranges (:class:`nlevel.ranges.RangeSet`), never as
Python sets of ints. Two layouts run in one process on the real roles
(:class:`nlevel.testing.network.Network`):

* ``2 levels``: the master with 64 slaves (serve-only master);
* ``3 levels``: the master, 2 region-masters (all serve-only; the master leads the first
  of 3 regions) and 64 slaves.

Each run takes ``--steps`` random steps (claims of ranges of 256 ids, reports delivered
in a random order, ticks), as a real machine would interleave them. It reports tracemalloc's peak over all the stations, and the number of ranges
in the master's completion record.

    python bench/memory.py [--steps 20000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import tracemalloc
from typing import Any

from nlevel.config import Config
from nlevel.model.plan import Plan
from nlevel.testing.network import LocalBoards, Network

TOTALS = (10**6, 10**7, 10**8, 10**9)


def run(total: int, steps: int, children: int = 64, seed: int = 1, levels: int = 2) -> dict[str, Any]:
    """Drive a ``levels``-level farm of ``children`` slaves for ``steps`` steps; return the peak and record size.

    The farm is :class:`nlevel.testing.network.Network`: every rank's real Station and Loop
    in this process, boards in local memory, messages delivered in a random order. A step
    is one random thing: a message delivered, a tick, or a user loop finishing its range
    and claiming the next (ranges of up to 256 ids).
    """
    tracemalloc.start()
    plan = Plan(3, (3,), serve_only="all") if levels == 3 else Plan(serve_only="master")
    size = children + 1 + (2 if levels == 3 else 0)
    config = Config(levels=levels, regions=plan.regions, serve_only=plan.serve_only, chunk=256,
                    fault_tolerance="off")
    net = Network(size, plan, total, seed, config=config, boards=LocalBoards(4096, 512))
    for _ in range(steps):
        if not net.step():
            break
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    ledger = net.ledger0
    region_ranges = [len(st.server.queue.ranges()) for st in net.stations
                     if st.server is not None and st.rank != 0]
    return {"levels": levels, "total": total, "steps": steps, "peak_mib": peak / 2**20,
            "record_ranges": ledger.committed.n_ranges, "committed": ledger.n_committed,
            "region_queue_ranges": region_ranges}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20_000)
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args()
    rows = []
    print(f"{'layout':9} {'total ids':>14} {'peak MiB':>9} {'ranges in record':>17} {'committed':>11}")
    for levels in (2, 3):
        for total in TOTALS:
            r = run(total, args.steps, levels=levels)
            rows.append(r)
            print(f"{levels} levels {total:14,} {r['peak_mib']:9.2f} {r['record_ranges']:17,} {r['committed']:11,}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
