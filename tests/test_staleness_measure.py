"""One staleness measure for every strategy (issue 25, docs/stats.md *Staleness σ*), on
hand-made dumps: every reader (summary, compare table and CSV, export, read_frames, plot)
takes σ from the ``staleness`` rows; dropped gradients and ADPSGD's partner-model age are not
σ; a dump written before the group existed falls back on its applied gradients; ``check``
holds the rows to the gradients."""

from __future__ import annotations

import csv
import re

import numpy as np
import pytest

from pserver.dump.check import check_dump
from pserver.dump.reader import load_dump, summarize
from pserver.dump.writer import StatsWriter
from pserver.stats import cli
from pserver.stats.compare_seeds import comparison_rows
from pserver.stats.export import export_csv
from pserver.stats.tables import applied_staleness, staleness_distribution


def attrs(name: str, learners: int = 2) -> dict:
    return {"config": {"protocol": {"name": name}}, "protocol": name, "n_learners": learners,
            "n_servers": 1, "world_size": 3 + learners, "pserver_version": "0.1.0",
            "started": "2024-01-01T00:00:00", "host": "h", "finished": "2024-01-01T00:00:09",
            "wall_time": 2.0}  # fmt: skip


def add_staleness(w: StatsWriter, learner, sigma, owner=None, version=None) -> None:
    k = len(sigma)
    w.append("staleness", learner=np.asarray(learner, np.int32),
             owner=np.asarray(learner if owner is None else owner, np.int32),
             version=np.arange(k) if version is None else np.asarray(version),
             staleness=np.asarray(sigma, np.int32), time=np.linspace(0.1, 1.0, k))  # fmt: skip




def ps_dump(path, with_group: bool = True):
    """Async-like shard rows: five gradients, the last two dropped (σ 6 and 7, PSP's drop of
    t' < t): applied σ = 0, 1, 2; ⟨σ⟩ = 1, not (0+1+2+6+7)/5 = 3.2."""
    ts = np.array([0, 0, 0, 0, 0], np.int64)
    sigma = np.array([0, 1, 2, 6, 7], np.int32)
    update = np.array([1, 2, 3, -1, -1], np.int64)
    learner = np.array([0, 1, 0, 1, 0], np.int32)
    with StatsWriter(path, attrs("psp")) as w:
        w.append("gradients", shard=np.zeros(5, np.int32), learner=learner, timestamp=ts,
                 staleness=sigma, update=update, time=np.linspace(0.1, 1.0, 5))  # fmt: skip
        if with_group:
            add_staleness(w, learner[:3], sigma[:3], owner=[0, 0, 0], version=ts[:3])
    return path


def adpsgd_dump(path):
    """Two learners; the exchanges' partner ages (5, 9) are large, the gradients' σ small."""
    with StatsWriter(path, attrs("adpsgd")) as w:
        w.append("exchanges", learner=np.array([0, 1], np.int32), step=np.array([3, 3]),
                 partner=np.array([1, 0], np.int32), partner_age=np.array([5, 9], np.int32),
                 partner_step=np.array([0, 0]), bytes=np.array([8, 8]),
                 wait_time=np.array([0.1, 0.1]), time=np.array([0.5, 0.5]))  # fmt: skip
        add_staleness(w, [0, 1, 0, 1], [1, 0, 1, 2])
    return path


def table_cell(out: str, header: str) -> str:
    """The one run's cell under ``header`` in ``compare``'s printed table."""
    lines = out.splitlines()
    head = re.split(r"\s{2,}", lines[0].strip())
    row = re.split(r"\s{2,}", lines[2].strip())
    return row[head.index(header)]


