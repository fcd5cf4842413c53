"""Cost of one checkpoint write (temp file + fsync + rename), by size of the record.

    python bench/checkpoint_io.py [--dir DIR] [--repeat 20]

Prints the median time and file size of ``nlevel.runtime.checkpoint.write`` for: a few ranges
and no results (a typical run with in-order completions), 10^5 scattered ranges, and
10^6 results. Run it on the file system your checkpoints go to: fsync costs differ.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

from nlevel.runtime import checkpoint as ck


def case(n_ranges: int, n_results: int, total: int) -> ck.Snapshot:
    if n_ranges == 1:
        completed = np.array([[0, total]], dtype=np.int64)
    else:
        starts = np.arange(n_ranges, dtype=np.int64) * 3
        completed = np.stack([starts, starts + 2], axis=1)
    ids = np.arange(n_results, dtype=np.int64)
    return ck.Snapshot(completed, ids, np.random.default_rng(0).random(n_results))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default=None, help="directory to write in (default: a temp dir)")
    p.add_argument("--repeat", type=int, default=20)
    args = p.parse_args()
    d = args.dir or tempfile.mkdtemp(prefix="nlevel-bench-")
    cases = {
        "10 ranges, no results": (10, 0, 10**6),
        "1e5 ranges, no results": (100_000, 0, 10**6),
        "1 range, 1e6 results": (1, 10**6, 10**6),
    }
    print(f"checkpoint write in {d} (median of {args.repeat})")
    print(f"{'record':28} {'ms':>8} {'file KB':>10}")
    for name, (k, r, total) in cases.items():
        snap = case(k, r, total)
        meta = ck.RunMeta(total, *ck.fingerprint("bench", {"case": name}), "{}", "bench")
        path = os.path.join(d, f"bench-{k}-{r}.h5")
        if os.path.exists(path):
            os.unlink(path)
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            ck.write(path, meta, snap)
            times.append(time.perf_counter() - t0)
        print(f"{name:28} {1e3 * statistics.median(times):8.2f} {os.path.getsize(path) / 1024:10.0f}")
        os.unlink(path)


if __name__ == "__main__":
    main()
