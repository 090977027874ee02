#!/usr/bin/env python3
"""Does one slow or stopped learner slow the others? (issue 10, item 3)

For each protocol and ``comm.mode`` it runs the quickstart twice on 4 learners (7 ranks): once
as is and once with learner 0 a straggler (``inject.slow_learner=0``, ``learner_factor`` 100:
each of its minibatches takes 100x longer), with ``inject.compute_time=0.01`` for everyone. The
figure is the *others'* throughput: minibatches per second of learners 1..λ-1 over their active
span (first to last ``train`` row), straggler run over plain run. Goal: >= 0.7. SSP's bound
(``protocol.s``, default 3) makes the others wait for the straggler by design, so its ratio is
low unless ``--ssp-s`` is large; SSP needs ``comm.mode = "blocking"`` and is skipped otherwise.

``--freeze SECONDS`` instead stops learner 0 (``inject.freeze_*``: it sleeps without calling MPI
after the push and pull request of minibatch 5) and reports the updates the shard made while it
slept and the longest gap between two updates of the run (goal: far below SECONDS).

Example (the lead's figure, before/after: run it from each worktree)::

    .venv/bin/python scripts/bench_straggler.py --json /tmp/straggler.json
    .venv/bin/python scripts/bench_straggler.py --freeze 10 --modes blocking nonblocking
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import Launcher, bench_parser, parse, pserver_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart.toml"
FREEZE_STEP = 5
PROTOCOLS = {
    "async": ["protocol.name=async"],
    "softsync-n=λ": ["protocol.name=softsync", "protocol.n={lam}"],
    "psp-c=λ-1": ["protocol.name=psp", "protocol.c={lam_1}"],
    "ssp": ["protocol.name=ssp"],
}


def overrides(proto: str, mode: str, lam: int, args: argparse.Namespace) -> list[str]:
    sets = [o.format(lam=lam, lam_1=lam - 1) for o in PROTOCOLS[proto]]
    if proto == "ssp" and args.ssp_s is not None:
        sets.append(f"protocol.s={args.ssp_s}")
    return [
        *sets, f"comm.mode={mode}", f"run.epochs={args.epochs}",
        f"inject.compute_time={args.compute}", "stats.progress=false", "run.overwrite=true",
        "run.log_level=warning", *args.set,
    ]  # fmt: skip


def others_rate(path: Path, slow: int) -> float:
    """Minibatches per second of every learner but ``slow``, each over its active span."""
    from pserver.dump.reader import load_dump

    t = load_dump(path).group("train")
    rates = []
    for lr in sorted(set(t["learner"].tolist()) - {slow}):
        times = t["time"][t["learner"] == lr]
        if len(times) > 1:
            rates.append((len(times) - 1) / max(times.max() - times.min(), 1e-9))
    return sum(rates)


def freeze_figures(path: Path, seconds: float) -> dict[str, float]:
    """Updates of shard 0 while learner 0 slept, and the longest gap between two updates."""
    from pserver.dump.reader import load_dump

    d = load_dump(path)
    t, u = d.group("train"), d.group("updates")
    woke = float(t["time"][(t["learner"] == 0) & (t["step"] == FREEZE_STEP)][0])
    times = sorted(u["time"][u["shard"] == 0].tolist())
    inside = sum(1 for x in times if woke - seconds < x < woke)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    return {"updates_while_frozen": inside, "longest_gap_s": max(gaps, default=0.0)}


def run_one(launcher: Launcher, cmd: list[str], n: int, extra: list[str], out: Path) -> float:
    started = time.monotonic()
    launcher.run(n, [*cmd, str(QUICKSTART), f"run.out_dir={out}", *extra])
    return time.monotonic() - started


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    launcher = Launcher.from_args(__file__, args)
    cmd, lam = pserver_run(args), args.learners
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_straggler_") as tmp:
        for proto in args.protocols:
            for mode in args.modes:
                if proto == "ssp" and mode != "blocking":
                    continue  # refused: SSP's bound needs blocking pulls
                base = overrides(proto, mode, lam, args)
                row: dict[str, Any] = {"protocol": proto, "mode": mode}
                if args.freeze:
                    frozen = [
                        "inject.freeze_learner=0", f"inject.freeze_step={FREEZE_STEP}",
                        f"inject.freeze_time={args.freeze}",
                    ]  # fmt: skip
                    out = Path(tmp) / f"{proto}_{mode}_freeze"
                    row["wall_s"] = run_one(launcher, cmd, 3 + lam, base + frozen, out)
                    row.update(freeze_figures(out / "stats.h5", args.freeze))
                    log(f"{proto:>14} {mode:>11}: {row}")
                    rows.append(row)
                    continue
                slow = ["inject.slow_learner=0", f"inject.learner_factor={args.factor}"]
                plain, strag, walls = [], [], []
                for rep in range(args.repeats):
                    for kind, extra, into in (("plain", [], plain), ("slow", slow, strag)):
                        out = Path(tmp) / f"{proto}_{mode}_{kind}_{rep}"
                        walls.append(run_one(launcher, cmd, 3 + lam, base + extra, out))
                        into.append(others_rate(out / "stats.h5", 0))
                row.update(
                    plain=statistics.median(plain), straggler=statistics.median(strag),
                    wall_plain_s=statistics.median(walls[0::2]),
                    wall_straggler_s=statistics.median(walls[1::2]),
                )  # fmt: skip
                row["ratio"] = row["straggler"] / row["plain"]
                log(f"{proto:>14} {mode:>11}: ratio {row['ratio']:.2f}")
                rows.append(row)
    return rows


def table(rows: list[dict[str, Any]], freeze: float) -> str:
    if freeze:
        head = f"{'protocol':>14} {'mode':>11} {'updates while frozen':>21} {'longest gap s':>14}"
        lines = [f"learner 0 stopped {freeze:g} s after minibatch {FREEZE_STEP}", head]
        for r in rows:
            lines.append(
                f"{r['protocol']:>14} {r['mode']:>11} {r['updates_while_frozen']:>21d} "
                f"{r['longest_gap_s']:>14.2f}"
            )
        return "\n".join(lines)
    head = (
        f"{'protocol':>14} {'mode':>11} {'others mb/s':>11} {'w/ straggler':>12} "
        f"{'ratio':>6} {'wall s':>7} {'w/ strag s':>10}"
    )
    lines = ["others' minibatches/s (learners 1..λ-1), plain run vs learner 0 100x slower", head]
    for r in rows:
        lines.append(
            f"{r['protocol']:>14} {r['mode']:>11} {r['plain']:>11.1f} {r['straggler']:>12.1f} "
            f"{r['ratio']:>6.2f} {r['wall_plain_s']:>7.1f} {r['wall_straggler_s']:>10.1f}"
        )
    return "\n".join([*lines, "goal: ratio >= 0.7 (SSP: bounded by protocol.s by design)"])


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = bench_parser(__doc__, repeats=1, timeout=300.0, quiet_idle=0.0)
    p.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), choices=list(PROTOCOLS))
    p.add_argument(
        "--modes", nargs="+", default=["blocking", "nonblocking", "thread"],
        choices=["blocking", "nonblocking", "thread"],
    )  # fmt: skip
    p.add_argument("--learners", type=int, default=4, help="λ (ranks: λ + 3)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--compute", type=float, default=0.01, help="inject.compute_time, s")
    p.add_argument("--factor", type=float, default=100.0, help="the straggler's slow-down")
    p.add_argument("--ssp-s", type=int, default=None, help="protocol.s for SSP (default 3)")
    p.add_argument("--freeze", type=float, default=0.0, help="stop learner 0 this long instead")
    args = parse(p, argv)
    if args.learners < 2:
        p.error("--learners needs >= 2")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = measure(args)
    print(table(rows, args.freeze))
    if args.json:
        args.json.write_text(json.dumps({"argv": sys.argv, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
