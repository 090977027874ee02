"""Real mpiexec runs of user models: a PyTorch module (``model.kind = "torch"``) and a plain
numpy class (``model.kind = "python"``), through the protocols; bad modules stop every rank."""

from __future__ import annotations

import numpy as np
import pytest
from mpirun import QUICKSTART, ROOT, final_weights, run_job, train

from learners.data import load_dataset
from learners.serial import train_serial
from pserver.dump.reader import load_dump
from pserver.plan.config import load_config

pytestmark = pytest.mark.mpi

CNN = "examples/torch_cnn.py:build"
SOFTMAX = "examples/numpy_softmax.py:NumpySoftmax"
TIMEOUT = 300.0  # each rank imports PyTorch (~2 s alone, ~10 s on the loaded 2-core machine)



def test_torch_lambda_1_equals_a_plain_torch_loop(tmp_path):
    torch = pytest.importorskip("torch")
    from test_torch_model import plain_sgd_config, plain_torch_loop

    extra = ("model.module=examples/torch_cnn.py:build_mlp",)
    common = ("protocol.name=hardsync", "optim.rule=sgd", "optim.lr=0.05",
              "optim.weight_decay=0", "run.epochs=1", "model.dtype=float64", *extra)
    res = run_job(4, [str(ROOT / "examples" / "torch_cnn.toml"), f"run.out_dir={tmp_path}",
                      "stats.progress=false", *common], TIMEOUT)
    assert res.returncode == 0, res.output
    cfg = plain_sgd_config("float64", *extra)
    ds = load_dataset(cfg.data, cfg.run.seed)
    from learners.factory import build_model

    factory = build_model(cfg.model, ds.n_features, ds.n_classes).factory
    torch.set_num_threads(1)
    want = plain_torch_loop(cfg, ds, factory)
    np.testing.assert_allclose(final_weights(tmp_path), want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(
    "ranks, overrides",
    [
        (7, ("protocol.name=softsync", "protocol.n=2", "cluster.servers=2", "blocks.split=layer")),
        # async divides the rate by <sigma> ~ 4.8: plain SGD at a larger rate (momentum 0.9
        # wanders at 20-60 % error, the built-in CNN too)
        (6, ("protocol.name=async", "comm.mode=thread", "blocks.count=3", "optim.rule=sgd",
             "optim.lr=0.2")),
        (6, ("protocol.name=hardsync", "cluster.tree_fanout=2", "comm.mode=nonblocking")),
        (5, ("protocol.name=sync",)),  # the learners-only family: allreduce of the gradients
        (5, ("protocol.name=bmuf",)),  # model averaging: local steps, then the filtered model
    ],
    ids=["softsync-2-shards-by-layer", "async-thread", "hardsync-tree-nonblocking", "sync",
         "bmuf"],
)
def test_a_torch_cnn_learns_under_the_protocols(tmp_path, ranks, overrides):
    pytest.importorskip("torch")
    train(tmp_path, ranks, "model.kind=torch", f"model.module={CNN}", "run.epochs=4",
          "optim.lr_milestones=[]", *overrides, timeout=TIMEOUT)
    dump = load_dump(tmp_path / "stats.h5")
    errors = dump.group("test")["error"]
    assert len(errors) == 4
    # chance is 0.9; measured 3-9 % after 4 epochs on a quiet machine, but async in thread mode
    # on an oversubscribed one (CI) reached 16.9 %: its ⟨σ⟩ and so its rate follow the load
    assert errors.min() < 0.25, errors
    assert np.all(np.isfinite(final_weights(tmp_path)))


@pytest.mark.parametrize(
    "spec, message",
    [
        ("examples/no_such_file.py:build", "does not exist"),
        ("examples/torch_cnn.py:no_such_factory", "has no 'no_such_factory'"),
        ("examples/numpy_softmax.py:NumpySoftmax", "expected a torch.nn.Module"),
    ],
)
def test_a_bad_torch_module_stops_every_rank_with_one_line(tmp_path, spec, message):
    pytest.importorskip("torch")
    res = run_job(5, [str(QUICKSTART), f"run.out_dir={tmp_path}", "model.kind=torch",
                      f"model.module={spec}"], TIMEOUT)
    assert res.returncode == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("pserver-run: error:")]
    assert len(lines) == 1, res.output
    assert message in lines[0] and "model.module" in lines[0]
    assert "Traceback" not in res.output
    assert not (tmp_path / "stats.h5").exists()


def test_a_plain_numpy_model_learns_and_lambda_1_equals_serial_sgd(tmp_path):
    common = ("model.kind=python", f"model.module={SOFTMAX}", "run.epochs=2",
              "protocol.name=hardsync", "blocks.split=layer", "cluster.servers=2")
    train(tmp_path, 5, *common, timeout=TIMEOUT)
    cfg = load_config(QUICKSTART, list(common))
    w_serial = train_serial(cfg, load_dataset(cfg.data, cfg.run.seed))
    np.testing.assert_array_equal(final_weights(tmp_path), w_serial)  # same code, same order
    errors = load_dump(tmp_path / "stats.h5").group("test")["error"]
    assert errors[-1] < 0.15, errors


def test_a_plain_model_learns_with_four_learners(tmp_path):
    train(tmp_path, 7, "model.kind=python", f"model.module={SOFTMAX}",
          "protocol.name=softsync", timeout=TIMEOUT)
    errors = load_dump(tmp_path / "stats.h5").group("test")["error"]
    assert errors.min() < 0.08 and errors[-1] < 0.1, errors  # softmax regression: ~4-5 %


def test_torch_under_hybrid_one_learner_is_the_delayed_serial_reference(tmp_path):
    """HYBRID allreduces one gradient buffer while the next is computed into the other: the
    adapter's gradient views follow the alternating buffers (learners/serial.py reference)."""
    pytest.importorskip("torch")
    from learners.serial import train_serial_delayed

    common = ("protocol.name=hybrid", "comm.mode=thread", "run.epochs=1", "model.kind=torch",
              "model.module=examples/torch_cnn.py:build_mlp", "model.dtype=float64",
              "optim.lr_milestones=[]")
    train(tmp_path, 3, *common, timeout=TIMEOUT)
    cfg = load_config(QUICKSTART, list(common))
    want = train_serial_delayed(cfg, load_dataset(cfg.data, cfg.run.seed))
    np.testing.assert_allclose(final_weights(tmp_path), want, rtol=1e-12, atol=1e-12)
