"""Cost of one flush of the statistics dump (``StatsWriter.flush``) against the dump's size.

    python scripts/bench_dump_flush.py [--sizes-mb 1 10 100] [--chunk-kib 64 8] [--dir DIR]

A flush writes the whole in-memory dump to ``stats.h5.new`` and renames it over ``stats.h5``
(pserver/dump/writer.py); this prints the median of five flushes at each size and the share
of the statistics server's time it takes at the default ``stats.flush_interval`` (2 s), once
the writer's stretching of the interval (10 x the flush time) is applied. It also prints how
fast rows are appended (batches of ``BATCH`` rows, as the statistics server appends a message's
rows) and, with several ``--chunk-kib``, the same for each chunk size
(``pserver.dump.writer.CHUNK_BYTES``), measured one after the other in this process.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from pserver.dump import writer
from pserver.dump.schema import GROUPS
from pserver.dump.writer import COPY_SHARE, StatsWriter

GROUP = "gradients"  # one row per applied gradient: the group that grows fastest
COLUMNS = {c.name: np.dtype(c.dtype) for c in GROUPS[GROUP].columns}
ROW_BYTES = sum(dt.itemsize for dt in COLUMNS.values())
BATCH = 1000


def rows(start: int, n: int) -> dict[str, np.ndarray]:
    return {name: np.arange(start, start + n).astype(dt) for name, dt in COLUMNS.items()}


def measure(sizes_mb: list[float], where: str | None) -> None:
    with tempfile.TemporaryDirectory(dir=where) as tmp:
        path = Path(tmp) / "stats.h5"
        w = StatsWriter(path, {"pserver_version": "bench"}, flush_interval=1e9)
        done, appending = 0, 0.0
        head = ("dump MB", "flush ms", "share of time at 2 s", "appends rows/s")
        print(f"{head[0]:>8}  {head[1]:>9}  {head[2]:>21}  {head[3]:>15}")
        for size in sorted(sizes_mb):
            want = int(size * 1e6 / ROW_BYTES)
            t0 = time.perf_counter()
            while done < want:
                n = min(BATCH, want - done)
                w.append(GROUP, **rows(done, n))
                done += n
            appending += time.perf_counter() - t0
            times = []
            for _ in range(5):
                w.flush()
                times.append(w.copy_seconds[-1])
            t = statistics.median(times)
            gap = max(2.0, COPY_SHARE * t)
            mb = path.stat().st_size / 1e6
            print(f"{mb:8.1f}  {1e3 * t:9.1f}  {100 * t / gap:20.1f}%  {done / appending:15.3g}")
        w.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 10, 100])
    parser.add_argument("--chunk-kib", type=float, nargs="+",
                        default=[writer.CHUNK_BYTES / 1024],
                        help="chunk sizes to compare (default: the writer's)")  # fmt: skip
    parser.add_argument("--dir", help="where to write (default: a temporary directory)")
    args = parser.parse_args()
    for kib in args.chunk_kib:
        writer.CHUNK_BYTES = int(kib * 1024)  # read by the writer when it creates a column
        print(f"chunks of {kib:g} KiB:")
        measure(args.sizes_mb, args.dir)


if __name__ == "__main__":
    main()