@pytest.mark.parametrize(
    "make, mean, top",
    [(ps_dump, 1.0, 2), (adpsgd_dump, 1.0, 2)],
    ids=["ps-with-dropped-gradients", "adpsgd-not-partner-age"],
)
def test_every_reader_shows_the_staleness_rows_mean(tmp_path, capsys, make, mean, top):
    path = make(tmp_path / "stats.h5")
    dump = load_dump(path)
    block = summarize(dump)["staleness"]
    assert block["count"] > 0 and block["mean"] == mean and block["max"] == top
    assert applied_staleness(dump).mean() == mean
    dist = staleness_distribution(dump)
    assert float(np.dot(dist["staleness"], dist["probability"])) == pytest.approx(mean)
    row = comparison_rows([dump])[0]
    assert row["mean_staleness"] == mean and row["max_staleness"] == top
    assert cli.main(["compare", str(path), "--csv", str(tmp_path / "c.csv")]) == 0
    out = capsys.readouterr().out
    assert table_cell(out, "⟨σ⟩") == f"{mean:.2f}" and table_cell(out, "max σ") == str(top)
    with (tmp_path / "c.csv").open() as f:
        assert float(next(csv.DictReader(f))["mean_staleness"]) == mean
    written = {p.name for p in export_csv(dump, tmp_path / "x")}
    assert {"staleness.csv", "staleness_rows.csv"} <= written  # distribution, rows: both kept
    with (tmp_path / "x" / "staleness_rows.csv").open() as f:
        assert np.mean([int(r["staleness"]) for r in csv.DictReader(f)]) == mean
    with (tmp_path / "x" / "run.csv").open() as f:
        assert float(next(csv.DictReader(f))["mean_staleness"]) == mean
    assert cli.main(["summary", str(path)]) == 0
    assert f"⟨σ⟩ over gradients {mean:.4g}" in capsys.readouterr().out


def test_read_frames_shows_the_same_number(tmp_path):
    pytest.importorskip("pandas")
    from pserver.stats import compare_frame, read_frames

    path = adpsgd_dump(tmp_path / "stats.h5")
    f = read_frames(path)
    assert f.summary["staleness"]["mean"] == 1.0
    assert f.frames["staleness"]["staleness"].mean() == 1.0
    assert compare_frame([path])["mean_staleness"].tolist() == [1.0]


def test_partner_age_stays_beside_sigma_under_its_own_name(tmp_path):
    s = summarize(load_dump(adpsgd_dump(tmp_path / "stats.h5")))
    assert s["exchanges"]["partner_age"]["mean"] == 7.0
    assert s["exchanges"]["staleness"]["mean"] == s["staleness"]["mean"] == 1.0
    assert "partner age  ⟨age⟩ 7" in cli.format_summary(s)


def test_a_dump_without_the_group_falls_back_on_its_applied_gradients(tmp_path):
    dump = load_dump(ps_dump(tmp_path / "stats.h5", with_group=False))
    assert summarize(dump)["staleness"]["mean"] == 1.0
    assert not [p for p in check_dump(dump) if "staleness" in p]


def test_no_rows_is_no_figure(tmp_path):
    path = tmp_path / "stats.h5"
    with StatsWriter(path, attrs("hardsync")) as w:
        w.append("test", epoch=np.array([1.0]), time=np.array([1.0]), samples=np.array([10]),
                 timestamp=np.array([1]), loss=np.array([1.0]), error=np.array([0.5]))  # fmt: skip
    dump = load_dump(path)
    assert summarize(dump)["staleness"]["count"] == 0
    assert comparison_rows([dump])[0]["mean_staleness"] is None


def test_check_holds_the_rows_to_the_applied_gradients(tmp_path):
    good = load_dump(ps_dump(tmp_path / "a.h5"))
    assert not [p for p in check_dump(good) if "staleness" in p]
    path = tmp_path / "b.h5"
    with StatsWriter(path, attrs("async")) as w:
        w.append("gradients", shard=np.zeros(2, np.int32), learner=np.array([0, 1], np.int32),
                 timestamp=np.array([0, 0]), staleness=np.array([0, 1], np.int32),
                 update=np.array([1, 2]), time=np.array([0.1, 0.2]))  # fmt: skip
        add_staleness(w, [0, 1], [0, 3], owner=[0, 0], version=[0, 0])
    problems = check_dump(load_dump(path))
    assert "staleness rows are not the applied gradients (learner, shard, timestamp, σ)" in (
        problems
    )
