"""PSP-SGD partial pulling (Algorithm 1, worker lines 3-15) with scripted block replies."""

from __future__ import annotations

import math

import pytest

from pserver.partial_pull import PartialPull


def test_fraction_of_blocks_then_compute_at_once() -> None:
    pp = PartialPull(n_blocks=10, fraction=0.9, tau2=0.0)
    pp.start(0.0, wanted=1)
    for b in range(8):
        assert pp.on_block(b, 1, now=0.1 * b)
        assert not pp.ready(100.0)
        assert pp.deadline() is None
    assert pp.on_block(9, 2, now=1.0)  # newer than required is fine
    assert pp.ready(1.0) and pp.deadline() == 1.0
    assert pp.missing() == {8}
    assert pp.stale_fraction == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("n", "fraction", "need"),
    [
        (100, 0.07, 7),  # 0.07 * 100 = 7.000000000000001: a bare ceil() would ask for 8
        (100, 0.57, 57),  # 0.57 * 100 = 56.99999999999999
        (10, 0.75, 8),
        (10, 0.9, 9),
        (4, 0.75, 3),
        (3, 0.1, 1),
        (5, 1.0, 5),
    ],
)
def test_blocks_needed(n: int, fraction: float, need: int) -> None:
    pp = PartialPull(n, fraction, 0.0)
    pp.start(0.0, wanted=0)
    assert pp.need == need
    for b in range(need - 1):
        pp.on_block(b, 0, 0.0)
    assert not pp.ready(0.0)
    pp.on_block(need - 1, 0, 0.0)
    assert pp.ready(0.0)


def test_timeout_after_b_blocks_has_an_exact_deadline() -> None:
    pp = PartialPull(n_blocks=4, fraction=0.5, tau2=0.25)
    pp.start(5.0, wanted={0: 3, 1: 3, 2: 3, 3: 3})
    pp.on_block(2, 3, now=5.5)
    assert pp.deadline() is None
    pp.on_block(0, 3, now=6.0)
    assert pp.deadline() == 6.25  # the timer starts at the b-th block
    assert not pp.ready(6.2499) and pp.ready(6.25)
    pp.on_block(3, 4, now=6.1)  # a third block does not restart it
    assert pp.deadline() == 6.25 and not pp.ready(6.2)
    assert pp.missing() == {1} and pp.stale_fraction == 0.25


def test_all_blocks_close_before_the_timeout() -> None:
    pp = PartialPull(n_blocks=3, fraction=0.5, tau2=30.0)
    pp.start(0.0, wanted=0)
    for now, b in enumerate((1, 0, 2)):
        pp.on_block(b, 0, now=float(now))
    assert pp.ready(2.0) and pp.deadline() == 31.0  # 2 of 3 at t = 1.0
    assert pp.missing() == set() and pp.stale_fraction == 0.0


def test_late_block_is_missing_then_used_next_iteration() -> None:
    # Rudra-style requirement: each block newer than the copy the last gradient came from.
    pp = PartialPull(n_blocks=4, fraction=0.75, tau2=0.0)
    have = {b: 0 for b in range(4)}
    pp.start(0.0, {b: have[b] + 1 for b in have})
    for b in (0, 1, 3):
        assert pp.on_block(b, 1, now=1.0)
        have[b] = 1
    assert pp.ready(1.0) and pp.missing() == {2}  # block 2's server is slow: compute without it
    # Iteration 1: block 2 still wants > 0 (its copy is still w^0); the others want > 1.
    pp.start(2.0, {b: have[b] + 1 for b in have})
    assert pp.wanted == {0: 2, 1: 2, 2: 1, 3: 2} and pp.iteration == 1
    assert pp.on_block(2, 1, now=2.1)  # the late reply of iteration 0, fresh enough now
    assert pp.missing() == {0, 1, 3}
    for b in (0, 1):
        assert pp.on_block(b, 2, now=2.5)
    assert pp.ready(2.5) and pp.missing() == {3}


def test_block_older_than_required_is_dropped() -> None:
    # Algorithm 1 verbatim: iteration t accepts only blocks with t' >= t (lines 10-11).
    pp = PartialPull(n_blocks=3, fraction=1.0, tau2=0.0)
    pp.start(0.0, wanted=2)
    assert not pp.on_block(1, 1, now=0.1)  # a late reply from iteration 1: dropped
    assert pp.dropped == 1 and pp.missing() == {0, 1, 2} and not pp.ready(1e9)
    assert pp.on_block(0, 2, now=0.2) and pp.on_block(2, 2, now=0.3)
    assert not pp.ready(1e9)  # fraction 1 waits for block 1 ...
    assert pp.on_block(1, 2, now=0.4)  # ... asked again, it comes back fresh
    assert pp.ready(0.4) and pp.stale_fraction == 0.0


def test_repeated_reply_counts_once() -> None:
    pp = PartialPull(n_blocks=2, fraction=1.0, tau2=0.0)
    pp.start(0.0, wanted=0)
    assert pp.on_block(0, 0, 0.0) and pp.on_block(0, 1, 0.1)
    assert not pp.ready(0.1) and pp.used == {0: 1}


def test_only_wanted_blocks_count() -> None:
    # Blocks 1 and 3 have stopped: the fraction is of the two blocks still waited for.
    pp = PartialPull(n_blocks=4, fraction=0.5, tau2=0.0)
    pp.start(0.0, {0: 5, 2: 5})
    assert pp.need == 1
    assert not pp.on_block(3, 9, 0.0)  # not waited for: ignored
    assert not pp.ready(0.0)
    assert pp.on_block(2, 5, 0.0)
    assert pp.ready(0.0) and pp.missing() == {0} and pp.stale_fraction == 0.5
    pp.start(1.0, {})
    assert pp.ready(1.0) and pp.stale_fraction == 0.0  # nothing left to wait for


def test_misuse() -> None:
    pp = PartialPull(n_blocks=2, fraction=0.5, tau2=0.0)
    with pytest.raises(RuntimeError, match="start"):
        pp.on_block(0, 0, 0.0)
    with pytest.raises(ValueError, match="out of range"):
        pp.start(0.0, {2: 0})
    pp.start(0.0, wanted=0)
    with pytest.raises(ValueError, match="out of range"):
        pp.on_block(-1, 0, 0.0)


@pytest.mark.parametrize(
    ("n", "fraction", "tau2", "match"),
    [
        (0, 0.5, 0.0, "at least one block"),
        (2, 0.0, 0.0, "fraction"),
        (2, 1.5, 0.0, "fraction"),
        (2, 0.5, -1.0, "tau2"),
        (2, 0.5, math.nan, "tau2"),
    ],
)
def test_bad_parameters(n: int, fraction: float, tau2: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PartialPull(n, fraction, tau2)
