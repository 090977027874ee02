#!/usr/bin/env python3
"""Step time of a PyTorch model trained through pserver against a plain PyTorch loop.

For each model (``--models``: the MLP and the CNN of ``examples/torch_cnn.py``) on the digits,
with ``--batch`` samples per minibatch and one thread per process (as a rank runs), it times:

==========  ==================================================================================
plain       the baseline, in this process: ``zero_grad``, forward, backward,
            ``torch.optim.SGD.step`` on the module itself (what a PyTorch user writes)
trainer     pserver's side of a step, in this process: ``TorchModel.loss_grad`` on pserver's
            flat buffers (parameters and gradients are views, two weight buffers alternating
            as a learner's pulls swap them) and pserver's SGD update of the flat vector
pserver     a real λ = 1 hardsync run (``mpiexec -n 4``: shard, statistics, data server,
            learner): the learner's wall time per minibatch, from the dump's ``train`` rows
            (compute, the push, the pull of the new model, the next minibatch), median over
            the steps after ``--warmup``
==========  ==================================================================================

Printed: milliseconds per step (medians over ``--repeats``) and each one's overhead against
``plain``, measured in the same run: ``(t / t_plain - 1)``. The goal of the issue is < 10 %
per step; ``trainer`` is the adapter's own cost (views, zeroing the gradient, the flat update),
``pserver`` adds what data parallelism costs with one learner (two messages a step and the
minibatch from the data server), which no plain loop pays and which shrinks relative to the
step as the model's compute grows (``--batch``, ``--hidden``).

Example (a quiet machine; the figures in docs/models.md)::

    .venv/bin/python scripts/bench_torch.py --repeats 3 --batch 64 --json /tmp/bench_torch.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import (
    ROOT,
    Launcher,
    bench_parser,
    idle_summary,
    median,
    parse,
    pserver_run,
    table,
    write_json,
)

EXAMPLE = ROOT / "examples" / "torch_cnn.py"
FACTORIES = {"mlp": "build_mlp", "cnn": "build"}


def parser() -> argparse.ArgumentParser:
    p = bench_parser(__doc__, repeats=3, timeout=600.0)
    p.add_argument("--models", nargs="+", choices=sorted(FACTORIES), default=["mlp", "cnn"])
    p.add_argument("--batch", type=int, default=64, help="samples per minibatch")
    p.add_argument("--steps", type=int, default=200, help="timed steps per in-process repeat")
    p.add_argument("--warmup", type=int, default=20, help="steps left out of every timing")
    p.add_argument("--epochs", type=int, default=8, help="epochs of each pserver run")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    p.add_argument("--no-mpi", action="store_true", help="only the in-process timings")
    return p


def dataset(batch: int) -> Any:
    from learners.data import load_dataset
    from pserver.plan.config import load_config

    cfg = load_config(None, [f"data.batch_size={batch}"])
    return load_dataset(cfg.data, cfg.run.seed)


def batches(ds: Any, batch: int, n: int) -> list[tuple[Any, Any]]:
    from learners.data import BatchSampler

    sampler = BatchSampler(len(ds.y_train), batch, 0)
    out = []
    for _ in range(n):
        idx = sampler.next()
        out.append((ds.X_train[idx], ds.y_train[idx]))
    return out


def per_step(steps: dict[str, Any], data: list[tuple[Any, Any]], warmup: int,
             window: int = 10) -> dict[str, float]:
    """Seconds per call of each ``fn(X, y)`` of ``steps`` over ``data`` (the first ``warmup``
    calls of each left out), the functions taking turns every ``window`` minibatches so that a
    change in the machine's load hits them alike."""
    for fn in steps.values():
        for X, y in data[:warmup]:
            fn(X, y)
    spent = dict.fromkeys(steps, 0.0)
    timed = data[warmup:]
    for a in range(0, len(timed), window):
        for name, fn in steps.items():
            t = time.perf_counter()
            for X, y in timed[a : a + window]:
                fn(X, y)
            spent[name] += time.perf_counter() - t
    return {name: v / max(len(timed), 1) for name, v in spent.items()}


def plain_step(model: str, ds: Any, dtype: str, lr: float = 0.05) -> Any:
    import torch

    from learners.loader import load_factory

    net = load_factory(f"{EXAMPLE}:{FACTORIES[model]}")(ds.n_features, ds.n_classes)
    tdtype = getattr(torch, dtype)
    net = net.to(tdtype)
    opt = torch.optim.SGD(net.parameters(), lr=lr)

    def step(X: Any, y: Any) -> float:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(torch.from_numpy(X).to(tdtype)),
                                                 torch.from_numpy(y))
        loss.backward()
        opt.step()
        return float(loss.detach())

    return step


