#!/usr/bin/env python3
"""Reproduce Tables 1–3 of BMUF (Chen & Huo, "Scalable training of deep learning machines by
incremental block training with intra-block parallel optimization and blockwise model-update
filtering") on this machine: MA vs BMUF-CBM vs BMUF-NBM vs serial SGD at λ = 4 and 8.

The paper trains DBLSTMs and DNNs for speech on N = 8–64 GPUs; each block of data is split in N
parts, every worker runs τ minibatch steps of momentum SGD on its part from the global model,
and the master then either averages the local models (MA) or filters the averaged update with
block momentum (eqs. 2–6): classical (CBM, eq. 5) or Nesterov (NBM, eq. 6), with η = 1 − 1/N
and ζ = 1 (eq. 10). Tables 1–3 list, per method and partition N × M (M blocks per sweep), the
test WER and the training speedup over single-GPU SGD with the same data passes. The claim:
MA degrades as N grows, BMUF keeps (or beats) the serial accuracy, NBM ≥ CBM.

Here the same four methods run on the quickstart MLP (one hidden layer of 64) over
Fashion-MNIST (``--data``: the first ``--train-samples`` = 10,000 training images, tested on the
full t10k set), or with ``--data teacher`` over a task made on the spot by ``learners.teacher``
(labels of a random tanh teacher network with Gumbel noise; written to an HDF5 file in
``--out``), or the quickstart's digits (``--data digits``): pserver's ``ma`` and
``bmuf`` (``protocol.nesterov`` false/true) with λ learners and one shard (the master), and the
serial baseline as a λ = 1 ``hardsync`` run (bit for bit serial momentum SGD). Every run makes
the same number of passes over the data (``--epochs``). The local learning rate is the serial
one for BMUF (§2.3: γ_b in the range of γ_s, the filter restoring the per-minibatch
contribution) and λ times it for MA (§2.3, eq. 8: "we should set γ_m about N times of γ_s";
``--ma-lr-scale`` changes the factor).

The second table is the cost of a block: the wall time between two rounds of the master
(``rounds/time``) against τ local steps of compute (τ × the learners' median ``compute_time``
per minibatch): what the exchange (one model push, the master's averaging and filtering, one
pull) adds per block, amortized over τ steps.

The claims, judged per λ in 4..8 by ``scripts/claims.py`` on the final test error over the
seeds (``--repeats``, 3 by default; repeat r runs with ``run.seed = r``): BMUF ≥ MA (CBM's and
NBM's mean error not above MA's by more than the seeds' spread: a Welch one-sided t-test at
p < 0.05 decides "above") and NBM ≥ CBM (the same rule). ``--quick`` (λ = 2) cannot show a
claim made at 4–8 learners and says so.

Example::

    python scripts/reproduce_bmuf.py                      # λ = 4 and 8, τ = 4, 5 epochs, 3 seeds
    python scripts/reproduce_bmuf.py --learners 4 8 16 --tau 8
    python scripts/reproduce_bmuf.py --quick              # a small smoke run
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import claims
import numpy as np
from benchlib import (
    ROOT,
    Launcher,
    add_data_args,
    bench_parser,
    data_label,
    data_overrides,
    idle_summary,
    parse,
    pserver_run,
    table,
    write_json,
)
from benchlib import median as _median

from learners.data import write_hdf5_dataset
from learners.teacher import teacher_task
from pserver.dump.check import check_dump
from pserver.dump.reader import load_dump

QUICKSTART = ROOT / "examples" / "quickstart.toml"
METHODS = {  # name -> overrides (the learning rate is set per run)
    "MA": ["protocol.name=ma"],
    "BMUF-CBM": ["protocol.name=bmuf", "protocol.nesterov=false"],
    "BMUF-NBM": ["protocol.name=bmuf", "protocol.nesterov=true"],
}


@dataclass
class Run:
    method: str
    learners: int
    tau: int
    final_error: float  # test error of the last model, %
    best_error: float  # lowest test error of any epoch, %
    seconds: float  # wall time of training (the dump's wall_time)
    seed: int  # run.seed
    blocks: int  # master rounds (parallel), or updates (serial)
    block_seconds: float  # median wall time between two rounds
    step_seconds: float  # median compute time of one minibatch at a learner
    problems: int  # pserver-stats check lines


def main(argv: list[str] | None = None) -> int:
    p = bench_parser(__doc__, repeats=3, timeout=900.0, quiet_idle=0.0)
    p.add_argument("--learners", type=int, nargs="+", default=[4, 8], help="λ values")
    p.add_argument("--tau", type=int, default=4, help="local steps per block (default 4)")
    p.add_argument("--epochs", type=int, default=5, help="data passes (default 5)")
    p.add_argument("--lr", type=float, default=0.05, help="serial and local lr (default 0.05)")
    p.add_argument("--ma-lr-scale", type=float, default=None,
                   help="MA's local lr is this times --lr (default: λ, eq. 8)")
    p.add_argument("--batch", type=int, default=32, help="minibatch size (default 32)")
    p.add_argument("--samples", type=int, default=20000, help="teacher task size")
    p.add_argument("--noise", type=float, default=0.1, help="teacher label noise (Gumbel T)")
    p.add_argument("--sharpness", type=float, default=1.0, help="teacher nonlinearity")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "reproduce_bmuf")
    p.add_argument("--compute", type=float, default=0.0,
                   help="emulated compute per minibatch, s (inject.compute_time; default 0)")
    p.add_argument("--quick", action="store_true", help="λ = 2, 2 epochs: a smoke run")
    add_data_args(p, extra=("teacher",))
    args = parse(p, argv)
    if args.quick:
        args.learners, args.epochs, args.samples = [2], 2, 4000
        args.train_samples = min(args.train_samples or 4000, 4000)
    if args.tau < 1 or args.epochs < 1 or min(args.learners) < 1:
        p.error("--tau, --epochs and --learners must be >= 1")
    args.out.mkdir(parents=True, exist_ok=True)
    launcher = Launcher.from_args(__file__, args)
    common = [
        *data_sets(args), f"data.batch_size={args.batch}",
        f"run.epochs={args.epochs}", "optim.lr_milestones=[]", "stats.progress=false",
        "run.overwrite=true", f"inject.compute_time={args.compute}", *args.set,
    ]  # fmt: skip
    runs: list[Run] = []
    serial_s = [in_process_serial(common, args, r) for r in range(args.repeats)]
    for r in range(args.repeats):
        seed = [f"run.seed={r}"]
        runs.append(one(launcher, args, "serial SGD", 1, args.lr,
                        ["protocol.name=hardsync", *seed, *common], r))  # fmt: skip
        for lam in args.learners:
            for method, over in METHODS.items():
                scale = (args.ma_lr_scale or lam) if method == "MA" else 1.0
                sets = [*over, f"protocol.tau={args.tau}", *seed, *common]
                runs.append(one(launcher, args, method, lam, args.lr * scale, sets, r))
    report(runs, args, _median(serial_s))
    found = verdicts(runs)
    print("\n" + claims.report(found))
    write_json(args.json, {"args": {k: str(v) for k, v in vars(args).items()},
                           "runs": [asdict(x) for x in runs],
                           "claims": [asdict(v) for v in found]})  # fmt: skip
    bad = sum(x.problems for x in runs)
    print(idle_summary(launcher.idle_seen))
    if bad:
        print(f"{bad} pserver-stats check problem(s): see the dumps under {args.out}")
    return 1 if bad else 0


def data_sets(args: Any) -> list[str]:
    """The data overrides: benchlib's ``--data``, or the teacher task written to ``--out``."""
    if args.data != "teacher":
        return data_overrides(args)
    data = args.out / "teacher.h5"
    task = teacher_task(args.samples, noise=args.noise, seed=0, sharpness=args.sharpness)
    write_hdf5_dataset(data, *task)
    return ["data.source=hdf5", f"data.path={data}"]


