"""Runs side by side: labels, the compare table and CSV, export, the DataFrame API, the plots.

The pure part runs on hand-made dumps; ``test_compare_real_runs`` and its neighbours on dumps
written by real short mpiexec runs (one module-scoped fixture, three runs).
"""

from __future__ import annotations

import csv
import math
import sys

import numpy as np
import pytest
from mpirun import train

from pserver.dump.reader import DumpError, load_dump
from pserver.dump.writer import StatsWriter
from pserver.stats import cli
from pserver.stats.compare_plots import compare_figure
from pserver.stats.plots import staleness_figure
from pserver.stats.runs import resolve_dump
from pserver.stats.tables import differing_keys, flatten, labels, staleness_distribution

PER_SAMPLE = 0.002  # s of emulated compute per sample in the async run


def config(name="hardsync", n=1, lr=0.05, out="runs/a"):
    return {
        "run": {"out_dir": out, "name": "x", "epochs": 2},
        "protocol": {"name": name, "n": n, "lr_policy": "auto"},
        "optim": {"lr": lr, "lr_milestones": [10, 15]},
    }


def hand_dump(path, cfg, sigma, learners=2, errors=(0.5, 0.3)):
    """A finished dump with the given applied staleness values and test errors."""
    sigma = np.asarray(sigma, np.int32)
    attrs = {"config": cfg, "protocol": cfg["protocol"]["name"], "n_learners": learners,
             "n_servers": 1, "world_size": 3 + learners, "pserver_version": "0.1.0",
             "started": "2024-01-01T00:00:00", "host": "h"}  # fmt: skip
    with StatsWriter(path, attrs) as w:
        k = sigma.size
        w.append("gradients", shard=np.zeros(k, np.int32), learner=np.arange(k) % learners,
                 timestamp=np.arange(k), staleness=sigma, update=np.arange(k) + 1,
                 time=np.linspace(0.1, 1.0, k))  # fmt: skip
        w.append("train", learner=np.arange(k) % learners, step=np.arange(k) // learners,
                 time=np.linspace(0.1, 1.0, k), loss=np.linspace(2.0, 0.5, k),
                 error=np.zeros(k), compute_time=np.full(k, 0.01),
                 wait_time=np.zeros(k))  # fmt: skip
        e = len(errors)
        w.append("test", epoch=np.arange(1.0, e + 1), time=np.arange(1.0, e + 1),
                 samples=100 * np.arange(1, e + 1), timestamp=np.arange(1, e + 1),
                 loss=np.ones(e), error=np.asarray(errors))  # fmt: skip
        w.set_attrs("/", finished="2024-01-01T00:00:10", wall_time=2.0)
    return path


# ---------------------------------------------------------------- pure: labels and tables


def test_labels_name_the_differing_keys_only():
    a = flatten(config("hardsync", out="runs/a"))
    b = flatten(config("softsync", n=2, out="runs/b"))
    c = flatten(config("async", lr=0.01, out="runs/c"))
    assert differing_keys([a, b, c]) == ["protocol.name", "protocol.n", "optim.lr"]
    # protocol.n is left out where the strategy does not read it (hardsync, async)
    assert labels([a, b, c], ["pa", "pb", "pc"]) == [
        "hardsync α0=0.05",
        "softsync n=2 α0=0.05",
        "async α0=0.01",
    ]


def test_labels_of_equal_configs_fall_back_to_the_paths():
    a = flatten(config(out="runs/a"))
    b = flatten(config(out="runs/b"))  # run.out_dir is noise: not a label
    assert differing_keys([a, b]) == []
    assert labels([a, b], ["runs/a", "runs/b"]) == ["runs/a", "runs/b"]


def test_a_key_an_older_dump_lacks_counts_as_its_default():
    """A dump written before ``[sim]`` or ``stats.tensorboard`` existed is not labelled by them:
    the run did what the default does."""
    new = flatten(config(out="runs/new"))
    old = {k: v for k, v in new.items() if not k.startswith("sim.") and k != "stats.tensorboard"}
    assert differing_keys([old, new]) == []
    changed = dict(new, **{"sim.latency": 0.5})
    assert differing_keys([old, changed]) == ["sim.latency"]
    assert differing_keys([{**old, "x.unknown": 1}, new]) == ["x.unknown"]


def test_flatten_keeps_lists_as_values():
    assert flatten({"optim": {"lr_milestones": [10, 15]}}) == {"optim.lr_milestones": (10, 15)}


def test_staleness_distribution_has_every_integer(tmp_path):
    d = load_dump(hand_dump(tmp_path / "s.h5", config("async"), [0, 2, 2, 3]))
    dist = staleness_distribution(d)
    assert dist["staleness"].tolist() == [0, 1, 2, 3]
    assert dist["count"].tolist() == [1, 0, 2, 1]
    assert dist["probability"].tolist() == [0.25, 0.0, 0.5, 0.25]


# ---------------------------------------------------------------- plots a paper can use


