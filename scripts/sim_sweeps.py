"""Questions pserver-sim answers at scales no real run here reaches (docs/simulation.md).

``python scripts/sim_sweeps.py fig3 [--learners 30 300 3000 30000] [--steps 20]``: Rudra's
Fig. 3 (⟨σ⟩ ≈ n and σ ≤ 2n under n-softsync) for n = 1, 4, 16 and λ (async) at each λ.

``python scripts/sim_sweeps.py psp [--learners 32 320 3200] [--steps 20]``: what PSP-SGD's
partial pushing (c = λ/2) saves against hardsync when 0.16 % of the pull replies are held 4 s
(PSP-SGD §4.2's straggler model): samples/s of each and their ratio.

``python scripts/sim_sweeps.py adpsgd [--learners 100 1000 3000] [--steps 10]``: ADPSGD
against SYNC when one learner computes ``--factor`` (10) times longer than the others
(``inject.slow_learner``, ``inject.learner_factor``; one in 1,000 at λ = 1,000): samples/s of
each, their ratio, and ADPSGD's σ. ``[inject]`` slows one learner, so at λ = 100 it is one in
100 and at λ = 10,000 one in 10,000 (the table says which).

Each simulation runs the quickstart model on synthetic data sized so that every learner
computes about ``--steps`` minibatches, with ``--set`` overrides (e.g. a fitted cost model,
``sim.compute=0.02``); the wall time and peak memory of the largest case are printed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from benchlib import ROOT, table

from pserver.dump.reader import load_dump, summarize
from pserver.plan.config import load_config
from pserver.sim.engine import simulate

CONFIG = ROOT / "examples" / "quickstart.toml"
BATCH = 16


def run(work: Path, name: str, n: int, steps: int, keys: list[str]) -> dict:
    samples = int(steps * n * BATCH / 0.75) + 1  # data.test_fraction = 0.25 of it is held out
    cfg = load_config(str(CONFIG), [
        f"run.out_dir={work / name}", f"cluster.learners={n}", "data.source=synthetic",
        f"data.n_samples={samples}", "run.epochs=1", f"data.batch_size={BATCH}", *keys])
    t = time.perf_counter()
    out = simulate(cfg)
    s = summarize(load_dump(out.dump))
    return {"sigma": s["staleness"]["mean"], "max": s["staleness"]["max"],
            "p99": s["staleness"]["p99"], "rate": s["samples_per_s"],
            "wall": time.perf_counter() - t, "rss": out.peak_rss_mib, "events": out.events}


def fig3(args: argparse.Namespace, work: Path) -> None:
    rows = []
    for lam in args.learners:
        for n in sorted({1, 4, 16, lam}):
            if n > lam:
                continue
            keys = ["protocol.name=async"] if n == lam else ["protocol.name=softsync",
                                                              f"protocol.n={n}"]
            r = run(work, f"fig3_{lam}_{n}", lam, args.steps, [*keys, *args.set])
            rows.append([str(lam), "async" if n == lam else str(n), f"{r['sigma']:.2f}",
                         f"{r['sigma'] / n:.2f}", str(r["max"]), f"{r['max'] / n:.2f}",
                         f"{r['wall']:.1f}", f"{r['rss']:.0f}"])
            print("  " + "  ".join(rows[-1]), file=sys.stderr, flush=True)
    print(table(["λ", "n", "⟨σ⟩", "⟨σ⟩/n", "max σ", "max σ/n", "wall s", "peak RSS MiB"], rows,
                title="n-softsync simulated: Rudra Fig. 3 (⟨σ⟩ ≈ n, σ ≤ 2n)"))


def psp(args: argparse.Namespace, work: Path) -> None:
    rows = []
    delays = ["inject.pull_delay_prob=0.0016", "inject.pull_delay=4.0", *args.set]
    for lam in args.learners:
        h = run(work, f"psp_h_{lam}", lam, args.steps, ["protocol.name=hardsync", *delays])
        p = run(work, f"psp_p_{lam}", lam, args.steps,
                ["protocol.name=psp", f"protocol.c={max(1, lam // 2)}", *delays])
        rows.append([str(lam), f"{h['rate']:.0f}", f"{p['rate']:.0f}",
                     f"{p['rate'] / h['rate']:.2f}", f"{p['sigma']:.2f}",
                     f"{h['wall'] + p['wall']:.1f}"])
        print("  " + "  ".join(rows[-1]), file=sys.stderr, flush=True)
    print(table(["λ", "hardsync samples/s", "psp c=λ/2", "psp/hardsync", "psp ⟨σ⟩", "wall s"],
                rows, title="PSP-SGD's partial pushing against hardsync, 0.16 % of replies 4 s "
                            "late (simulated)"))


def adpsgd(args: argparse.Namespace, work: Path) -> None:
    rows = []
    for lam in args.learners:
        slow = [f"inject.slow_learner={lam // 2}", f"inject.learner_factor={args.factor}",
                *args.set]  # fmt: skip
        sy = run(work, f"adpsgd_s_{lam}", lam, args.steps, ["protocol.name=sync", *slow])
        ad = run(work, f"adpsgd_a_{lam}", lam, args.steps, ["protocol.name=adpsgd", *slow])
        rows.append([str(lam), f"1 in {lam:,}", f"{sy['rate']:.0f}", f"{ad['rate']:.0f}",
                     f"{ad['rate'] / sy['rate']:.2f}", f"{ad['sigma']:.2f}", str(ad["p99"]),
                     f"{sy['wall'] + ad['wall']:.1f}", f"{max(sy['rss'], ad['rss']):.0f}"])
        print("  " + "  ".join(rows[-1]), file=sys.stderr, flush=True)
    print(table(["λ", "straggler", "SYNC samples/s", "ADPSGD samples/s", "ADPSGD/SYNC",
                 "ADPSGD ⟨σ⟩", "σ p99", "wall s", "peak RSS MiB"], rows,
                title=f"ADPSGD against SYNC, one learner {args.factor:g}× slower (simulated)"))


SWEEPS = {"fig3": fig3, "psp": psp, "adpsgd": adpsgd}
DEFAULT_LEARNERS = {"fig3": [30, 300, 3000, 30000], "psp": [32, 320, 3200],
                    "adpsgd": [100, 1000, 3000]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep", choices=tuple(SWEEPS))
    ap.add_argument("--learners", nargs="+", type=int)
    ap.add_argument("--steps", type=int, help="minibatches per learner (20; adpsgd: 10)")
    ap.add_argument("--factor", type=float, default=10.0, help="adpsgd: the straggler's slowdown")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    args.learners = args.learners or DEFAULT_LEARNERS[args.sweep]
    args.steps = args.steps or (10 if args.sweep == "adpsgd" else 20)
    work = args.out or Path(tempfile.mkdtemp(prefix="sim_sweeps_"))
    SWEEPS[args.sweep](args, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
