"""scripts/reproduce_psp.py in one process: Table 1's verdicts over seeds."""

from __future__ import annotations

import sys

from mpirun import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import reproduce_psp as rp  # noqa: E402


def tables(times: dict[str, list[float]], errors: dict[str, list[float]]) -> dict:
    cells = {k: {"label": k, "times": times[k], "errors": errors[k]} for k in times}
    return {"delayed": cells}


def test_push_pull_holds_with_the_saving_and_sync_s_error_and_aggressive_is_worse():
    times = {"Sync": [100.0, 101.0, 99.0], "Sync+push": [90.0, 91.0, 89.0],
             "Sync+push+pull": [70.0, 71.0, 72.0], "aggressive": [68.0, 69.0, 70.0]}  # fmt: skip
    errors = {"Sync": [0.15, 0.151, 0.149], "Sync+push": [0.16, 0.161, 0.159],
              "Sync+push+pull": [0.155, 0.156, 0.154], "aggressive": [0.29, 0.3, 0.28]}  # fmt: skip
    fast, aggressive = rp.verdicts(tables(times, errors), 0.01)
    assert fast.status == "holds" and "saving +29.0%" in fast.numbers
    assert aggressive.status == "holds"
    errors["Sync+push+pull"] = [0.18, 0.181, 0.179]  # 3 points worse than Sync
    errors["aggressive"] = [0.18, 0.182, 0.178]
    fast, aggressive = rp.verdicts(tables(times, errors), 0.01)
    assert fast.status == "does not hold" and "test error: [does not hold]" in fast.numbers
    assert aggressive.status == "does not hold"


def test_without_the_delayed_scenario_the_claims_are_not_tested():
    found = rp.verdicts({"clean": {}}, 0.01)
    assert [v.status for v in found] == ["not tested", "not tested"]