def integer_ticks(ax) -> bool:
    lo, hi = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
    return bool(ticks) and all(float(t).is_integer() for t in ticks)


def test_hardsync_staleness_plot_is_readable(tmp_path):
    """σ = 0 everywhere: integer ticks around 0, probability axis within [0, 1], said in words.
    Before: one dot, fractional ticks (-0.04 … 0.04) and a log axis from 0.1 to 10."""
    d = load_dump(hand_dump(tmp_path / "h.h5", config(), [0] * 8))
    ax = staleness_figure(d).axes[0]
    assert integer_ticks(ax)
    lo, hi = ax.get_ylim()
    assert 0.0 <= lo and hi <= 1.0
    assert any("σ = 0 for all 8" in t.get_text() for t in ax.texts)
    assert "(weight updates)" in ax.get_xlabel() and "probability" in ax.get_ylabel()


def test_staleness_plot_with_a_tail_is_log_up_to_one(tmp_path):
    d = load_dump(hand_dump(tmp_path / "a.h5", config("async"), [0] + [3] * 98 + [9]))
    ax = staleness_figure(d).axes[0]
    assert ax.get_yscale() == "log" and ax.get_ylim()[1] == 1.0
    assert integer_ticks(ax) and ax.get_xlim()[1] >= 9


def test_compare_figure_has_units_and_integer_staleness(tmp_path):
    dumps = [
        load_dump(hand_dump(tmp_path / "h.h5", config(), [0] * 6)),
        load_dump(hand_dump(tmp_path / "s.h5", config("softsync", 2), [0, 1, 2, 3, 2, 4])),
    ]
    fig = compare_figure(dumps, ["hardsync", "softsync n=2"])
    ax_time, ax_epoch, ax_loss, ax_sigma = fig.axes
    for ax in fig.axes:
        assert "(" in ax.get_xlabel() and "(" in ax.get_ylabel(), (ax.get_xlabel(), ax.get_ylabel())
    assert integer_ticks(ax_sigma) and integer_ticks(ax_epoch)
    assert ax_sigma.get_ylim()[1] <= 1.0
    assert ax_sigma.get_legend() is None  # one legend, below the panels, over none of them
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[0] == "hardsync (σ = 0 always)" and legend[1].startswith("softsync n=2: ⟨σ⟩")
    assert len(ax_time.lines) == 2 and len(ax_loss.lines) == 2
    # the test error is drawn in percent
    assert ax_time.lines[0].get_ydata().tolist() == pytest.approx([50.0, 30.0])


# ---------------------------------------------------------------- RUN: file or directory


def test_run_may_be_a_directory_or_its_latest_link(tmp_path):
    run = tmp_path / "runs" / "q" / "20240101-000000-1"
    dump = hand_dump(run / "stats.h5", config(), [0, 0])
    (tmp_path / "runs" / "q" / "latest").symlink_to(run.name)
    assert resolve_dump(dump) == dump
    assert resolve_dump(run) == dump
    assert resolve_dump(tmp_path / "runs" / "q").resolve() == dump.resolve()
    hand_dump(tmp_path / "two" / "a" / "stats.h5", config(), [0])
    hand_dump(tmp_path / "two" / "b" / "stats.h5", config(), [0])
    with pytest.raises(DumpError, match="holds 2 runs"):
        resolve_dump(tmp_path / "two")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DumpError, match="without a dump"):
        resolve_dump(tmp_path / "empty")


