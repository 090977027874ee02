"""Rudra's protocols as pure state machines, driven by scripted arrivals (no MPI)."""

from __future__ import annotations

import math

import pytest

from pserver.errors import ConfigError
from pserver.plan.config import load_config
from pserver.protocols import Arrival, make_protocol
from pserver.protocols.clocks import mean_staleness, staleness
from pserver.protocols.rudra import Hardsync, Softsync


def test_eq2_mean_staleness_by_hand():
    # update producing ts_5 from gradients computed on ts 4, 3, 3, 2: <σ> = 4 - 3 = 1
    assert mean_staleness(5, [4, 3, 3, 2]) == 1.0
    assert mean_staleness(1, [0]) == 0.0
    assert staleness(7, 4) == 3
    with pytest.raises(ValueError):
        staleness(3, 4)
    with pytest.raises(ValueError):
        mean_staleness(2, [])


def test_hardsync_waits_for_one_gradient_per_learner():
    p = Hardsync(n_learners=3, batch_size=16, ref_batch=12)
    assert p.waits_for_update
    for learner in (2, 0):
        assert p.on_gradient(Arrival(learner, 5), server_ts=5).accept
        assert not p.ready()
    dup = p.on_gradient(Arrival(0, 5), server_ts=5)
    assert not dup.accept and "second" in dup.reason
    old = p.on_gradient(Arrival(1, 4), server_ts=5)
    assert not old.accept and old.staleness == 1
    assert p.on_gradient(Arrival(1, 5), server_ts=5).accept
    assert p.ready()
    d = p.commit(server_ts=5)
    assert d.new_timestamp == 6 and d.vector_clock == (5, 5, 5) and d.learners == (2, 0, 1)
    assert d.mean_staleness == 0.0 and d.divisor == 3.0
    assert d.lr_scale == pytest.approx(math.sqrt(3 * 16 / 12))  # √(λμ/B) = 2
    assert not p.ready()  # a new round starts empty


@pytest.mark.parametrize("n, count", [(1, 4), (2, 2), (4, 1)])
def test_softsync_updates_after_floor_lambda_over_n(n, count):
    p = Softsync(n_learners=4, n=n, lr_policy="none")
    arrivals = [Arrival(i % 4, ts) for i, ts in enumerate([9, 8, 9, 7])]
    for a in arrivals[: count - 1]:
        p.on_gradient(a, server_ts=9)
        assert not p.ready()
    p.on_gradient(arrivals[count - 1], server_ts=9)
    assert p.ready()
    d = p.commit(server_ts=9)
    assert len(d.vector_clock) == count and d.divisor == count and d.lr_scale == 1.0


def test_softsync_mean_policy_divides_by_eq2_staleness():
    p = Softsync(n_learners=2, n=1, lr_policy="mean")
    p.on_gradient(Arrival(0, 6), server_ts=10)  # σ = 4
    p.on_gradient(Arrival(1, 8), server_ts=10)  # σ = 2
    d = p.commit(server_ts=10)
    assert d.mean_staleness == 3.0  # (11 - 1) - mean(6, 8)
    assert d.lr_scale == pytest.approx(1 / 3)  # eq. (6): α0 / <σ>


def test_softsync_mean_policy_never_enlarges_the_rate():
    p = Softsync(n_learners=2, n=1, lr_policy="mean")
    p.on_gradient(Arrival(0, 10), server_ts=10)
    p.on_gradient(Arrival(1, 9), server_ts=10)
    assert p.commit(server_ts=10).lr_scale == 1.0  # <σ> = 0.5 < 1


def test_softsync_per_gradient_weights():
    p = Softsync(n_learners=3, n=3, lr_policy="per-gradient")
    assert p.on_gradient(Arrival(0, 7), server_ts=7).weight == 1.0  # σ = 0 -> 1/max(0, 1)
    p.commit(server_ts=7)
    assert p.on_gradient(Arrival(1, 5), server_ts=8).weight == pytest.approx(1 / 3)
    assert p.commit(server_ts=8).lr_scale == 1.0


def test_make_protocol_from_config():
    assert isinstance(make_protocol(load_config(None, []), 4), Hardsync)
    a = make_protocol(load_config(None, ["protocol.name=async"]), 4)
    # issue 25: the default is eq. (6) as published, α0/n (α0/λ for async), not measured ⟨σ⟩
    assert isinstance(a, Softsync) and a.count == 1 and a.lr_policy == "nominal"
    a.on_gradient(Arrival(0, 0), server_ts=0)
    assert a.commit(server_ts=0).lr_scale == 1 / 4  # σ = 0 measured: still α0/λ
    s = make_protocol(load_config(None, ["protocol.name=softsync", "protocol.n=2"]), 4)
    assert s.count == 2 and s.lr_policy == "nominal"
    ssp = make_protocol(load_config(None, ["protocol.name=ssp"]), 4)
    assert ssp.lr_policy == "mean"  # no n: the measured rule (docs/protocols.md, Deviations)
    with pytest.raises(ConfigError, match="protocol.n = 5 exceeds the 4 learners"):
        make_protocol(load_config(None, ["protocol.name=softsync", "protocol.n=5"]), 4)
    with pytest.raises(ConfigError, match="does not apply to hardsync"):
        make_protocol(load_config(None, ["protocol.lr_policy=mean"]), 4)
    with pytest.raises(ConfigError, match="protocol.c = 6 exceeds"):
        make_protocol(load_config(None, ["protocol.name=psp", "protocol.c=6"]), 4)


@pytest.mark.parametrize("n_learners, n, scale", [(4, 1, 1.0), (4, 2, 0.5), (30, 4, 0.25)])
def test_softsync_nominal_policy_is_alpha0_over_n(n_learners, n, scale):
    """Eq. (6) as published: α = α0/n, a constant, whatever σ the update measured."""
    p = Softsync(n_learners=n_learners, n=n, lr_policy="nominal")
    for ts in (3, 9):  # server at 9: σ = 6 and 0, ⟨σ⟩ = 3 (``mean`` would give 1/3)
        for learner in range(p.count):
            p.on_gradient(Arrival(learner, ts), server_ts=9)
        d = p.commit(server_ts=9)
        assert d.lr_scale == scale and d.divisor == p.count


def test_async_nominal_policy_is_alpha0_over_lambda():
    cfg = load_config(None, ["protocol.name=async", "protocol.lr_policy=nominal"])
    p = make_protocol(cfg, 8)
    assert p.on_gradient(Arrival(3, 9), server_ts=9).weight == 1.0  # σ = 0: still α0/λ
    assert p.commit(server_ts=9).lr_scale == 1 / 8
    s = make_protocol(load_config(None, ["protocol.name=softsync", "protocol.n=2",
                                         "protocol.lr_policy=nominal"]), 8)  # fmt: skip
    assert s.on_gradient(Arrival(0, 9), server_ts=9).weight == 1.0


@pytest.mark.parametrize("name", ["ssp", "hardsync", "psp"])
def test_nominal_policy_refused_where_there_is_no_n(name):
    with pytest.raises(ConfigError, match="lr_policy"):
        make_protocol(load_config(None, [f"protocol.name={name}", "protocol.lr_policy=nominal"]), 4)
