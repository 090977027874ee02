"""Randomized soak of ADPSGD: many short mpiexec jobs of tests/gossip_prog.py, or (``--cli``)
of whole ``pserver-run`` trainings.

    python scripts/soak_gossip.py --runs 50 --seed 1
    python scripts/soak_gossip.py --runs 50 --seed 1 --cli

Each run draws λ from 2, 3, 5, 8, a comm engine (thread or nonblocking), host staging or not,
and a program seed (which draws every learner's step count, some zero, and its random injected
compute delays); it must exit 0 within the hard timeout with every rank's ``gossip ok`` line
(the program checks that every request was answered once and that the mix kept the sum of the
models). With ``--cli`` each run is a one-epoch training (quickstart digits, a small MLP) with
λ from 2, 3, 5, 8, a drawn ``comm.mode``, emulated compute and maybe one straggler
(``inject.slow_learner``, ``learner_factor`` 2 or 10): it must exit 0 within the timeout with
a dump that passes ``pserver-stats check``, the run's M minibatches taken, and every epoch
tested. Prints one line per run and a summary; exit 1 if any run failed or hung.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

from pserver.job import launch

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "tests" / "gossip_prog.py"


def one(n: int, mode: str, seed: int, staged: bool, timeout: float) -> tuple[str, float, str]:
    args = [sys.executable, str(PROGRAM), mode, str(seed), *(["staged"] if staged else [])]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
    res = launch.run(launch.mpi_command(n, args), timeout, env=env, cwd=ROOT)
    if res.reason:
        return "hang", res.seconds, res.output[-2000:]
    ranks = set(re.findall(r"gossip ok rank (\d+)", res.stdout))
    if res.returncode != 0 or len(ranks) != n:
        return "failed", res.seconds, res.output[-2000:]
    return "ok", res.seconds, ""


CLI_CONFIG = """
[run]
epochs = 1
[protocol]
name = "adpsgd"
[model]
kind = "mlp"
hidden = [16]
[data]
source = "digits"
batch_size = 32
"""


def draw_cli(rng: random.Random) -> tuple[int, list[str]]:
    """λ and the overrides of one ``--cli`` run."""
    n = rng.choice([2, 3, 5, 8])
    sets = [
        f"comm.mode={rng.choice(['thread', 'nonblocking', 'blocking'])}",
        f"run.seed={rng.randrange(1000)}",
        f"inject.compute_time={rng.choice([0.0, 0.002, 0.005])}",
        "comm.stall_timeout=20",
    ]
    if rng.random() < 0.6:
        sets += [f"inject.slow_learner={rng.randrange(n)}",
                 f"inject.learner_factor={rng.choice([2, 10])}"]  # fmt: skip
    return n, sets


def cli_run(n: int, sets: list[str], out: Path, timeout: float) -> tuple[str, float, str]:
    """One training of λ = ``n`` learners in ``out``: ok, failed (with why) or hang."""
    from pserver.dump.check import check_dump
    from pserver.dump.reader import load_dump

    out.mkdir(parents=True, exist_ok=True)
    config = out / "adpsgd.toml"
    config.write_text(CLI_CONFIG)
    args = [*launch.pserver_cli(), str(config), f"run.out_dir={out / 'run'}",
            "stats.progress=false", "run.log_level=warning", *sets]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
    res = launch.run(launch.mpi_command(n + 2, args), timeout, env=env, cwd=ROOT)
    if res.reason:
        return "hang", res.seconds, res.output[-2000:]
    if res.returncode != 0:
        return "failed", res.seconds, res.output[-2000:]
    dump = load_dump(out / "run" / "stats.h5")
    problems = list(check_dump(dump))
    total = -(-int(dump.group("test")["samples"][0]) // 32) if dump.rows("test") else -1
    if int(dump.group("learners")["minibatches"].sum()) != total:
        problems.append(f"minibatches {dump.group('learners')['minibatches']} != M = {total}")
    if dump.group("test")["epoch"].tolist() != [1]:
        problems.append(f"tested epochs {dump.group('test')['epoch']}")
    return ("failed" if problems else "ok"), res.seconds, "; ".join(map(str, problems))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per run")
    ap.add_argument("--cli", action="store_true", help="whole pserver-run trainings")
    a = ap.parse_args(argv)
    rng = random.Random(a.seed)
    outcomes: Counter[str] = Counter()
    if a.cli:
        with tempfile.TemporaryDirectory(prefix="soak_gossip_") as tmp:
            for i in range(a.runs):
                n, sets = draw_cli(rng)
                what, secs, tail = cli_run(n, sets, Path(tmp) / str(i), a.timeout)
                outcomes[what] += 1
                print(f"run {i:3d}: λ={n} {' '.join(sets)} {what} {secs:.1f}s", flush=True)
                if tail:
                    print(tail, flush=True)
        print("summary:", dict(outcomes), flush=True)
        return 0 if outcomes["ok"] == a.runs else 1
    for i in range(a.runs):
        n, mode = rng.choice([2, 3, 5, 8]), rng.choice(["thread", "nonblocking"])
        staged, seed = rng.random() < 0.3, rng.randrange(10**6)
        what, secs, tail = one(n, mode, seed, staged, a.timeout)
        outcomes[what] += 1
        line = f"run {i:3d}: λ={n} {mode:11s} staged={staged!s:5s} seed={seed:6d}"
        line += f" {what} {secs:.1f}s"
        print(line, flush=True)
        if tail:
            print(tail, flush=True)
    print("summary:", dict(outcomes), flush=True)
    return 0 if outcomes["ok"] == a.runs else 1


if __name__ == "__main__":
    sys.exit(main())