def test_cli_errors_are_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert cli.main(["compare", str(tmp_path / "empty")]) == 2
    assert cli.main(["export", str(tmp_path / "missing.h5"), "--csv", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("pserver-stats: error: ") for line in err)


# ---------------------------------------------------------------- real runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three short real runs: hardsync λ = 2, 2-softsync λ = 4 with α0/n, async λ = 4 with
    compute emulated per sample (``inject.compute_per_sample``)."""
    root = tmp_path_factory.mktemp("runs")
    specs = {
        "hard": (5, ["protocol.name=hardsync"]),
        "soft": (7, ["protocol.name=softsync", "protocol.n=2", "protocol.lr_policy=nominal"]),
        "async": (7, ["protocol.name=async", f"inject.compute_per_sample={PER_SAMPLE}"]),
    }
    for name, (ranks, overrides) in specs.items():
        train(root / name, ranks, "run.epochs=2", *overrides, timeout=180)
    return root


@pytest.mark.mpi
def test_compare_real_runs(runs, tmp_path, capsys):
    out, table = tmp_path / "cmp.png", tmp_path / "cmp.csv"
    args = [str(runs / "hard"), str(runs / "soft" / "stats.h5"), str(runs / "async")]
    assert cli.main(["compare", *args, "--out", str(out), "--csv", str(table)]) == 0
    printed = capsys.readouterr().out
    assert out.stat().st_size > 10_000 and out.read_bytes()[:4] == b"\x89PNG"
    rows = list(csv.DictReader(table.open()))
    assert [r["label"] for r in rows] == [
        "hardsync lr_policy=auto compute_per_sample=0 λ=2",
        "softsync n=2 lr_policy=nominal compute_per_sample=0 λ=4",
        "async lr_policy=auto compute_per_sample=0.002 λ=4",
    ]
    for row, name in zip(rows, ("hard", "soft", "async"), strict=True):
        dump = load_dump(runs / name / "stats.h5")
        err, sigma = dump.group("test")["error"], dump.group("gradients")["staleness"]
        assert float(row["final_error"]) == err[-1] and float(row["best_error"]) == err.min()
        assert float(row["wall_time_s"]) == dump.attrs["wall_time"]
        assert int(row["max_staleness"]) == sigma.max()
        assert math.isclose(float(row["mean_staleness"]), sigma.mean())
        assert row["label"] in printed
    assert rows[0]["max_staleness"] == "0" and rows[0]["protocol.n"] == "1"
    assert rows[1]["protocol.lr_policy"] == "nominal" and rows[2]["n_learners"] == "4"


@pytest.mark.mpi
def test_nominal_lr_is_alpha0_over_n_in_a_real_run(runs):
    """Eq. (6) as published: every update of 2-softsync used α0/2 (0.05/2), whatever its σ."""
    upd = load_dump(runs / "soft" / "stats.h5").group("updates")
    assert len(upd["lr"]) > 10 and np.all(upd["lr"] == 0.05 / 2)
    assert np.any(upd["mean_staleness"] != 1.0)  # measured ⟨σ⟩ varies; the rate does not


@pytest.mark.mpi
def test_compute_per_sample_stretches_every_minibatch(runs):
    """μ = 16 samples × 2 ms: every minibatch of the async run computed at least 32 ms."""
    for name, least in (("async", 16 * PER_SAMPLE), ("soft", 0.0)):
        train = load_dump(runs / name / "stats.h5").group("train")
        assert train["compute_time"].min() >= least
    assert load_dump(runs / "soft" / "stats.h5").group("train")["compute_time"].min() < 0.032


@pytest.mark.mpi
def test_export_writes_the_dump_as_csv(runs, tmp_path, capsys):
    outdir = tmp_path / "csv"
    assert cli.main(["export", str(runs / "soft"), "--csv", str(outdir)]) == 0
    dump = load_dump(runs / "soft" / "stats.h5")
    names = {p.name for p in outdir.iterdir()}
    assert {"run.csv", "test.csv", "train.csv", "updates.csv", "gradients.csv",
            "staleness.csv"} <= names and "model.csv" not in names  # fmt: skip
    test = list(csv.DictReader((outdir / "test.csv").open()))
    assert [float(r["error"]) for r in test] == dump.group("test")["error"].tolist()
    upd = list(csv.DictReader((outdir / "updates.csv").open()))
    clocks = dump.group("updates")["vector_clock"]
    assert len(upd) == len(clocks)
    assert upd[0]["vector_clock"].split() == [str(t) for t in clocks[0] if t != -1]
    (run,) = list(csv.DictReader((outdir / "run.csv").open()))
    assert run["config.protocol.n"] == "2" and run["protocol"] == "softsync"
    sigma = list(csv.DictReader((outdir / "staleness.csv").open()))
    applied = int((dump.group("gradients")["update"] != -1).sum())
    assert sum(int(r["count"]) for r in sigma) == applied
    assert str(outdir / "run.csv") in capsys.readouterr().out


@pytest.mark.mpi
def test_frames_api_returns_dataframes(runs):
    pd = pytest.importorskip("pandas")
    from pserver.stats import compare_frame, read_frame, read_frames

    f = read_frames(runs / "async")
    dump = load_dump(runs / "async" / "stats.h5")
    assert isinstance(f.test, pd.DataFrame)
    assert f.test["error"].tolist() == dump.group("test")["error"].tolist()
    assert len(f.gradients) == dump.rows("gradients") and f.config["protocol.name"] == "async"
    assert f.delays.empty  # a group this dump does not have
    assert f.staleness["count"].sum() == (dump.group("gradients")["update"] != -1).sum()
    assert read_frame(runs / "hard", "train")["loss"].notna().all()
    table = compare_frame([runs / "hard", runs / "async"])
    assert table["label"].tolist() == [
        "hardsync compute_per_sample=0 λ=2",
        "async compute_per_sample=0.002 λ=4",
    ]
    assert table["max_staleness"].iloc[0] == 0


def test_frames_without_pandas_say_how_to_install(tmp_path, monkeypatch):
    from pserver.stats.frames import FramesError, read_frames

    dump = hand_dump(tmp_path / "h.h5", config(), [0, 0])
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas raises ImportError
    with pytest.raises(FramesError, match=r"pip install -e '\.\[pandas\]'"):
        read_frames(dump)
    assert cli.main(["export", str(dump), "--csv", str(tmp_path / "csv")]) == 0  # no pandas
