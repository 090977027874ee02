#!/usr/bin/env python3
"""Rudra's experiments (Gupta, Zhang, Wang, ICDM 2016, §V), one command each, on this machine.

    python scripts/reproduce_rudra.py fig3     # staleness distributions, n = 1, 2, 4, λ
    python scripts/reproduce_rudra.py fig4     # α0 against α0/n (eq. 6) under n-softsync
    python scripts/reproduce_rudra.py sweep    # the (σ, μ, λ) sweep: Tables II-III, Figs. 5-7
    python scripts/reproduce_rudra.py table4   # Rudra-base / -adv / -adv* (Table IV)
    python scripts/reproduce_rudra.py fig3 --quick   # a smoke run (tests/test_reproduce_rudra.py)

The paper trains a CIFAR10 CNN for 140 epochs on a P775 (λ up to 30) and an ImageNet AlexNet
(λ up to 54). Here every run is the MLP of ``examples/quickstart.toml`` (one hidden layer of 64)
on Fashion-MNIST (``--data``: the first ``--train-samples`` = 10,000 training images, tested on
the full t10k set; ``--data digits``: the quickstart's 8×8 digits) for a few epochs,
with up to λ = 8 (12 for table4) learners on one machine. The compute is emulated so that it
grows with the minibatch as GEMM time does on the paper's learners (§V-B): every minibatch
sleeps ``inject.compute_time`` + μ × ``inject.compute_per_sample`` seconds (a host waiting for
its accelerator: the CPU stays free for the other ranks), so μ changes the runtime and a small
μ costs more time per sample. Other settings the paper fixes:

* hardsync: α = α0 √(μλ/B) with B the baseline's μ (``protocol.ref_batch``, §V-B);
* n-softsync and async: α = α0/n, eq. (6) as published (``protocol.lr_policy = "nominal"``),
  except where fig4 compares it with α0 (``none``);
* no learning-rate decay (the runs are a few epochs), the same momentum SGD everywhere;
* table4 warm-starts every run from one model trained ``--warm-epochs`` (1) with hardsync
  (§V-D; ``model.init_from``).

Every run is repeated over ``--repeats`` seeds (3; ``--quick``: 1), seeds the outer loop. Each
experiment prints its table (test errors as mean ± std over the seeds), then one verdict per
qualitative claim of the paper from ``scripts/claims.py``: ``holds``, ``does not hold`` or
``not tested`` with the figures behind it and the rule that decided it. The accuracy claims
compare seeds: Fig. 4's α0/n below α0 by a Welch one-sided t-test (p < 0.05), and only at
λ >= 8 (at λ = 2, ``fig4 --quick``, they are not tested); Table IV's hardsync error no higher
than each softsync configuration's (it fails only on a Welch p < 0.05) and each within 3 points
of it. The staleness and time claims (fig3, sweep, Table IV's speed) are judged as their text
says on the means over the seeds (fig3 on the seeds' histograms summed). It draws the
runs side by side with ``pserver-stats compare`` (``compare.png``, ``compare.csv``) plus its own
figure, under ``--out`` (default ``runs/rudra/<experiment>``), with ``report.json``.
Timings are wall-clock on a shared machine: the claims about time need a quiet one.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
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
    parse,
    pserver_run,
    table,
    write_json,
)

from pserver.plan.topology import tree_size

CONFIG = ROOT / "examples" / "quickstart.toml"
EXPERIMENTS = ("fig3", "fig4", "sweep", "table4")


# -- runs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """One pserver run: its key (directory name), λ, μ and overrides."""

    key: str
    learners: int
    batch: int
    overrides: tuple[str, ...] = ()
    fanout: int = 0  # cluster.tree_fanout: aggregator ranks to add
    n: int = 0  # fig3: n of n-softsync

    def ranks(self) -> int:
        """1 shard + statistics + data server + the learners (+ the tree's aggregators)."""
        return 3 + self.learners + tree_size(self.learners, self.fanout)


@dataclass
class Outcome:
    """What one run gave: its dump's facts (``pserver.stats.tables.run_facts``) or why not."""

    job: Job
    ok: bool
    out_dir: str
    message: str = ""
    facts: dict[str, Any] = field(default_factory=dict)
    sigma_hist: dict[int, int] = field(default_factory=dict)
    seconds: float = math.nan
    seed: int = 0
    per_seed: list[Outcome] = field(default_factory=list)  # merged: one Outcome per seed


def seeds(args: argparse.Namespace) -> list[int]:
    """``run.seed`` of every repeat: ``--seed``, ``--seed + 1``, ..."""
    return [args.seed + r for r in range(args.repeats)]


def run_jobs(
    args: argparse.Namespace, jobs: Sequence[Job], only: Sequence[int] | None = None
) -> list[Outcome]:
    """Each job once per seed (``only``: these seeds, else :func:`seeds`) under a hard timeout,
    one after another, seeds the outer loop; a failure is recorded, not raised. One
    :func:`merged` Outcome per job."""
    launcher = Launcher.from_args(__file__, args)
    started = time.monotonic()
    runs = []
    for seed in only if only is not None else seeds(args):
        for job in jobs:
            out = run_one(launcher, args, job, seed)
            runs.append(out)
            state = (
                f"error {100 * out.facts['final_error']:.2f} %  time "
                f"{out.facts['wall_time_s']:.1f} s  ⟨σ⟩ {out.facts['mean_staleness']:.2f}"
                if out.ok
                else f"FAILED: {out.message}"
            )
            print(f"  [{time.monotonic() - started:5.0f} s] {job.key:28s} seed {seed}  {state}",
                  flush=True)  # fmt: skip
    return [merged([o for o in runs if o.job == job]) for job in jobs]


#: figures a diverged seed contributes as chance (see :func:`fact`)
ERRORS = ("final_error", "best_error")


def merged(group: Sequence[Outcome]) -> Outcome:
    """One job's runs over the seeds as one Outcome: the mean of each numeric fact over the
    seeds that finished (an error over those that finished or diverged, a diverged one counting
    as chance, :func:`fact`), the staleness histograms summed, the first finished seed's run
    directory; ``per_seed`` keeps every seed's own Outcome for the error bars."""
    done = [o for o in group if o.ok]
    if not done:
        first = group[0]
        return Outcome(first.job, False, first.out_dir, first.message, seed=first.seed,
                       per_seed=list(group))  # fmt: skip
    facts = dict(done[0].facts)
    for key, value in done[0].facts.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        over = group if key in ERRORS else done
        facts[key] = float(np.nanmean([fact(o, key) for o in over]))
    hist: dict[int, int] = {}
    for o in done:
        for s, c in o.sigma_hist.items():
            hist[s] = hist.get(s, 0) + c
    failed = [o for o in group if not o.ok]
    message = f"{len(failed)} of {len(group)} seeds failed: {failed[0].message}" if failed else ""
    return Outcome(done[0].job, True, done[0].out_dir, message, facts, dict(sorted(hist.items())),
                   float(np.mean([o.seconds for o in done])), done[0].seed,
                   list(group))  # fmt: skip


def sample(o: Outcome | None, key: str, label: str, **kw: Any) -> claims.Sample:
    """One figure of a merged Outcome, one value per seed (:func:`fact`: a diverged seed's
    error is chance)."""
    runs = o.per_seed if o is not None else []
    return claims.Sample.of(label, [fact(s, key) for s in runs], **kw)


def errors(o: Outcome | None, label: str) -> claims.Sample:
    """Final test errors over the seeds, printed in %."""
    return sample(o, "final_error", label, scale=100, unit="%")


def common_overrides(
    args: argparse.Namespace, job: Job, out_dir: Path, seed: int | None = None
) -> list[str]:
    return [
        f"run.out_dir={out_dir}",
        "run.overwrite=true",
        f"run.seed={args.seed if seed is None else seed}",
        f"run.epochs={args.epochs}",
        f"cluster.learners={job.learners}",
        f"data.batch_size={job.batch}",
        f"inject.compute_time={args.compute_time!r}",
        f"inject.compute_per_sample={args.compute_per_sample!r}",
        f"optim.lr={args.lr!r}",
        "optim.lr_milestones=[]",
        "stats.progress=false",
        "run.log_level=warning",
        *data_overrides(args),
    ]


def run_one(launcher: Launcher, args: argparse.Namespace, job: Job, seed: int) -> Outcome:
    """``mpiexec -n N pserver-run quickstart.toml ...``; the dump read back."""
    out_dir = args.out / "runs" / f"{job.key}-s{seed}"
    cmd = [
        *pserver_run(args),
        str(args.config),
        *common_overrides(args, job, out_dir, seed),
        *job.overrides,
        *args.set,
    ]
    log = out_dir.with_suffix(".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    res = launcher.run(job.ranks(), cmd, log=log, check=False)
    outcome = Outcome(job, ok=False, out_dir=str(out_dir), seconds=res.seconds, seed=seed)
    if res.reason or res.returncode != 0:
        text = log.read_text(errors="replace") if log.exists() else res.output
        diverged = "diverged" in text or "not finite" in text
        why = "diverged (loss not finite)" if diverged else res.reason or f"exit {res.returncode}"
        outcome.message = f"{why} (log: {log})"
        return outcome
    return read_outcome(outcome, out_dir)


def read_outcome(outcome: Outcome, out_dir: Path) -> Outcome:
    from pserver.dump.reader import DumpError
    from pserver.stats.runs import load_run
    from pserver.stats.tables import applied_staleness, run_facts

    try:
        dump = load_run(out_dir)
    except DumpError as e:
        outcome.message = str(e)
        return outcome
    outcome.facts = run_facts(dump, outcome.job.key)
    values, counts = np.unique(applied_staleness(dump), return_counts=True)
    outcome.sigma_hist = {int(v): int(c) for v, c in zip(values, counts, strict=True)}
    outcome.ok = outcome.facts["final_error"] is not None
    if not outcome.ok:
        outcome.message = "no test rows in the dump"
    return outcome


def compare(args: argparse.Namespace, outcomes: Sequence[Outcome], name: str = "compare") -> None:
    """``pserver-stats compare`` of the runs that finished: its table, figure and CSV."""
    from pserver.stats.cli import main as stats_main

    dirs = [o.out_dir for o in outcomes if o.ok]
    if not dirs:
        print("pserver-stats compare: no finished run to compare")
        return
    png, csv = args.out / f"{name}.png", args.out / f"{name}.csv"
    print(f"\n$ pserver-stats compare {' '.join(dirs)} --out {png} --csv {csv}", flush=True)
    stats_main(["compare", *dirs, "--out", str(png), "--csv", str(csv)])


# -- claims -----------------------------------------------------------------------------------


#: the rule of a claim judged on one figure of each run (fig3, sweep: staleness and time)
ON_MEANS = "the test in the claim's text, on the means over the seeds"


def judged(
    where: str, text: str, holds: bool | None, figures: str, rule: str = ON_MEANS
) -> claims.Verdict:
    """A claim judged here (None: the runs it needs failed), as ``scripts/claims.py`` prints it."""
    return claims.judged(where, text, holds, figures, rule)


def print_claims(found: Sequence[claims.Verdict]) -> None:
    print("\n" + claims.report(found))


def fact(o: Outcome | None, key: str) -> float:
    """A figure of a run; NaN for a failed run (a diverged run's error is chance: 0.9)."""
    if o is None:
        return math.nan
    if not o.ok:
        return 0.9 if key in ("final_error", "best_error") and "diverged" in o.message else math.nan
    value = o.facts.get(key)
    return math.nan if value is None else float(value)


def pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.2f} %"


def num(x: float, spec: str = ".2f") -> str:
    return "n/a" if math.isnan(x) else format(x, spec)


def epochs(args: argparse.Namespace) -> str:
    return f"{args.epochs} epoch" + ("s" if args.epochs != 1 else "")


def known(*values: float) -> bool:
    return not any(math.isnan(v) for v in values)


def falling(values: Sequence[float]) -> bool:
    """Strictly decreasing."""
    return all(b < a for a, b in zip(values, values[1:], strict=False))


def rising(values: Sequence[float]) -> bool:
    """Strictly increasing."""
    return all(b > a for a, b in zip(values, values[1:], strict=False))


def nondecreasing(values: Sequence[float]) -> bool:
    return all(b >= a for a, b in zip(values, values[1:], strict=False))


# -- fig3: staleness --------------------------------------------------------------------------


def fig3_jobs(args: argparse.Namespace) -> list[Job]:
    lam = args.learners
    ns = sorted({n for n in (1, 2, 4, lam) if n <= lam})
    return [
        Job(
            f"softsync-n{n}-l{lam}",
            lam,
            args.batch,
            ("protocol.name=softsync", f"protocol.n={n}", "protocol.lr_policy=nominal"),
            n=n,
        )
        for n in ns
    ]


def expected_sigma(n: int, lam: int) -> float:
    """⟨σ⟩ of n-softsync with λ equally fast learners: while one learner computes, the other
    λ − 1 push a gradient each, i.e. (λ − 1)/⌊λ/n⌋ updates; n(λ − 1)/λ when n divides λ. The
    paper's ⟨σ⟩ ≈ n is the large-λ limit (λ = 30: 0.97 n)."""
    return (lam - 1) / (lam // n)


def fig3(args: argparse.Namespace) -> tuple[list[Outcome], list[claims.Verdict]]:
    outcomes = run_jobs(args, fig3_jobs(args))
    lam = args.learners
    rows, claims = [], []
    for o in outcomes:
        n = o.job.n
        hist = o.sigma_hist
        total = sum(hist.values())
        beyond = sum(c for s, c in hist.items() if s > 2 * n)
        o.facts["n"], o.facts["beyond_2n"], o.facts["applied"] = n, beyond, total
        rows.append(
            [
                f"{n}-softsync" + (" (async)" if n == lam else ""),
                lam // n,
                num(expected_sigma(n, lam)),
                num(fact(o, "mean_staleness")),
                num(fact(o, "max_staleness"), ".0f"),
                2 * n,
                f"{beyond}/{total}" if o.ok else "n/a",
                " ".join(str(s) for s in sorted(hist))
                if len(hist) <= 12
                else f"{min(hist)}..{max(hist)}",
            ]
        )
    print(
        table(
            ["protocol", "c=⌊λ/n⌋", "n(λ-1)/λ", "⟨σ⟩", "max σ", "2n", "σ > 2n", "σ seen"],
            rows,
            title=f"\nFig. 3: gradient staleness, λ = {lam} learners, "
            f"μ = {args.batch}, {epochs(args)}",
        )
    )
    for o in outcomes:
        n, mean = o.facts.get("n"), fact(o, "mean_staleness")
        if not o.ok or n is None:
            continue
        want = expected_sigma(n, lam)
        claims.append(
            judged(
                "§V-A, Fig. 3",
                f"⟨σ⟩ ≈ n for {n}-softsync (n(λ−1)/λ = {want:.2f} with λ = {lam}; within 15 %)",
                abs(mean - want) <= 0.15 * max(want, 1.0),
                f"⟨σ⟩ = {mean:.3f}, n = {n}",
            )
        )
    for o in outcomes:
        if o.ok and o.facts.get("n") in (1, 2):
            n = o.facts["n"]
            hist = o.sigma_hist
            claims.append(
                judged(
                    "§V-A",
                    f"{n}-softsync: σ ∈ {{0, …, {2 * n}}}",
                    max(hist) <= 2 * n,
                    f"σ seen: {sorted(hist)}",
                )
            )
    big = [o for o in outcomes if o.ok and o.facts.get("n", 0) > 2]
    for o in big:
        n, beyond, total = o.facts["n"], o.facts["beyond_2n"], o.facts["applied"]
        frac = beyond / max(total, 1)
        # fewer than 1e4 gradients cannot resolve 1e-4: then the claim holds only if none is
        resolved = total >= 10_000
        claims.append(
            judged(
                "§V-A, Fig. 3(b)",
                f"{n}-softsync: σ > 2n = {2 * n} only with probability < 1e-4",
                frac < 1e-4 if resolved else beyond == 0,
                f"{beyond} of {total} gradients ({frac:.2e}); max σ = "
                f"{fact(o, 'max_staleness'):.0f}"
                + ("" if resolved else f" (with {total} gradients: none may exceed 2n)"),
            )
        )
    from rudra_figures import staleness_figure

    print(
        f"\nfigure (Fig. 3: ⟨σ⟩ per update and the distributions): "
        f"{staleness_figure(outcomes, args.out / 'fig3.png')}"
    )
    return outcomes, claims


# -- fig4: learning-rate modulation -----------------------------------------------------------


def fig4_ns(args: argparse.Namespace) -> list[int]:
    lam = args.learners
    if args.quick:
        return [lam]
    return sorted({max(1, lam // 2), lam})  # the paper: n = 4 and n = λ = 30


def fig4(args: argparse.Namespace) -> tuple[list[Outcome], list[claims.Verdict]]:
    lam = args.learners
    jobs = [
        Job(
            f"softsync-n{n}-{policy}",
            lam,
            args.batch,
            ("protocol.name=softsync", f"protocol.n={n}", f"protocol.lr_policy={policy}"),
        )
        for n in fig4_ns(args)
        for policy in ("none", "nominal")
    ]
    outcomes = run_jobs(args, jobs)
    by = {o.job.key: o for o in outcomes}
    rows = []
    for n in fig4_ns(args):
        for policy, alpha in (("none", "α0"), ("nominal", f"α0/{n}")):
            o = by[f"softsync-n{n}-{policy}"]
            rows.append(
                [
                    f"{n}-softsync",
                    alpha,
                    claims.mean_std(errors(o, "")),
                    pct(fact(o, "best_error")),
                    num(fact(o, "mean_staleness")),
                    "ok" if o.ok and not o.message else o.message.split(" (log")[0],
                ]
            )
    print(
        table(
            ["protocol", "α", "final error %, mean ± std", "best error", "⟨σ⟩", "runs"],
            rows,
            title=f"\nFig. 4: α0 = {args.lr} against α0/n, λ = {lam}, μ = {args.batch}, "
            f"{epochs(args)}",
        )
    )
    return outcomes, fig4_claims(args, by)


#: Fig. 4's claims are made at λ = 30 (CIFAR10); a run below this λ cannot show them: with
#: λ = 2 the largest n is 2 and α0 and α0/n differ by a factor of 2 at most
FIG4_MIN_LEARNERS = 8


def fig4_claims(args: argparse.Namespace, by: dict[str, Outcome]) -> list[claims.Verdict]:
    """Fig. 4 on the final test errors over the seeds (``scripts/claims.py``): for each n,
    α0/n ends lower than α0 (Welch one-sided, p < 0.05); λ-softsync with α0 fails to converge
    (mean final error ≥ 50 %, a diverged seed counting as 90 %)."""
    lam, where = args.learners, "Rudra §V-A, Fig. 4"
    found = []
    for n in fig4_ns(args):
        text = f"{n}-softsync: α0/n ends at a lower test error than α0"
        if lam < FIG4_MIN_LEARNERS:
            found.append(claims.not_tested(where, text, f"λ = {lam}: the claim is at λ >= "
                                           f"{FIG4_MIN_LEARNERS} (the paper: 30)"))  # fmt: skip
            continue
        a0, an = by[f"softsync-n{n}-none"], by[f"softsync-n{n}-nominal"]
        found.append(claims.lower(where, text, errors(an, f"α0/{n}"), errors(a0, "α0")))
    text = (f"{lam}-softsync (async) with α = α0 fails to converge (the paper: a constant 90 % "
            "error; here: mean final error ≥ 50 %)")  # fmt: skip
    e0 = errors(by[f"softsync-n{lam}-none"], "α0")
    if lam < FIG4_MIN_LEARNERS:
        found.append(claims.not_tested(where, text, f"λ = {lam}: the claim is at λ >= "
                                       f"{FIG4_MIN_LEARNERS} (the paper: 30)"))  # fmt: skip
    elif why := claims.too_few(e0):
        found.append(claims.not_tested(where, text, f"{e0}: {why}"))
    else:
        found.append(
            claims.judged(
                where,
                text,
                e0.mean >= 0.5,
                str(e0),
                "mean final error >= 50 %, a diverged seed counting as 90 %",
            )
        )
    return found


# -- sweep: (σ, μ, λ), Tables II-III, Figs. 5-7 ---------------------------------------------------


def sweep_grid(args: argparse.Namespace) -> list[tuple[int, int]]:
    """(μ, λ): the contours μ = small and μ = large over every λ, and the diagonal μλ = const
    (Table II) from (μ_large, 1) down to (μ_small, λ_max)."""
    small, large, lams = args.mu_small, args.mu_large, args.lambdas
    cells = {(mu, lam) for mu in (small, large) for lam in lams}
    cells |= {(large // lam, lam) for lam in lams if large // lam >= small}
    return sorted(cells, key=lambda c: (c[1], -c[0]))


def sweep_jobs(args: argparse.Namespace) -> list[Job]:
    jobs = []
    for mu, lam in sweep_grid(args):
        protocols = [
            ("hardsync", ("protocol.name=hardsync", f"protocol.ref_batch={args.mu_large}"))
        ]
        if lam > 1:  # λ = 1: every protocol is hardsync (Fig. 6 caption)
            protocols += [
                (
                    "1-softsync",
                    ("protocol.name=softsync", "protocol.n=1", "protocol.lr_policy=nominal"),
                ),
                (f"{lam}-softsync", ("protocol.name=async", "protocol.lr_policy=nominal")),
            ]
        for name, overrides in protocols:
            jobs.append(Job(f"{name}-mu{mu}-l{lam}", lam, mu, overrides))
    return jobs


def sigma_of(job: Job) -> int:
    """Rudra's nominal σ of a sweep job: 0 (hardsync), 1 (1-softsync), λ (λ-softsync)."""
    name = job.key.split("-mu")[0]
    return 0 if name == "hardsync" else int(name.split("-")[0])


def sweep(args: argparse.Namespace) -> tuple[list[Outcome], list[claims.Verdict]]:
    outcomes = run_jobs(args, sweep_jobs(args))
    rows = sorted(
        outcomes, key=lambda o: (o.job.batch * o.job.learners, sigma_of(o.job), o.job.batch)
    )
    print(
        table(
            ["μλ", "σ", "μ", "λ", "⟨σ⟩ measured", "test error", "training time (s)"],
            [
                [
                    o.job.batch * o.job.learners,
                    sigma_of(o.job),
                    o.job.batch,
                    o.job.learners,
                    num(fact(o, "mean_staleness")),
                    pct(fact(o, "final_error")),
                    num(fact(o, "wall_time_s"), ".1f"),
                ]
                for o in rows
            ],
            title=f"\nTable II: test error after {epochs(args)} and training time, by μλ",
        )
    )
    best = top5(outcomes)
    print(
        table(
            ["σ", "μ", "λ", "protocol", "test error", "training time (s)"],
            [
                [
                    sigma_of(o.job),
                    o.job.batch,
                    o.job.learners,
                    o.job.key.split("-mu")[0],
                    pct(fact(o, "final_error")),
                    num(fact(o, "wall_time_s"), ".1f"),
                ]
                for o in best
            ],
            title="\nTable III: the 5 fastest runs within 1 point of the lowest test error",
        )
    )
    from rudra_figures import speedup_figure, tradeoff_figure

    print(
        f"\nfigures: {tradeoff_figure(outcomes, sigma_of, args.out / 'tradeoff.png')} "
        f"(Figs. 5-6), {speedup_figure(outcomes, sigma_of, args.out / 'speedup.png')} "
        "(Fig. 7)"
    )
    return outcomes, sweep_claims(args, outcomes)


def top5(outcomes: Sequence[Outcome]) -> list[Outcome]:
    done = [o for o in outcomes if o.ok]
    if not done:
        return []
    floor = min(fact(o, "final_error") for o in done)
    close = [o for o in done if fact(o, "final_error") <= floor + 0.01]
    return sorted(close, key=lambda o: fact(o, "wall_time_s"))[:5]


def sweep_claims(args: argparse.Namespace, outcomes: Sequence[Outcome]) -> list[claims.Verdict]:
    by = {
        (sigma_of(o.job) if o.job.learners > 1 else 0, o.job.batch, o.job.learners): o
        for o in outcomes
    }
    lams, small, large = args.lambdas, args.mu_small, args.mu_large
    top = max(lams)

    def get(sigma: int, mu: int, lam: int, key: str) -> float:
        return fact(by.get((sigma if lam > 1 else 0, mu, lam)), key)

    claims = []
    times = [get(0, large, lam, "wall_time_s") for lam in lams]
    claims.append(
        judged(
            "§V-B, Fig. 5",
            f"hardsync, μ = {large}: training time falls monotonically with λ",
            falling(times) if known(*times) else None,
            "times "
            + ", ".join(f"λ={lam}: {num(t, '.1f')} s" for lam, t in zip(lams, times, strict=True)),
        )
    )
    for sigma in (0, top):
        e_l, e_s = get(sigma, large, top, "final_error"), get(sigma, small, top, "final_error")
        claims.append(
            judged(
                "§V-B, Figs. 5-6",
                f"σ = {sigma}, λ = {top}: μ = {small} restores test error lost at μ = {large}",
                (e_s < e_l) if known(e_s, e_l) else None,
                f"μ={large}: {pct(e_l)}, μ={small}: {pct(e_s)}",
            )
        )
    for mu in (large, small):
        t = {s: get(s, mu, top, "wall_time_s") for s in (0, 1, top)}
        base = get(0, mu, 1, "wall_time_s")
        claims.append(
            judged(
                "§V-B, Fig. 7",
                f"μ = {mu}, λ = {top}: hardsync speeds up least",
                (t[0] > max(t[1], t[top])) if known(*t.values()) else None,
                "speed-up vs (0, μ, 1): "
                + ", ".join(f"σ={s}: {num(base / v, '.2f')}×" for s, v in t.items()),
            )
        )
    t1, tl = get(1, small, top, "wall_time_s"), get(top, small, top, "wall_time_s")
    claims.append(
        judged(
            "§V-B, Fig. 6-7",
            f"μ = {small}, λ = {top}: λ-softsync is slower than "
            "1-softsync (more pulls at the parameter server)",
            (tl > t1) if known(t1, tl) else None,
            f"1-softsync {num(t1, '.1f')} s, {top}-softsync {num(tl, '.1f')} s",
        )
    )
    e0, ea = get(0, large, top, "final_error"), get(top, large, top, "final_error")
    claims.append(
        judged(
            "§V-B",
            f"μ = {large}, λ = {top}: hardsync ends at a lower test error than λ-softsync",
            (e0 < ea) if known(e0, ea) else None,
            f"hardsync {pct(e0)}, {top}-softsync {pct(ea)}",
        )
    )
    claims += table2_claims(outcomes)
    return claims


def table2_claims(outcomes: Sequence[Outcome]) -> list[claims.Verdict]:
    """Table II: within a μλ group the error hardly depends on σ; it grows with μλ; 1-softsync
    is the fastest of each group."""
    groups: dict[int, list[Outcome]] = {}
    for o in outcomes:
        if o.ok:
            groups.setdefault(o.job.batch * o.job.learners, []).append(o)
    multi = {k: v for k, v in sorted(groups.items()) if len({sigma_of(o.job) for o in v}) > 1}
    claims = []
    spreads = {
        k: max(fact(o, "final_error") for o in v) - min(fact(o, "final_error") for o in v)
        for k, v in multi.items()
    }
    claims.append(
        judged(
            "§V-C, Table II",
            "for a given μλ the test error hardly depends on σ (spread within 2 points)",
            all(s <= 0.02 for s in spreads.values()) if spreads else None,
            "spread: " + ", ".join(f"μλ={k}: {100 * s:.2f} pt" for k, s in spreads.items()),
        )
    )
    means = [
        (k, sum(fact(o, "final_error") for o in v) / len(v)) for k, v in sorted(groups.items())
    ]
    rising = nondecreasing([e for _, e in means])
    claims.append(
        judged(
            "§V-C, Table II",
            "the test error increases monotonically with μλ",
            rising if len(means) > 1 else None,
            "mean error: " + ", ".join(f"μλ={k}: {100 * e:.2f} %" for k, e in means),
        )
    )
    fastest = {}
    for k, v in multi.items():
        soft1 = [o for o in v if sigma_of(o.job) == 1]
        if soft1:
            fastest[k] = min(v, key=lambda o: fact(o, "wall_time_s")) in soft1
    claims.append(
        judged(
            "§V-C, Table II",
            "1-softsync shows the smallest training time for any μλ",
            all(fastest.values()) if fastest else None,
            ", ".join(f"μλ={k}: {'yes' if f else 'no'}" for k, f in fastest.items()),
        )
    )
    return claims


# -- table4: Rudra-base, -adv, -adv* ----------------------------------------------------------


def warm_job(args: argparse.Namespace) -> Job:
    """Rudra §V-D's warm start: hardsync for ``--warm-epochs`` on the base layout, whose final
    model every Table IV run then starts from (``model.init_from``)."""
    return Job("warm-hardsync", args.learners, args.batch,
               ("protocol.name=hardsync", f"run.epochs={args.warm_epochs}"))  # fmt: skip


def table4_jobs(args: argparse.Namespace, warm: str | None = None) -> list[Job]:
    """The four configurations of Table IV; with ``warm`` (a run directory) each starts from
    that run's final model."""
    base, adv, k = args.learners, args.adv_learners, args.fanout
    mu_base, mu_adv = args.batch, max(1, args.batch // 4)  # the paper: 16 and 4
    soft = ("protocol.name=softsync", "protocol.n=1", "protocol.lr_policy=nominal")
    start = (f"model.init_from={warm}",) if warm else ()
    return [
        Job("base-hardsync", base, mu_base, ("protocol.name=hardsync", *start)),
        Job("base-softsync", base, mu_base, (*soft, *start)),
        Job("adv-softsync", adv, mu_adv, (*soft, f"cluster.tree_fanout={k}", *start), fanout=k),
        Job(
            "adv*-softsync",
            adv,
            mu_adv,
            (
                *soft,
                f"cluster.tree_fanout={k}",
                "comm.mode=thread",
                f"cluster.bcast_fanout={k}",
                *start,
            ),  # fmt: skip
            fanout=k,
        ),
    ]


def table4(args: argparse.Namespace) -> tuple[list[Outcome], list[claims.Verdict]]:
    warm = None
    if args.warm_epochs > 0:
        print(
            f"Table IV from a warm start, as the paper's (§V-D): every run starts from the model "
            f"of {args.warm_epochs} hardsync epoch(s) on the base layout (model.init_from; the "
            "paper warm-starts its 1-softsync runs, here base-hardsync too, so that all four "
            "compare from one model), with the same momentum SGD (the paper used AdaGrad for "
            "1-softsync)."
        )
        first = run_jobs(args, [warm_job(args)], only=[args.seed])[0]
        if not first.ok:
            print(f"the warm-start run failed ({first.message}): every run starts cold")
        warm = first.out_dir if first.ok else None
    else:
        print("Table IV from a cold start (--warm-epochs 0): every run from the same seed.")
    outcomes = run_jobs(args, table4_jobs(args, warm))
    by = {o.job.key: o for o in outcomes}
    arch = {
        "base-hardsync": "Rudra-base",
        "base-softsync": "Rudra-base",
        "adv-softsync": "Rudra-adv",
        "adv*-softsync": "Rudra-adv*",
    }
    rows = []
    for o in outcomes:
        per_epoch = fact(o, "wall_time_s") / args.epochs
        o.facts["s_per_epoch"] = per_epoch
        rows.append(
            [
                o.job.key,
                arch[o.job.key],
                o.job.batch,
                o.job.learners,
                "hardsync" if "hard" in o.job.key else "1-softsync",
                claims.mean_std(errors(o, "")),
                num(fact(o, "mean_staleness")),
                num(per_epoch, ".2f"),
            ]
        )
    print(
        table(
            [
                "configuration",
                "architecture",
                "μ",
                "λ",
                "protocol",
                "test error %",
                "⟨σ⟩",
                "s/epoch",
            ],
            rows,
            title=f"\nTable IV: after {epochs(args)} (tree fan-out {args.fanout})",
        )
    )
    return outcomes, table4_claims(args, by)


def table4_claims(args: argparse.Namespace, by: dict[str, Outcome]) -> list[claims.Verdict]:
    """Table IV's claims over the seeds (``scripts/claims.py``): the speed order (means of
    s/epoch), base-hardsync's error no higher than any softsync configuration's and each of
    those within 3 points of it, adv*'s staleness above adv's."""
    where = "Rudra §V-E, Table IV"
    order = ["adv*-softsync", "adv-softsync", "base-softsync", "base-hardsync"]
    per_epoch = {k: claims.Sample.of(k, [fact(s, "wall_time_s") / args.epochs
                                         for s in by[k].per_seed], unit="s/epoch")
                 for k in order}  # fmt: skip
    speeds = [per_epoch[k].mean for k in order]
    err = {k: errors(by[k], k) for k in order}
    hard = err["base-hardsync"]
    sigma = {k: sample(by[k], "mean_staleness", f"⟨σ⟩ {k}") for k in order[:2]}
    return [
        judged(
            where,
            "training speed: adv*-softsync > adv-softsync > base-softsync > base-hardsync",
            rising(speeds) if known(*speeds) else None,
            "; ".join(str(per_epoch[k]) for k in order),
            "the means of s/epoch strictly rising in that order",
        ),  # fmt: skip
        claims.both(
            where,
            "base-hardsync reaches the lowest error",
            *(claims.no_worse(where, f"hardsync <= {k}", hard, err[k]) for k in order[:3]),
        ),  # fmt: skip
        claims.lower(
            where,
            "adv* raises the average staleness over adv",
            sigma["adv-softsync"],
            sigma["adv*-softsync"],
        ),  # fmt: skip
        claims.both(
            where,
            "the softsync configurations stay within 3 points of base-hardsync's error",
            *(claims.within(where, f"{k} = hardsync", err[k], hard, 0.03) for k in order[:3]),
        ),  # fmt: skip
    ]


def compared(args: argparse.Namespace, outcomes: Sequence[Outcome]) -> list[Outcome]:
    """The runs drawn by ``pserver-stats compare``: all of them, except for the sweep, whose
    curves are those of Figs. 5-7's ends: the baselines (λ = 1) and the largest λ."""
    if args.experiment != "sweep":
        return list(outcomes)
    top = max(args.lambdas)
    return [o for o in outcomes if o.job.learners in (1, top)]


# -- driver -----------------------------------------------------------------------------------

RUNNERS: dict[str, Callable[[argparse.Namespace], tuple[list[Outcome], list[claims.Verdict]]]] = {
    "fig3": fig3,
    "fig4": fig4,
    "sweep": sweep,
    "table4": table4,
}

#: per experiment: (learners, μ, epochs) by default and with --quick
#: per experiment: emulated compute (inject.compute_time, inject.compute_per_sample). The
#: sweep and table4 make claims about time: there compute dominates pserver's overhead per
#: minibatch (a few ms on a loaded 2-core machine), as it does on the paper's hardware.
COMPUTE = {
    "fig3": (0.001, 0.00025),
    "fig4": (0.001, 0.00025),
    "sweep": (0.002, 0.001),
    "table4": (0.005, 0.002),
}
SIZES = {
    "fig3": ((8, 16, 3), (4, 16, 1)),
    "fig4": ((8, 16, 4), (2, 16, 1)),
    "sweep": ((8, 16, 3), (2, 16, 1)),  # λ and μ of the sweep: --lambdas, --mu-small/large
    "table4": ((4, 16, 3), (2, 16, 1)),
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = bench_parser(__doc__, repeats=None, timeout=300.0, quiet_idle=0.0, json_out=False)
    add_data_args(p)
    p.add_argument(
        "--repeats", "--repeat", type=int, dest="repeats",
        help="seeds of every run: --seed, --seed + 1, ... (default: 3; --quick: 1)",
    )  # fmt: skip
    add = p.add_argument
    add("experiment", choices=EXPERIMENTS, help="which of the paper's experiments")
    add("--learners", type=int, help="λ (fig3, fig4; table4: base λ) (default: 8; table4: 4)")
    add("--batch", type=int, help="μ, samples per minibatch (default: 16)")
    add(
        "--epochs",
        type=int,
        help="epochs of every run (default: fig3 3, fig4 4, sweep 3, table4 3)",
    )
    add("--lr", type=float, default=0.05, help="α0, optim.lr (default: %(default)s)")
    add("--seed", type=int, default=0, help="run.seed of the first repeat (default: %(default)s)")
    add(
        "--compute-time",
        type=float,
        help="emulated compute seconds per minibatch, inject.compute_time (default: 0.001; "
        "sweep 0.002, table4 0.005)",
    )
    add(
        "--compute-per-sample",
        type=float,
        help="emulated compute seconds per sample, inject.compute_per_sample (default: 0.00025; "
        "sweep 0.001, table4 0.002)",
    )
    add("--lambdas", type=int, nargs="+", help="sweep: λ values (default: 1 2 4 8)")
    add("--mu-small", type=int, help="sweep: the small μ contour (default: 4)")
    add(
        "--mu-large",
        type=int,
        help="sweep: the large μ contour and the baseline μ, B of √(μλ/B) (default: 32)",
    )
    add("--adv-learners", type=int, help="table4: λ of adv and adv* (default: 3 × --learners)")
    add("--fanout", type=int, help="table4: tree and broadcast fan-out (default: 4; quick: 2)")
    add(
        "--warm-epochs",
        type=int,
        default=1,
        help="table4: hardsync epochs of the model every run starts from, 0 for a cold start "
        "(default: %(default)s)",
    )
    add("--out", type=Path, help="output directory (default: runs/rudra/EXPERIMENT)")
    add("--config", type=Path, default=CONFIG, help="base config (default: %(default)s)")
    add("--quick", action="store_true", help="smoke test: 1 epoch, the fewest learners")
    return fill_defaults(p, parse(p, argv))


def fill_defaults(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """The experiment's sizes (:data:`SIZES`, ``--quick``) where an option was not given."""
    lam, mu, epochs = SIZES[args.experiment][1 if args.quick else 0]
    defaults = {
        "learners": lam,
        "batch": mu,
        "epochs": epochs,
        "lambdas": [1, 2] if args.quick else [1, 2, 4, 8],
        "mu_small": 8 if args.quick else 4,
        "mu_large": 16 if args.quick else 32,
        "fanout": 2 if args.quick else 4,
        "repeats": 1 if args.quick else 3,
    }
    defaults["compute_time"], defaults["compute_per_sample"] = COMPUTE[args.experiment]
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.adv_learners is None:
        args.adv_learners = 3 * args.learners
    args.out = args.out or Path("runs") / "rudra" / args.experiment
    for name in ("learners", "batch", "epochs", "mu_small", "mu_large", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.mu_small >= args.mu_large:
        p.error("--mu-small must be below --mu-large")
    if args.fanout < 2:
        p.error("--fanout must be >= 2")
    if args.warm_epochs < 0:
        p.error("--warm-epochs must be >= 0")
    if min(args.lambdas) < 1:
        p.error("--lambdas must be >= 1")
    args.lambdas = sorted(set(args.lambdas))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    print(
        f"Rudra {args.experiment}: MLP on {data_label(args)}, {epochs(args)}, "
        f"{args.repeats} seed(s), compute "
        f"{1e3 * args.compute_time:g} ms + {1e3 * args.compute_per_sample:g} ms/sample per "
        f"minibatch, α0 = {args.lr}, on {os.cpu_count()} cores (load "
        f"{os.getloadavg()[0]:.1f})"
    )
    outcomes, claims = RUNNERS[args.experiment](args)
    compare(args, compared(args, outcomes))
    print_claims(claims)
    report = args.out / "report.json"
    write_json(
        report,
        {
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "runs": [asdict(o) for o in outcomes],
            "claims": [asdict(c) for c in claims],
        },
    )
    print(
        f"\nreport: {report}\nruns: {args.out / 'runs'}\ntotal "
        f"{time.monotonic() - started:.0f} s (load {os.getloadavg()[0]:.1f})"
    )
    return 0 if any(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
