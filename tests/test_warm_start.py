"""model.init_from (pserver.ckpt.warm_start) in one process: the checks on a hand-made dump."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from pserver.ckpt.warm_start import architecture_mismatch, dump_path, load_initial_weights
from pserver.errors import ConfigError
from pserver.plan.config import Config

MODEL = {"kind": "mlp", "hidden": [64], "dtype": "float32", "size_mib": 1.0,
         "channels": [32, 64], "module": "", "init_from": ""}  # fmt: skip


def write_dump(path, weights=None, model=None, config=True):
    cfg = Config().to_dict()
    cfg["model"] = dict(model or MODEL)
    with h5py.File(path, "w") as f:
        if config:
            f.attrs["config"] = json.dumps(cfg)
        if weights is not None:
            f["model/weights"] = weights
    return path


def test_a_run_directory_and_its_dump_give_the_same_weights(tmp_path):
    w = np.arange(10, dtype=np.float64) / 7
    write_dump(tmp_path / "stats.h5", w)
    assert dump_path(str(tmp_path)) == tmp_path / "stats.h5"
    for source in (str(tmp_path), str(tmp_path / "stats.h5")):
        got = load_initial_weights(source, MODEL, 10, np.float32)
        assert got.dtype == np.float32 and got.flags.c_contiguous
        assert np.array_equal(got, w.astype(np.float32))  # float64 cast to this run's dtype
    same = load_initial_weights(str(tmp_path), MODEL, 10, np.float64)
    assert np.array_equal(same, w)  # no rounding where the dtypes agree


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda d: d / "nothing", "does not exist"),
        (lambda d: (d / "x.h5").write_text("not hdf5") and d / "x.h5", "is not an HDF5 dump"),
        (lambda d: write_dump(d / "x.h5"), "holds no final model"),
        (lambda d: write_dump(d / "x.h5", np.zeros(10), config=False), "no readable config"),
        (lambda d: write_dump(d / "x.h5", np.zeros(9)), "this run's has 10 parameters"),
        (lambda d: write_dump(d / "x.h5", np.zeros((2, 5))), "this run's has 10 parameters"),
        (lambda d: write_dump(d / "x.h5", np.arange(10)), "this run's has 10 parameters"),
        (lambda d: write_dump(d / "x.h5", np.full(10, np.nan)), "NaN or infinite"),
        (
            lambda d: write_dump(d / "x.h5", np.zeros(10), {**MODEL, "hidden": [32]}),
            "another model: model.hidden = [32] there, [64] here",
        ),
        (
            lambda d: write_dump(d / "x.h5", np.zeros(10), {**MODEL, "kind": "cnn"}),
            "model.kind = 'cnn' there, 'mlp' here",
        ),
    ],
    ids=[
        "missing",
        "not-hdf5",
        "no-model",
        "no-config",
        "short",
        "2-d",
        "integers",
        "nan",
        "hidden",
        "kind",
    ],
)
def test_bad_sources_are_one_error_naming_the_key(tmp_path, make, expected):
    source = make(tmp_path)
    with pytest.raises(ConfigError) as e:
        load_initial_weights(str(source), MODEL, 10, np.float32)
    message = str(e.value)
    assert message.startswith("model.init_from = ") and expected in message, message
    assert "\n" not in message


def test_a_soft_link_to_a_model_elsewhere_is_not_followed(tmp_path):
    path = write_dump(tmp_path / "x.h5")
    with h5py.File(path, "a") as f:
        f["elsewhere/weights"] = np.zeros(10)
        f["model/weights"] = h5py.SoftLink("/elsewhere/weights")
    with pytest.raises(ConfigError, match="holds no final model"):
        load_initial_weights(str(path), MODEL, 10, np.float32)


def test_dtype_and_the_warm_start_key_itself_are_not_architecture():
    other = {**MODEL, "dtype": "float64", "init_from": "runs/a"}
    assert architecture_mismatch(other, MODEL) == []
    assert architecture_mismatch({"kind": "mlp"}, MODEL) == []  # keys the source lacks: no claim
