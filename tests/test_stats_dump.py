"""The statistics dump: writer, crash survival, reader errors, summary numbers, CLI, plots."""

import json
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest

from pserver.dump.reader import DumpError, load_dump, staleness_summary, summarize
from pserver.dump.writer import StatsWriter
from pserver.errors import PserverError
from pserver.stats import cli

CONFIG = {"protocol": {"name": "softsync", "n": 1}, "cluster": {"servers": 1}}
ATTRS = {
    "config": CONFIG,
    "protocol": "softsync",
    "n_learners": 2,
    "n_servers": 1,
    "world_size": 5,
    "pserver_version": "0.1.0",
    "started": "2024-01-01T00:00:00",
    "host": "testhost",
}


def write_hand_dump(path, finished=True):
    """λ = 2 learners, 1-softsync (2 gradients per update), one dropped gradient.

    update i  vector clock  eq. (2): (i-1) - mean      gradient σ = (i-1) - ts
      1       [0, 0]        0 - 0   = 0                0, 0
      2       [1, 0]        1 - 0.5 = 0.5              0, 1
      3       [2, 1]        2 - 1.5 = 0.5              0, 1
    then a gradient with ts 3 from learner 1 is dropped.
    """
    with StatsWriter(path, ATTRS) as w:
        w.append(
            "updates",
            shard=np.zeros(3, np.int32),
            timestamp=np.array([1, 2, 3], np.int64),
            time=np.array([1.0, 2.0, 3.0]),
            n_gradients=np.full(3, 2, np.int32),
            mean_staleness=np.array([0.0, 0.5, 0.5]),
            lr=np.full(3, 0.1),
        )
        w.append_clocks("updates", "vector_clock", [[0, 0], [1, 0], [2, 1]])
        w.append(
            "gradients",
            shard=np.zeros(7, np.int32),
            learner=np.array([0, 1, 0, 1, 0, 1, 1], np.int32),
            timestamp=np.array([0, 0, 1, 0, 2, 1, 3], np.int64),
            staleness=np.array([0, 0, 0, 1, 0, 1, 0], np.int32),
            update=np.array([1, 1, 2, 2, 3, 3, -1], np.int64),
            time=np.linspace(0.5, 3.5, 7),
        )
        w.append(
            "train",
            learner=np.array([0, 1, 0, 1, 0, 1, 1], np.int32),
            step=np.array([0, 0, 1, 1, 2, 2, 3], np.int64),
            time=np.linspace(0.5, 3.5, 7),
            loss=np.array([2.0, 2.1, 1.5, 1.6, 1.2, 1.3, 1.1]),
            error=np.array([0.9, 0.9, 0.7, 0.7, 0.5, 0.5, 0.4]),
            compute_time=np.full(7, 0.5),
            wait_time=np.full(7, 0.1),
        )
        w.append(
            "test",
            epoch=np.array([1.0, 2.0, 3.0]),
            time=np.array([3.0, 6.0, 9.0]),
            samples=np.array([64, 128, 224], np.int64),
            timestamp=np.array([1, 2, 3], np.int64),
            loss=np.array([1.5, 1.0, 1.1]),
            error=np.array([0.5, 0.3, 0.35]),
        )
        w.append(
            "learners",
            learner=np.array([0, 1], np.int32),
            minibatches=np.array([3, 4], np.int64),
            compute_time=np.array([1.5, 2.0]),
            wait_time=np.array([0.3, 0.4]),
            samples=np.array([96, 128], np.int64),
        )
        if finished:
            w.set_attrs("/", finished="2024-01-01T00:00:10", wall_time=10.0)
    return path


# ---------------------------------------------------------------- writer


def test_append_round_trip_keeps_dtypes_and_grows(tmp_path):
    path = tmp_path / "sub" / "stats.h5"  # parent directory is created
    with StatsWriter(path, ATTRS) as w:
        w.append("train", learner=np.array([0, 1], np.int32), loss=[0.5, 0.25])
        w.append("train", learner=[2], loss=np.array([0.125], np.float32))  # cast to stored dtype
        w.append("train", learner=np.zeros(0, np.int32), loss=[])  # empty batch: no-op
    with h5py.File(path, "r") as f:
        learner, loss = f["train/learner"], f["train/loss"]
        assert learner.dtype == np.int32 and loss.dtype == np.float64
        assert learner.maxshape == (None,) and learner.chunks is not None
        np.testing.assert_array_equal(learner[()], [0, 1, 2])
        np.testing.assert_array_equal(loss[()], [0.5, 0.25, 0.125])


