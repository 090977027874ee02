"""Deterministic straggler/delay injection: same seed, same delays; frequencies as configured."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random

import pytest

from pserver.errors import ConfigError
from pserver.plan.inject import InjectPlan, mix64, uniform

GRID = list(itertools.product(range(4), range(25), range(1000)))  # 100k (server, learner, i)


def delayed(plan: InjectPlan, keys) -> int:
    return sum(plan.pull_delay_for(s, lr, i) > 0.0 for s, lr, i in keys)


def test_same_inputs_same_delay_in_any_order() -> None:
    keys = GRID[::97]
    first = {
        k: InjectPlan(seed=7, pull_delay_prob=0.3, pull_delay=4.0).pull_delay_for(*k) for k in keys
    }
    shuffled = keys[:]
    random.Random(1).shuffle(shuffled)
    plan = InjectPlan(seed=7, pull_delay_prob=0.3, pull_delay=4.0)  # a fresh object: no state
    assert {k: plan.pull_delay_for(*k) for k in shuffled} == first
    assert set(first.values()) == {0.0, 4.0}


def test_seed_and_each_coordinate_matter() -> None:
    a = [uniform(1, 2, 3, i) for i in range(50)]
    assert a == [uniform(1, 2, 3, i) for i in range(50)]
    for key in ((2, 2, 3), (1, 3, 3), (1, 2, 4), (1, 3, 2)):  # seed, server, learner; swapped
        assert [uniform(*key, i) for i in range(50)] != a
    assert 0.0 <= min(a) and max(a) < 1.0
    assert uniform(0, -1, -1, 0) != uniform(0, 0, 0, 0)  # -1 (none) is a valid coordinate


@pytest.mark.parametrize("p", [0.0016, 0.05, 0.5])
def test_delayed_fraction_matches_probability(p: float) -> None:
    # The count of delayed pulls among N independent draws is Binomial(N, p): accept 5 σ.
    plan = InjectPlan(seed=2017, pull_delay_prob=p, pull_delay=4.0)
    n = len(GRID)
    k = delayed(plan, GRID)
    sigma = math.sqrt(n * p * (1 - p))
    assert abs(k - n * p) <= 5 * sigma, (k, n * p, sigma)


def test_neighbouring_requests_are_independent() -> None:
    # P(request i and i+1 both delayed) = p² for independent draws; also Binomial, 5 σ.
    p, plan = 0.5, InjectPlan(seed=3, pull_delay_prob=0.5, pull_delay=1.0)
    both = sum(
        plan.pull_delay_for(s, lr, i) > 0 and plan.pull_delay_for(s, lr, i + 1) > 0
        for s, lr, i in GRID[::5]
    )
    n = len(GRID[::5])
    assert abs(both - n * p * p) <= 5 * math.sqrt(n * p * p * (1 - p * p))


def test_uniform_histogram() -> None:
    # 10 equal bins of 100k draws: each count is Binomial(N, 0.1); 5 σ per bin.
    counts = [0] * 10
    for key in GRID:
        counts[int(uniform(11, *key) * 10)] += 1
    n = len(GRID)
    assert all(abs(c - n / 10) <= 5 * math.sqrt(n * 0.09) for c in counts), counts


def test_edge_probabilities() -> None:
    keys = GRID[:2000]
    assert delayed(InjectPlan(seed=1, pull_delay_prob=0.0, pull_delay=4.0), keys) == 0
    assert delayed(InjectPlan(seed=1, pull_delay_prob=1.0, pull_delay=4.0), keys) == len(keys)
    assert delayed(InjectPlan(seed=1, pull_delay_prob=1.0, pull_delay=0.0), keys) == 0


def test_mix64_is_a_64_bit_word() -> None:
    assert all(0 <= mix64(x) < 2**64 for x in (0, 1, 2**64 - 1))
    assert len({mix64(x) for x in range(1000)}) == 1000  # a bijection: no collisions


def test_slow_learner_and_server() -> None:
    plan = InjectPlan(
        slow_server=1, server_factor=3.0, slow_learner=2, learner_factor=4.0, compute_time=0.01
    )
    assert [plan.server_slowdown(s) for s in range(3)] == [1.0, 3.0, 1.0]
    assert [plan.compute_time_for(lr) for lr in range(4)] == [0.01, 0.01, 0.04, 0.01]
    none = InjectPlan(compute_time=0.5)
    assert none.server_slowdown(0) == 1.0 and none.compute_time_for(0) == 0.5
    assert none.pull_delay_for(0, 0, 0) == 0.0


def test_plan_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        InjectPlan().seed = 1  # type: ignore[misc]


def test_defaults_are_valid() -> None:
    InjectPlan().validate()
    InjectPlan(seed=-5, pull_delay_prob=1.0, slow_server=3, slow_learner=0).validate(4, 1)


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"pull_delay_prob": -0.1}, "inject.pull_delay_prob = -0.1: expected a probability"),
        ({"pull_delay_prob": 1.5}, "inject.pull_delay_prob = 1.5"),
        ({"pull_delay_prob": math.nan}, "inject.pull_delay_prob = nan: expected a finite"),
        ({"pull_delay": -1.0}, "inject.pull_delay = -1.0: expected seconds >= 0"),
        ({"compute_time": -0.5}, "inject.compute_time = -0.5"),
        ({"server_factor": 0.5}, "inject.server_factor = 0.5: expected a slow-down factor >= 1"),
        ({"learner_factor": 0.0}, "inject.learner_factor = 0.0"),
        ({"learner_factor": math.inf}, "inject.learner_factor = inf: expected a finite"),
        ({"slow_server": -2}, "inject.slow_server = -2: expected -1 (none) or an index"),
        ({"slow_learner": 1.5}, "inject.slow_learner = 1.5: expected an integer"),
        ({"seed": True}, "inject.seed = True: expected an integer"),
    ],
)
def test_validate_names_the_key(changes: dict, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        InjectPlan(**changes).validate()
    assert key in str(err.value)


def test_validate_checks_ranks_when_counts_are_given() -> None:
    InjectPlan(slow_server=7).validate()  # no count: any index
    with pytest.raises(ConfigError, match=r"inject.slow_server = 7: .* one of servers 0..3"):
        InjectPlan(slow_server=7).validate(n_servers=4)
    with pytest.raises(ConfigError, match=r"inject.slow_learner = 2: .* one of learners 0..1"):
        InjectPlan(slow_learner=2).validate(n_learners=2)


def test_compute_per_sample_grows_with_the_minibatch() -> None:
    """``inject.compute_per_sample``: μ changes the emulated compute as GEMM time does."""
    plan = InjectPlan(compute_time=0.01, compute_per_sample=0.001, slow_learner=1,
                      learner_factor=2.0)  # fmt: skip
    assert plan.compute_time_for(0, 4) == pytest.approx(0.014)
    assert plan.compute_time_for(0, 128) == pytest.approx(0.138)
    assert plan.compute_time_for(1, 4) == pytest.approx(0.028)  # the straggler's factor too
    assert InjectPlan(compute_time=0.5).compute_time_for(0, 64) == 0.5
    with pytest.raises(ConfigError, match="inject.compute_per_sample"):
        InjectPlan(compute_per_sample=-1.0).validate()