def train_size(args: Any) -> int:
    """Training samples of one pass (the teacher task keeps 75 %: test_fraction 0.25)."""
    if args.data == "teacher":
        return int(args.samples * 0.75)
    if args.data == "digits":
        return 1347  # the quickstart's split of 1,797 images
    return args.train_samples or 60_000


def in_process_serial(common: list[str], args: Any, seed: int) -> float:
    """Seconds of plain serial momentum SGD in this process (``learners.serial``): the
    compute alone, plus the emulated compute of ``--compute`` per minibatch."""
    from learners.data import load_dataset
    from learners.serial import serial_steps, train_serial
    from pserver.plan.config import load_config

    over = [*common, f"run.seed={seed}", f"optim.lr={args.lr}", "run.out_dir=/nonexistent"]
    cfg = load_config(QUICKSTART, over)
    ds = load_dataset(cfg.data, cfg.run.seed)
    started = time.perf_counter()
    train_serial(cfg, ds)
    steps = serial_steps(cfg, len(ds.y_train))
    return time.perf_counter() - started + steps * args.compute


def one(
    launcher: Launcher, args: Any, method: str, lam: int, lr: float, over: list[str], repeat: int
) -> Run:
    """One pserver job: λ learners, one shard, the statistics and data servers."""
    tag = f"{method.replace(' ', '_')}-{lam}-r{repeat}"
    out = args.out / tag
    cmd = [*pserver_run(args), str(QUICKSTART), f"run.out_dir={out}", f"optim.lr={lr}", *over]
    launcher.run(lam + 3, cmd, log=args.out / f"{tag}.log")
    dump = load_dump(out / "stats.h5")
    err = dump.group("test")["error"] * 100.0
    rounds = dump.group("rounds")
    times = rounds["time"] if rounds else dump.group("updates")["time"]
    run = Run(
        method=method, learners=lam, tau=args.tau if rounds else 1,
        final_error=float(err[-1]), best_error=float(err.min()), seed=repeat,
        seconds=float(dump.attrs.get("wall_time", float("nan"))), blocks=len(times),
        block_seconds=_median(np.diff(times)) if len(times) > 1 else float("nan"),
        step_seconds=_median(dump.group("train")["compute_time"]),
        problems=len(check_dump(dump)),
    )  # fmt: skip
    print(f"  {method:10s} λ={lam} seed {repeat}: error {run.final_error:.2f} % "
          f"(best {run.best_error:.2f}), {run.seconds:.1f} s",
          file=sys.stderr, flush=True)  # fmt: skip
    return run


