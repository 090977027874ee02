"""scripts/reproduce_ibm.py in one process: Table 2's and Table 3's verdicts over seeds."""

from __future__ import annotations

import argparse
import sys

from mpirun import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import reproduce_ibm as ri  # noqa: E402


def row(name: str, factor: float, seed: int, error: float, kept: float = 1.0) -> dict:
    return {"strategy": name, "factor": factor, "seed": seed, "final_error": error,
            "best_error": error, "epoch_s": 1.0 / kept, "ratio": 1.0 / kept,
            "speed_kept": kept}  # fmt: skip


def test_table2_holds_when_every_pair_is_within_the_margin():
    same = [row(n, 1, s, 0.17 + 0.001 * s) for n in ("sync", "hybrid", "adpsgd") for s in range(3)]
    v = ri.table2_claim(same, 0.01)
    assert v.status == "holds" and "SYNC = HYBRID: [holds]" in v.numbers
    worse = [r if r["strategy"] != "hybrid" else {**r, "final_error": 0.3} for r in same]
    v = ri.table2_claim(worse, 0.01)
    assert v.status == "does not hold" and "SYNC = ADPSGD: [holds]" in v.numbers
    assert ri.table2_claim(same[:3], 0.01).status == "not tested"  # sync alone


def test_table3_needs_the_straggler_runs_and_two_seeds():
    base = [row(n, 1, s, 0.2) for n in ("adpsgd", "sync") for s in range(2)]
    assert ri.claim(base, 0.9, 4).status == "not tested"  # no 10x runs
    slow = [row("adpsgd", 10, s, 0.2, 0.78) for s in range(2)]
    slow += [row("sync", 10, s, 0.2, 0.2) for s in range(2)]
    v = ri.claim(base + slow, 0.9, 4)  # ideal at λ = 4: (3 + 0.1)/4 = 77.5 %
    assert v.status == "holds" and "ADPSGD 78 ± 0 % (2 seeds)" in v.numbers
    assert ri.claim(base + slow[:1] + slow[2:], 0.9, 4).status == "not tested"  # one seed


def test_hybrid_delay_control_trains_both_serial_references(capsys):
    """scripts/hybrid_delay.py: SYNC's and HYBRID's serial references on the digits, one row
    per momentum, each a mean over the seeds; the two differ (one is a step late)."""
    import hybrid_delay

    assert hybrid_delay.main(["--data", "digits", "--epochs", "1", "--seeds", "3",
                              "--momentum", "0.9"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if ln.startswith("| 0.9 |")]
    assert len(rows) == 1 and rows[0].count("(3 seeds)") == 2, out
    args = argparse.Namespace(data="digits", train_samples=0, epochs=1, seeds=1, learners=4)
    plain, delayed = hybrid_delay.errors(args, 0.9)
    assert len(plain) == len(delayed) == 1 and plain != delayed
