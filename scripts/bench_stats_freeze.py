"""Does training wait for the statistics server? Freeze it (SIGSTOP) and look at the updates.

    python scripts/bench_stats_freeze.py [-n 7] [--after 3] [--freeze 10] [-- OVERRIDES...]

Runs ``examples/quickstart.toml`` (with OVERRIDES) under mpiexec, stops the statistics rank
(rank = cluster.servers, found by Hydra's PMI_RANK) ``--after`` seconds after it appears, for
``--freeze`` seconds, and prints from the dump: the longest pause between two consecutive
updates of shard 0, and the updates per second before, during and after the freeze (update
times of the dump are seconds since the run's start; the freeze's place among them is taken
from the launch, so allow ~1 s of start-up). On the code before issue 10 the pause was the
whole freeze (9.9 s of 10).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pserver.dump.reader import load_dump  # noqa: E402
from tests.mpirun import mpiexec  # noqa: E402
from tests.test_mpi_stats_offpath import rank_pid  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=7)
    parser.add_argument("--after", type=float, default=3.0)
    parser.add_argument("--freeze", type=float, default=10.0)
    parser.add_argument("--stats-rank", type=int, default=1)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out:
        cmd = [mpiexec(), "-n", str(args.n), sys.executable, "-m", "pserver.job.cli",
               str(ROOT / "examples" / "quickstart.toml"), f"run.out_dir={out}",
               "run.epochs=400", "stats.progress=false", *args.overrides]  # fmt: skip
        launched = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL)
        try:
            while (pid := rank_pid(proc.pid, args.stats_rank)) is None:
                assert proc.poll() is None, "the run ended before its statistics rank was found"
                time.sleep(0.05)
            time.sleep(args.after)
            os.kill(pid, signal.SIGSTOP)
            stopped = time.monotonic() - launched
            time.sleep(args.freeze)
            os.kill(pid, signal.SIGCONT)
            proc.wait(timeout=600)
        finally:
            proc.kill()
        dump = load_dump(Path(out) / "stats.h5")
    upd = dump.group("updates")
    t = np.sort(upd["time"][upd["shard"] == 0])
    gaps = np.diff(t)
    i = int(np.argmax(gaps))
    print(f"updates {len(t)}, run {t[-1]:.1f} s; longest pause between updates "
          f"{gaps[i]:.2f} s at t={t[i]:.1f} s (freeze began ~{stopped:.1f} s after launch)")
    for name, lo, hi in (("before", 0.0, stopped - 1), ("during", stopped, stopped + args.freeze),
                         ("after", stopped + args.freeze + 1, t[-1])):  # fmt: skip
        n = int(np.sum((t >= lo) & (t < hi)))
        print(f"  {name:>6} [{lo:6.1f}, {hi:6.1f}) s: {n / max(hi - lo, 1e-9):8.1f} updates/s")
    print(f"dropped statistics rows {dump.attrs.get('dropped_records_total', 0)}, "
          f"skipped tests {dump.rows('skipped_tests')}")


if __name__ == "__main__":
    main()
