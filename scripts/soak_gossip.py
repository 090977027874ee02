"""Randomized soak of ADPSGD's exchange: many short mpiexec jobs of tests/gossip_prog.py.

    python scripts/soak_gossip.py --runs 50 --seed 1

Each run draws λ from 2, 3, 5, 8, a comm engine (thread or nonblocking), host staging or not,
and a program seed (which draws every learner's step count, some zero, and its random injected
compute delays); it must exit 0 within the hard timeout with every rank's ``gossip ok`` line
(the program checks that every request was answered once and that the mix kept the sum of the
models). Prints one line per run and a summary; exit 1 if any run failed or hung.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys
from collections import Counter
from pathlib import Path

from pserver import launch

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per run")
    a = ap.parse_args(argv)
    rng = random.Random(a.seed)
    outcomes: Counter[str] = Counter()
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
