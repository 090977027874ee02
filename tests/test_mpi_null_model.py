"""The zero-compute model (``model.kind = null``) in real runs: it pushes defined gradients."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from mpirun import train

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("mode", ["blocking", "thread"])
def test_null_model_weights_stay_exactly_zero(tmp_path, mode):
    # zero gradients from w0 = 0 leave every rule's weights at 0; an unwritten gradient buffer
    # pushed whatever the memory held (NaN in 6 of 15 soak runs)
    train(
        tmp_path, 6, "model.kind=null", "model.size_mib=0.02", "blocks.count=2",
        "protocol.name=async", f"comm.mode={mode}", "run.epochs=2", "optim.rule=adagrad",
    )
    with h5py.File(tmp_path / "stats.h5", "r") as f:
        w = f["model/weights"][:]
    assert w.size > 0 and np.array_equal(w, np.zeros_like(w))