@pytest.mark.parametrize(
    "columns, fragment",
    [
        ({"a": [1, 2], "b": [1]}, "differ in length"),
        ({"a": [[1, 2]], "b": [[1, 2]]}, "expected a 1-D array"),
        ({"a": ["x"], "b": ["y"]}, "expected a numeric"),
        ({"a": [1]}, "differ from the group's columns"),
        ({}, "no columns given"),
    ],
)
def test_append_rejects_bad_columns(tmp_path, columns, fragment):
    with StatsWriter(tmp_path / "s.h5", ATTRS) as w:
        w.append("g", a=[0], b=[0])
        with pytest.raises(ValueError, match=fragment):
            w.append("g", **columns)


def test_ragged_clocks_are_padded_and_widen(tmp_path):
    path = tmp_path / "s.h5"
    with StatsWriter(path, ATTRS) as w:
        w.append_clocks("updates", "vector_clock", [[0, 1], [2]])
        w.append_clocks("updates", "vector_clock", [[3, 4, 5]])  # wider: old rows get -1
        w.append_clocks("updates", "vector_clock", [[6]])
        w.append_clocks("updates", "vector_clock", [])
    with h5py.File(path, "r") as f:
        clocks = f["updates/vector_clock"]
        assert clocks.dtype == np.int64 and clocks.maxshape == (None, None)
        np.testing.assert_array_equal(clocks[()], [[0, 1, -1], [2, -1, -1], [3, 4, 5], [6, -1, -1]])


def test_attrs_stored_as_json_and_parsed_back(tmp_path):
    path = tmp_path / "s.h5"
    with StatsWriter(path, ATTRS) as w:
        w.set_attrs("updates", note="per shard", sizes=[1, 2])
    with h5py.File(path, "r") as f:
        assert json.loads(f.attrs["config"]) == CONFIG
        assert f.attrs["n_learners"] == 2 and f.attrs["protocol"] == "softsync"
    dump = load_dump(path)
    assert dump.config == CONFIG
    assert dump.attrs["n_learners"] == 2 and dump.attrs["host"] == "testhost"
    assert dump.group_attrs["updates"] == {"note": "per shard", "sizes": [1, 2]}
    assert dump.group("updates") == {} and dump.rows("gradients") == 0


def test_maybe_flush_waits_for_the_interval(tmp_path):
    with StatsWriter(tmp_path / "s.h5", ATTRS, flush_interval=60.0) as w:
        calls = []
        w.flush = lambda: calls.append(1)  # spy; the real flush is exercised below
        w.maybe_flush()
        assert calls == []
        w._last_flush -= 61.0  # pretend a minute went by
        w.maybe_flush()
        assert calls == [1]


CRASH_SCRIPT = """
import os, sys
import numpy as np
from pserver.dump.writer import StatsWriter
w = StatsWriter(sys.argv[1], {"pserver_version": "0.1.0", "config": {"a": 1}})
for i in range(20):
    w.append("gradients", learner=np.full(50, i % 4, np.int32), staleness=np.arange(50) % 7)
    w.append_clocks("updates", "vector_clock", [[i] * (1 + i % 3)])
w.flush()
for i in range(200):  # never flushed: may or may not reach the disk
    w.append("gradients", learner=np.zeros(50, np.int32), staleness=np.zeros(50, np.int64))
os._exit(0)  # no close, no atexit, no h5py cleanup: what SIGKILL would leave
"""


