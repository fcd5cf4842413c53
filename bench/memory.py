"""Memory of the master's and region-masters' records as ``total`` grows to 10^9 ids (no MPI).

The master keeps the ids not yet granted, what each child holds, and the completion
record; a region-master keeps its queue, what each child holds and the completions it
has not yet forwarded: all as id ranges (:class:`nlevel.ranges.RangeSet`), never as
Python sets of ints. Two layouts are driven through the real
:class:`~nlevel.roles.station.Station` objects, with slaves simulated here:

* ``2 levels``: the master with 64 slaves (serve-only master);
* ``3 levels``: the master, 2 region-masters (all serve-only; the master leads the first
  of 3 regions) and 64 slaves; the stations'
  messages are routed to each other at once, as the runtime would deliver them.

Each run makes ``--steps`` slave requests of up to 256 ids; completions come back in a
shuffled order (a slave keeps back up to one range a while), as they do on a real
machine. It reports tracemalloc's peak over all the stations, and the number of ranges
in the master's completion record.

    python bench/memory.py [--steps 20000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import tracemalloc
from typing import Any

from nlevel.config import Config
from nlevel.model.hierarchy import build
from nlevel.model.plan import Plan
from nlevel.roles.ledger import Ledger
from nlevel.roles.messages import Report
from nlevel.roles.station import Station

TOTALS = (10**6, 10**7, 10**8, 10**9)


def run(total: int, steps: int, children: int = 64, seed: int = 1, levels: int = 2) -> dict[str, Any]:
    """Drive the servers of a ``levels``-level farm of ``children`` slaves; return the peak and record size."""
    rng = random.Random(seed)
    tracemalloc.start()
    # 3 regions: the master leads the first (as in the paper), 2 region-masters the others.
    plan = Plan(3, (3,), serve_only="all") if levels == 3 else Plan(serve_only="master")
    size = children + 1 + (2 if levels == 3 else 0)
    h = build(size, plan)
    ledger = Ledger(total)
    config = Config(levels=levels, serve_only="all" if levels == 3 else "master")
    servers = {r: Station(h, r, config, lambda: 0.0, ledger if r == 0 else None) for r in range(size) if h[r].children}
    slaves = [r for r in range(size) if r not in servers]
    assert len(slaves) == children, (len(slaves), h.summary())
    held: dict[int, list[tuple[int, int]]] = {c: [] for c in slaves}

    def deliver(src: int, dest: int, msg: Any) -> None:
        pending = [(src, dest, msg)]
        while pending:
            s, d, m = pending.pop()
            if d in servers:
                pending.extend((d, out.dest, out.msg) for out in servers[d].deliver(s, m))
            else:
                held[d].extend(m.ids)

    for _ in range(steps):
        c = rng.choice(slaves)
        done = tuple(held[c])
        rng.shuffle(held[c])
        # Report most of what this child holds (out of order), keep the rest a while.
        keep = held[c][: rng.randrange(0, 2)]
        held[c] = list(keep)
        deliver(c, h[c].parent, Report(done=tuple(r for r in done if r not in keep), want=256))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    region_ranges = [len(s.dispatcher.queue.ranges()) for r, s in servers.items() if r != 0 and s.dispatcher]
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
