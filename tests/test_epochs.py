"""Epochs and termination as pure decisions (pserver/protocols/epochs.py), in one process."""

from __future__ import annotations

import pytest

from pserver.plan.config import Config
from pserver.protocols.epochs import EpochCounter


def counter(**kw) -> EpochCounter:
    args = dict(train_size=100, batch_size=10, epochs=3, test_every=1, basis="applied")
    args.update(kw)
    return EpochCounter(**args)


def test_applied_basis_ignores_drops():
    c = counter()
    assert c.samples(applied=4, dropped=6) == 40
    assert c.advance(applied=4, dropped=6).ended == ()
    assert c.epoch(applied=10, dropped=6) == 1


def test_computed_basis_counts_drops():
    c = counter(basis="computed")
    assert c.counts_drops
    assert c.samples(applied=4, dropped=6) == 100
    ends = c.advance(applied=4, dropped=6)
    assert ends.ended == (1,) and ends.tested == (1,) and not ends.done
    assert c.epoch(applied=4, dropped=6) == 1


def test_each_epoch_ends_once():
    c = counter()
    assert c.advance(9).ended == ()
    assert c.advance(10).ended == (1,)
    assert c.advance(11).ended == ()
    assert c.advance(25).ended == (2,)  # one call may end one epoch ...
    c2 = counter()
    assert c2.advance(20).ended == (1, 2)  # ... or several


def test_test_every_skips_epochs_but_not_the_final_one():
    c = counter(epochs=5, test_every=2)
    tested = [e for applied in range(1, 51) for e in c.advance(applied).tested]
    assert tested == [2, 4, 5]


def test_every_epoch_ended_by_the_final_call_is_tested():
    c = counter(epochs=3, test_every=2)
    ends = c.advance(30)  # epochs 1..3 end at once, the last sample among them
    assert ends.ended == (1, 2, 3) and ends.tested == (1, 2, 3) and ends.done


def test_stop_after_the_last_sample():
    c = counter(epochs=2)
    assert not c.advance(19).done
    assert c.advance(20).done
    assert c.advance(21).done  # stays over (a fast shard may take a late gradient's round)


def test_data_server_ends_a_learners_only_run_after_the_last_minibatch():
    c = counter(train_size=95, batch_size=10, epochs=2)  # 190 samples: 19 minibatches
    assert [c.last_minibatch(n) for n in (0, 18, 19, 20)] == [False, False, True, True]


def test_from_config():
    cfg = Config()
    cfg.run.epochs, cfg.run.epoch_basis, cfg.stats.test_every = 4, "computed", 2
    cfg.data.batch_size = 8
    c = EpochCounter.from_config(cfg, 64)
    got = (c.train_size, c.batch_size, c.epochs, c.test_every, c.basis)
    assert got == (64, 8, 4, 2, "computed")
    assert c.total_samples == 256


def test_unknown_basis_is_refused():
    with pytest.raises(ValueError, match="epoch basis"):
        counter(basis="seen")