def data_name(args: Any) -> str:
    return "teacher task" if args.data == "teacher" else data_label(args)


def spread(values: list[float]) -> str:
    """``mean ± std`` over the seeds (``scripts/claims.py``)."""
    s = claims.Sample.of("", values)
    return f"{s.mean:.2f}" + (f" ± {s.std:.2f}" if s.n > 1 else "")


def verdicts(runs: list[Run]) -> list[claims.Verdict]:
    """BMUF ≥ MA and NBM ≥ CBM at each λ in 4..8 (the paper's Tables 1–3: N = 8–64 GPUs,
    BMUF keeps the serial WER where MA degrades, NBM at or below CBM), on the final test error
    over the seeds; a λ outside 4..8 cannot show them."""
    where = "BMUF Tables 1-3"
    lams = sorted({x.learners for x in runs if x.learners > 1})
    shown = [lam for lam in lams if 4 <= lam <= 8]
    if not shown:
        why = f"λ = {', '.join(map(str, lams))}: the claims are made at 4-8 learners"
        return [claims.not_tested(where, "BMUF >= MA at 4-8 learners", why),
                claims.not_tested(where, "NBM >= CBM at 4-8 learners", why)]  # fmt: skip

    def errors(method: str, lam: int) -> claims.Sample:
        values = [x.final_error for x in runs if x.method == method and x.learners == lam]
        return claims.Sample.of(f"{method} λ={lam}", values, unit="%")

    out = []
    for lam in shown:
        ma, cbm, nbm = (errors(m, lam) for m in METHODS)
        out.append(claims.both(
            where, f"BMUF >= MA at λ = {lam} (test error no higher)",
            claims.no_worse(where, "CBM <= MA", cbm, ma),
            claims.no_worse(where, "NBM <= MA", nbm, ma),
        ))  # fmt: skip
        out.append(claims.no_worse(where, f"NBM >= CBM at λ = {lam} (test error no higher)",
                                   nbm, cbm))  # fmt: skip
    return out


def report(runs: list[Run], args: Any, base: float) -> None:
    """``base``: seconds of in-process serial SGD, the speedups' reference."""
    per_epoch = train_size(args) / args.batch  # minibatches per epoch
    rows = []
    for method in [*METHODS, "serial SGD"]:
        for lam in sorted({x.learners for x in runs if x.method == method}):
            sel = [x for x in runs if x.method == method and x.learners == lam]
            m = round(per_epoch / (lam * sel[0].tau))
            rows.append([
                method, f"{lam} × {m}" if lam > 1 else "—",
                spread([x.final_error for x in sel]), spread([x.best_error for x in sel]),
                f"{_median(x.seconds for x in sel):.1f}",
                f"{base / _median(x.seconds for x in sel):.2f}",
            ])  # fmt: skip
    print(table(
        ["training method", "partition λ × M", "test error %", "best %", "time s", "speedup"],
        rows,
        title=f"Tables 1–3 layout: {data_name(args)}, {args.epochs} data passes, τ = {args.tau}, "
        f"lr {args.lr} (MA ×{args.ma_lr_scale or 'λ'}); errors mean ± std over "
        f"{args.repeats} seed(s), times medians",
    ))  # fmt: skip
    print(f"speedup: against {base:.1f} s of in-process serial SGD (the serial SGD row is "
          "the same algorithm as a λ = 1 pserver job, a server round trip per minibatch)")
    print()
    rows = []
    for x in runs:
        if x.learners == 1:
            continue
        compute = x.tau * x.step_seconds
        rows.append([
            f"{x.method} λ={x.learners}", f"{x.block_seconds * 1e3:.2f}", f"{compute * 1e3:.2f}",
            f"{(x.block_seconds - compute) * 1e3:.2f}", f"{x.block_seconds / compute:.2f}",
        ])  # fmt: skip
    print(table(
        ["run", "block ms", "τ steps compute ms", "exchange ms", "block / compute"], rows,
        title=f"The cost of a block (τ = {args.tau}) against τ steps of serial compute",
    ))  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
