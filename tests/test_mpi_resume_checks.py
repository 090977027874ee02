"""``--resume`` refuses what would silently change or skip the run (issue 22, D10).

On the code before, each of these resumed with exit 0: a ``run.out_dir`` override was replaced
by the resume directory, ``run.epochs`` at the epochs done made a part that trained nothing, and
a data file of the same shape with other contents was trained on from the checkpoint's sampler.
Now each is one ``pserver-run: error:`` line, exit 2, every rank, before training.
"""

from __future__ import annotations

import re
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.mpirun import QUICKSTART, run_job

pytestmark = pytest.mark.mpi

N = 4  # server, stats, data, one learner
TIMEOUT = 120.0


def data_file(path: Path, seed: int) -> None:
    """A small training set: 512 samples of 16 features, 4 classes, drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as f:
        f["X"] = rng.normal(size=(512, 16)).astype(np.float32)
        f["y"] = rng.integers(0, 4, 512)


def job(args: list[str]):  # noqa: ANN201 - tests.mpirun.Result
    return run_job(N, [str(QUICKSTART), "stats.progress=false", *args], TIMEOUT)


def errors(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("pserver-run: error:")]


def test_resume_refuses_out_dir_epochs_done_and_other_data(tmp_path: Path) -> None:
    data, out = tmp_path / "d.h5", tmp_path / "run"
    data_file(data, 0)
    source = ["data.source=hdf5", f"data.path={str(data)!r}"]
    first = job([*source, f"run.out_dir={out}", "run.epochs=1"])
    assert first.returncode == 0, first.output
    before = (out / "stats.h5").read_bytes()
    cases = {
        "override": ([f"run.out_dir={tmp_path / 'other'}", "run.epochs=2"], "run.out_dir"),
        "epochs": (["run.epochs=1"], "run.epochs = 1.*done 1 epochs"),
    }
    for args, said in cases.values():
        res = job([*source, "--resume", str(out), *args])
        assert res.returncode == 2, res.output
        lines = errors(res.output)
        assert len(lines) == 1 and re.search(said, lines[0]), res.output
        assert "Traceback" not in res.output
    data_file(data, 1)  # the same shape, other contents
    res = job([*source, "--resume", str(out), "run.epochs=2"])
    assert res.returncode == 2, res.output
    lines = errors(res.output)
    assert len(lines) == 1 and "training data differ" in lines[0], res.output
    assert (out / "stats.h5").read_bytes() == before  # nothing written
    assert not (tmp_path / "other").exists()
    data_file(data, 0)  # the same data again: the resume goes on
    res = job([*source, "--resume", str(out), "run.epochs=2"])
    assert res.returncode == 0, res.output