def trainer_step(model: str, ds: Any, dtype: str, lr: float = 0.05) -> Any:
    import numpy as np

    from learners.factory import build_model
    from pserver.optim.rules import make_updater
    from pserver.plan.config import load_config

    cfg = load_config(None, ["model.kind=torch", f"model.module={EXAMPLE}:{FACTORIES[model]}",
                             f"model.dtype={dtype}", "optim.rule=sgd", f"optim.lr={lr}",
                             "optim.weight_decay=0"])
    m = build_model(cfg.model, ds.n_features, ds.n_classes, np)
    buffers = [m.init_params(0), m.init_params(0)]  # a learner's compute and comm buffers
    grad = np.empty_like(buffers[0])
    updater = make_updater(cfg.optim, m.n_params, np, buffers[0].dtype)
    state = {"i": 0}

    def step(X: Any, y: Any) -> float:
        w = buffers[state["i"] % 2]
        state["i"] += 1
        loss, _ = m.loss_grad(w, X, y, grad)
        updater.step(w, grad, lr)
        return loss

    return step


def in_process(args: argparse.Namespace, model: str) -> dict[str, float]:
    import torch

    torch.set_num_threads(1)  # what run.blas_threads = 0 gives every rank
    ds = dataset(args.batch)
    data = batches(ds, args.batch, args.steps + args.warmup)
    steps = {"plain": plain_step(model, ds, args.dtype),
             "trainer": trainer_step(model, ds, args.dtype)}
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(args.repeats):
        for name, t in per_step(steps, data, args.warmup).items():
            times[name].append(t)
    return {k: median(v) for k, v in times.items()}


def through_pserver(args: argparse.Namespace, launcher: Launcher, model: str,
                    tmp: Path) -> dict[str, float]:
    from pserver.dump.reader import load_dump

    walls, computes = [], []
    for rep in range(args.repeats):
        out = tmp / f"{model}_{rep}"
        launcher.run(4, [*pserver_run(args), str(ROOT / "examples" / "torch_cnn.toml"),
                         f"run.out_dir={out}", f"model.module={EXAMPLE}:{FACTORIES[model]}",
                         "protocol.name=hardsync", "optim.rule=sgd", "optim.weight_decay=0",
                         f"data.batch_size={args.batch}", f"run.epochs={args.epochs}",
                         f"model.dtype={args.dtype}", "stats.progress=false", *args.set])
        t = load_dump(out / "stats.h5").group("train")
        times, compute = t["time"][args.warmup:], t["compute_time"][args.warmup:]
        if len(times) < 3:
            raise RuntimeError(f"{model}: only {len(t['time'])} steps; raise --epochs")
        walls.append(statistics.median(b - a for a, b in zip(times, times[1:], strict=False)))
        computes.append(statistics.median(compute))
    return {"pserver": median(walls), "pserver_compute": median(computes)}


def main(argv: list[str] | None = None) -> int:
    args = parse(parser(), argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        print("bench_torch: PyTorch is missing: pip install -e .[torch]", file=sys.stderr)
        return 2
    launcher = Launcher.from_args(__file__, args)
    rows, doc = [], {}
    with tempfile.TemporaryDirectory(prefix="bench_torch_") as tmp:
        for model in args.models:
            launcher.wait_quiet()
            figures = in_process(args, model)
            if not args.no_mpi:
                figures.update(through_pserver(args, launcher, model, Path(tmp)))
            doc[model] = figures
            base = figures["plain"]
            for name in ("plain", "trainer", "pserver"):
                if name in figures:
                    over = "baseline" if name == "plain" else f"{figures[name] / base - 1:+.1%}"
                    rows.append([f"{model} {name}", f"{figures[name] * 1e3:.3f}",
                                 f"{figures[name] / base:.3f}", over])
            if "pserver_compute" in figures:
                c = figures["pserver_compute"]
                rows.append([f"{model} pserver (compute only)", f"{c * 1e3:.3f}",
                             f"{c / base:.3f}", f"{c / base - 1:+.1%}"])
    print(table(["model / path", "ms/step", "ratio", "overhead"], rows,
                title=f"torch step time, batch {args.batch}, {args.dtype}, 1 thread per "
                f"process, medians of {args.repeats}"))
    print(idle_summary(launcher.idle_seen))
    write_json(args.json, {"args": {k: str(v) for k, v in vars(args).items()}, "figures": doc})
    return 0


if __name__ == "__main__":
    sys.exit(main())
