"""scripts/claims.py: the verdict rules of the reproduce_* drivers, in one process."""

from __future__ import annotations

import math
import sys

import pytest
from mpirun import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import claims as c  # noqa: E402


def s(label: str, *values: float) -> c.Sample:
    return c.Sample.of(label, values, scale=100, unit="%")


def test_a_sample_drops_failed_runs_and_prints_its_error_bar():
    x = c.Sample.of("x", [0.1, 0.2, math.nan, 0.3], scale=100, unit="%")
    assert x.n == 3 and x.mean == pytest.approx(0.2) and x.std == pytest.approx(0.1)
    assert c.mean_std(x) == "20.00 ± 10.00 % (3 seeds)"
    assert math.isnan(c.Sample.of("one", [1.0]).std)
    assert c.mean_std(c.Sample.of("none", [])).startswith("n/a")


@pytest.mark.parametrize(
    ("t", "df", "p"),
    [(2.132, 4, 0.05), (2.776, 4, 0.025), (1.812, 10, 0.05), (0.0, 3, 0.5), (-2.132, 4, 0.95)],
)
def test_the_t_tail_matches_the_printed_tables(t, df, p):
    """Student's t quantiles of any printed table (one-sided)."""
    assert c.t_sf(t, df) == pytest.approx(p, abs=2e-4)


def test_welch_uses_the_satterthwaite_degrees_of_freedom():
    x, y = c.Sample.of("x", [1.0, 2.0, 3.0]), c.Sample.of("y", [2.0, 4.0, 6.0, 8.0])
    t, df = c.welch(x, y)
    vx, vy = 1.0 / 3, (20.0 / 3) / 4
    assert t == pytest.approx(-3.0 / math.sqrt(vx + vy))
    assert df == pytest.approx((vx + vy) ** 2 / (vx**2 / 2 + vy**2 / 3))


def test_lower_needs_a_difference_beyond_the_seeds_spread():
    clear = c.lower("P", "x < y", s("x", 0.10, 0.11, 0.12), s("y", 0.20, 0.21, 0.22))
    assert clear.holds is True and "p = " in clear.numbers and "Welch" in clear.rule
    noisy = c.lower("P", "x < y", s("x", 0.10, 0.30, 0.20), s("y", 0.12, 0.32, 0.22))
    assert noisy.holds is False  # lower mean, but well inside the spread
    wrong = c.lower("P", "x < y", s("x", 0.30, 0.31, 0.32), s("y", 0.10, 0.11, 0.12))
    assert wrong.holds is False


def test_one_seed_is_not_tested():
    v = c.lower("P", "x < y", s("x", 0.1), s("y", 0.2, 0.3))
    assert v.status == c.UNTESTED and "too few seeds" in v.numbers and v.holds is None
    assert c.within("P", "same", s("x"), s("y", 0.1, 0.2), 0.01).status == c.UNTESTED


def test_no_worse_fails_only_on_a_clear_loss():
    assert c.no_worse("B", "x <= y", s("x", 0.21, 0.25, 0.23), s("y", 0.2, 0.24, 0.22)).holds
    assert c.no_worse("B", "x <= y", s("x", 0.1, 0.11), s("y", 0.3, 0.31)).holds
    assert not c.no_worse("B", "x <= y", s("x", 0.3, 0.31, 0.32), s("y", 0.1, 0.11, 0.12)).holds


def test_within_compares_the_means_to_the_stated_margin():
    v = c.within("I", "same", s("x", 0.10, 0.12), s("y", 0.11, 0.12), 0.01)
    assert v.holds is True and "difference -0.50 %" in v.numbers and "<= 1.00 %" in v.rule
    assert c.within("I", "same", s("x", 0.10, 0.12), s("y", 0.13, 0.14), 0.01).holds is False


def test_saving_needs_the_share_and_the_test():
    x, y = c.Sample.of("x", [70.0, 71.0, 72.0]), c.Sample.of("y", [100.0, 101.0, 99.0])
    assert c.saving("T", "30 % less", x, y, 0.2).holds is True
    assert c.saving("T", "30 % less", x, y, 0.35).holds is False
    assert "saving +29.0%" in c.saving("T", "t", x, y, 0.2).numbers


def test_both_fails_on_any_failed_part_and_is_untested_on_a_missing_one():
    yes = c.judged("P", "a", True, "n", "r")
    no = c.judged("P", "b", False, "n", "r")
    maybe = c.not_tested("P", "c", "quick")
    assert c.both("P", "ab", yes, yes).holds is True
    assert c.both("P", "ab", yes, no, maybe).holds is False
    assert c.both("P", "ab", yes, maybe).status == c.UNTESTED


def test_the_report_prints_every_status_and_counts_them():
    text = c.report([c.judged("P", "a", True, "n1", "r1"), c.judged("P", "b", False, "n2", "r2"),
                     c.not_tested("P", "c", "λ = 2 cannot show λ >= 8")])  # fmt: skip
    assert "[holds] P: a" in text and "[does not hold] P: b" in text
    assert "[not tested] P: c\n    λ = 2 cannot show" in text
    assert text.endswith("3 claims: holds: 1, does not hold: 1, not tested: 1")
