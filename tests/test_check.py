"""pserver.dump.check: a consistent hand-made dump passes, and each rule catches its breach."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
from mpirun import train

from pserver.dump.check import check_dump
from pserver.dump.reader import Dump
from pserver.stats import cli

I32, I64 = np.int32, np.int64


def consistent() -> Dump:
    """Hardsync, one shard, two learners, three updates of two fresh gradients, one epoch."""
    ts = np.array([1, 2, 3], I64)
    groups = {
        "updates": {
            "shard": np.zeros(3, I32), "timestamp": ts, "n_gradients": np.full(3, 2, I32),
            "mean_staleness": np.zeros(3), "vector_clock": np.array([[0, 0], [1, 1], [2, 2]], I64),
        },
        "gradients": {
            "shard": np.zeros(6, I32), "learner": np.array([0, 1] * 3, I32),
            "timestamp": np.repeat([0, 1, 2], 2).astype(I64), "staleness": np.zeros(6, I32),
            "update": np.repeat(ts, 2),
        },
        "servers": {"shard": np.zeros(1, I32), "updates": np.array([3], I64)},
        "blocks": {
            "block": np.zeros(1, I32), "shard": np.zeros(1, I32), "timestamp": np.array([3], I64),
            "applied": np.array([6], I64), "dropped": np.zeros(1, I64),
        },
        "learners": {"learner": np.array([0, 1], I32), "minibatches": np.array([3, 3], I64)},
        "train": {
            "learner": np.repeat([0, 1], 3).astype(I32), "step": np.tile([0, 1, 2], 2),
            "loss": np.full(6, 2.0),
        },
        "test": {"epoch": np.array([1.0]), "samples": np.array([96], I64),
                 "error": np.array([0.5]), "loss": np.array([1.5])},
        "model": {"weights": np.ones(10, np.float32)},
    }
    config = {"protocol": {"name": "hardsync"}, "run": {"epochs": 1, "epoch_basis": "applied"},
              "data": {"batch_size": 16}}
    attrs = {"config": config, "finished": "2026-01-01T00:00:00", "wall_time": 1.0}
    return Dump(path=Path("x.h5"), attrs=attrs, groups=groups)


def test_a_consistent_dump_has_no_problem() -> None:
    assert check_dump(consistent()) == []


def breach(edit) -> list[str]:  # noqa: ANN001
    d = consistent()
    edit(d)
    return check_dump(d)


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda d: d.attrs.pop("finished"), "did not end cleanly"),
        (lambda d: d.groups["model"]["weights"].__setitem__(3, np.nan), "non-finite"),
        (lambda d: d.groups["updates"]["timestamp"].__setitem__(2, 4), "are not 1, 2"),
        (lambda d: d.groups["updates"]["mean_staleness"].__setitem__(0, 0.5), "eq. (2)"),
        (lambda d: d.groups["updates"]["vector_clock"].__setitem__((1, 1), -1), "vector clocks"),
        (lambda d: d.groups["gradients"]["staleness"].__setitem__(5, 1), "(i − 1) − timestamp"),
        (lambda d: d.groups["gradients"]["update"].__setitem__(5, 2), "differ from n_gradients"),
        (lambda d: d.groups["servers"]["updates"].__setitem__(0, 2), "servers/updates"),
        (lambda d: d.groups["blocks"]["applied"].__setitem__(0, 5), "applied 5 gradients"),
        (lambda d: d.groups["learners"]["minibatches"].__setitem__(1, 4), "learner 1"),
        (lambda d: d.groups["test"]["samples"].__setitem__(0, 200), "before 1 epochs"),
        (lambda d: d.groups["test"]["error"].__setitem__(0, 1.5), "outside [0, 1]"),
    ],
)
def test_each_rule_catches_its_breach(edit, words: str) -> None:  # noqa: ANN001
    problems = breach(edit)
    assert any(words in p for p in problems), problems


def test_hardsync_with_a_stale_gradient_is_caught_but_async_may_have_one() -> None:
    def stale(d: Dump) -> None:
        g = d.groups["gradients"]
        g["timestamp"][5], g["staleness"][5] = 1, 1
        d.groups["updates"]["vector_clock"][2, 1] = 1
        d.groups["updates"]["mean_staleness"][2] = 0.5

    assert any("hardsync applied 1 stale" in p for p in breach(stale))

    def stale_async(d: Dump) -> None:
        stale(d)
        d.attrs["config"]["protocol"]["name"] = "async"

    assert breach(stale_async) == []

    def stale_partial(d: Dump) -> None:
        stale(d)
        d.attrs["config"]["protocol"]["pull_fraction"] = 0.5

    assert breach(stale_partial) == []


@pytest.mark.mpi
def test_pserver_stats_check_passes_a_real_run_and_catches_a_tampered_one(tmp_path, capsys):
    train(tmp_path, 7, "protocol.name=softsync", "protocol.n=2", "run.epochs=1", timeout=180)
    dump = str(tmp_path / "stats.h5")
    assert cli.main(["check", dump]) == 0
    assert "consistent" in capsys.readouterr().out
    with h5py.File(dump, "r+") as f:
        f["gradients/staleness"][0] += 1
    assert cli.main(["check", dump]) == 1
    assert "staleness is not (i − 1) − timestamp" in capsys.readouterr().out


def test_a_shards_later_blocks_may_decide_apart_but_servers_updates_is_the_highest() -> None:
    """Under PSP with overlapped pulls the blocks of one shard judge freshness by their own
    timestamps; the updates/gradients rows record the first block only (docs/stats.md)."""

    def second_block(d: Dump, ts: int) -> None:
        b = d.groups["blocks"]
        for key, value in (("block", 1), ("shard", 0), ("timestamp", ts), ("applied", 8),
                           ("dropped", 0)):
            b[key] = np.append(b[key], value).astype(b[key].dtype)

    assert breach(lambda d: second_block(d, 2)) == []
    problems = breach(lambda d: second_block(d, 4))
    assert problems == ["servers/updates of shard 0 is 3, its highest block timestamp 4"]


def with_predictions(d: Dump, error: float | None = None) -> Dump:
    """PP-ASGD rows for ``consistent()``: S = 1 served at each update, one probe from t = 1."""
    mu, dd, dm, mm = 0.9, 2.0, 1.0, 1.5
    a = mu + mu * mu
    d.groups["predictions"] = {"shard": np.zeros(3, I32), "timestamp": np.array([1, 2, 3], I64),
                               "steps": np.ones(3, I32), "staleness_mean": np.full(3, 1.5)}
    d.groups["prediction_errors"] = {
        "shard": np.zeros(1, I32), "block": np.zeros(1, I32), "origin": np.array([1], I64),
        "steps": np.ones(1, I32), "horizon": np.array([2], I64), "dd": np.array([dd]),
        "dm": np.array([dm]), "mm": np.array([mm]), "momentum": np.array([mu]),
        "error": np.array([error if error is not None else (dd - 2 * a * dm + a * a * mm) ** 0.5]),
    }
    return d


def test_prediction_rows_are_checked() -> None:
    assert check_dump(with_predictions(consistent())) == []
    bad = check_dump(with_predictions(consistent(), error=0.1))
    assert bad == ["prediction_errors/error is not √(dd − 2a·dm + a²·mm)"]
    d = with_predictions(consistent())
    d.groups["predictions"]["timestamp"] = np.array([1, 2, 2], I64)
    assert check_dump(d) == ["shard 0: predictions/ rows are not one per update"]


def test_a_run_in_parts_is_held_to_its_last_end_rows() -> None:
    """A resumed run (or one with periodic checkpoints) has one ``learners``/``servers``/
    ``blocks`` row per part, with the counts so far: the last one is held to the streams, an
    earlier part's smaller counts are no problem, a wrong last one still is."""
    d = consistent()
    g = d.groups
    g["learners"] = {"learner": np.array([0, 1, 0, 1], I32),
                     "minibatches": np.array([1, 2, 3, 3], I64)}
    g["servers"] = {"shard": np.zeros(2, I32), "updates": np.array([1, 3], I64)}
    g["blocks"] = {k: np.concatenate([v, v]) for k, v in g["blocks"].items()}
    g["blocks"]["timestamp"][0], g["blocks"]["applied"][0] = 1, 2
    assert check_dump(d) == []
    g["learners"]["minibatches"][-1] = 2
    assert check_dump(d) == ["learner 1: 2 minibatches but train steps 3 rows, 0..2"]
