"""The learning-rate schedule (pserver/optim/rules.py, ``scheduled_lr``): linear warm-up
(PP-ASGD §4 footnote 5, IBM §3.1), step decay, per-epoch annealing (IBM §3.1); the fractional
epoch every caller passes; the keys' checks (issue 25, "the papers' rules by default")."""

from __future__ import annotations

import math

import numpy as np
import pytest

from learners.data import load_dataset
from learners.serial import train_serial
from pserver.errors import ConfigError
from pserver.optim.local_rule import block_position
from pserver.optim.rules import scheduled_lr
from pserver.plan.config import DataConfig, OptimConfig, load_config
from pserver.protocols.epochs import EpochCounter
from pserver.protocols.lockstep import RunPlan
from pserver.protocols.ring import local_epoch


def test_defaults_keep_the_old_step_decay_bit_for_bit():
    cfg = OptimConfig(lr=0.05, lr_milestones=[10, 15])
    for e in (0.0, 3.7, 9.99, 10.0, 14.5, 15.0, 19.2):
        k = sum(1 for m in cfg.lr_milestones if m <= math.floor(e))
        assert scheduled_lr(cfg, e) == 0.05 * 0.1**k  # exactly, not approximately


def test_ppasgd_warm_up_rises_linearly_from_zero_over_the_first_epoch():
    cfg = OptimConfig(lr=0.2, warmup_epochs=1.0)
    assert [scheduled_lr(cfg, e) for e in (0.0, 0.25, 0.5, 1.0, 3.0)] == pytest.approx(
        [0.0, 0.05, 0.1, 0.2, 0.2])


def test_fractional_warm_up_from_a_share_of_the_rate():
    cfg = OptimConfig(lr=1.0, warmup_epochs=0.5, warmup_start=0.1)
    assert scheduled_lr(cfg, 0.0) == pytest.approx(0.1)
    assert scheduled_lr(cfg, 0.25) == pytest.approx(0.55)
    assert scheduled_lr(cfg, 0.5) == 1.0


def test_ibm_schedule_warm_up_ten_epochs_then_anneal_by_one_over_root_two():
    """Zhang et al. §3.1: the base rate 0.1 → 1 over the first 10 epochs, then × 1/√2 every
    epoch from the 11th (0-based epoch 10)."""
    cfg = OptimConfig(lr=1.0, warmup_epochs=10, warmup_start=0.1, lr_decay=2**-0.5,
                      lr_decay_from=10)
    assert scheduled_lr(cfg, 0) == pytest.approx(0.1)
    assert scheduled_lr(cfg, 5) == pytest.approx(0.55)
    assert scheduled_lr(cfg, 9.9) < 1.0 < scheduled_lr(cfg, 9.9) + 0.01
    assert [scheduled_lr(cfg, e) for e in (10, 10.5, 11, 15)] == pytest.approx(
        [2**-0.5, 2**-0.5, 0.5, (2**-0.5) ** 6])


def test_every_counter_gives_the_same_fractional_epoch_as_the_serial_reference():
    n_train, batch, lam = 1347, 16, 4
    counter = EpochCounter(n_train, batch, 20)
    for step in (0, 1, 84, 85, 1000):
        serial = step * batch / n_train  # learners/serial.py, λ = 1
        assert counter.position(step) == serial
        assert local_epoch(step, 1, batch, n_train) == serial
        assert RunPlan(counter, 1).epoch(step) == serial
        assert block_position(step, 1, 1, batch, n_train) == serial
    assert RunPlan(counter, lam).epoch(10) == counter.position(10 * lam)


def test_serial_reference_follows_the_warm_up():
    base = ["run.epochs=1", "model.hidden=[8]", "optim.lr=0.5"]
    data = load_dataset(DataConfig(), 0)
    plain = train_serial(load_config(None, base), data, steps=3)
    warm = train_serial(load_config(None, [*base, "optim.warmup_epochs=1"]), data, steps=3)
    first = train_serial(load_config(None, [*base, "optim.warmup_epochs=1"]), data, steps=1)
    w0 = train_serial(load_config(None, base), data, steps=0)
    np.testing.assert_array_equal(first, w0)  # lr 0 at the start of PP-ASGD's warm-up
    assert not np.allclose(plain, warm)


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (["optim.warmup_start=1.5", "optim.warmup_epochs=1"], "optim.warmup_start = 1.5"),
        (["optim.lr_decay=1.2"], "optim.lr_decay = 1.2: expected a factor in (0, 1]"),
        (["optim.lr_decay=0"], "optim.lr_decay = 0.0: expected a value > 0"),
        (["optim.warmup_epochs=-1"], "optim.warmup_epochs = -1.0: expected a value >= 0"),
        (["optim.warmup_start=0.1"], "optim.warmup_start = 0.1 belongs to a warm-up"),
        (["optim.lr_decay_from=3"], "optim.lr_decay_from = 3 belongs to annealing"),
    ],
)
def test_schedule_keys_checked(overrides, fragment):
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert fragment in str(info.value)
