"""data.source = "fashion-mnist" in a real job: it trains, and a missing dataset stops every
rank before training with one line (small look-alike files: no Debian package needed)."""

from __future__ import annotations

import pytest
from fake_fashion import fake_fashion
from mpirun import train
from test_mpi_failures import fails

from pserver.dump.reader import load_dump

pytestmark = pytest.mark.mpi

FASHION = ("data.source=fashion-mnist", "model.kind=softmax", "optim.lr_milestones=[]")


def test_fashion_mnist_trains_and_tests_on_the_t10k_set(tmp_path):
    d = fake_fashion(tmp_path / "data")
    train(tmp_path / "run", 7, *FASHION, f"data.dir={d}", "run.epochs=3", timeout=120)
    dump = load_dump(tmp_path / "run" / "stats.h5")
    err = dump.group("test")["error"]
    assert err[-1] < 0.2, err  # chance is 0.9; the look-alike's classes are bright bands


def test_missing_dataset_is_one_error_line(tmp_path):
    msg = fails(tmp_path / "run", 7, *FASHION, f"data.dir={tmp_path / 'none'}")
    assert "train-images-idx3-ubyte.gz' does not exist" in msg and "dataset-fashion-mnist" in msg
