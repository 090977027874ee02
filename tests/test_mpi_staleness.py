"""Issue 25: one staleness measure, the same number everywhere, for every strategy.

A short quickstart run per strategy (λ = 4, 2 epochs, a hard timeout each): the dump has
``staleness`` rows (count > 0), and the progress line's last ⟨σ⟩, ``pserver-stats summary
--json``'s ``staleness`` mean, ``compare``'s ⟨σ⟩ column and its CSV ``mean_staleness`` agree.
"""

from __future__ import annotations

import csv
import json
import re

import pytest
from mpirun import QUICKSTART, run_job

from pserver.dump.check import check_dump
from pserver.dump.reader import load_dump
from pserver.stats import cli

LEARNERS = 4
#: strategy -> (ranks for λ = 4, extra overrides, the σ it must show when it is fixed)
CASES = {
    "hardsync": (LEARNERS + 3, (), 0),
    "async": (LEARNERS + 3, (), None),
    "psp": (LEARNERS + 3, ("protocol.pull_fraction=0.5", "blocks.count=4"), None),
    "sync": (LEARNERS + 2, (), 0),
    "hybrid": (LEARNERS + 2, (), None),
    "adpsgd": (LEARNERS + 2, (), None),
    "bmuf": (LEARNERS + 3, (), 0),
    "ma": (LEARNERS + 3, (), 0),
}
SIGMA = re.compile(r"<sigma> (\d+\.\d\d)")


def cell(table: str, header: str) -> str:
    """The one run's cell under ``header`` in ``compare``'s printed table."""
    lines = table.splitlines()
    head = re.split(r"\s{2,}", lines[0].strip())
    return re.split(r"\s{2,}", lines[2].strip())[head.index(header)]


@pytest.mark.mpi
@pytest.mark.parametrize("name", list(CASES))
def test_progress_summary_and_compare_show_one_sigma(tmp_path, capsys, name):
    n, extra, fixed = CASES[name]
    out = tmp_path / "run"
    res = run_job(n, [str(QUICKSTART), f"run.out_dir={out}", f"protocol.name={name}",
                      "run.epochs=2", *extra], 120)  # fmt: skip
    assert res.returncode == 0, res.output
    assert check_dump(load_dump(out / "stats.h5")) == []
    progress = SIGMA.findall(res.output)
    assert progress, res.output  # the per-epoch lines and the run's last line
    assert cli.main(["summary", str(out / "stats.h5"), "--json"]) == 0
    block = json.loads(capsys.readouterr().out)["staleness"]
    assert block["count"] > 0
    assert cli.main(["compare", str(out), "--csv", str(tmp_path / "c.csv")]) == 0
    table = capsys.readouterr().out
    with (tmp_path / "c.csv").open() as f:
        mean_csv = float(next(csv.DictReader(f))["mean_staleness"])
    assert mean_csv == block["mean"]
    assert float(progress[-1]) == float(cell(table, "⟨σ⟩")) == round(block["mean"], 2)
    if fixed is not None:
        assert block["max"] == fixed
    if name == "hybrid":  # one step late from the second step on (IBM Table 1)
        assert block["max"] == 1 and block["histogram"]["1"] > block["histogram"].get("0", 0)
