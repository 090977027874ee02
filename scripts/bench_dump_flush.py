"""Cost of one flush of the statistics dump (``StatsWriter.flush``) against the dump's size.

    python scripts/bench_dump_flush.py [--sizes-mb 1 10 100] [--dir DIR]

A flush writes the whole in-memory dump to ``stats.h5.new`` and renames it over ``stats.h5``
(pserver/dump/writer.py); this prints the median of five flushes at each size and the share
of the statistics server's time it takes at the default ``stats.flush_interval`` (2 s), once
the writer's stretching of the interval (10 x the flush time) is applied.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np

from pserver.dump.writer import COPY_SHARE, StatsWriter

ROW_BYTES = 6 * 8  # a gradients row: six 8-byte columns (int32 columns round up here)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 10, 100])
    parser.add_argument("--dir", help="where to write (default: a temporary directory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "stats.h5"
        w = StatsWriter(path, {"pserver_version": "bench"}, flush_interval=2.0)
        rows = 0
        print(f"{'dump MB':>8}  {'flush ms':>9}  {'share of time at 2 s':>21}")
        for size in sorted(args.sizes_mb):
            want = int(size * 1e6 / ROW_BYTES)
            while rows < want:
                n = min(100_000, want - rows)
                cols = {f"c{i}": np.arange(rows, rows + n, dtype=np.int64) for i in range(6)}
                w.append("gradients", **cols)
                rows += n
            times = []
            for _ in range(5):
                w.flush()
                times.append(w.copy_seconds[-1])
            t = statistics.median(times)
            gap = max(2.0, COPY_SHARE * t)
            mb = path.stat().st_size / 1e6
            print(f"{mb:8.1f}  {1e3 * t:9.1f}  {100 * t / gap:20.1f}%")
        w.close()


if __name__ == "__main__":
    main()
