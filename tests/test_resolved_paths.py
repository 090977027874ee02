"""Records name the run a path resolved to, never a ``latest`` link that a newer run moves on:
the compare table and CSV, the summary's path, a warm start's source (issue 24 item 6)."""

from __future__ import annotations

import csv
import json

from test_stats_compare import config, hand_dump

from pserver.ckpt.warm_start import resolved
from pserver.runtime.rundir import point_latest
from pserver.stats import cli


def two_runs_with_latest(tmp_path):
    """runs/a/{1,2} and runs/b/{1}, each with a ``latest`` link, as run.out_dir's template."""
    for name, ids, lr in (("a", ["1", "2"], 0.05), ("b", ["1"], 0.1)):
        for rid in ids:
            hand_dump(tmp_path / name / rid / "stats.h5", config(lr=lr), [0, 1])
            point_latest(tmp_path / name / "latest", tmp_path / name / rid)
    return tmp_path / "a", tmp_path / "b" / "latest"


def test_the_compare_csv_names_the_runs_not_latest(tmp_path, capsys):
    a, b = two_runs_with_latest(tmp_path)
    out = tmp_path / "ab.csv"
    assert cli.main(["compare", str(a), str(b), "--csv", str(out)]) == 0
    with open(out) as f:
        rows = list(csv.DictReader(f))
    assert [r["dump"] for r in rows] == [
        str(tmp_path / "a" / "2" / "stats.h5"), str(tmp_path / "b" / "1" / "stats.h5")]
    assert "latest" not in out.read_text() and "latest" not in capsys.readouterr().out


def test_the_summary_path_is_the_run_not_latest(tmp_path, capsys):
    a, _ = two_runs_with_latest(tmp_path)
    for given in (a, a / "latest", a / "latest" / "stats.h5"):
        assert cli.main(["summary", "--json", str(given)]) == 0
        assert json.loads(capsys.readouterr().out)["path"] == str(a / "2" / "stats.h5")


def test_a_warm_starts_source_is_recorded_as_the_run_itself(tmp_path):
    a, _ = two_runs_with_latest(tmp_path)
    assert resolved(str(a / "latest")) == str((a / "2").resolve())
    assert resolved(str(a / "latest" / "stats.h5")) == str((a / "2" / "stats.h5").resolve())
    assert resolved(str(tmp_path / "none")) == str(tmp_path / "none")  # the reader says why
