"""``pserver-stats compare`` groups runs that differ only in seed (mean ± std) and stays
readable with many runs (issue 25, item 5), on hand-made dumps."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgba

from pserver.dump.reader import load_dump
from pserver.dump.writer import StatsWriter
from pserver.stats import cli
from pserver.stats.compare_plots import compare_figure, grouped_figure
from pserver.stats.compare_seeds import comparison_rows, seed_groups
from pserver.stats.tables import run_config


def run(path, name="hardsync", seed=0, lr=0.05, sigma=(0, 0), errors=(0.5, 0.3), out="runs/x",
        lost=False):
    """A finished dump: the given applied σ (``staleness`` rows) and test errors (``lost``:
    learner 1 lost after its step 0)."""
    cfg = {"run": {"seed": seed, "out_dir": out, "epochs": len(errors)},
           "protocol": {"name": name}, "optim": {"lr": lr}}  # fmt: skip
    attrs = {"config": cfg, "protocol": name, "n_learners": 2, "n_servers": 1,
             "world_size": 5, "pserver_version": "0.1.0", "started": "2024-01-01T00:00:00",
             "host": "h", "finished": "2024-01-01T00:00:09", "wall_time": 2.0 + seed}  # fmt: skip
    k, e = len(sigma), len(errors)
    with StatsWriter(path, attrs) as w:
        w.append("staleness", learner=np.arange(k) % 2, owner=np.zeros(k), version=np.arange(k),
                 staleness=np.asarray(sigma), time=np.linspace(0.1, 1.0, k))  # fmt: skip
        w.append("train", learner=np.arange(k) % 2, step=np.arange(k) // 2,
                 time=np.linspace(0.1, 1.0 + seed, k), loss=np.linspace(2.0, 0.5 + seed, k),
                 error=np.zeros(k), compute_time=np.full(k, 0.01),
                 wait_time=np.zeros(k))  # fmt: skip
        w.append("test", epoch=np.arange(1.0, e + 1), time=np.arange(1.0, e + 1) * (1 + seed),
                 samples=100 * np.arange(1, e + 1), timestamp=np.arange(1, e + 1),
                 loss=np.ones(e), error=np.asarray(errors))  # fmt: skip
        if lost:
            w.append("learners_lost", learner=np.array([1]), rank=np.array([4]),
                     time=np.array([0.5]), last_step=np.array([0]), learners=np.array([1]))
    return load_dump(path)


@pytest.fixture
def six(tmp_path):
    """hardsync and async, three seeds each (out_dir differs too: bookkeeping, not a key)."""
    dumps = []
    for name, base in (("hardsync", 0.30), ("async", 0.40)):
        for seed in range(3):
            sigma = (0, seed) if name == "async" else (0, 0)
            errors = (0.5, base + 0.01 * seed)
            path, out = tmp_path / f"{name}{seed}.h5", f"runs/{name}{seed}"
            dumps.append(run(path, name, seed, sigma=sigma, errors=errors, out=out))
    return dumps


def test_runs_differing_only_in_seed_are_one_row_with_mean_and_std(six):
    rows = comparison_rows(six)
    assert [r["label"] for r in rows] == ["hardsync (3 seeds)", "async (3 seeds)"]
    hard, asyn = rows
    assert hard["runs"] == 3 and hard["seeds"] == (0, 1, 2)
    finals = [0.30, 0.31, 0.32]
    assert hard["final_error"] == pytest.approx(np.mean(finals))
    assert hard["final_error_std"] == pytest.approx(np.std(finals, ddof=1))
    assert hard["wall_time_s"] == 3.0 and hard["wall_time_s_std"] == 1.0
    # ⟨σ⟩: the mean of the runs' ⟨σ⟩ (0, 0.5, 1) and their spread
    assert asyn["mean_staleness"] == 0.5 and asyn["mean_staleness_std"] == 0.5
    assert hard["mean_staleness"] == 0.0 and hard["mean_staleness_std"] == 0.0
    assert len(hard["dump"].split()) == 3


def test_a_key_other_than_the_seed_keeps_runs_apart(tmp_path):
    dumps = [run(tmp_path / f"{lr}-{s}.h5", seed=s, lr=lr) for lr in (0.1, 0.05) for s in (0, 1)]
    assert seed_groups([run_config(d) for d in dumps]) == [[0, 1], [2, 3]]
    rows = comparison_rows(dumps)
    assert [r["label"] for r in rows] == ["α0=0.1 (2 seeds)", "α0=0.05 (2 seeds)"]
    assert [r["optim.lr"] for r in rows] == [0.1, 0.05] and "run.seed" not in rows[0]


def test_single_runs_keep_their_own_figures(tmp_path):
    dumps = [run(tmp_path / "a.h5", "hardsync"), run(tmp_path / "b.h5", "async", sigma=(1, 2))]
    rows = comparison_rows(dumps)
    assert [r["label"] for r in rows] == ["hardsync", "async"]
    assert rows[1]["runs"] == 1 and rows[1]["mean_staleness"] == 1.5
    assert rows[1]["mean_staleness_std"] is None and rows[1]["max_staleness"] == 2


def test_compare_prints_mean_plus_minus_std_and_writes_the_spread(six, tmp_path, capsys):
    paths = [str(d.path) for d in six]
    assert cli.main(["compare", *paths, "--csv", str(tmp_path / "c.csv")]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("async (3 seeds)"))
    assert "0.50 ± 0.50" in line and "41.00 ± 1.00" in line  # ⟨σ⟩; final error in %
    rows = list(csv.DictReader((tmp_path / "c.csv").open()))
    assert len(rows) == 2 and rows[1]["runs"] == "3"
    assert float(rows[1]["final_error_std"]) == pytest.approx(0.01)
    assert float(rows[1]["mean_staleness"]) == 0.5  # the column the study and papers read


def line_colors(fig) -> list[tuple]:
    return [to_rgba(ln.get_color()) for ln in fig.axes[0].lines]


def test_the_figure_draws_a_band_per_experiment_of_several_seeds(six):
    groups = seed_groups([run_config(d) for d in six])
    fig = grouped_figure([[six[i] for i in g] for g in groups], ["hardsync", "async"])
    ax_time, ax_epoch, ax_loss, _ = fig.axes
    for ax in (ax_time, ax_epoch, ax_loss):
        assert len(ax.lines) == 2 and len(ax.collections) == 2  # mean curves and their bands
    # test error against epochs: the seeds' mean, in percent
    assert ax_epoch.lines[0].get_ydata().tolist() == pytest.approx([50.0, 31.0])


def test_fourteen_runs_stay_readable(tmp_path):
    dumps = [run(tmp_path / f"r{i}.h5", lr=0.01 * (i + 1)) for i in range(14)]
    names = [f"run {i}" for i in range(14)]
    fig = compare_figure(dumps, names)
    colors = line_colors(fig)
    assert len(colors) == 14 and len(set(colors)) == 14  # no colour used twice
    assert all(ax.get_legend() is None for ax in fig.axes)
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == [f"{n} (σ = 0 always)" for n in names]
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    box = legend.get_window_extent(renderer)
    for ax in fig.axes:  # the legend is below the panels, over none of them
        assert not box.overlaps(ax.get_window_extent(renderer)), ax.get_title()


def test_compare_shows_a_lost_learner(tmp_path, capsys):
    """A run that lost a learner (issue 22) says so in the table and under it; the seed
    group's row counts the losses on average; runs without a loss keep the narrow table."""
    a = run(tmp_path / "a.h5", "async", 0, out="runs/a")
    b = run(tmp_path / "b.h5", "async", 1, out="runs/b", lost=True)
    rows = comparison_rows([a, b])
    assert [r["learners_lost"] for r in rows] == [0.5] and rows[0]["learners_lost_std"] > 0
    assert cli.main(["compare", str(tmp_path / "a.h5"), str(tmp_path / "b.h5")]) == 0
    out = capsys.readouterr().out
    assert " lost" in out.splitlines()[0]
    assert f"lost: {tmp_path / 'b.h5'}: learner 1 (rank 4) at t=0.5s after step 0; λ = 1" in out
    assert cli.main(["compare", str(tmp_path / "a.h5")]) == 0
    out = capsys.readouterr().out
    assert " lost" not in out.splitlines()[0] and "lost:" not in out
