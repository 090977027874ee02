#!/usr/bin/env python3
"""The same λ = 1 training run on the CPU backend and on the GPU backend, compared step by step.

With one learner every protocol is plain minibatch SGD in a fixed order, so the run with
``run.device = "gpu"`` (CuPy arrays in the learner and the server, payloads staged through
pinned host buffers or handed to a CUDA-aware MPI) must follow the run with ``run.device = "cpu"``
up to floating-point rounding: cuBLAS sums in another order than OpenBLAS, and the fused update
kernels are compiled without FMA contraction so that they round like numpy. For every model and
dtype asked for, the script launches both runs (``mpiexec -n 4``: server, statistics server,
data server, learner), reads their dumps and prints

* the largest relative difference of the per-minibatch training loss over the whole run
  (``train/loss``, the loss curve), and at the last step;
* the relative difference of the final weights (``model/weights``), ``‖w_gpu − w_cpu‖ / ‖w_cpu‖``;
* the final test error of both runs.

``--check`` makes it exit 1 when a curve differs by more than ``--rtol`` (default per dtype:
1e-9 for float64, 1e-3 for float32). ``--plot`` writes both loss curves and their relative
difference to ``OUT/loss_curves.png``. Without CuPy or a device it says so and exits 0.

Example (on a GPU machine)::

    python scripts/compare_backends.py --models mlp cnn --dtypes float64 float32 --check --plot
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (  # noqa: E402
    ROOT,
    Launcher,
    bench_parser,
    gpu_missing,
    parse,
    pserver_run,
    table,
    write_json,
)

RTOL = {"float64": 1e-9, "float32": 1e-3}


@dataclass
class Comparison:
    model: str
    dtype: str
    steps: int
    loss_max_rel: float  # over every minibatch of the run
    loss_last_rel: float
    weights_rel: float
    test_error_ref: float  # the first of --devices
    test_error_other: float
    within: bool


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = bench_parser(__doc__, timeout=300.0)
    p.add_argument("--config", type=Path, default=ROOT / "examples" / "quickstart.toml")
    p.add_argument("--models", nargs="+", default=["mlp", "cnn"], choices=["softmax", "mlp", "cnn"])
    p.add_argument("--dtypes", nargs="+", default=["float64", "float32"], choices=list(RTOL))
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument(
        "--devices",
        nargs=2,
        default=["cpu", "gpu"],
        choices=["cpu", "gpu"],
        metavar="DEVICE",
        help="run.device of the reference run and of the compared run (default: cpu gpu)",
    )
    p.add_argument("--rtol", type=float, help="tolerance of --check (default: per dtype)")
    p.add_argument("--check", action="store_true", help="exit 1 when a curve is off tolerance")
    p.add_argument("--plot", action="store_true", help="write OUT/loss_curves.png")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "compare_backends")
    return parse(p, argv)


def train(launcher: Launcher, args: argparse.Namespace, out: Path, overrides: list[str]) -> None:
    cmd = [*pserver_run(args), str(args.config), f"run.out_dir={out}"]
    launcher.run(4, [*cmd, "run.overwrite=true", "stats.progress=false", *overrides, *args.set])


def read(path: Path) -> tuple[np.ndarray, np.ndarray, float]:
    """(training loss per step, final weights, last test error) of a λ = 1 dump."""
    import h5py

    with h5py.File(path, "r", locking=False) as f:
        order = np.argsort(f["train/step"][:], kind="stable")
        return f["train/loss"][:][order], f["model/weights"][:], float(f["test/error"][-1])


def rel(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a - b) / np.maximum(np.abs(b), np.finfo(np.float64).tiny)


def run_dirs(args: argparse.Namespace, model: str, dtype: str) -> list[Path]:
    """Where the reference run and the compared run of a model and dtype write their dumps."""
    return [args.out / f"{model}_{dtype}_{i}_{d}" for i, d in enumerate(args.devices)]


Curves = tuple[np.ndarray, np.ndarray]  # per-minibatch training loss: reference, compared


def compare(
    launcher: Launcher, args: argparse.Namespace, model: str, dtype: str
) -> tuple[Comparison, Curves]:
    """Both runs of one model and dtype, their figures and their loss curves (for the plot)."""
    runs = []
    for out, device in zip(run_dirs(args, model, dtype), args.devices, strict=True):
        overrides = [f"model.kind={model}", f"model.dtype={dtype}", f"run.epochs={args.epochs}"]
        train(launcher, args, out, [*overrides, f"run.device={device}"])
        runs.append(read(out / "stats.h5"))
    (loss_c, w_c, err_c), (loss_g, w_g, err_g) = runs
    if loss_c.shape != loss_g.shape:
        ref, other = args.devices
        raise RuntimeError(
            f"{model}/{dtype}: {loss_c.size} steps on {ref} against {loss_g.size} on {other}"
        )
    diff = rel(loss_g, loss_c)
    w_rel = float(np.linalg.norm(w_g - w_c) / np.linalg.norm(w_c))
    tol = args.rtol if args.rtol is not None else RTOL[dtype]
    within = bool(diff.max() <= tol and w_rel <= tol)
    result = Comparison(
        model, dtype, int(loss_c.size), float(diff.max()), float(diff[-1]), w_rel, err_c, err_g,
        within,
    )  # fmt: skip
    return result, (loss_c, loss_g)


def plot(args: argparse.Namespace, compared: list[tuple[Comparison, Curves]]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    for r, (loss_c, loss_g) in compared:
        label = f"{r.model} {r.dtype}"
        ref, other = args.devices
        (line,) = top.plot(loss_c, lw=1.2, alpha=0.7, label=f"{label} {ref}")
        top.plot(loss_g, lw=0.8, ls="--", color=line.get_color(), label=f"{label} {other}")
        bottom.semilogy(np.maximum(rel(loss_g, loss_c), 1e-18), lw=0.8, label=label)
    top.set_ylabel("training loss (per minibatch)")
    top.set_yscale("log")
    top.legend(fontsize=7, ncol=2)
    ref, other = args.devices
    top.set_title(f"λ = 1: {other} backend against {ref} backend")
    bottom.set_ylabel(f"|loss_{other} − loss_{ref}| / loss_{ref}")
    bottom.set_xlabel("minibatch")
    bottom.legend(fontsize=7)
    fig.tight_layout()
    path = args.out / "loss_curves.png"
    fig.savefig(path, dpi=120)
    return path


def results_table(results: list[Comparison], devices: list[str]) -> str:
    head = ["model", "dtype", "steps", "loss max rel", "loss last rel", "weights rel",
            f"err {devices[0]}", f"err {devices[1]}", "within"]  # fmt: skip
    rows = [
        [r.model, r.dtype, r.steps, f"{r.loss_max_rel:.2e}", f"{r.loss_last_rel:.2e}",
         f"{r.weights_rel:.2e}", f"{r.test_error_ref:.4f}", f"{r.test_error_other:.4f}", r.within]
        for r in results
    ]  # fmt: skip
    return table(head, rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    why = gpu_missing() if "gpu" in args.devices else ""
    if why:
        print(f"no GPU: skipped ({why})")
        return 0
    # The ranks import pserver from this checkout, installed or not.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    args.out.mkdir(parents=True, exist_ok=True)
    launcher = Launcher.from_args(__file__, args)
    compared = [compare(launcher, args, m, d) for m in args.models for d in args.dtypes]
    results = [r for r, _ in compared]
    print(results_table(results, args.devices))
    tol = "per dtype " + json.dumps(RTOL) if args.rtol is None else f"{args.rtol:g}"
    print(f"(tolerance {tol}; dumps under {args.out})")
    if args.plot:
        print(f"loss curves: {plot(args, compared)}")
    write_json(args.json, [asdict(r) for r in results])
    return 1 if args.check and not all(r.within for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
