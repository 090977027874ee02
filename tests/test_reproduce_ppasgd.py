"""scripts/reproduce_ppasgd.py in one process: its runs' overrides are valid configs, and the
Fig. 3-right sweep from the probes' dot products (no mpiexec)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import reproduce_ppasgd as rp  # noqa: E402

from pserver.dump.reader import Dump  # noqa: E402
from pserver.optim.prediction import horizon_sum  # noqa: E402
from pserver.plan.config import load_config  # noqa: E402


@pytest.mark.parametrize("kind", rp.KINDS)
def test_every_run_is_a_valid_config(kind):
    args = argparse.Namespace(epochs=2, compute_time=0.01, probe=10, momentum=rp.PAPER_MOMENTUM,
                              warmup=rp.PAPER_WARMUP, data="fashion-mnist",
                              train_samples=10_000)  # fmt: skip
    cfg = load_config(rp.CONFIG, rp.overrides(kind, args, 9, rp.default_lr(9), 0))
    assert cfg.cluster.learners == 10
    assert (cfg.data.source, cfg.data.train_samples) == ("fashion-mnist", 10_000)
    assert cfg.protocol.predict == (kind == "PP-ASGD")
    assert cfg.protocol.name == ("hardsync" if kind == "SSGD" else "async")
    # the paper's settings (Sato et al. §4, footnote 5): μ = 0.99, one epoch of warm-up from
    # 0, no drop; SSGD is NAG, ASGD and PP-ASGD classical momentum (issue 25)
    assert cfg.optim.momentum == 0.99 and cfg.optim.warmup_epochs == 1.0
    assert cfg.optim.warmup_start == 0.0 and cfg.optim.lr_milestones == []
    assert cfg.optim.rule == ("nesterov" if kind == "SSGD" else "momentum")


def test_deviations_name_each_departure_with_its_reason():
    args = argparse.Namespace(compute_time=0.01, momentum=0.99, warmup=1.0)
    base = rp.deviations(args)
    assert any("CIFAR-10" in d for d in base) and not any("--momentum" in d for d in base)
    args.momentum, args.warmup = 0.9, 0.0
    extra = rp.deviations(args)[len(base):]
    assert extra == ["momentum μ = 0.9, not 0.99: --momentum given",
                     "warm-up 0 epoch(s), not 1: --warmup given"]


def test_fig2_claim_is_judged_over_seeds_and_only_at_large_staleness():
    def run(kind: str, target: int, repeat: int, error: float) -> rp.Run:
        return rp.Run(kind, target, repeat, "", target + 1, 0.01, errors=[0.5, error])

    runs = [run("ASGD", 9, r, e) for r, e in enumerate((0.30, 0.32, 0.31))]
    runs += [run("PP-ASGD", 9, r, e) for r, e in enumerate((0.20, 0.21, 0.19))]
    (v,) = rp.verdicts(runs, [9])
    assert v.status == "holds" and "PP-ASGD S=9 20.00 ± 1.00 % (3 seeds)" in v.numbers
    (quick,) = rp.verdicts(runs, [3])
    assert quick.status == "not tested" and "S >= 9" in quick.numbers


def test_sweep_sums_the_blocks_of_a_probe_and_finds_the_minimum():
    """Two blocks whose d is exactly a_2·M: the error is 0 at S' = 2 and ‖d‖ without prediction."""
    mu, a2 = 0.5, horizon_sum(0.5, 2)
    m = np.array([1.0, 2.0])  # M·M of the two blocks
    rows = {
        "shard": np.zeros(3, np.int32), "block": np.array([0, 1, 0], np.int32),
        "origin": np.array([10, 10, 40]), "steps": np.array([2, 2, 1], np.int32),
        "dd": np.array([a2 * a2 * m[0], a2 * a2 * m[1], 1.0]),
        "dm": np.array([a2 * m[0], a2 * m[1], 0.0]), "mm": np.array([m[0], m[1], 1.0]),
        "momentum": np.full(3, mu),
    }  # fmt: skip
    dump = Dump(path=Path("x.h5"), attrs={}, groups={"prediction_errors": rows})
    curve, plain, s0, probes = rp.sweep(dump, 4, 0)
    assert (s0, probes) == (2, 1)  # the S = 1 probe is of another S0
    assert int(np.argmin(curve)) == 2 and curve[2] == pytest.approx(0.0, abs=1e-12)
    assert plain == pytest.approx(a2 * np.sqrt(3.0))
