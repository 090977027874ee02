#!/usr/bin/env python3
"""Checkpoint figures (issue 14): write time and size, and SIGTERM to the last rank's exit.

For each model (the quickstart MLP; ``model.kind = "null"`` of 64 MiB) it

1. times ``pserver.ckpt.files.write_state`` of one shard's state (the weights and the momentum
   velocity, exactly what ``ServerShard.state`` writes) and ``read_state`` of it, median of
   ``--repeat`` writes, in a fresh directory under ``--dir``;
2. runs the job (7 ranks: 1 shard, 4 learners), sends SIGTERM to ``mpiexec`` once the dump shows
   training under way, and reports the seconds from the signal to the exit of the last rank,
   the exit status (75 expected) and the bytes of the committed generation;
3. with ``--periodic T``: runs the job for ``--epochs`` epochs twice, with
   ``run.checkpoint_interval = T`` and without, and reports the pause one periodic checkpoint
   costs: the difference of the two runs' wall times divided by the periodic generations
   committed, the median "written in" seconds of the statistics rank's log lines, and the
   longest gap between two minibatches of a learner (the ``train`` rows' times).

Timings on a loaded machine are not figures: run it alone, on a quiet node::

    .venv/bin/python scripts/bench_checkpoint.py --dir /tmp/ckbench
    .venv/bin/python scripts/bench_checkpoint.py --dir /tmp/ckbench --periodic 2 --epochs 20
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pserver.ckpt.files import latest, read_state, write_state  # noqa: E402
from pserver.job import launch  # noqa: E402

QUICKSTART = ROOT / "examples" / "quickstart.toml"
MODELS = {
    "quickstart": [],
    "null-64MiB": ["model.kind=null", "model.size_mib=64", "inject.compute_time=0.01"],
}
QUICKSTART_PARAMS = 64 * 64 + 64 + 64 * 10 + 10  # digits: 64 features, hidden 64, 10 classes


def n_params(model: str) -> int:
    return QUICKSTART_PARAMS if model == "quickstart" else 64 * 2**20 // 4


def time_write(model: str, where: Path, repeat: int) -> tuple[float, float, int]:
    """(median write seconds, median read seconds, file bytes) of one shard's state."""
    n = n_params(model)
    rng = np.random.default_rng(0)
    arrays = {"w0": rng.normal(size=n).astype(np.float32),
              "opt0.velocity": rng.normal(size=n).astype(np.float32)}
    attrs = {"role": "server", "blocks": {"0": {"ts": 1, "applied": 1}}}
    path = where / f"{model}.h5"
    writes, reads, size = [], [], 0
    for _ in range(repeat):
        t = time.perf_counter()
        size = write_state(path, arrays, attrs)
        writes.append(time.perf_counter() - t)
        t = time.perf_counter()
        read_state(path)
        reads.append(time.perf_counter() - t)
    return statistics.median(writes), statistics.median(reads), size


def train_rows(dump: Path) -> int:
    try:
        with h5py.File(dump, "r") as f:
            return len(f["train/step"]) if "train/step" in f else 0
    except OSError:
        return 0


def sigterm_run(model: str, out: Path, timeout: float) -> tuple[float, int, int]:
    """(seconds from SIGTERM to the job's end, exit status, bytes of the checkpoint)."""
    args = [str(QUICKSTART), f"run.out_dir={out}", "stats.progress=false", "run.epochs=200",
            "stats.flush_interval=0.2", *MODELS[model]]
    cmd = launch.mpi_command(7, [*launch.pserver_cli(), *args], launch.launcher())
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    try:
        while train_rows(out / "stats.h5") < 10 and proc.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError("training did not start")
            time.sleep(0.05)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=timeout)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.returncode != 75:
        print(output, file=sys.stderr)
    m = latest(out / "checkpoint")
    gen = out / "checkpoint" / f"g{m.generation:06d}" if m else None
    size = sum(p.stat().st_size for p in gen.iterdir()) if gen else 0
    return took, proc.returncode, size


WRITTEN = re.compile(r"checkpoint generation \d+ committed .*written in ([0-9.]+) s \(periodic\)")


def timed_run(model: str, out: Path, interval: float, epochs: int, timeout: float) -> dict:
    """One job to its end: exit status, wall time, periodic generations and their write
    seconds (from the log), the longest gap between two of a learner's minibatches."""
    args = [str(QUICKSTART), f"run.out_dir={out}", "stats.progress=false", f"run.epochs={epochs}",
            f"run.checkpoint_interval={interval}", *MODELS[model]]
    res = launch.run(launch.mpi_command(7, [*launch.pserver_cli(), *args], launch.launcher()),
                     timeout=timeout, cwd=ROOT)
    written = [float(x) for x in WRITTEN.findall(res.output)]
    with h5py.File(out / "stats.h5", "r") as f:
        wall = float(f.attrs["wall_time"])
        learner, t = f["train/learner"][()], f["train/time"][()]
    gap = max((float(np.diff(np.sort(t[learner == r])).max()) for r in np.unique(learner)
               if np.sum(learner == r) > 1), default=0.0)
    return {"code": res.returncode, "wall": wall, "written": written, "gap": gap}


def periodic_cost(model: str, base: Path, interval: float, epochs: int, timeout: float) -> str:
    """The table row of ``--periodic``: the pause of one periodic checkpoint."""
    on = timed_run(model, base / f"periodic-{model}", interval, epochs, timeout)
    off = timed_run(model, base / f"plain-{model}", 0.0, epochs, timeout)
    n = len(on["written"])
    pause = (on["wall"] - off["wall"]) / n if n else float("nan")
    write = statistics.median(on["written"]) if n else float("nan")
    return (f"{model:12s} {on['code']:4d} {n:5d} {off['wall']:8.2f} {on['wall']:8.2f} "
            f"{pause:8.3f} {write:8.3f} {on['gap']:8.3f} {off['gap']:8.3f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--periodic", type=float, default=0.0, metavar="T",
                   help="measure the pause of a periodic checkpoint every T s instead")
    p.add_argument("--epochs", type=int, default=20, help="epochs of each --periodic run")
    a = p.parse_args()
    base = Path(a.dir or tempfile.mkdtemp(prefix="ckbench-"))
    base.mkdir(parents=True, exist_ok=True)
    if a.periodic > 0:
        print(f"{'model':12s} {'exit':>4s} {'gens':>5s} {'wall s':>8s} {'+ckpt s':>8s} "
              f"{'pause s':>8s} {'write s':>8s} {'gap s':>8s} {'gap0 s':>8s}")
        for model in a.models:
            print(periodic_cost(model, base, a.periodic, a.epochs, a.timeout), flush=True)
        return 0
    print(f"{'model':12s} {'shard file':>11s} {'write s':>8s} {'read s':>8s} "
          f"{'SIGTERM->exit s':>15s} {'exit':>4s} {'generation':>11s}")
    for model in a.models:
        w, r, size = time_write(model, base, a.repeat)
        took, code, total = sigterm_run(model, base / f"run-{model}", a.timeout)
        print(f"{model:12s} {size / 2**20:9.2f}Mi {w:8.3f} {r:8.3f} {took:15.2f} {code:4d} "
              f"{total / 2**20:9.2f}Mi", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