def test_flushed_rows_survive_a_killed_writer(tmp_path):
    path = tmp_path / "s.h5"
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CRASH_SCRIPT), str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    with h5py.File(path, "r") as f:  # opens at all (no "already open for write" flags)
        assert f["gradients/staleness"].shape[0] >= 1000
    dump = load_dump(path)
    assert dump.config == {"a": 1}
    grads = dump.group("gradients")
    assert len(grads["learner"]) == len(grads["staleness"]) >= 1000
    np.testing.assert_array_equal(grads["staleness"][:1000], np.tile(np.arange(50) % 7, 20))
    np.testing.assert_array_equal(grads["learner"][:1000], np.repeat(np.arange(20) % 4, 50))
    clocks = dump.group("updates")["vector_clock"]
    assert clocks.shape == (20, 3)
    np.testing.assert_array_equal(clocks[:3], [[0, -1, -1], [1, 1, -1], [2, 2, 2]])


# ---------------------------------------------------------------- reader


def test_reader_errors_are_pserver_errors(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("not hdf5\n")
    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["x"] = [1, 2, 3]
    cases = [
        (tmp_path / "missing.h5", "no such dump file"),
        (tmp_path, "is a directory"),
        (text, "is not an HDF5 file"),
        (foreign, "not a pserver dump"),
    ]
    for path, fragment in cases:
        with pytest.raises(DumpError, match=fragment) as info:
            load_dump(path)
        assert isinstance(info.value, PserverError) and str(path) in str(info.value)


def test_staleness_summary_exact():
    s = staleness_summary([0, 0, 0, 1, 0, 1])
    assert s == {
        "count": 6,
        "mean": pytest.approx(1 / 3),
        "min": 0,
        "max": 1,
        "p50": 0,
        "p90": 1,
        "p99": 1,
        "histogram": {0: 4, 1: 2},
    }
    # inverted CDF: p-th percentile = smallest σ with at least p % of the values <= it
    s = staleness_summary(np.arange(100))
    assert (s["p50"], s["p90"], s["p99"], s["max"]) == (49, 89, 98, 99)
    assert staleness_summary([])["count"] == 0 and staleness_summary([])["mean"] is None


def test_summary_of_hand_made_dump(tmp_path):
    s = summarize(load_dump(write_hand_dump(tmp_path / "stats.h5")))
    assert s["run"]["protocol"] == "softsync" and s["run"]["n_learners"] == 2
    assert s["updates"] == {
        "count": 3,
        "mean_staleness": pytest.approx(1 / 3),  # (0 + 0.5 + 0.5) / 3
        "mean_gradients_per_update": 2.0,
        "per_shard": {0: 3},
    }
    g = s["gradients"]
    assert (g["count"], g["applied"], g["dropped"]) == (7, 6, 1)
    assert g["staleness"]["mean"] == pytest.approx(1 / 3)  # = eq. (2) mean: 2 gradients/update
    assert g["staleness"]["histogram"] == {0: 4, 1: 2} and g["staleness"]["max"] == 1
    assert g["per_learner_mean"] == {0: 0.0, 1: pytest.approx(2 / 3)}
    assert g["bound_2n"] == 2 and g["fraction_within_2n"] == 1.0
    assert s["learners"] == {
        0: {"minibatches": 3, "compute_time": 1.5, "wait_time": 0.3, "samples": 96},
        1: {"minibatches": 4, "compute_time": 2.0, "wait_time": 0.4, "samples": 128},
    }
    assert s["test"] == {
        "count": 3,
        "final_error": 0.35,
        "best_error": 0.3,
        "final_epoch": 3.0,
        "best_epoch": 2.0,
    }
    assert (s["wall_time"], s["wall_time_estimated"]) == (10.0, False)
    assert s["samples"] == 224 and s["samples_per_s"] == pytest.approx(22.4)


def test_summary_of_unfinished_and_empty_dumps(tmp_path):
    s = summarize(load_dump(write_hand_dump(tmp_path / "a.h5", finished=False)))
    assert (s["wall_time"], s["wall_time_estimated"]) == (9.0, True)  # last test row at 9 s
    with StatsWriter(tmp_path / "b.h5", ATTRS):
        pass
    s = summarize(load_dump(tmp_path / "b.h5"))
    assert s["updates"] == {"count": 0} and s["gradients"]["count"] == 0
    assert s["learners"] == {} and s["test"] == {"count": 0}
    assert s["wall_time"] is None and s["samples_per_s"] is None


def test_learner_totals_fall_back_to_train_rows(tmp_path):
    path = tmp_path / "s.h5"
    with StatsWriter(path, ATTRS) as w:
        w.append(
            "train",
            learner=[0, 1, 1],
            time=[1.0, 2.0, 3.0],
            loss=[1.0, 1.0, 1.0],
            compute_time=[0.5, 0.25, 0.25],
            wait_time=[0.0, 0.5, 1.0],
        )
    learners = summarize(load_dump(path))["learners"]
    assert learners == {
        0: {"minibatches": 1, "compute_time": 0.5, "wait_time": 0.0},
        1: {"minibatches": 2, "compute_time": 0.5, "wait_time": 1.5},
    }


# ---------------------------------------------------------------- CLI


def test_histogram_bins_wide_ranges():
    assert cli.histogram_rows({0: 4, 2: 1}) == [("0", 4), ("1", 0), ("2", 1)]
    rows = cli.histogram_rows({v: 1 for v in range(100)}, max_rows=25)
    assert rows[0] == ("0-3", 4) and rows[-1] == ("96-99", 4) and len(rows) == 25


def test_cli_summary_text_and_json(tmp_path, capsys):
    path = write_hand_dump(tmp_path / "stats.h5")
    assert cli.main(["summary", str(path)]) == 0
    out = capsys.readouterr().out
    assert "protocol softsync" in out and "dropped 1" in out
    assert "⟨σ⟩ over gradients 0.3333" in out and "max σ 1" in out
    assert "0.6667  ########################################" in out  # σ = 0 is the mode
    assert "final 0.3500 (epoch 3)" in out and "22.4 samples/s" in out
    assert cli.main(["summary", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["gradients"]["staleness"]["histogram"] == {"0": 4, "1": 2}
    assert data["learners"]["1"]["minibatches"] == 4


def test_cli_plot_writes_pngs(tmp_path, capsys):
    names = ["staleness.png", "test_error.png", "train_loss.png"]
    full = write_hand_dump(tmp_path / "full" / "stats.h5")
    empty = tmp_path / "empty" / "stats.h5"  # no rows at all: the figures say so
    with StatsWriter(empty, ATTRS):
        pass
    for argv, outdir in (
        (["plot", str(full), "-o", str(tmp_path / "figs")], tmp_path / "figs"),
        (["plot", str(empty)], empty.parent),  # default: next to the dump
    ):
        assert cli.main(argv) == 0
        assert capsys.readouterr().out.split() == [str(outdir / n) for n in names]
        for name in names:
            assert (outdir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_missing_dump_is_one_line_exit_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pserver.stats.cli", "summary", str(tmp_path / "nope.h5")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("pserver-stats: error: no such dump file:")


def test_cli_prints_each_learners_share_of_a_core(tmp_path, capsys):
    path = tmp_path / "s.h5"
    with StatsWriter(path, ATTRS) as w:
        w.append(
            "learners", learner=np.array([0, 1], np.int32), minibatches=np.array([3, 4]),
            compute_time=np.array([1.0, 1.0]), wait_time=np.array([0.5, 0.5]),
            samples=np.array([96, 128]), cpu_time=np.array([0.25, 1.5]),
            run_time=np.array([5.0, 2.0]),
        )  # fmt: skip
    learners = summarize(load_dump(path))["learners"]
    assert learners[0]["cpu_time"] == 0.25 and learners[1]["run_time"] == 2.0
    assert cli.main(["summary", str(path)]) == 0
    # learner rows: id, minibatches, compute s, wait s, samples, cpu % (the dump's path, also
    # printed, may hold "96" or "128" too: pytest numbers its temporary directories)
    out = capsys.readouterr().out.splitlines()
    rows = [r for r in map(str.split, out) if len(r) == 6 and r[0].isdigit()]
    assert [(r[4], r[-1]) for r in rows] == [("96", "5.0"), ("128", "75.0")]  # 0.25/5, 1.5/2
    assert cli.main(["summary", str(write_hand_dump(tmp_path / "old.h5"))]) == 0
    assert "cpu %" in (out := capsys.readouterr().out) and "n/a" in out  # dumps without them
