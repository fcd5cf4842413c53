"""Cost of a checkpoint write against what is new since the previous one, and against what the file holds.

    python bench/checkpoint_io.py [--dir DIR] [--repeat 20] [--writes 200]

Two tables. **Whole writes** (``nlevel.runtime.checkpoint.write``: temp file + fsync + rename, what a
new master's first write costs, and a compaction): median time and file size for a few ranges and no
results (a typical run with in-order completions), 10^5 scattered ranges, and 10^6 results.
**Appends** (what every periodic write of a running master costs): a :class:`~nlevel.runtime.checkpoint.Store`
on a file that already holds B results, then ``--writes`` writes each bringing N new ids with a
result; for each (B, N): the median time of a write, the bytes written per write (compactions
included, amortised over the writes: they are ``bytes/write``), the bytes of one record, and the
compactions. A write's cost should follow N, not B. Run it on the file system your checkpoints go
to: fsync costs differ.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

from nlevel.roles.ledger import Ledger
from nlevel.runtime import checkpoint as ck
from nlevel.runtime.checkpoint_write import _record


def case(n_ranges: int, n_results: int, total: int) -> ck.Snapshot:
    if n_ranges == 1:
        completed = np.array([[0, total]], dtype=np.int64)
    else:
        starts = np.arange(n_ranges, dtype=np.int64) * 3
        completed = np.stack([starts, starts + 2], axis=1)
    ids = np.arange(n_results, dtype=np.int64)
    return ck.Snapshot(completed, ids, np.random.default_rng(0).random(n_results))


def whole_writes(d: str, repeat: int) -> None:
    cases = {
        "10 ranges, no results": (10, 0, 10**6),
        "1e5 ranges, no results": (100_000, 0, 10**6),
        "1 range, 1e6 results": (1, 10**6, 10**6),
    }
    print(f"whole write in {d} (median of {repeat})")
    print(f"{'record':28} {'ms':>8} {'file KB':>10}")
    for name, (k, r, total) in cases.items():
        snap = case(k, r, total)
        meta = ck.RunMeta(total, *ck.fingerprint("bench", {"case": name}), "{}", "bench")
        path = os.path.join(d, f"bench-{k}-{r}.h5")
        if os.path.exists(path):
            os.unlink(path)
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            ck.write(path, meta, snap)
            times.append(time.perf_counter() - t0)
        print(f"{name:28} {1e3 * statistics.median(times):8.2f} {os.path.getsize(path) / 1024:10.0f}")
        os.unlink(path)


def appends(d: str, writes: int) -> None:
    total = 10**9
    meta = ck.RunMeta(total, *ck.fingerprint("bench", {"case": "appends"}), "{}", "bench")
    print(f"\nappends in {d} ({writes} writes each; B results in the file before, N new ids with a result per write)")
    print(f"{'B':>10} {'N':>8} {'ms/write':>9} {'bytes/write':>12} {'record B':>9} {'compactions':>12}")
    for base in (0, 10**5, 10**6):
        for new in (10, 1000, 10_000):
            path = os.path.join(d, f"append-{base}-{new}.h5")
            for p in (path, f"{path}.journal"):
                if os.path.exists(p):
                    os.unlink(p)
            ids = np.arange(base, dtype=np.int64)
            if base:
                ck.write(path, meta, ck.Snapshot([[0, base]], ids, ids * 0.5))
            led = ck.load(path, meta).ledger(total)
            led.track()
            store = ck.Store(path, meta)
            times, record = [], 0
            start_bytes = store.bytes_written
            for k in range(writes):
                a = base + k * new
                led.commit([(a, a + new)], [(i, 1.0) for i in range(a, a + new)])
                ch = led.changes()
                record = len(_record(ch))
                t0 = time.perf_counter()
                store.write(ch)
                times.append(time.perf_counter() - t0)
            per_write = (store.bytes_written - start_bytes) / writes
            print(f"{base:>10} {new:>8} {1e3 * statistics.median(times):9.3f} {per_write:12.0f} {record:9d} "
                  f"{store.compactions:12d}")
            store.close()
            for p in (path, f"{path}.journal"):
                if os.path.exists(p):
                    os.unlink(p)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default=None, help="directory to write in (default: a temp dir)")
    p.add_argument("--repeat", type=int, default=20, help="whole writes per case")
    p.add_argument("--writes", type=int, default=200, help="appends per case")
    args = p.parse_args()
    d = args.dir or tempfile.mkdtemp(prefix="nlevel-bench-")
    os.makedirs(d, exist_ok=True)
    whole_writes(d, args.repeat)
    appends(d, args.writes)


if __name__ == "__main__":
    main()
