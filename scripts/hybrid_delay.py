#!/usr/bin/env python3
"""Why HYBRID trails SYNC here: one step of gradient delay under heavy momentum, serially.

HYBRID (IBM, Zhang et al. §3) is SYNC with every averaged gradient applied one step late
(σ = 1). With λ learners of minibatch μ both are, step for step, serial SGD on minibatches of
λμ: SYNC is ``learners.serial.train_serial``, HYBRID ``learners.serial.train_serial_delayed``
(both are the references the MPI runs reproduce bit for bit at λ = 1, tests/test_mpi_collective.py).
This script trains both serial references in one process, on the data and minibatch of
``scripts/reproduce_ibm.py``'s Table 2 cell (λ = 4 × μ = 16 = 64), for each momentum given,
over ``--seeds`` seeds, and prints the final test errors with Welch's verdict
(``scripts/claims.py``): where the delayed run is worse serially too, the gap between the
MPI runs is the algorithm's, not the exchange's.

    .venv/bin/python scripts/hybrid_delay.py                    # momentum 0.9 and 0, 3 seeds
    .venv/bin/python scripts/hybrid_delay.py --momentum 0.9 0.5 0 --epochs 5 --seeds 3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import claims
import numpy as np
from benchlib import add_data_args, data_label, data_overrides

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from learners.data import load_dataset  # noqa: E402
from learners.factory import build_model  # noqa: E402
from learners.serial import train_serial, train_serial_delayed  # noqa: E402
from pserver.plan.config import load_config  # noqa: E402


def errors(args: argparse.Namespace, momentum: float) -> tuple[list[float], list[float]]:
    """Final test errors of the serial and the one-step-delayed reference, one per seed."""
    plain, delayed = [], []
    for seed in range(args.seeds):
        cfg = load_config(ROOT / "examples" / "quickstart.toml", [
            *data_overrides(args), f"run.epochs={args.epochs}", "optim.lr_milestones=[]",
            f"data.batch_size={args.learners * 16}", f"run.seed={seed}",
            f"optim.momentum={momentum}",
        ])  # fmt: skip
        data = load_dataset(cfg.data, cfg.run.seed)
        model = build_model(cfg.model, data.n_features, data.n_classes, np)
        for train, out in ((train_serial, plain), (train_serial_delayed, delayed)):
            out.append(float(model.evaluate(train(cfg, data), data.X_test, data.y_test)[1]))
    return plain, delayed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--momentum", type=float, nargs="+", default=[0.9, 0.0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--learners", type=int, default=4, help="λ: the minibatch is λ × 16")
    add_data_args(p)
    args = p.parse_args(argv)
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)  # the figures are per core, as in the MPI runs
    print(f"{data_label(args)}, {args.epochs} epochs, minibatch {args.learners} × 16, "
          f"the quickstart's rate 0.05 without decay, {args.seeds} seeds")  # fmt: skip
    print("| momentum | SYNC's serial reference | HYBRID's (one step late) | verdict |")
    print("|---|---|---|---|")
    for m in args.momentum:
        pe, de = errors(args, m)
        kw = dict(scale=100.0, unit="%")
        plain = claims.Sample.of("SYNC", pe, **kw)
        delayed = claims.Sample.of("HYBRID", de, **kw)
        v = claims.within("", "", delayed, plain, 0.01)  # IBM Table 2's "the same", 1 point
        same = {True: "within 1 point", False: "more than 1 point apart"}.get(v.holds, v.status)
        print(f"| {m:g} | {claims.mean_std(plain)} | {claims.mean_std(delayed)} | {same} |",
              flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
