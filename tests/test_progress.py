"""Progress lines, their ETA, and the live outputs' windows (pserver.dump.progress,
pserver.roles.live), in one process with a scripted clock."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from pserver.dump.progress import (
    Cadence,
    RunShape,
    TrainWindow,
    duration,
    epoch_line,
    eta,
    interim_line,
)
from pserver.plan.config import load_config
from pserver.roles.live import Live

SHAPE = RunShape(epochs=10, train_size=1000, batch_size=10)


def test_eta_is_the_time_so_far_scaled_by_what_is_left():
    assert eta(30.0, 3, 10) == pytest.approx(70.0)  # 10 s an epoch, 7 to go
    assert eta(30.0, 10, 10) == 0.0
    assert eta(0.0, 0, 10) is None and eta(5.0, 0, 10) is None


@pytest.mark.parametrize("seconds, text", [(None, "-"), (float("inf"), "-"), (4.4, "4s"),
                                           (59.6, "1m00s"), (187, "3m07s"), (7500, "2h05m")])
def test_durations_read_at_a_glance(seconds, text):
    assert duration(seconds) == text


def test_the_epoch_line_says_the_eta():
    line = epoch_line(SHAPE, 2, 0.1234, 0.5, "<sigma> 1.00  max sigma 3", 20.0, 0.01)
    assert line.startswith("epoch 2/10  test error 12.34%  loss 0.5000  <sigma> 1.00")
    assert "100 samples/s" in line and "t=20.0s" in line and "ETA 1m20s" in line


def test_the_interim_line_estimates_the_epoch_from_the_minibatches():
    line = interim_line(SHAPE, 250, 0.75, "<sigma> -  max sigma -", 10.0)
    assert line.startswith("epoch ~2.50/10  train loss 0.7500")  # 250 × 10 / 1000
    assert "250 samples/s" in line and "ETA 30s" in line
    # rows lag behind the model: never behind the epoch already tested
    assert interim_line(SHAPE, 150, None, "", 10.0, tested=2).startswith("epoch ~2.00/10  "
                                                                         "train loss -")


def test_cadence_and_window():
    c = Cadence(5.0)
    assert c.due(5.0) and not Cadence(0.0).due(1e9)
    c.reset(5.0)
    assert not c.due(9.9) and c.due(10.0)
    w = TrainWindow()
    w.add([1.0, 2.0])
    w.add([3.0])
    assert (w.take(), w.rows, w.since) == (2.0, 3, 3)
    assert w.take() is None


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def live(tmp_path, *overrides):  # noqa: ANN201
    log = logging.getLogger(f"test-live-{tmp_path.name}")
    log.handlers[:] = [handler := Lines()]
    log.setLevel(logging.INFO)
    cfg = load_config(None, ["run.epochs=3", "data.batch_size=10", *overrides])
    return Live(cfg, 100, tmp_path, log, t0=1000.0), handler.lines


def batch(losses, lr=None, sigma=None):  # noqa: ANN001, ANN201
    rows = {"train": {"loss": list(losses)}}
    if lr is not None:
        rows["updates"] = {"lr": [lr]}
    return rows


def test_lines_between_tests_follow_progress_every(tmp_path):
    out, lines = live(tmp_path, "stats.progress_every=2.0")
    out.rows(batch([1.0, 3.0]), 1.0, (0, 0, 0))  # not yet due
    out.rows(batch([5.0]), 2.5, (4, 2, 3))  # due: the three rows so far
    out.rows(batch([1.0]), 3.0, (4, 2, 3))  # 0.5 s later: not due
    assert len(lines) == 1 and lines[0].startswith("epoch ~0.30/3  train loss 3.0000  "
                                                   "<sigma> 2.00  max sigma 3")
    out.tested(1, 0.5, 0.2, 3.5, 0.01, (4, 2, 3))
    assert lines[1].startswith("epoch 1/3  test error 20.00%") and "ETA 7s" in lines[1]
    out.rows(batch([2.0]), 5.0, (4, 2, 3))  # 1.5 s after the test's line: not due
    out.rows(batch([4.0]), 5.4, (4, 2, 3))
    assert len(lines) == 2
    out.rows(batch([9.0]), 5.5, (4, 2, 3))  # the test's line started the interval again
    assert "train loss 5.0000" in lines[2]  # the rows after the test only (2, 4, 9)


def test_no_lines_between_tests_by_default_or_without_progress(tmp_path):
    for overrides in ((), ("stats.progress_every=1", "stats.progress=false")):
        out, lines = live(tmp_path, *overrides)
        for k in range(10):
            out.rows(batch([1.0]), float(k), (0, 0, 0))
        assert lines == []


def test_scalars_recompute_from_the_rows(tmp_path):
    from tfevents import read_scalars

    out, _ = live(tmp_path, "stats.tensorboard=true", "stats.flush_interval=1.0")
    losses = [2.0, 4.0, 1.0, 1.5, 0.5, 0.25]
    out.rows(batch(losses[:2], lr=0.1), 1.0, (1, 1, 1))  # a point: 1 s passed
    out.rows(batch(losses[2:3], lr=0.2), 1.5, (3, 3, 2))  # not due
    out.tested(1, 0.4, 0.1, 1.6, 0.0, (3, 3, 2))  # a point before the test, then the test
    out.rows(batch(losses[3:], lr=0.05), 1.7, (3, 3, 2))
    out.close(2.0, (6, 4, 3))
    got = read_scalars(tmp_path)
    assert [s for s, _, _ in got["train/loss"]] == [2, 3, 6]
    assert np.allclose([v for _, v, _ in got["train/loss"]], [3.0, 1.0, 0.75])
    assert [(s, v) for s, v, _ in got["test/error"]] == [(1, pytest.approx(0.1))]
    assert [v for _, v, _ in got["staleness/mean"]] == [1.0, 1.0, 1.5]
    assert [v for _, v, _ in got["staleness/max"]] == [1, 2, 3]
    assert np.allclose([v for _, v, _ in got["train/lr"]], [0.1, 0.2, 0.05])
    assert np.allclose([v for _, v, _ in got["train/samples_per_s"]], [20.0, 30 / 1.6, 30.0])
    assert [w for _, _, w in got["test/loss"]] == [pytest.approx(1001.6)]  # t0 + now


def test_a_fresh_run_replaces_earlier_event_files_and_a_resumed_one_keeps_them(tmp_path):
    from pserver.dump.tensorboard import PATTERN, EventFile

    stale = tmp_path / "events.out.tfevents.1.old"
    stale.write_bytes(b"")
    EventFile(tmp_path, fresh=False).close()
    EventFile(tmp_path, fresh=False).close()  # the same second: a file of its own
    assert stale.exists() and len(list(tmp_path.glob(PATTERN))) == 3
    EventFile(tmp_path, fresh=True).close()
    assert not stale.exists() and len(list(tmp_path.glob(PATTERN))) == 1


def test_a_missing_tensorboardx_is_bad_input(monkeypatch):
    import sys

    from pserver.dump.tensorboard import require
    from pserver.errors import ConfigError

    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # import raises ImportError
    with pytest.raises(ConfigError, match="stats.tensorboard = true needs the package "
                                          "tensorboardX"):
        require()


def test_docs_list_every_tensorboard_tag():
    from pathlib import Path

    from pserver.dump.tensorboard import TAGS

    text = (Path(__file__).resolve().parents[1] / "docs" / "stats.md").read_text()
    assert all(f"| `{tag}` |" in text for tag in TAGS)
