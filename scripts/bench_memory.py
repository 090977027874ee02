"""Peak resident memory of every rank of a job that trains on a large HDF5 file.

Makes an HDF5 file of ``--size-mb`` MB (float32 samples of 784 features, 10 classes), runs the
quickstart MLP on it for one epoch on ``--np`` ranks, and prints each rank's role and peak
resident memory (``VmHWM`` of ``/proc/self/status``, read by each rank as it exits), then the
total. ``--code DIR`` runs the pserver of another checkout (e.g. the commit before only the
data and statistics servers loaded the data) with this script, for a before/after table::

    python scripts/bench_memory.py                        # this checkout
    git worktree add /tmp/before <commit> && python scripts/bench_memory.py --code /tmp/before

Each rank reports through a ``sitecustomize`` module put on its ``PYTHONPATH``, which records
``VmHWM`` at exit under the rank's launcher rank (Hydra's ``PMI_RANK``, Open MPI's
``OMPI_COMM_WORLD_RANK``); pserver itself knows nothing of it. Linux only.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pserver.job import launch  # noqa: E402

FEATURES = 784
SITECUSTOMIZE = """
import atexit, os
_rank = os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK")
_out = os.environ.get("PSERVER_BENCH_MEM")
def _report():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            with open(os.path.join(_out, f"rank-{_rank}"), "w") as f:
                f.write(line.split()[1])
if _rank is not None and _out:
    atexit.register(_report)
"""


def make_file(path: Path, size_mb: float, seed: int = 0) -> int:
    """Write X (N x 784 float32, about ``size_mb`` MB) and y to ``path``; N."""
    import h5py

    n = int(size_mb * 1e6 // (4 * FEATURES))
    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as f:
        X = f.create_dataset("X", (n, FEATURES), dtype="float32")
        for start in range(0, n, 8192):  # written in slices: this process stays small
            stop = min(n, start + 8192)
            X[start:stop] = rng.random((stop - start, FEATURES), dtype=np.float32)
        f.create_dataset("y", data=rng.integers(0, 10, n))
    return n


def roles(n: int) -> list[str]:
    """The quickstart's roles (one shard, flat) for ``n`` ranks."""
    return ["server 0", "stats server", "data server"] + [f"learner {i}" for i in range(n - 3)]


def table(n: int, reports: Path) -> str:
    lines = [f"{'rank':>4}  {'role':<14} {'peak RSS (VmHWM)':>18}"]
    total = 0
    for rank, role in enumerate(roles(n)):
        f = reports / f"rank-{rank}"
        kib = int(f.read_text()) if f.exists() else None
        total += kib or 0
        shown = f"{kib / 1024:.0f} MiB" if kib is not None else "no report"
        lines.append(f"{rank:>4}  {role:<14} {shown:>18}")
    lines.append(f"{'':>4}  {'total':<14} {total / 1024:>14.0f} MiB")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mb", type=float, default=230.0, help="HDF5 file size (default 230)")
    p.add_argument("--np", type=int, default=7, help="ranks (default 7: 4 learners)")
    p.add_argument("--code", default=str(ROOT), help="the pserver checkout to run")
    p.add_argument("--timeout", type=float, default=600.0)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench_memory_") as tmp:
        tmp_path = Path(tmp)
        site, reports = tmp_path / "site", tmp_path / "reports"
        site.mkdir()
        reports.mkdir()
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
        data = tmp_path / "big.h5"
        n = make_file(data, args.size_mb)
        print(f"{data.stat().st_size / 1e6:.0f} MB HDF5 file: {n} x {FEATURES} float32; "
              f"pserver from {args.code}")  # fmt: skip
        cmd = launch.mpi_command(args.np, [
            *launch.pserver_cli(), str(Path(args.code) / "examples" / "quickstart.toml"),
            "data.source=hdf5", f"data.path={data}", "data.batch_size=256", "run.epochs=1",
            "model.hidden=[16]", f"run.out_dir={tmp_path / 'run'}", "stats.progress=false",
            "run.log_level=warning",
        ])  # fmt: skip
        env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{args.code}",
               "PSERVER_BENCH_MEM": str(reports), "PYTHONUNBUFFERED": "1"}  # fmt: skip
        job = launch.run(cmd, args.timeout, env=env, cwd=tmp_path)
        if job.returncode != 0 or job.reason:
            print(job.output[-3000:], file=sys.stderr)
            print(f"bench_memory: the job failed ({job.reason or job.returncode})", file=sys.stderr)
            return 1
        print(table(args.np, reports))
    return 0


if __name__ == "__main__":
    sys.exit(main())
