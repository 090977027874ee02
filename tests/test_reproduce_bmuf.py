"""scripts/reproduce_bmuf.py in one process: the verdicts over seeds, only at 4-8 learners."""

from __future__ import annotations

import sys

from mpirun import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import reproduce_bmuf as rb  # noqa: E402


def run(method: str, lam: int, seed: int, error: float) -> rb.Run:
    return rb.Run(method, lam, 4, error, error, 1.0, seed, 10, 0.1, 0.01, 0)


def test_bmuf_claims_are_judged_per_learner_count_in_four_to_eight():
    errors = {"MA": (27.0, 28.0, 29.0), "BMUF-CBM": (17.5, 17.7, 17.9),
              "BMUF-NBM": (17.0, 17.2, 17.4)}  # fmt: skip
    runs = [run(m, lam, s, e) for lam in (2, 8) for m, es in errors.items()
            for s, e in enumerate(es)]  # fmt: skip
    found = rb.verdicts(runs)
    assert [v.status for v in found] == ["holds", "holds"]
    assert all("λ = 8" in v.claim for v in found)  # λ = 2 is outside the claims' range
    worse = [r if r.method != "BMUF-NBM" else run(r.method, r.learners, r.seed, 30.0 + r.seed)
             for r in runs]  # fmt: skip
    assert [v.status for v in rb.verdicts(worse)] == ["does not hold", "does not hold"]


def test_a_quick_run_says_not_tested():
    found = rb.verdicts([run(m, 2, 0, 20.0) for m in rb.METHODS])
    assert [v.status for v in found] == ["not tested", "not tested"]
    assert "4-8 learners" in found[0].numbers
